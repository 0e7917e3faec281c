"""A fork server for probe workers: import TensorFlow once, fork each fresh worker from it.

A fresh worker pays a TensorFlow import before it builds the model (8-20 s on two busy cores); the
search starts several. The server imports TensorFlow and Keras, runs nothing, and forks a child per
worker, which then runs `worker_child.worker_main()` exactly as
`python -m edgebatch.probing.worker_main` would.

What a child measures must match a fresh process, so each child first touches the file-backed
pages the server has resident (resident_file_pages); where /proc/self/pagemap cannot be read the
server refuses to start and the probe spawns workers the usual way. CPU probes only: a child forked
from a process that touched CUDA cannot use it, and a GPU probe's fresh worker is not dominated by
the import anyway. Lifetimes: see ForkServer.
"""

from __future__ import annotations

import array
import ctypes
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time

from edgebatch.probing.reaping import kill_and_reap

ENV_DISABLE = "EDGEBATCH_NO_FORK_SERVER"
_PR_SET_PDEATHSIG = 1
_PAGEMAP_PRESENT = 0x80  # bit 63 of a little-endian pagemap entry, in its last byte


class ForkServerError(RuntimeError):
    """The fork server could not start or stopped answering; the caller spawns workers directly."""


def fork_server_wanted(device: str) -> bool:
    """A fork server serves CPU probes on Linux unless EDGEBATCH_NO_FORK_SERVER is set."""
    return (
        sys.platform.startswith("linux")
        and device.upper().startswith("CPU")
        and not os.environ.get(ENV_DISABLE)
    )


class ForkServer:
    """Probe-side handle of the server process. It starts in the background; `spawn(env, stderr_fd)`
    waits until it is ready and returns a Popen-like ForkedProcess (ForkServerError if it cannot).

    Lifetimes: the server dies with the probe (PR_SET_PDEATHSIG), each child with the server. The
    probe never waits on a child itself (it is the server's child), so the server reports exit
    statuses on request (`status`).
    """

    def __init__(self, env: dict[str, str], startup_deadline_seconds: float = 300.0) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._socket = ours
        self._stderr = open(os.devnull, "wb")  # noqa: SIM115 - held for the server's life
        self.process = subprocess.Popen(
            [sys.executable, "-m", "edgebatch.probing.forkserver", str(theirs.fileno()), str(os.getpid())],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self._stderr,
            env=env,
            start_new_session=True,  # Ctrl-C reaches the probe only, as for workers
        )
        theirs.close()
        self._startup_deadline_seconds = startup_deadline_seconds
        self.resident_pages: int | None = None  # known once the server said it is ready
        self._last_request_id = 0
        self._received = b""  # bytes read past the last reply line

    def wait_ready(self) -> None:
        """Block until the server has imported TensorFlow (it starts in the background); raise if it cannot."""
        if self.resident_pages is not None:
            return
        self._socket.settimeout(self._startup_deadline_seconds)
        try:
            ready = self._receive()
        except (OSError, ForkServerError) as error:
            self.close()
            raise ForkServerError(f"fork server did not start: {error}") from None
        if not ready.get("ready"):
            self.close()
            raise ForkServerError(f"fork server did not start: {ready.get('error', ready)}")
        self.resident_pages = ready["resident_pages"]
        self._socket.settimeout(30.0)

    def spawn(self, env: dict[str, str], stderr_fd: int) -> ForkedProcess:
        """Fork a worker with `env`, its stdin and stdout on new pipes and its stderr on `stderr_fd`."""
        self.wait_ready()
        stdin_read, stdin_write = os.pipe()
        stdout_read, stdout_write = os.pipe()
        try:
            request_id = self._new_request_id()
            message = json.dumps({"op": "fork", "env": env, "id": request_id}).encode() + b"\n"
            socket.send_fds(self._socket, [message], [stdin_read, stdout_write, stderr_fd])
            reply = self._receive(request_id)
        except BaseException:
            # An interrupt too: with its stdin closed, a child forked for this request exits.
            os.close(stdin_write)
            os.close(stdout_read)
            raise
        finally:
            os.close(stdin_read)
            os.close(stdout_write)
        if "pid" not in reply:
            os.close(stdin_write)
            os.close(stdout_read)
            raise ForkServerError(f"fork server could not fork a worker: {reply.get('error', reply)}")
        return ForkedProcess(self, reply["pid"], os.fdopen(stdin_write, "wb"), os.fdopen(stdout_read, "rb"))

    def status(self, pid: int) -> int | None:
        """The child's return code (negative: killed by that signal) or None while it runs."""
        try:
            request_id = self._new_request_id()
            self._socket.sendall(json.dumps({"op": "status", "pid": pid, "id": request_id}).encode() + b"\n")
            return self._receive(request_id).get("returncode")
        except (OSError, ForkServerError):
            # The server is gone, and its children with it (PR_SET_PDEATHSIG).
            return -signal.SIGKILL

    def close(self) -> None:
        kill_and_reap(self.process)  # not Popen.kill and wait: an interrupt can leave Popen's lock held (reaping.py)
        self._socket.close()
        self._stderr.close()

    def _new_request_id(self) -> int:
        self._last_request_id += 1
        return self._last_request_id

    def _receive(self, request_id: int | None = None) -> dict:
        """The server's reply to request `request_id` (None: its ready message).

        Replies to earlier requests are skipped: an interrupt that lands after a request went out and
        before its reply was read leaves that reply in the socket, and without the id every later
        call would read the reply to the call before it (a running worker read as finished).
        """
        while True:
            while b"\n" not in self._received:
                chunk = self._socket.recv(65536)
                if not chunk:
                    raise ForkServerError("fork server closed its socket")
                self._received += chunk
            line, self._received = self._received.split(b"\n", 1)
            try:
                reply = json.loads(line)
            except ValueError as error:
                raise ForkServerError(f"fork server sent a garbled reply: {line[:80]!r}") from error
            if not isinstance(reply, dict):
                raise ForkServerError(f"fork server sent a garbled reply: {line[:80]!r}")
            if reply.get("id") == request_id:
                return reply


class ForkedProcess:
    """The subset of subprocess.Popen that probe workers use, for a child of the fork server."""

    def __init__(self, server: ForkServer, pid: int, stdin, stdout) -> None:
        self._server = server
        self.pid = pid
        self.stdin = stdin
        self.stdout = stdout
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._server.status(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"forked worker {self.pid}", timeout)
            time.sleep(0.02)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


# ---- the server side -------------------------------------------------------------------------


def resident_file_pages() -> array.array:
    """Addresses of this process's readable file-backed pages present in its page tables.

    fork() does not copy the page-table entries of file-backed mappings (the kernel faults them in
    lazily), so a plain forked child's resident set leaves out most of TensorFlow's libraries until
    it touches them again: small_cnn at 128 peaked at 690 MiB in forked children against 1019 MiB
    in fresh processes. So the server records these pages (/proc/self/pagemap, bit 63) and each
    child reads one byte of each before it starts (touch_pages), mapping what a fresh process maps
    after the same import (docs/probe-evidence.md, "Fresh workers from a fork server", has the
    measurement and the command that made it).
    """
    page = os.sysconf("SC_PAGE_SIZE")
    addresses = array.array("Q")
    with open("/proc/self/maps") as maps, open("/proc/self/pagemap", "rb") as pagemap:
        for line in maps.read().splitlines():
            fields = line.split()
            # Anonymous memory, heap and stack are copied by fork; only files are mapped lazily.
            if len(fields) < 6 or not fields[5].startswith("/") or "r" not in fields[1]:
                continue
            start, end = (int(part, 16) for part in fields[0].split("-"))
            pagemap.seek(start // page * 8)
            entries = pagemap.read((end - start) // page * 8)
            for index in range(7, len(entries), 8):
                if entries[index] & _PAGEMAP_PRESENT:
                    addresses.append(start + (index // 8) * page)
    return addresses


def touch_pages(addresses: array.array) -> None:
    """Read one byte of each page: the child then maps what its parent had resident."""
    for address in addresses:
        ctypes.string_at(address, 1)


def _die_with_parent(expected_parent: int) -> None:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != expected_parent:
        os._exit(1)


def _child(connection: socket.socket, fds: list[int], env: dict[str, str], pages: array.array) -> None:
    """In the forked child: become a fresh worker on the given descriptors, then run the worker,
    which ends the process (worker_child.run_and_exit) as a new process's worker ends."""
    try:
        connection.close()
        os.setsid()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", line_buffering=True)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8", line_buffering=True)
        os.environ.update(env)
        touch_pages(pages)
        from edgebatch.probing.worker_child import run_and_exit
    except BaseException as error:  # noqa: BLE001 - the child must never return into the server loop
        try:
            print(f"forked worker failed: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
        finally:
            os._exit(1)
    run_and_exit()


def _serve(connection: socket.socket, pages: array.array) -> None:
    finished: dict[int, int] = {}
    buffer = b""
    while True:
        message, fds, _, _ = socket.recv_fds(connection, 65536, 3)
        if not message:
            return  # the probe closed its end
        buffer += message
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            request = json.loads(line)
            if request["op"] == "fork":
                pid = os.fork()
                if pid == 0:
                    _child(connection, list(fds), {**request["env"], "EDGEBATCH_PROBE_PARENT_PID": str(os.getppid())}, pages)
                for fd in fds:
                    os.close(fd)
                fds = []
                reply = {"pid": pid}
            else:
                pid = request["pid"]
                if pid not in finished:
                    done, status = os.waitpid(pid, os.WNOHANG)
                    if done:
                        finished[pid] = os.waitstatus_to_exitcode(status)
                reply = {"returncode": finished.get(pid)}
            connection.sendall(json.dumps({**reply, "id": request.get("id")}).encode() + b"\n")


def server_main(argv: list[str]) -> int:
    connection = socket.socket(fileno=int(argv[0]))
    try:
        _die_with_parent(int(argv[1]))
        # What a worker imports before it builds a model (worker_child.worker_main), and nothing run.
        import keras  # noqa: F401
        import tensorflow  # noqa: F401

        import edgebatch.probing.trial  # noqa: F401
        import edgebatch.probing.worker  # noqa: F401
        import edgebatch.probing.worker_child  # noqa: F401
        import edgebatch.models.zoo  # noqa: F401

        pages = resident_file_pages()
        if not pages:
            raise ForkServerError("no resident file-backed pages read from /proc/self/pagemap")
    except Exception as error:  # noqa: BLE001 - told to the probe, which then spawns workers directly
        connection.sendall(json.dumps({"ready": False, "error": f"{type(error).__name__}: {error}"}).encode() + b"\n")
        return 1
    connection.sendall(json.dumps({"ready": True, "resident_pages": len(pages)}).encode() + b"\n")
    _serve(connection, pages)
    return 0


if __name__ == "__main__":
    sys.exit(server_main(sys.argv[1:]))
