"""The governor on a real run: another process takes memory in the same cgroup, then gives it back.

Needs root and a writable cgroup memory hierarchy (v1 here; v2 where the memory controller is
delegated); skips with the reason elsewhere.
"""

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

HERE = Path(__file__).parent
LIMIT_BYTES = 3 * 1024**3

pytestmark = pytest.mark.slow


def make_cgroup():
    name = f"edgebatch-test-{uuid.uuid4().hex[:8]}"
    v1 = Path("/sys/fs/cgroup/memory")
    v2 = Path("/sys/fs/cgroup")
    try:
        if (v1 / "memory.limit_in_bytes").exists():
            group = v1 / name
            group.mkdir()
            (group / "memory.limit_in_bytes").write_text(str(LIMIT_BYTES))
            return group
        if (v2 / "cgroup.controllers").exists() and "memory" in (v2 / "cgroup.subtree_control").read_text():
            group = v2 / name
            group.mkdir()
            (group / "memory.max").write_text(str(LIMIT_BYTES))
            return group
    except OSError as error:
        pytest.skip(f"cannot create a memory cgroup here ({error}); needs root and a writable cgroup fs")
    pytest.skip("no cgroup memory controller that this process may delegate")


@pytest.fixture
def cgroup():
    group = make_cgroup()
    yield group
    try:
        group.rmdir()
    except OSError:
        pass


def test_governor_shrinks_while_another_process_holds_memory_and_grows_back_after(cgroup):
    procs = cgroup / "cgroup.procs"

    def join_cgroup():
        procs.write_text(str(os.getpid()))

    done = subprocess.run(
        [sys.executable, str(HERE / "support" / "pressure_run.py"), str(LIMIT_BYTES)],
        capture_output=True, text=True, timeout=900, preexec_fn=join_cgroup,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    updates = [r for r in records if "update" in r and "micro_batches" in r]
    stopped = next(r["update"] for r in records if r.get("event") == "hog_stopped")
    for r in updates:
        print(r)
    before = [r for r in updates if r["update"] < 8]
    assert all(max(r["micro_batches"]) == 64 for r in before), "no pressure yet: full micro-batches"
    during = [r for r in updates if 8 < r["update"] <= stopped]
    assert any(r["pressure"] and r["pressure"] > 0.9 for r in during), "the hog should push pressure over 0.9"
    # predicted: the memory model's footprint plus what the hog uses, against the limit (policy.py)
    shrinks = [r for r in during if r["reason"].startswith("predicted") and r["next_micro_batch"] < 64]
    assert shrinks, "the governor should shrink under pressure"
    smallest = min(max(r["micro_batches"]) for r in during)
    assert smallest <= 32
    after = [r for r in updates if r["update"] > stopped]
    assert any(r["pressure"] is not None and r["pressure"] < 0.6 for r in after)
    assert max(after[-1]["micro_batches"]) == 64, "after the hog leaves, micro-batches grow back"
    # Every update still used exactly the effective batch (accumulation held it).
    assert all(sum(r["micro_batches"]) == 64 for r in updates)
