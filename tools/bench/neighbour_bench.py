"""Section 5: a neighbour takes memory mid-run and later gives it back (issue 10's scenario (b)).

The limit is a real one: a cgroup v1 memory cgroup made for each run (`memory.limit_in_bytes`),
holding the training process (and, for the governed run, its supervisor) and a second process,
the neighbour. Over the limit, the kernel's OOM killer SIGKILLs a process in the cgroup; the
training raises its oom_score_adj to 500, so that is the training. Nothing else is simulated.

Each pair runs side by side, in two cgroups: `static` (fit at a fixed micro-batch, nothing
restarts it) and `governed` (fit with a memory-model governor reading the room every update,
checkpointing every 2 updates, under `edgebatch supervise`, so a kill is survived by a restart
from the checkpoint). After PRE_UPDATES timed updates the neighbour takes what leaves the training
room for about `ROOM_FRACTION` of the ceiling micro-batch (the cgroup's peak so far, less the
per-sample bytes of the rest by the training's own warm-up memory model), holds it HOLD seconds and exits; the run goes on AFTER
seconds more. Reported per run: OOMs (kills + caught OOMs) during the pressure event, samples/s
before, during and after, time from the release until a window of updates runs at >= 0.9 x the
pre-pressure samples/s, and the micro-batch of every update.

Why the training runs with oneDNN off (TF_ENABLE_ONEDNN_OPTS=0) and MALLOC_MMAP_THRESHOLD_=65536:
with oneDNN's CPU allocator, a process keeps the peak of its largest step (measured: dense_wide
ran 512 then 64 and stayed at 1753 MiB resident), so no governor decision gives memory back and a
neighbour can only take what was never used. With the default allocator and large tensors
always mmapped, resident memory drops back after each step (696 MiB; peaks 1720/1208/952/824 MiB
at 512/256/128/64): the setting in which following a neighbour is possible at all.

Needs root and a writable cgroup v1 memory hierarchy; elsewhere the section reports why it did not run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from harness import MIB, ROOT, Deadline, Mode, child_env, log, ratio_stat, stat_of

CHILD = ROOT / "tools" / "bench" / "neighbour_child.py"
CGROUP_ROOT = Path("/sys/fs/cgroup/memory")
CEILING = 256
LIMIT_BYTES = 2048 * MIB
# The room the neighbour leaves the training: its charge at about this share of the ceiling
# (2.03 MiB a sample): 256 misses by ~180 MiB, 192 by ~50 MiB; 128 fits with ~80 MiB to spare.
ROOM_FRACTION = 0.65
NEIGHBOUR_RATE_BYTES_PER_SECOND = 200 * MIB
# The training's data is sized for this many updates; the bench stops it long before.
MAX_UPDATES = 400
PRE_UPDATES = 6  # timed updates (after the first, which traces) before the neighbour comes
RECOVERY_FRACTION = 0.9
RECOVERY_WINDOW = 3  # updates whose pace must reach RECOVERY_FRACTION x the pre-pressure pace
# The hold outlasts a supervised restart (~30 s here) so that the governed run also trains beside
# the neighbour; the after phase leaves room for the governor's 20-update cooldown.
QUICK = {"hold_seconds": 40.0, "after_seconds": 60.0, "repeats": 1}
FULL = {"hold_seconds": 50.0, "after_seconds": 75.0, "repeats": 3}
# One pair here, side by side on the shared 2 cores, takes this on top of the hold and the after
# phase (two TensorFlow imports and warm-ups, the pre-pressure updates, a restart of the governed
# child, the stop): measured 106 s in the quick validation run.
SETUP_SECONDS = 110.0
ENV = {"TF_ENABLE_ONEDNN_OPTS": "0", "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_ARENA_MAX": "2"}


class CgroupUnavailable(RuntimeError):
    pass


def make_cgroup(limit_bytes: int) -> Path:
    """A fresh memory cgroup with `limit_bytes`; CgroupUnavailable (one line) where none can be made."""
    if not (CGROUP_ROOT / "memory.limit_in_bytes").exists():
        raise CgroupUnavailable(f"no cgroup v1 memory hierarchy at {CGROUP_ROOT}")
    group = CGROUP_ROOT / f"edgebatch-bench-{uuid.uuid4().hex[:8]}"
    try:
        group.mkdir()
        (group / "memory.limit_in_bytes").write_text(str(limit_bytes))
    except OSError as exc:
        raise CgroupUnavailable(f"cannot make a memory cgroup under {CGROUP_ROOT}: {exc}") from exc
    return group


def remove_cgroup(group: Path) -> None:
    for _ in range(50):  # the last process may still be exiting
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)
    log(f"neighbour: could not remove {group}")


def _read(path: Path) -> list[dict]:
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line being written
    return records


def _pids(group: Path) -> list[int]:
    try:
        return [int(p) for p in (group / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def run_one(kind: str, workdir: Path, hold_seconds: float, after_seconds: float, timeout_seconds: float) -> dict:
    """One training run of `kind` in its own cgroup, with the neighbour; the run's facts."""
    group = make_cgroup(LIMIT_BYTES)
    progress, stop = workdir / f"{kind}.jsonl", workdir / f"{kind}.stop"
    checkpoint_dir = workdir / f"{kind}-checkpoints"
    env = {**child_env(), **ENV}
    procs_file = group / "cgroup.procs"

    def join() -> None:
        procs_file.write_text(str(os.getpid()))

    train = [sys.executable, str(CHILD), "train", kind, str(progress), str(CEILING), str(MAX_UPDATES), str(stop)]
    if kind == "governed":
        train = [sys.executable, "-m", "edgebatch", "supervise", "--checkpoint-dir", str(checkpoint_dir),
                 "--max-restarts", "3", "--", *train, str(checkpoint_dir)]
    started = time.time()
    events: dict = {"limit_bytes": LIMIT_BYTES}
    neighbour = None
    # stderr to a file: a pipe nobody reads while the run goes on could fill and stall the child.
    stderr_file = (workdir / f"{kind}.stderr").open("w")
    training = subprocess.Popen(train, cwd=ROOT, env=env, preexec_fn=join, stdout=subprocess.DEVNULL,
                                stderr=stderr_file)
    try:
        # 1. Until PRE_UPDATES timed updates ran (or the run ended or overran).
        while training.poll() is None and time.time() - started < timeout_seconds:
            updates = [r for r in _read(progress) if r["event"] == "update"]
            if len(updates) > PRE_UPDATES:
                break
            time.sleep(0.2)
        records = _read(progress)
        memory = next((r for r in records if r["event"] == "memory_model"), None)
        starts = [r for r in records if r["event"] == "start"]
        if training.poll() is None and memory is not None and starts:
            # 2. The neighbour: it leaves the cgroup's peak so far (the training at the ceiling, plus the
            # supervisor) less (1 - ROOM_FRACTION) x the ceiling's per-sample bytes by the training's own
            # warm-up model. Sized on the cgroup's charge, not on RSS: the RSS of a TensorFlow process
            # includes ~290 MiB of shared library pages that are charged elsewhere (measured: VmHWM
            # 1269 MiB at 256, the cgroup's peak 982 MiB).
            peak = int((group / "memory.max_usage_in_bytes").read_text())
            room = peak - (1.0 - ROOM_FRACTION) * CEILING * memory["per_sample_bytes"]
            size = int(LIMIT_BYTES - room)
            events.update({"neighbour_bytes": size, "room_left_bytes": int(room), "cgroup_peak_before_bytes": peak,
                           "neighbour_start_t": time.time()})
            neighbour = subprocess.Popen([sys.executable, str(CHILD), "neighbour", str(size),
                                          str(NEIGHBOUR_RATE_BYTES_PER_SECOND)], cwd=ROOT, env=child_env(),
                                         preexec_fn=join, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            filled = neighbour.stdout.readline().strip() == "filled"
            events["neighbour_filled_t"] = time.time() if filled else None
            # 3. Hold, then release (the neighbour exits).
            until = time.time() + hold_seconds
            while time.time() < until and time.time() - started < timeout_seconds:
                time.sleep(0.2)
            neighbour.stdin.close()
            neighbour.wait(timeout=30)
            events["neighbour_released_t"] = time.time()
            # 4. The run goes on AFTER seconds (a killed static run has nothing to go on with).
            until = time.time() + after_seconds
            while training.poll() is None and time.time() < until and time.time() - started < timeout_seconds:
                time.sleep(0.2)
        stop.touch()
        try:
            training.wait(timeout=max(60.0, timeout_seconds - (time.time() - started)))
        except subprocess.TimeoutExpired:
            training.kill()
            training.wait()
            events["timed_out"] = True
    finally:
        for process in (neighbour, training):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
        for pid in _pids(group):  # e.g. a supervised child whose supervisor was killed above
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        oom_kills = _oom_kills(group)
        remove_cgroup(group)
        stderr_file.close()
    stderr = (workdir / f"{kind}.stderr").read_text(errors="replace")
    events["returncode"] = training.returncode
    events["kernel_oom_kills"] = oom_kills
    events["stderr_tail"] = "\n".join(line for line in (stderr or "").splitlines() if line.strip())[-600:]
    return summarise(kind, _read(progress), events, started)


def _oom_kills(group: Path) -> int | None:
    try:
        for line in (group / "memory.oom_control").read_text().splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def _pace(updates: list[dict], since: float, until: float) -> float | None:
    """Samples/s of the updates that ended in (since, until], timed from `since`."""
    inside = [u for u in updates if since < u["t"] <= until]
    if not inside or until <= since:
        return None
    return sum(u["examples"] for u in inside) / (until - since)


def summarise(kind: str, records: list[dict], events: dict, started: float) -> dict:
    """The run's figures from its progress lines and the bench's timestamps (wall clock, seconds)."""
    ran = [r for r in records if r["event"] == "update"]
    # An update a killed child ran after its last checkpoint was lost and is run again by the next
    # child: only the run that stuck (the last with that number) counts towards samples/s.
    last_run = {r["update"]: i for i, r in enumerate(ran)}
    updates = [r for i, r in enumerate(ran) if last_run[r["update"]] == i]
    starts = [r for r in records if r["event"] == "start"]
    first = updates[0]["t"] if updates else None  # the first update traces: time from its end
    arrive, filled = events.get("neighbour_start_t"), events.get("neighbour_filled_t")
    release = events.get("neighbour_released_t")
    pre = None
    if first is not None and arrive is not None:
        pre = _pace(updates, first, arrive)
    during = _pace(updates, arrive, release) if arrive and release else None
    after_end = updates[-1]["t"] if updates else None
    after = _pace(updates, release, after_end) if release and after_end and after_end > release else None
    recovered_seconds = None
    if pre and release:
        later = [u for u in updates if u["t"] > release]
        # The first window of RECOVERY_WINDOW consecutive updates after the release, timed from the
        # update before it, that runs at >= RECOVERY_FRACTION x the pre-pressure pace.
        ordered = [u for u in updates if u["t"] <= release][-1:] + later
        for end in range(RECOVERY_WINDOW, len(ordered)):
            window = ordered[end - RECOVERY_WINDOW + 1:end + 1]
            pace = sum(u["examples"] for u in window) / (window[-1]["t"] - ordered[end - RECOVERY_WINDOW]["t"])
            if pace >= RECOVERY_FRACTION * pre:
                recovered_seconds = max(0.0, window[-1]["t"] - release)
                break
    back_at_ceiling = None
    if release:
        for u in updates:
            if u["t"] > release and u["micro_batch"] == CEILING:
                back_at_ceiling = u["t"] - release
                break
    pressure_window = [u for u in updates if arrive and u["t"] > arrive and (release is None or u["t"] <= release + 5)]
    kills = max(0, len(starts) - 1)
    completed = bool(records) and records[-1]["event"] == "end" and events.get("returncode") == 0
    return {
        "kind": kind,
        "completed": completed,
        "neighbour_filled": filled is not None,  # False: no pressure event happened (the neighbour failed)
        "returncode": events.get("returncode"),
        "restarts": kills,
        "kernel_oom_kills": events.get("kernel_oom_kills"),
        # Kills the supervisor restarted, plus OOMs fit caught, from the neighbour's arrival to 5 s after it left.
        "ooms_in_pressure_event": (kills if kind == "governed" else int((events.get("returncode") or 0) < 0 and arrive is not None))
        + sum(u["oom_events"] for u in pressure_window),
        "updates": len(updates),
        "updates_lost_to_kills": len(ran) - len(updates),
        "examples": sum(u["examples"] for u in updates),
        "pre_samples_per_second": pre,
        "during_samples_per_second": during if during is not None else (0.0 if arrive and release else None),
        "after_samples_per_second": after,
        "recovered_seconds": recovered_seconds,
        "back_at_ceiling_seconds": back_at_ceiling,
        "smallest_micro_batch_in_pressure": min((u["micro_batch"] for u in pressure_window), default=None),
        "memory_model": next(({k: r[k] for k in ("fixed_bytes", "per_sample_bytes", "peaks")}
                              for r in records if r["event"] == "memory_model"), None),
        "events": {k: (round(v - started, 2) if k.endswith("_t") and v else v) for k, v in events.items()},
        # Every update as it ran, lost ones included (the plot shows the micro-batch over time).
        "timeline": [{"update": u["update"], "seconds": round(u["t"] - started, 2), "micro_batch": u["micro_batch"],
                      "examples": u["examples"], "oom_events": u["oom_events"], "restart": u["restart"],
                      "pressure": u["pressure"], "reason": u["reason"]} for u in ran],
    }


def run(mode: Mode, deadline: Deadline, end: float) -> dict:
    settings = QUICK if mode.quick else FULL
    base = {"model": "dense_wide (tests/models)", "ceiling_batch": CEILING, "limit_bytes": LIMIT_BYTES,
            "room_fraction": ROOM_FRACTION, "neighbour_rate_bytes_per_second": NEIGHBOUR_RATE_BYTES_PER_SECOND,
            "pre_updates": PRE_UPDATES, "recovery_fraction": RECOVERY_FRACTION, "recovery_window": RECOVERY_WINDOW,
            "training_env": ENV, **settings}
    try:
        remove_cgroup(make_cgroup(LIMIT_BYTES))
    except CgroupUnavailable as exc:
        return {**base, "unavailable": str(exc), "runs": {"static": [], "governed": []}, "skipped": []}
    pair_seconds = SETUP_SECONDS + settings["hold_seconds"] + settings["after_seconds"]
    runs: dict[str, list[dict]] = {"static": [], "governed": []}
    skipped = []
    import tempfile

    with ThreadPoolExecutor(max_workers=2) as pool:
        for repeat in range(settings["repeats"]):
            if deadline.until(end) < pair_seconds:
                skipped.append(f"repeat {repeat + 1}: time budget ({deadline.until(end):.0f} s left of {pair_seconds:.0f})")
                continue
            with tempfile.TemporaryDirectory(prefix="edgebatch-neighbour-") as workdir:
                timeout = pair_seconds + 120.0
                futures = {kind: pool.submit(run_one, kind, Path(workdir), settings["hold_seconds"],
                                             settings["after_seconds"], timeout) for kind in runs}
                for kind, future in futures.items():
                    result = future.result()
                    runs[kind].append(result)
                    log(f"neighbour {kind}: completed {result['completed']}, {result['updates']} updates, OOMs in the "
                        f"pressure event {result['ooms_in_pressure_event']}, samples/s pre {_f(result['pre_samples_per_second'])} "
                        f"during {_f(result['during_samples_per_second'])} after {_f(result['after_samples_per_second'])}, "
                        f"recovered in {_f(result['recovered_seconds'])} s")
    summary = {kind: {
        "runs": len(results),
        "completed_runs": sum(r["completed"] for r in results),
        "pressure_runs": sum(r["neighbour_filled"] for r in results),
        "ooms_in_pressure_event": stat_of([r["ooms_in_pressure_event"] for r in results]),
        "pre_samples_per_second": stat_of([r["pre_samples_per_second"] for r in results]),
        "during_samples_per_second": stat_of([r["during_samples_per_second"] for r in results]),
        "after_samples_per_second": stat_of([r["after_samples_per_second"] for r in results]),
        "recovered_seconds": stat_of([r["recovered_seconds"] for r in results]),
        "recovered_runs": sum(r["recovered_seconds"] is not None for r in results),
        "back_at_ceiling_seconds": stat_of([r["back_at_ceiling_seconds"] for r in results]),
        "smallest_micro_batch_in_pressure": stat_of([r["smallest_micro_batch_in_pressure"] for r in results]),
        "examples": stat_of([r["examples"] for r in results]),
    } for kind, results in runs.items()}
    governed, static = runs["governed"], runs["static"]
    ratios = {
        "pre_samples_per_second": ratio_stat([r["pre_samples_per_second"] for r in governed],
                                             [r["pre_samples_per_second"] for r in static]),
        "examples": ratio_stat([r["examples"] for r in governed], [r["examples"] for r in static]),
    }
    return {**base, "summary": summary, "governed_vs_static": ratios, "runs": runs, "skipped": skipped}


def _f(value) -> str:
    return "-" if value is None else f"{value:.1f}"
