"""The one benchmark harness: repeats, medians with min and max, ratios, deadlines, children, the machine.

Every figure in BENCHMARKS.md is a `Stat` (median, min, max over n repeats). A comparison is the
`Stat` of per-repeat ratios measured in the same run (`ratio_stat`), never a ratio of two medians
taken at different times: the build machines are shared and noisy (docs/tensorflow-memory.md), so only numbers taken
side by side compare. Benchmarks report; nothing here asserts a timing.

Imports no TensorFlow.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
RESULTS_DIR = ROOT / "tools" / "bench" / "results"
MIB = 1024**2
# Children (truth runs, pressure runs) answer with one line carrying this prefix; TensorFlow prints too.
CHILD_PREFIX = "@@bench "


@dataclass(frozen=True)
class Mode:
    """How much a run may do. `budget_seconds` bounds the whole run (quick: the issue's 5 minutes)."""

    name: str  # "quick" | "full"
    repeats: int
    budget_seconds: float

    @property
    def quick(self) -> bool:
        return self.name == "quick"


# 270 s of planned work leaves room for the one step that may overrun its share (a pressure pair).
QUICK = Mode("quick", repeats=3, budget_seconds=270.0)
FULL = Mode("full", repeats=5, budget_seconds=3300.0)


@dataclass(frozen=True)
class Stat:
    median: float
    min: float
    max: float
    n: int

    def to_dict(self) -> dict:
        return asdict(self)


def stat_of(values: Sequence[float | None]) -> Stat | None:
    """Median, min and max of the values that are not None; None when there are none."""
    present = [float(v) for v in values if v is not None]
    if not present:
        return None
    return Stat(statistics.median(present), min(present), max(present), len(present))


def ratio_stat(numerators: Sequence[float | None], denominators: Sequence[float | None]) -> Stat | None:
    """The Stat of per-repeat ratios numerator[i] / denominator[i] (pairs with a gap are left out)."""
    return stat_of([n / d for n, d in zip(numerators, denominators) if n is not None and d])


def timed(function: Callable, *args, **kwargs) -> tuple[object, float]:
    """(function's result, wall seconds)."""
    started = time.perf_counter()
    result = function(*args, **kwargs)
    return result, time.perf_counter() - started


class Deadline:
    """Wall-clock allowance shared by the sections of one run; work that would overrun is skipped
    and reported as skipped, so `--quick` stays under its budget however loaded the machine is."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.started = clock()
        self.seconds = seconds

    def elapsed(self) -> float:
        return self._clock() - self.started

    def remaining(self) -> float:
        return self.seconds - self.elapsed()

    def allows(self, cost_seconds: float) -> bool:
        return self.remaining() >= cost_seconds

    def until(self, fraction: float) -> float:
        """Seconds left until `fraction` of the whole allowance has passed (may be negative)."""
        return self.seconds * fraction - self.elapsed()


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@contextmanager
def capped_malloc_arenas():
    """MALLOC_ARENA_MAX=2 for the processes started inside (workers, truth runs, pressure runs).

    Under an address-space cap, glibc's per-thread malloc arenas (64 MiB of address space each,
    created as threads happen to contend) moved the boundary by ~15% between two processes on a busy
    machine (tests/test_probe_real.py found the same); two arenas keep capped processes comparable.
    """
    old = os.environ.get("MALLOC_ARENA_MAX")
    os.environ["MALLOC_ARENA_MAX"] = "2"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("MALLOC_ARENA_MAX", None)
        else:
            os.environ["MALLOC_ARENA_MAX"] = old


def child_env() -> dict:
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["CUDA_VISIBLE_DEVICES"] = "-1"  # CPU benchmarks: never reserve a GPU that happens to be there
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


@dataclass(frozen=True)
class ChildResult:
    reply: dict | None  # the last JSON line (prefixed, or a bare {...} line), None when there was none
    returncode: int | None  # None when it ran past its timeout
    seconds: float
    stderr_tail: str


def run_child(args: Sequence[str], timeout_seconds: float) -> ChildResult:
    """Run a Python child to completion; its answer is its last JSON line on stdout."""
    started = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, *args], capture_output=True, text=True, timeout=timeout_seconds, env=child_env(), cwd=ROOT
        )
    except subprocess.TimeoutExpired as expired:
        tail = (expired.stderr or b"")[-400:]
        return ChildResult(None, None, time.perf_counter() - started, tail.decode(errors="replace") if isinstance(tail, bytes) else tail)
    reply = None
    for line in done.stdout.splitlines():
        text = line[len(CHILD_PREFIX):] if line.startswith(CHILD_PREFIX) else line
        if text.startswith("{"):
            try:
                reply = json.loads(text)
            except json.JSONDecodeError:
                continue
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    return ChildResult(reply, done.returncode, time.perf_counter() - started, "\n".join(lines[-3:])[-400:])


def status_bytes(field: str) -> int:
    """A size from this process's /proc/self/status (VmHWM, VmSize, ...), in bytes."""
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def send_reply(reply: dict) -> None:
    """A child's answer to run_child."""
    sys.stdout.write(CHILD_PREFIX + json.dumps(reply) + "\n")
    sys.stdout.flush()


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _git_commit() -> str | None:
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def environment() -> dict:
    """The machine, versions and date a run happened on (no TensorFlow import)."""
    from edgebatch.sensors import cpu_model_name, read_host_memory

    try:
        memory_total = read_host_memory().total_bytes
    except Exception:  # noqa: BLE001 - a missing /proc field should not stop a benchmark
        memory_total = None
    return {
        "date_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "cpu": cpu_model_name(),
        "cores": os.cpu_count(),
        "memory_total_bytes": memory_total,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": {name: _version(name) for name in ("edgebatch", "tensorflow", "keras", "numpy", "matplotlib")},
        "git_commit": _git_commit(),
        "load_average_at_start": load_average(),
    }


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(path.suffix + ".tmp")
    temporary.write_text(json.dumps(data, indent=2, default=_jsonable) + "\n")
    temporary.replace(path)


def _jsonable(value):
    if isinstance(value, Stat):
        return value.to_dict()
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if hasattr(value, "__dataclass_fields__"):
        return asdict(value)
    raise TypeError(f"not JSON-able: {value!r}")


def write_section(path: Path, section: str, start_marker: str, end_marker: str) -> None:
    """Replace a bench's own section of `path` (from `start_marker` to `end_marker`, both kept in
    `section`), or append it at the end. tools/bench/report.py keeps such sections when it rewrites
    the file."""
    text = path.read_text()
    if start_marker in text and end_marker in text:
        head, rest = text.split(start_marker, 1)
        tail = rest.split(end_marker, 1)[1]
        text = head + section + tail
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.write_text(text)


def publish_section(section: str, benchmarks_md: Path | None, start_marker: str, end_marker: str) -> None:
    """Print a bench's BENCHMARKS.md section and, given the file, put it there (write_section)."""
    print(section)
    if benchmarks_md is not None:
        write_section(benchmarks_md, section, start_marker, end_marker)


def add_output_options(parser) -> None:
    """The options every section's bench takes: --benchmarks-md and --from-json."""
    parser.add_argument("--benchmarks-md", type=Path, help="write the section into this BENCHMARKS.md")
    parser.add_argument("--from-json", type=Path, help="re-render a saved result instead of running")


def measured_or_loaded(from_json: Path | None, measure: Callable[[], dict], results_name: str) -> dict:
    """The result saved at `from_json`, or a new one from `measure`, written to results/`results_name`."""
    if from_json is not None:
        return json.loads(from_json.read_text())
    data = measure()
    write_json(RESULTS_DIR / results_name, data)
    return data


def spin_load(cpu: int, stop) -> None:
    """A competing load for benches: a pure-Python busy loop pinned to `cpu` until `stop` (an Event) is set."""
    os.sched_setaffinity(0, {cpu})
    counter = 0
    while not stop.is_set():
        for _ in range(100_000):
            counter += 1


def wait_for_load(below: float, limit_seconds: float) -> dict:
    """Wait until the 1-minute load average is below `below`, at most `limit_seconds`; say what happened."""
    started = time.monotonic()
    while os.getloadavg()[0] >= below and time.monotonic() - started < limit_seconds:
        time.sleep(5)
    reached = os.getloadavg()[0] < below
    log(f"load average {load_average()} after {time.monotonic() - started:.0f} s of waiting")
    return {"below": below, "seconds": time.monotonic() - started, "reached": reached}
