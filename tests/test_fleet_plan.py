"""edgebatch/fleet/plan.py and `edgebatch fleet plan`: pure, table-driven, fast (no TensorFlow)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math

import pytest
from click.testing import CliRunner
from profile_factory import make_profile, make_trial

from edgebatch.cli import main
from edgebatch.errors import ProfileError, UsageError
from edgebatch.fleet.plan import (
    PlanDevice,
    ThroughputPoint,
    device_from_profile,
    plan_fleet,
    throughput_points,
)
from edgebatch.profiles import save_profile


def device(device_id: str, safe_batch: int, curve: dict[int, float]) -> PlanDevice:
    """A device from {batch: samples/s}."""
    return PlanDevice(device_id, device_id, safe_batch, tuple(ThroughputPoint(b, r) for b, r in curve.items()))


# Step time b / samples_per_second(b) grows with b on every segment of these curves (the rate is
# a + c b with a > 0), so the planner's monotone envelope changes nothing and a brute force that
# knows nothing of it must agree with the planner.
FAST = {1: 10.0, 4: 30.0, 16: 60.0, 32: 70.0}
MEDIUM = {1: 6.0, 8: 25.0, 16: 32.0}
SLOW = {1: 2.0, 4: 6.0, 8: 8.0}
VERY_SLOW = {1: 0.01, 8: 0.05}

MIXED_SETS = {
    "fast+slow": [device("fast", 32, FAST), device("slow", 8, SLOW)],
    "fast+medium+slow": [device("fast", 32, FAST), device("medium", 16, MEDIUM), device("slow", 8, SLOW)],
    "small ceiling": [device("fast", 8, FAST), device("medium", 16, MEDIUM)],
}


def interpolated(curve: dict[int, float], batch: int) -> float:
    batches = sorted(curve)
    if batch <= batches[0]:
        return curve[batches[0]]
    if batch >= batches[-1]:
        return curve[batches[-1]]
    for low, high in itertools.pairwise(batches):
        if low <= batch <= high:
            return curve[low] + (curve[high] - curve[low]) * (batch - low) / (high - low)
    raise AssertionError


def brute_share_seconds(curve: dict[int, float], safe_batch: int, share: int) -> float:
    """Fastest time for `share` over every allowed micro-batch, straight from the definition."""
    if share == 0:
        return 0.0
    ceiling = min(safe_batch, max(curve))
    best = math.inf
    for micro in range(1, min(ceiling, share) + 1):
        accumulation = math.ceil(share / micro)
        last = share - (accumulation - 1) * micro
        seconds = (accumulation - 1) * micro / interpolated(curve, micro) + last / interpolated(curve, last)
        best = min(best, seconds)
    return best


def brute_optimum(curves_and_safe: list[tuple[dict, int]], total: int, overhead_seconds: float = 0.0) -> float:
    """Smallest update time over every integer split of `total` (and every micro-batch)."""
    tables = [[brute_share_seconds(curve, safe, s) for s in range(total + 1)] for curve, safe in curves_and_safe]
    best = math.inf
    for split in itertools.product(range(total + 1), repeat=len(tables) - 1):
        last = total - sum(split)
        if last < 0:
            continue
        shares = (*split, last)
        used = [tables[i][s] for i, s in enumerate(shares) if s > 0]
        best = min(best, max(used) + (overhead_seconds if len(used) > 1 else 0.0))
    return best


def check_plan_invariants(result, devices, total):
    by_id = {d.device_id: d for d in devices}
    assert sum(a.share for a in result.plan.assignments) == total
    for a in result.plan.assignments:
        assert 1 <= a.last_micro_batch <= a.micro_batch <= by_id[a.device_id].max_micro_batch
        assert a.micro_batch <= by_id[a.device_id].safe_batch
        assert (a.accumulation - 1) * a.micro_batch + a.last_micro_batch == a.share
        assert a.predicted_seconds == pytest.approx(by_id[a.device_id].share_seconds(a.share, a.micro_batch))
    assert {a.device_id for a in result.plan.assignments} | {left.device_id for left in result.left_out} == set(by_id)
    assert sum(a.share for a in result.equal_split.assignments) == total
    assert result.plan.predicted_update_seconds <= result.equal_split.predicted_update_seconds * (1 + 1e-9)


# --- the curve -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("batch", "expected"),
    [(1, 10.0), (4, 30.0), (10, 45.0), (16, 60.0), (24, 65.0), (32, 70.0), (100, 70.0)],
    ids=["first point", "a point", "between 4 and 16", "a point", "between 16 and 32", "last point", "clamped above"],
)
def test_samples_per_second_is_piecewise_linear_and_clamped(batch, expected):
    assert device("d", 64, FAST).samples_per_second(batch) == pytest.approx(expected)


def test_samples_per_second_below_the_first_point_is_clamped():
    d = device("d", 64, {8: 80.0, 16: 120.0})
    assert d.samples_per_second(1) == pytest.approx(80.0)
    assert d.step_seconds(1) == pytest.approx(1 / 80.0)


@pytest.mark.parametrize(
    ("safe_batch", "curve", "expected"),
    [(64, FAST, 32), (16, FAST, 16), (5, {8: 1.0}, 5)],
    ids=["largest measured batch", "safe batch", "safe batch below every measured batch"],
)
def test_max_micro_batch_is_the_smaller_of_safe_batch_and_largest_measured(safe_batch, curve, expected):
    assert device("d", safe_batch, curve).max_micro_batch == expected


def test_step_time_never_falls_as_the_batch_grows():
    # 16 samples at 400/s take 0.04 s, 8 samples at 100/s 0.08 s: noise or not, 8 is taken as 0.04 s.
    d = device("d", 16, {8: 100.0, 16: 400.0})
    steps = [d.step_seconds(b) for b in range(17)]
    assert steps == sorted(steps)
    assert d.step_seconds(8) == pytest.approx(16 / 400.0)


def trial(batch, samples_per_second, *, ok=True, measured=True, steady=None, error=None):
    base = make_trial(batch, 1000, ok=ok, error=error, step_seconds=batch / samples_per_second, measured=measured)
    return dataclasses.replace(base, steady=steady)


@pytest.mark.parametrize(
    ("trials", "expected"),
    [
        ([trial(8, 80), trial(16, 100)], [(8, 80, True), (16, 100, True)]),
        ([trial(8, 80), trial(16, 100, ok=False, error="over_budget")], [(8, 80, True)]),
        ([trial(8, 80), trial(16, 100, measured=False)], [(8, 80, True)]),
        ([trial(8, 80, steady=False), trial(8, 90, steady=True)], [(8, 90, True)]),
        ([trial(8, 80, steady=True), trial(16, 50, steady=False), trial(32, 120, steady=True)],
         [(8, 80, True), (32, 120, True)]),
        ([trial(8, 80, steady=True), trial(64, 150, steady=False)], [(8, 80, True), (64, 150, False)]),
        ([trial(8, 80), trial(8, 100), trial(8, 120)], [(8, 100, True)]),
    ],
    ids=["steady unknown counts", "failed trial dropped", "unmeasured dropped", "steady preferred at a batch",
         "unsteady between steady ones dropped", "unsteady beyond steady ones kept", "median of repeats"],
)
def test_throughput_points(trials, expected):
    points = throughput_points(trials)
    assert [(p.batch, p.samples_per_second, p.steady) for p in points] == [
        (b, pytest.approx(r), s) for b, r, s in expected
    ]


def test_device_from_profile_uses_successful_measured_trials():
    d = device_from_profile(make_profile(), device_id="x")
    assert d.safe_batch == 64
    assert [p.batch for p in d.points] == [8, 16, 32, 64]  # 128 was over budget, 256 never ran
    assert d.samples_per_second(32) == pytest.approx(32 / 0.32)


def test_a_plan_with_unsteady_figures_says_so():
    profile = make_profile(trials=(trial(8, 80, steady=True), trial(64, 150, steady=False)))
    result = plan_fleet([device_from_profile(profile, device_id="x")], 100)
    assert any("x: samples/s at batch 64 timed the warm-up step" in note for note in result.notes)


@pytest.mark.parametrize(
    ("make", "error"),
    [
        (lambda: device("d", 16, {}), ProfileError),
        (lambda: device("d", 0, FAST), ProfileError),
        (lambda: device_from_profile(make_profile(trials=(trial(8, 80, ok=False, error="oom"),)), device_id="d"),
         ProfileError),
        (lambda: device("d", 16, {8: 0.0}), ValueError),
    ],
    ids=["no points", "safe batch 0", "no successful trial", "zero samples/s"],
)
def test_unusable_devices_are_refused(make, error):
    with pytest.raises(error):
        make()


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: plan_fleet([device("a", 8, FAST)], 0), "effective batch"),
        (lambda: plan_fleet([], 10), "no devices"),
        (lambda: plan_fleet([device("a", 8, FAST), device("a", 8, SLOW)], 10), "distinct"),
        (lambda: plan_fleet([device("a", 8, FAST)], 10, update_overhead_seconds=-1.0), "overhead"),
    ],
    ids=["N < 1", "no devices", "duplicate ids", "negative overhead"],
)
def test_usage_errors(call, message):
    with pytest.raises(UsageError, match=message):
        call()


# --- the plan --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(MIXED_SETS))
@pytest.mark.parametrize("total", [1, 2, 7, 40, 100, 257, 1000])
def test_shares_sum_to_n_within_safe_batches_and_never_above_equal_split(name, total):
    devices = MIXED_SETS[name]
    check_plan_invariants(plan_fleet(devices, total), devices, total)


@pytest.mark.parametrize("name", sorted(MIXED_SETS))
def test_plan_is_strictly_faster_than_equal_split_on_a_mixed_set(name):
    result = plan_fleet(MIXED_SETS[name], 256)
    assert result.plan.predicted_update_seconds < result.equal_split.predicted_update_seconds
    assert result.speedup > 1.0


def test_equal_split_is_bounded_by_the_smallest_ceiling():
    result = plan_fleet(MIXED_SETS["fast+medium+slow"], 90)
    assert result.equal_micro_batch == 8  # slow's safe batch
    assert [a.share for a in result.equal_split.assignments] == [30, 30, 30]
    assert all(a.micro_batch == 8 and a.accumulation == 4 and a.last_micro_batch == 6
               for a in result.equal_split.assignments)
    assert result.equal_split.slowest.device_id == "slow"


@pytest.mark.parametrize(
    ("devices", "total"),
    [
        ([device("fast", 32, FAST), device("slow", 8, SLOW)], n) for n in (1, 2, 3, 9, 17, 25, 40)
    ] + [
        ([device("fast", 32, FAST), device("medium", 16, MEDIUM), device("slow", 8, SLOW)], n) for n in (1, 4, 11, 23, 40)
    ] + [
        ([device("a", 4, FAST), device("b", 6, MEDIUM), device("c", 3, SLOW)], n) for n in (5, 19, 40)
    ] + [
        ([device("fast", 32, FAST), device("very slow", 8, VERY_SLOW)], n) for n in (1, 12, 40)
    ],
)
def test_plan_matches_brute_force_optimum(devices, total):
    curves = {"fast": FAST, "slow": SLOW, "medium": MEDIUM, "very slow": VERY_SLOW, "a": FAST, "b": MEDIUM, "c": SLOW}
    expected = brute_optimum([(curves[d.device_id], d.safe_batch) for d in devices], total)
    result = plan_fleet(devices, total)
    check_plan_invariants(result, devices, total)
    assert result.plan.predicted_update_seconds == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("overhead_seconds", [0.05, 0.5, 5.0])
@pytest.mark.parametrize("total", [3, 20, 40])
def test_plan_with_overhead_matches_brute_force_optimum(overhead_seconds, total):
    devices = [device("fast", 32, FAST), device("medium", 16, MEDIUM)]
    expected = brute_optimum([(FAST, 32), (MEDIUM, 16)], total, overhead_seconds)
    result = plan_fleet(devices, total, update_overhead_seconds=overhead_seconds)
    check_plan_invariants(result, devices, total)
    assert result.plan.predicted_update_seconds == pytest.approx(expected, rel=1e-9)


def test_a_large_overhead_leaves_every_device_but_the_fastest_out():
    result = plan_fleet([device("fast", 32, FAST), device("medium", 16, MEDIUM)], 20, update_overhead_seconds=5.0)
    assert [a.device_id for a in result.plan.assignments] == ["fast"]
    assert result.plan.predicted_update_seconds == pytest.approx(brute_share_seconds(FAST, 32, 20))
    assert [left.device_id for left in result.left_out] == ["medium"]
    assert "overhead" in result.left_out[0].reason


def test_a_very_slow_device_is_left_out_with_the_reason():
    devices = [device("fast", 32, FAST), device("medium", 16, MEDIUM), device("very slow", 8, VERY_SLOW)]
    result = plan_fleet(devices, 100)
    assert [left.device_id for left in result.left_out] == ["very slow"]
    assert "even one sample takes 100 s" in result.left_out[0].reason
    assert sum(a.share for a in result.plan.assignments) == 100
    assert result.equal_split.slowest.device_id == "very slow"
    assert result.speedup > 10


@pytest.mark.parametrize("count", [2, 3, 4])
@pytest.mark.parametrize("multiple", [1, 5, 64])
def test_identical_devices_get_equal_shares(count, multiple):
    devices = [device(f"d{i}", 32, FAST) for i in range(count)]
    total = count * multiple
    result = plan_fleet(devices, total)
    assert [a.share for a in result.plan.assignments] == [multiple] * count
    assert result.left_out == ()
    assert result.plan.predicted_update_seconds == pytest.approx(result.equal_split.predicted_update_seconds)


def test_n_smaller_than_the_device_count():
    devices = [device(f"d{i}", 32, FAST) for i in range(3)]
    result = plan_fleet(devices, 2)
    check_plan_invariants(result, devices, 2)
    assert [a.share for a in result.plan.assignments] == [1, 1]
    assert len(result.left_out) == 1 and "not needed" in result.left_out[0].reason
    assert [a.share for a in result.equal_split.assignments] == [1, 1, 0]


def test_n_smaller_than_the_device_count_on_a_mixed_set():
    # fast does 2 samples (0.12 s) sooner than medium does 1 (0.17 s): the others are left out.
    devices = [device("fast", 32, FAST), device("medium", 16, MEDIUM), device("slow", 8, SLOW)]
    result = plan_fleet(devices, 2)
    check_plan_invariants(result, devices, 2)
    assert [(a.device_id, a.share) for a in result.plan.assignments] == [("fast", 2)]
    assert [left.device_id for left in result.left_out] == ["medium", "slow"]
    assert all("even one sample" in left.reason for left in result.left_out)


def test_a_large_fleet_and_batch_plan_quickly():
    devices = [device(f"gpu{i}", 4096, {8: 4000.0 + i, 4096: 180000.0}) for i in range(8)]
    devices += [device(f"cpu{i}", 64, {8: 60.0, 64: 90.0}) for i in range(4)]
    result = plan_fleet(devices, 100_000)
    check_plan_invariants(result, devices, 100_000)
    assert result.speedup > 1


def test_plan_to_dict_is_json():
    result = plan_fleet(MIXED_SETS["fast+slow"], 50)
    data = json.loads(json.dumps(result.to_dict()))
    assert sum(d["share"] for d in data["plan"]["devices"]) == 50
    assert data["predicted_update_seconds"] < data["equal_split_update_seconds"]
    assert data["speedup_over_equal_split"] == pytest.approx(result.speedup)


# --- the command -----------------------------------------------------------------------------------


def fleet_profile(host: str, description: str, curve: dict[int, float], safe_batch: int, **model):
    trials = tuple(trial(b, r, steady=True) for b, r in curve.items())
    return make_profile(device={"host": host, "description": description}, model=model, trials=trials,
                        safe_batch=safe_batch, max_batch=safe_batch)


@pytest.fixture
def fleet_dir(tmp_path):
    """Two nodes as a fleet probe lays them out, plus a profile of another model."""
    save_profile(fleet_profile("node-a", "fast cpu", {8: 80.0, 32: 160.0, 64: 200.0}, 64), tmp_path / "nodes" / "node-a")
    save_profile(fleet_profile("node-b", "slow cpu", {8: 20.0, 16: 30.0}, 16), tmp_path / "nodes" / "node-b")
    save_profile(fleet_profile("node-b", "slow cpu", {8: 20.0}, 8, name="other_model"), tmp_path / "nodes" / "node-b")
    return tmp_path


def key_of(directory):  # every profile the fixture writes for mobilenet_v2 has this key
    return fleet_profile("x", "fast cpu", {8: 1.0}, 8).model_key


def test_cli_prints_the_table_and_the_equal_split(fleet_dir):
    result = CliRunner().invoke(main, ["fleet", "plan", "--model", key_of(fleet_dir), "--effective-batch", "256",
                                       str(fleet_dir)])
    assert result.exit_code == 0, result.output
    for text in ("node-a", "node-b", "safe batch", "micro-batch", "accumulation", "predicted update",
                 "equal split", "speedup", "smallest ceiling"):
        assert text in result.output


def test_cli_shows_each_prediction_with_and_without_the_overhead(fleet_dir):
    args = ["fleet", "plan", "--model", key_of(fleet_dir), "--effective-batch", "256", str(fleet_dir)]
    plain = CliRunner().invoke(main, args)
    with_overhead = CliRunner().invoke(main, args + ["--overhead-seconds", "0.05"])
    assert plain.exit_code == with_overhead.exit_code == 0, with_overhead.output
    assert "without the" not in plain.output

    def seconds(output, label):
        line = next(line for line in output.splitlines() if line.strip().startswith(label))
        return [float(word) for word in line.replace("(", " ").split() if word.replace(".", "", 1).isdigit()]

    for label in ("predicted update", "equal split"):
        after = seconds(with_overhead.output, label)
        assert after[0] == pytest.approx(after[1] + 0.05, rel=1e-3)  # with, then without the overhead
        assert "without the 0.05 s overhead" in next(line for line in with_overhead.output.splitlines()
                                                     if line.strip().startswith(label))
    # The equal split keeps its shares: without the overhead it is the plain run's prediction.
    assert seconds(with_overhead.output, "equal split")[1] == pytest.approx(seconds(plain.output, "equal split")[0],
                                                                            rel=1e-3)


def test_cli_json_plan(fleet_dir):
    result = CliRunner().invoke(main, ["fleet", "plan", "--model", "mobilenet_v2", "--effective-batch", "300",
                                       "--json", str(fleet_dir), str(fleet_dir / "nodes")])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    shares = {d["label"]: d for d in data["plan"]["devices"]}
    assert set(shares) == {"node-a", "node-b"}  # the same files given twice count once
    assert sum(d["share"] for d in shares.values()) == 300
    assert shares["node-a"]["micro_batch"] <= 64 and shares["node-b"]["micro_batch"] <= 16
    assert data["predicted_update_seconds"] < data["equal_split_update_seconds"]
    assert data["equal_split"]["micro_batch"] == 16
    assert data["model_key"] == key_of(fleet_dir)


@pytest.mark.parametrize(
    ("args", "exit_code", "message"),
    [
        (["--model", "nope", "--effective-batch", "10"], 2, "available keys"),
        (["--model", "mobilenet_v2", "--effective-batch", "0"], 2, "at least 1"),
        (["--model", "mobilenet_v2", "--effective-batch", "10", "--overhead-seconds", "-1"], 2, ">= 0"),
    ],
    ids=["no such model", "N < 1", "negative overhead"],
)
def test_cli_usage_errors(fleet_dir, args, exit_code, message):
    result = CliRunner().invoke(main, ["fleet", "plan", *args, str(fleet_dir)])
    assert result.exit_code == exit_code
    assert message in result.output
    assert "Traceback" not in result.output


def test_cli_missing_location_is_said_and_nothing_left_is_an_error(tmp_path):
    result = CliRunner().invoke(main, ["fleet", "plan", "--model", "m", "--effective-batch", "8",
                                       str(tmp_path / "missing")])
    assert result.exit_code == 1
    assert "does not exist" in result.output
    assert "no readable device profiles" in result.output


def test_cli_reads_profiles_at_a_url():
    base = "memory://edgebatch-test-fleet-plan"
    save_profile(fleet_profile("node-a", "fast cpu", {8: 80.0, 64: 200.0}, 64), f"{base}/nodes/node-a")
    save_profile(fleet_profile("node-b", "slow cpu", {8: 20.0, 16: 30.0}, 16), f"{base}/nodes/node-b")
    result = CliRunner().invoke(main, ["fleet", "plan", "--model", "mobilenet_v2", "--effective-batch", "100",
                                       "--json", base])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert {d["label"] for d in data["plan"]["devices"]} == {"node-a", "node-b"}
    assert sum(d["share"] for d in data["plan"]["devices"]) == 100
    assert all(source.startswith(base) for source in data["sources"].values())


def test_cli_empty_directory_is_a_runtime_error(tmp_path):
    result = CliRunner().invoke(main, ["fleet", "plan", "--model", "m", "--effective-batch", "8", str(tmp_path)])
    assert result.exit_code == 1
    assert "no readable device profiles" in result.output


def test_cli_device_without_usable_throughput_is_one_line(tmp_path):
    broken = make_profile(device={"host": "node-c"}, trials=(trial(8, 80, ok=False, error="oom"),))
    save_profile(broken, tmp_path / "nodes" / "node-c")
    result = CliRunner().invoke(main, ["fleet", "plan", "--model", broken.model_key, "--effective-batch", "8",
                                       str(tmp_path)])
    assert result.exit_code == 1
    assert "node-c has no usable throughput" in result.output
    assert "Traceback" not in result.output


def test_cli_skips_an_invalid_profile_and_says_so(fleet_dir):
    (fleet_dir / "nodes" / "node-a" / "garbage.json").write_text("{")
    result = CliRunner().invoke(main, ["fleet", "plan", "--model", "mobilenet_v2", "--effective-batch", "64",
                                       str(fleet_dir)])
    assert result.exit_code == 0, result.output
    assert "skipped" in result.output and "garbage.json" in result.output


@pytest.mark.parametrize("total", [7, 256, 300])
def test_identical_devices_with_flat_step_times_get_equal_shares(total):
    # samples/s grows in proportion to the batch (mlp on a CPU comes close): every step takes about
    # the same time, so one device could take nearly all and the update time would not change.
    # Equal devices still get equal shares, as a user expects.
    flat = {1: 100.0, 256: 25_600.0}
    devices = [device(f"d{i}", 256, flat) for i in range(3)]
    result = plan_fleet(devices, total)
    check_plan_invariants(result, devices, total)
    shares = [a.share for a in result.plan.assignments]
    assert max(shares) - min(shares) <= 1 and len(shares) == 3, shares
    assert result.speedup == pytest.approx(1.0)


def test_shares_follow_what_each_device_does_in_the_update_time():
    # Flat step times of 0.01 s on both, one with twice the other's ceiling: within the 0.01 s update
    # the first does 256 samples and the second 128, so 300 splits 200:100, not 256:44.
    flat = {1: 100.0, 256: 25_600.0}
    devices = [device("large", 256, flat), device("small", 128, flat)]
    result = plan_fleet(devices, 300)
    check_plan_invariants(result, devices, 300)
    assert [(a.device_id, a.share) for a in result.plan.assignments] == [("large", 200), ("small", 100)]


def test_cli_model_name_takes_every_profile_of_its_key(tmp_path):
    # A profile under the same model key whose model name says otherwise (the file's key is what
    # a probe reuses) is the same model: selecting by name must not leave it out.
    save_profile(fleet_profile("node-a", "fast cpu", {8: 80.0, 64: 200.0}, 64), tmp_path / "nodes" / "node-a")
    renamed = fleet_profile("node-b", "slow cpu", {8: 20.0, 16: 30.0}, 16, name="renamed", key=key_of(tmp_path))
    assert renamed.model_key == key_of(tmp_path)
    save_profile(renamed, tmp_path / "nodes" / "node-b")
    result = CliRunner().invoke(main, ["fleet", "plan", "--model", "mobilenet_v2", "--effective-batch", "64",
                                       "--json", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert {d["label"] for d in json.loads(result.stdout)["plan"]["devices"]} == {"node-a", "node-b"}


def test_cli_prints_control_characters_in_host_names_as_escapes(tmp_path):
    save_profile(fleet_profile("node\x1b[31m-a", "fast cpu", {8: 80.0, 64: 200.0}, 64), tmp_path / "nodes" / "a")
    result = CliRunner().invoke(main, ["fleet", "plan", "--model", "mobilenet_v2", "--effective-batch", "64",
                                       str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.output and "node\\x1b[31m-a" in result.output
