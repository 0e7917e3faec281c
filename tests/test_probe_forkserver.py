"""Fresh probe workers forked from a fork server: they run, they measure what a fresh process does, they die with it."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from edgebatch.probing import fresh_workers
from edgebatch.probing.forkserver import ENV_DISABLE, ForkServer, ForkServerError, fork_server_wanted
from edgebatch.probing.worker import WorkerSetup, start_worker, worker_environment

MIB = 1024**2
# What a forked worker may hold above a fresh one (measured: 24 MiB; see the test that uses it).
EXTRA_FORKED_MIB = 40
SETUP = WorkerSetup(model_spec="mlp", precision="float32", optimizer="adam", device="CPU:0", steps_per_trial=3,
                    trial_seconds=10.0)


def test_only_cpu_probes_on_linux_use_a_fork_server(monkeypatch):
    monkeypatch.delenv(ENV_DISABLE, raising=False)
    assert fork_server_wanted("CPU:0") == sys.platform.startswith("linux")
    assert not fork_server_wanted("GPU:0")
    monkeypatch.setenv(ENV_DISABLE, "1")
    assert not fork_server_wanted("CPU:0")


@pytest.mark.parametrize(("room", "budget", "served"), [
    (20 * 1024 * MIB, 4 * 1024 * MIB, True),
    (20 * 1024 * MIB, 20 * 1024 * MIB, False),  # the default budget is all of the room
    (4 * 1024 * MIB, 4 * 1024 * MIB - fresh_workers.FORK_SERVER_RESERVE_BYTES + 1, False),
    (None, 1024 * MIB, False),  # the room cannot be read
])
def test_the_server_runs_only_with_room_for_it_beside_the_budget(monkeypatch, room, budget, served):
    from edgebatch.probing import budget as budget_module
    from edgebatch.probing import forkserver

    started = []
    monkeypatch.delenv(ENV_DISABLE, raising=False)
    monkeypatch.setattr(budget_module, "device_room_bytes", lambda device: room)
    monkeypatch.setattr(forkserver, "ForkServer", lambda env: started.append(env) or "server")
    fresh = fresh_workers.FreshWorkers("CPU:0", budget, print)
    assert (fresh.server == "server") == (served and sys.platform.startswith("linux"))
    fresh.server = None


@pytest.fixture(scope="module")
def server():
    server = ForkServer(worker_environment("CPU:0"))
    server.wait_ready()
    yield server
    server.close()


@pytest.mark.slow
def test_a_forked_worker_measures_what_a_fresh_one_does(server):
    """A plain fork leaves TensorFlow's library pages out of the child's resident set (690 against
    1019 MiB for small_cnn at 128; docs/probe-evidence.md, "Fresh workers from a fork server"): the
    retouch puts them back."""
    assert server.resident_pages > 10_000
    forked = start_worker(SETUP, server=server)
    fresh = start_worker(SETUP)
    try:
        forked_reply, fresh_reply = forked.run_trial(64), fresh.run_trial(64)
        assert forked_reply["ok"] and fresh_reply["ok"]
        for field, got, expected in (
            ("baseline", forked.facts["baseline_process_bytes"], fresh.facts["baseline_process_bytes"]),
            ("peak", forked_reply["process_peak_bytes"], fresh_reply["process_peak_bytes"]),
        ):
            # A forked child holds a fixed amount more than a new process: on an AMD EPYC host
            # 828.5 against 804.5-804.6 MiB after setup and 829.8-830.2 against 806.4-806.6 MiB at
            # the trial, three pairs each (24 MiB, 2.9-3.0% of this small model's process; for the
            # probe's models it is the 1.7-1.9% docs/probe-evidence.md reports). Never below
            # a fresh process by more than 1% (the plain fork was 329 MiB, 32%, low), never more
            # than EXTRA_FORKED_MIB above it.
            assert got >= 0.99 * expected, (field, got >> 20, expected >> 20)
            assert got - expected <= EXTRA_FORKED_MIB * MIB, (field, got >> 20, expected >> 20)
    finally:
        forked.close()
        fresh.close()
    assert forked.process.returncode == 0


@pytest.mark.slow
def test_a_killed_worker_is_reported_with_its_signal(server):
    worker = start_worker(SETUP, server=server)
    os.kill(worker.process.pid, signal.SIGKILL)
    assert worker.process.wait(timeout=10) == -signal.SIGKILL
    worker.close()


def test_a_server_that_cannot_start_says_so(tmp_path):
    env = {**worker_environment("CPU:0"), "PYTHONPATH": str(tmp_path)}
    (tmp_path / "tensorflow.py").write_text("raise ImportError('no TensorFlow here')\n")
    broken = ForkServer(env)
    with pytest.raises(ForkServerError, match="no TensorFlow here"):
        broken.wait_ready()


@pytest.mark.slow
def test_server_and_workers_die_with_the_probe(tmp_path):
    """SIGKILL the process that started the server: no server and no forked worker is left."""
    script = tmp_path / "probe_parent.py"
    script.write_text(textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {os.getcwd()!r})
        from edgebatch.probing.forkserver import ForkServer
        from edgebatch.probing.worker import WorkerSetup, start_worker, worker_environment
        server = ForkServer(worker_environment("CPU:0"))
        setup = WorkerSetup(model_spec="mlp", precision="float32", optimizer="adam", device="CPU:0")
        worker = start_worker(setup, server=server)
        print(server.process.pid, worker.process.pid, flush=True)
        time.sleep(600)
    """))
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        server_pid, worker_pid = (int(pid) for pid in parent.stdout.readline().split())
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and (_alive(server_pid) or _alive(worker_pid)):
            time.sleep(0.1)
        assert not _alive(server_pid), "the fork server outlived the probe"
        assert not _alive(worker_pid), "a forked worker outlived the probe"
    finally:
        if parent.poll() is None:
            parent.kill()


def _alive(pid: int) -> bool:
    """True while `pid` runs (a zombie, which init will reap, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _server_on_a_thread():
    """A ForkServer handle talking to `forkserver._serve` on a thread of this process (no TensorFlow):
    it answers status requests about this process's own children as the real server does."""
    import socket
    import threading

    from edgebatch.probing import forkserver

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    threading.Thread(target=forkserver._serve, args=(theirs, []), daemon=True).start()
    return _handle_on(ours)


def _handle_on(ours):
    """A ForkServer handle on one end of a socket pair, with no server process of its own."""
    handle = ForkServer.__new__(ForkServer)
    handle._socket, handle._received, handle._last_request_id, handle.resident_pages = ours, b"", 0, 0
    return handle


def test_a_status_call_after_an_interrupted_one_reads_its_own_reply(monkeypatch):
    """An interrupt after a status request went out and before its reply was read leaves that reply
    in the socket; the next call must skip it, not return it (a running worker read as finished)."""
    handle = _server_on_a_thread()
    finished = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        deadline = time.monotonic() + 20
        while handle.status(finished.pid) is None:
            assert time.monotonic() < deadline, "the finished child was never reported"
            time.sleep(0.05)
        receive = ForkServer._receive

        def interrupted(self, request_id=None):
            raise KeyboardInterrupt

        monkeypatch.setattr(ForkServer, "_receive", interrupted)
        with pytest.raises(KeyboardInterrupt):
            handle.status(finished.pid)  # its reply, 3, stays unread
        monkeypatch.setattr(ForkServer, "_receive", receive)
        assert handle.status(running.pid) is None
        assert handle.status(finished.pid) == 3
        assert handle._received == b""
    finally:
        running.kill()
        running.wait()
        handle._socket.close()


def test_a_garbled_reply_is_a_fork_server_error():
    import socket

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    handle = _handle_on(ours)
    try:
        theirs.sendall(b'{"returncode": 0, "id"\n')
        with pytest.raises(ForkServerError, match="garbled"):
            handle._receive(1)
    finally:
        ours.close()
        theirs.close()
