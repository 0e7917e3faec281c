"""Worker faults: hung workers, a killed parent, garbled replies, swapping trials.

Most tests drive the parent side against a stand-in worker (a few lines of Python that speak the
protocol), so they take about a second each; the killed-parent tests run the real worker module.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgebatch.errors import ProbeError
from edgebatch.probing import worker as worker_module
from edgebatch.probing.trial import swap_grew
from edgebatch.probing.worker import (
    PREFIX,
    WorkerSetup,
    parse_reply,
    start_worker,
    trial_deadline_seconds,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
HANG_MODEL = f"{REPO_ROOT / 'tests' / 'models' / 'hang_on_build.py'}:build"

# A stand-in worker: its setup's model_spec says how it misbehaves.
FAKE_WORKER = r"""
import json, sys, time
setup = json.loads(sys.stdin.readline())
mode = setup["model_spec"]
def send(text):
    sys.stdout.write(text)
    sys.stdout.flush()
if mode == "never_ready":
    time.sleep(60)
    sys.exit(0)
send("chatter from TensorFlow that is not the protocol\n")
send('@@edgebatch {"ready": true, "measure": "process_peak", "prewarm_step_seconds": 0.25}\n')
for line in sys.stdin:
    batch = json.loads(line)["batch"]
    if mode == "hang":
        time.sleep(60)
    elif mode == "garbled":
        send('@@edgebatch {"batch": %d, "ok": tru\n' % batch)
    elif mode == "truncated":
        send('@@edgebatch {"batch": %d, "o' % batch)
        sys.exit(0)
    elif mode == "not_an_object":
        send('@@edgebatch [1, 2]\n')
    else:
        send('@@edgebatch {"batch": %d, "ok": true, "step_seconds": 0.5, "process_peak_bytes": 1000}\n' % batch)
"""


def fake_worker(mode: str, **setup_fields):
    return start_worker(WorkerSetup(model_spec=mode, **setup_fields), command=[sys.executable, "-c", FAKE_WORKER])


def process_gone(pid: int) -> bool:
    """No such process, or only its zombie left (a reaper that has not reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def wait_until(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


# ---- deadlines -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("trial_seconds", "expected_step_seconds", "deadline"),
    [
        (10.0, None, 200.0),  # 20 x trial_seconds
        (1.0, None, 120.0),  # the floor
        (10.0, 5.0, 200.0),  # steps that fit the trial change nothing
        (10.0, 60.0, 610.0),  # slow steps: trial_seconds + 10 steps
        (10.0, 0.0, 200.0),
    ],
)
def test_trial_deadline_is_generous_and_grows_with_slow_steps(trial_seconds, expected_step_seconds, deadline):
    assert trial_deadline_seconds(trial_seconds, expected_step_seconds) == deadline


def test_a_hung_trial_stops_the_probe_and_the_worker():
    worker = fake_worker("hang", trial_deadline_seconds=1.0)
    try:
        started = time.monotonic()
        with pytest.raises(ProbeError, match=r"no reply within 1 s at batch 8 .*hung, not out of memory") as caught:
            worker.run_trial(8)
        assert time.monotonic() - started < 5
        assert "\n" not in str(caught.value)
        assert worker.process.poll() is not None
        assert not worker.can_run(16)
    finally:
        worker.close()


def test_a_hung_trial_whose_swap_grew_is_a_failed_trial(monkeypatch):
    readings = iter([0, 8192])
    monkeypatch.setattr(worker_module, "_process_swap_bytes", lambda pid: next(readings))
    worker = fake_worker("hang", trial_deadline_seconds=1.0)
    try:
        reply = worker.run_trial(8)
        assert reply["ok"] is False and reply["error"] == "swapped" and reply["batch"] == 8
        assert worker.process.poll() is not None
        assert not worker.can_run(16)
    finally:
        worker.close()


def test_a_stopping_probe_kills_a_worker_mid_trial_without_waiting_for_it(monkeypatch):
    """Ctrl-C or SIGTERM during a trial (api.probe closes its workers `at_once`): Ctrl-C took 5.3 s
    to return while close waited for the trial to end (CLOSE_WAIT_SECONDS)."""
    monkeypatch.setattr(worker_module, "CLOSE_WAIT_SECONDS", 60.0)
    worker = fake_worker("hang")
    worker.process.stdin.write(b'{"batch": 8}\n')  # a trial that will not end by itself
    worker.process.stdin.flush()
    started = time.monotonic()
    worker.close(at_once=True)
    assert time.monotonic() - started < 30  # not the 60 s wait
    assert worker.process.returncode == -signal.SIGKILL


def _close_in_a_thread(close, seconds: float) -> bool:
    """Whether close() returned within `seconds` (run in a daemon thread, so a hang fails the test
    instead of hanging the suite)."""
    import threading

    thread = threading.Thread(target=close, daemon=True)
    thread.start()
    thread.join(seconds)
    return not thread.is_alive()


@pytest.mark.parametrize("at_once", [True, False], ids=["stopping", "done"])
def test_a_worker_closes_when_an_interrupt_left_popens_lock_held(monkeypatch, at_once):
    """An interrupt raised inside Popen.poll() between its lock's acquire and its try leaves the
    lock held (reaping.py). A probe stopped by Ctrl-C then hung for ever in Worker.close, in
    Popen.wait(), at `with self._waitpid_lock` (tests/test_probe_models.py, 1 run in 6 of that
    module). Here the lock is held as that interrupt leaves it, and the worker is mid-trial."""
    monkeypatch.setattr(worker_module, "CLOSE_WAIT_SECONDS", 1.0)
    worker = fake_worker("hang")
    worker.process.stdin.write(b'{"batch": 8}\n')
    worker.process.stdin.flush()
    assert worker.process._waitpid_lock.acquire(False)  # what the interrupted poll() left behind
    assert _close_in_a_thread(lambda: worker.close(at_once=at_once), 20), "close() hung on Popen's lock"
    assert worker.process.returncode == -signal.SIGKILL
    assert process_gone(worker.process.pid)


def test_the_fork_server_closes_when_an_interrupt_left_popens_lock_held():
    """The same for the fork server's own process (ForkServer.close), started here without its
    TensorFlow import finished: close() kills it wherever it is."""
    from edgebatch.probing.forkserver import ForkServer

    server = ForkServer(dict(os.environ))
    assert server.process._waitpid_lock.acquire(False)
    assert _close_in_a_thread(server.close, 20), "ForkServer.close() hung on Popen's lock"
    assert server.process.returncode == -signal.SIGKILL
    assert process_gone(server.process.pid)


def test_ctrl_c_during_side_by_side_repeats_kills_their_workers_at_once(monkeypatch):
    """The answer's repeats run two or more new processes at once (fresh_workers.repeats_side_by_side). With
    a thread per worker, SIGTERM there waited for every trial to end (19 s for small_cnn under
    3 GiB); here the trials hang, so that wait would be the trial deadline (120 s)."""
    from edgebatch.probing import fresh_workers
    from edgebatch.probing.search import SearchConfig

    pids = []

    def spawn(setup):
        worker = worker_module.spawn_worker(setup, command=[sys.executable, "-c", FAKE_WORKER])
        pids.append(worker.process.pid)
        return worker

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    monkeypatch.setattr(fresh_workers, "spawn_worker", spawn)
    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 2.0)  # by then both stand-ins are ready and in their trials
    started = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            fresh_workers.repeats_side_by_side(64, 2, SearchConfig(budget_bytes=2**30), WorkerSetup(model_spec="hang"),
                                               "process_peak")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert time.monotonic() - started < 30, "the interrupt waited for the trials"
    assert len(pids) == 2
    assert all(wait_until(lambda pid=pid: process_gone(pid), 5) for pid in pids), "a repeat's worker outlived the stop"


def test_a_worker_that_never_gets_ready_is_stopped_at_the_startup_deadline():
    started = time.monotonic()
    with pytest.raises(ProbeError, match=r"not ready within 1 s"):
        fake_worker("never_ready", startup_deadline_seconds=1.0)
    assert time.monotonic() - started < 5


def test_the_real_worker_is_stopped_at_the_startup_deadline(tmp_path, monkeypatch):
    marker = tmp_path / "marker"
    monkeypatch.setenv("EDGEBATCH_TEST_HANG_MARKER", str(marker))
    spawned = []
    real_spawn = worker_module.spawn_worker
    monkeypatch.setattr(worker_module, "spawn_worker", lambda *a, **k: spawned.append(real_spawn(*a, **k)) or spawned[-1])
    with pytest.raises(ProbeError, match=r"not ready within 2 s .*hang_on_build"):
        start_worker(WorkerSetup(model_spec=HANG_MODEL, startup_deadline_seconds=2.0))
    assert process_gone(spawned[0].process.pid)


def test_the_deadline_follows_the_workers_own_step_times():
    worker = fake_worker("answer", prewarm_batch=4)
    try:
        # The prewarm's 0.25 s at batch 4 foresees 625 s at batch 10000: 10 + 10 x 625.
        assert worker.trial_deadline(10000) == pytest.approx(6260.0)
        assert worker.run_trial(8)["ok"] is True
        # Now 0.5 s at batch 8: 625 s again at 10000, and the floor at small batches.
        assert worker.trial_deadline(10000) == pytest.approx(6260.0)
        assert worker.trial_deadline(16) == 200.0
    finally:
        worker.close()


# ---- garbled replies -------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["garbled", "truncated", "not_an_object"])
def test_a_garbled_or_cut_reply_is_a_one_line_probe_error(mode):
    worker = fake_worker(mode)
    try:
        with pytest.raises(ProbeError, match="probe worker sent a") as caught:
            worker.run_trial(8)
        assert "\n" not in str(caught.value)
    finally:
        worker.close()


@pytest.mark.parametrize(
    ("line", "reply"),
    [
        (b'@@edgebatch {"batch": 8, "ok": true}\n', {"batch": 8, "ok": True}),
        (b"2026-01-01 I tensorflow: something\n", None),
        (b'{"batch": 8}\n', None),  # JSON without the prefix is someone else's output
    ],
)
def test_parse_reply_reads_protocol_lines_and_skips_others(line, reply):
    assert parse_reply(line) == reply


@pytest.mark.parametrize("body", ['{"batch": 8, "ok"', '{"batch": 8, "ok": tru}', "", "null", "[1]", '"text"'])
def test_parse_reply_refuses_broken_protocol_lines(body):
    with pytest.raises(ProbeError) as caught:
        parse_reply((PREFIX + body + "\n").encode())
    assert "\n" not in str(caught.value)


# ---- swap ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("before", "after", "grew"),
    [(0, 0, False), (0, 4096, True), (1 << 20, 1 << 20, False), (8192, 4096, False), (None, 4096, False), (0, None, False)],
)
def test_swap_grew(before, after, grew):
    assert swap_grew(before, after) is grew


# ---- a killed parent leaves no worker --------------------------------------------------------

PARENT_SCRIPT = r"""
import sys, time
from edgebatch.probing.worker import WorkerSetup, spawn_worker
worker = spawn_worker(WorkerSetup(model_spec=sys.argv[1]))
print(worker.process.pid, flush=True)
time.sleep(600)
"""


def start_parent(tmp_path):
    env = {
        **os.environ,
        "EDGEBATCH_TEST_HANG_MARKER": str(tmp_path / "marker"),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
    }
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT_SCRIPT, HANG_MODEL], stdout=subprocess.PIPE, text=True, env=env, cwd=REPO_ROOT
    )
    return parent, int(parent.stdout.readline())


def kill_parent_and_check_worker(parent, worker_pid):
    try:
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        assert wait_until(lambda: process_gone(worker_pid), timeout_s=10), "the worker outlived its killed parent"
    finally:
        if not process_gone(worker_pid):
            os.kill(worker_pid, signal.SIGKILL)


@pytest.mark.slow  # the worker imports TensorFlow before it reaches the stand-in model
def test_a_worker_busy_in_tensorflow_dies_with_its_killed_parent(tmp_path):
    parent, worker_pid = start_parent(tmp_path)
    marker = tmp_path / "marker"
    # The worker is past its start-up and stuck building the model: only PR_SET_PDEATHSIG can end it
    # (it will not read its stdin again).
    reached = wait_until(lambda: marker.exists() and marker.read_text() == str(worker_pid), timeout_s=180)
    if not reached:
        os.kill(worker_pid, signal.SIGKILL)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        pytest.fail("the stand-in model never started building")
    kill_parent_and_check_worker(parent, worker_pid)


def test_a_worker_whose_parent_dies_at_once_leaves_too(tmp_path):
    # Killed before the worker may have asked for PR_SET_PDEATHSIG: it notices the new parent pid.
    parent, worker_pid = start_parent(tmp_path)
    kill_parent_and_check_worker(parent, worker_pid)


# ---- a trial whose swap grew fails (real steps, the swap reading faked: no swap here) ----------


@pytest.fixture(scope="module")
def tiny_runner():
    import keras

    from edgebatch.probing.trial import TrialRunner

    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(4)])
    runner = TrialRunner(model, optimizer="sgd")
    runner.run_steps(1, 1)
    return runner


@pytest.mark.slow  # imports TensorFlow and Keras in this process (10-25 s here)
@pytest.mark.parametrize(("swap_step_bytes", "ok"), [(0, True), (4096, False)])
def test_a_trial_whose_swap_grew_fails(tiny_runner, monkeypatch, swap_step_bytes, ok):
    from edgebatch.probing import trial as trial_module

    readings = iter(range(10 * 2**20, 100 * 2**20, swap_step_bytes) if swap_step_bytes else [])
    monkeypatch.setattr(trial_module, "process_swap_bytes", lambda: next(readings, 10 * 2**20))
    result = tiny_runner.run_trial(8, 3, 1.0)
    assert result["ok"] is ok
    if not ok:
        assert result["error"] == "swapped" and "grew" in result["detail"]


# ---- a closed worker ends without Python's interpreter shutdown --------------------------------


@pytest.mark.slow  # a real worker: a TensorFlow import and a tiny model
def test_a_closed_worker_exits_0_without_interpreter_shutdown(tmp_path, monkeypatch):
    """Interpreter shutdown (TensorFlow's teardown) took 1.3-1.9 s per new-process worker, on the
    probe's critical path (docs/probe-evidence.md, "What a probe costs, and why"). The worker now
    flushes and leaves with os._exit: its replies all arrive, its exit code is 0, and atexit
    handlers, which only an interpreter shutdown runs, do not run."""
    marker = tmp_path / "interpreter_shut_down"
    (tmp_path / "sitecustomize.py").write_text(
        "import atexit, os\n"
        "if os.environ.get('EDGEBATCH_TEST_ATEXIT_MARKER'):\n"
        "    atexit.register(lambda: open(os.environ['EDGEBATCH_TEST_ATEXIT_MARKER'], 'w').close())\n"
    )
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("EDGEBATCH_TEST_ATEXIT_MARKER", str(marker))
    # The stand-in shows the marker works: a plain Python process that exits normally writes it.
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    assert marker.exists(), "sitecustomize's atexit handler did not run in a plain process"
    marker.unlink()
    worker = start_worker(WorkerSetup(model_spec="mlp", device="CPU:0", steps_per_trial=1, trial_seconds=1.0))
    try:
        assert worker.run_trial(8)["ok"]
    finally:
        worker.close()
    assert worker.process.returncode == 0
    assert not marker.exists(), "the worker ran Python's interpreter shutdown"


@pytest.mark.slow  # a real worker: a TensorFlow import before it builds the model
@pytest.mark.parametrize(("exit_call", "code", "said"), [("sys.exit(3)", 3, None),
                                                         ("sys.exit('no data here')", 1, "no data here")])
def test_a_model_that_calls_sys_exit_ends_the_worker_with_its_code_and_message(tmp_path, exit_call, code, said):
    model = tmp_path / "exits.py"
    model.write_text(f"import sys\n\ndef build():\n    {exit_call}\n")
    with pytest.raises(ProbeError) as failed:
        start_worker(WorkerSetup(model_spec=f"{model}:build", device="CPU:0"))
    message = str(failed.value)
    assert f"worker exited with code {code}" in message, message
    assert "Traceback" not in message
    if said:
        assert said in message, message
