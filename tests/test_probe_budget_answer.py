"""A profile answers every budget up to its own from the readings it holds: pure, no TensorFlow.

The committed profiles in device_profiles/ are real probes (whole-host budgets, MobileNetV2 and a
small CNN); below their budgets the answer is checked against their own readings.
"""

from pathlib import Path

import pytest

from edgebatch.probing import budget_answer, summary
from edgebatch.probing.budget_answer import BudgetAnswer, BudgetQuestion, answer_at
from edgebatch.probing.margins import DEFAULT_HEADROOM, fit_budget_bytes
from edgebatch.probing.reuse import answered_from_readings, reuse_problem
from edgebatch.profiles import MemoryModel, Trial
from edgebatch.profiles.schema import SAFE_RULE_SCHEMA, SCHEMA_VERSION
from edgebatch.profiles.store import load_profile

MIB = 1024**2
GIB = 1024**3
COMMITTED = sorted((Path(__file__).parent.parent / "device_profiles").glob("*.json"))


def question(budget_bytes, *, headroom=0.10, multiple=1, tolerance=0.02, threads=1):
    return BudgetQuestion(budget_bytes=budget_bytes, fit_budget_bytes=fit_budget_bytes(budget_bytes, threads),
                          headroom=headroom, multiple=multiple, tolerance=tolerance)


def trial(batch, peak_mib, *, ok=True, error=None, fresh=True, measured=True):
    return Trial(batch=batch, ok=ok, error=error, peak_bytes=None if peak_mib is None else int(peak_mib * MIB),
                 process_peak_bytes=None, allocator_peak_bytes=None, step_seconds=None, samples_per_second=None,
                 measured=measured, fresh=fresh)


# A slow start under 2 GiB: doubling, a jump near the line's edge, the answer read three times.
LINE = MemoryModel(fixed_bytes=500 * MIB, per_sample_bytes=10 * MIB, r2=0.999, points=5)
TRIALS = (
    trial(8, 580), trial(16, 660, fresh=False), trial(32, 820, fresh=False), trial(64, 1140, fresh=False),
    trial(128, 1780), trial(140, 1900), trial(145, 1950, ok=False, error="over_budget"),
    trial(140, 1901), trial(140, 1899),
)


def profile_question(profile, share, headroom=None):
    budget = int(profile.budget_bytes * share)
    threads = profile.search.get("inter_op_threads", 0)
    return question(budget, headroom=profile.headroom if headroom is None else headroom, multiple=profile.search["multiple"],
                    tolerance=profile.search.get("tolerance", 0.02), threads=threads)


def test_a_bracket_within_the_tolerance_is_answered_by_the_reading_itself():
    answer = answer_at(TRIALS, LINE, question(1950 * MIB), ceiling_batch=140)
    assert isinstance(answer, BudgetAnswer)
    # 1950 MiB less the 1% margin is 1930.5: 140 (1,901 at most) fits, 145 (1,950) is over.
    assert (answer.max_batch, answer.read_batch, answer.over_batch, answer.on_line) == (140, 140, 145, False)


def test_a_wide_bracket_is_bridged_by_the_memory_line_never_past_the_reading_over_it():
    answer = answer_at(TRIALS, LINE, question(1500 * MIB), ceiling_batch=140)
    # 1,485 MiB to fit: 64 fits (1,140), 128 is over (1,780); from 128's reading the line allows
    # 128 - ceil(295 / 10) = 98, from 64's 64 + 34 = 98 too.
    assert (answer.read_batch, answer.over_batch, answer.on_line) == (64, 128, True)
    assert answer.max_batch == 98
    assert 64 <= answer.safe_batch < answer.max_batch
    assert "on the memory line between readings at 64 (fits), 128 read over it" in answer.describe()


def test_without_a_memory_line_a_wide_bracket_is_no_answer():
    reason = answer_at(TRIALS, None, question(1500 * MIB), ceiling_batch=140)
    assert isinstance(reason, str) and "64 (fits) and 128 (over)" in reason and "no memory line" in reason


def test_a_budget_under_every_reading_is_no_answer():
    reason = answer_at(TRIALS, LINE, question(500 * MIB), ceiling_batch=140)
    assert reason == "no batch it read fits 500.00 MiB"


def test_the_answer_never_passes_the_profiles_own_max_and_safe_batches():
    answer = answer_at(TRIALS, LINE, question(1950 * MIB), ceiling_batch=128, ceiling_safe_batch=100)
    assert answer.max_batch == 128 and answer.safe_batch == 100


def test_the_multiple_rounds_the_line_down():
    answer = answer_at(TRIALS, LINE, question(1500 * MIB, multiple=8), ceiling_batch=136)
    assert answer.max_batch == 96 and answer.safe_batch % 8 == 0


def test_rejudged_trials_are_over_the_smaller_budget_where_their_reading_is():
    trials = budget_answer.rejudged(TRIALS, 1485 * MIB)
    assert [t.ok for t in trials][:5] == [True, True, True, True, False]
    assert trials[4].error == "over_budget"


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.name.split("__")[1][:14] + "-" + p.name[:18])
def test_a_committed_profile_at_its_own_budget_answers_as_its_search_did(path):
    profile = load_profile(path)
    q = profile_question(profile, 1.0)
    answer = answer_at(profile.trials, profile.memory_model, q, profile.max_batch)
    assert answer.max_batch == profile.max_batch
    assert answer.safe_batch == summary.safe_batch_of(profile.trials, q.fit_budget_bytes, profile.headroom,
                                                      q.multiple, profile.memory_model, profile.max_batch)


@pytest.mark.parametrize("share", [0.95, 0.70])
@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.name.split("__")[1][:14] + "-" + p.name[:18])
def test_a_committed_profile_answers_5_and_30_percent_below_consistently_with_its_readings(path, share):
    profile = load_profile(path)
    q = profile_question(profile, share)
    answer = answer_at(profile.trials, profile.memory_model, q, profile.max_batch, profile.safe_batch)
    assert isinstance(answer, BudgetAnswer), answer
    readings = [t for t in profile.trials if t.measured and t.peak_bytes is not None]
    # Every reading at or below the answer fits the smaller budget (less its margin)...
    assert all(t.peak_bytes <= q.fit_budget_bytes for t in readings if t.batch <= answer.max_batch)
    # ...the batch it says it read fits, the one it says is over is over, and the answer lies between.
    assert any(t.batch == answer.read_batch and t.peak_bytes <= q.fit_budget_bytes for t in readings)
    if answer.over_batch is not None:
        assert answer.read_batch <= answer.max_batch < answer.over_batch
    # Where the line bridged a gap, its highest reading's level carried down puts the answer under the budget.
    if answer.on_line:
        highest = max((t for t in readings if t.fresh), key=lambda t: t.peak_bytes - profile.memory_model.predict_bytes(t.batch))
        carried = highest.peak_bytes + (answer.max_batch - highest.batch) * profile.memory_model.per_sample_bytes
        assert carried <= q.fit_budget_bytes
    assert q.multiple <= answer.safe_batch <= min(answer.max_batch, profile.safe_batch)
    # A smaller budget never gives more.
    assert answer.max_batch <= profile.max_batch


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.name.split("__")[1][:14] + "-" + p.name[:18])
def test_a_smaller_budget_never_answers_more(path):
    profile = load_profile(path)
    answers = [answer_at(profile.trials, profile.memory_model, profile_question(profile, share), profile.max_batch,
                         profile.safe_batch) for share in (1.0, 0.99, 0.95, 0.8, 0.7, 0.5, 0.3)]
    answers = [a for a in answers if isinstance(a, BudgetAnswer)]
    assert [a.max_batch for a in answers] == sorted((a.max_batch for a in answers), reverse=True)
    assert [a.safe_batch for a in answers] == sorted((a.safe_batch for a in answers), reverse=True)


@pytest.mark.parametrize(
    ("requested", "reused", "below"),
    [(GIB, True, False), (int(GIB * 1.02), True, False), (int(GIB * 1.05), False, False),
     (int(GIB * 0.95), True, True), (int(GIB * 0.70), True, True)],
)
def test_a_profile_answers_every_budget_up_to_its_own(requested, reused, below):
    from edgebatch.probing.api import ProbeRequest

    search = ProbeRequest().search_settings()
    problem = reuse_problem(cached_search=search, cached_headroom=0.1, cached_budget_bytes=GIB,
                            requested_search=search, requested_headroom=0.1, requested_budget_bytes=requested)
    assert (problem is None) == reused
    if not reused:
        assert "a larger budget needs readings it does not hold" in problem
    assert answered_from_readings(GIB, requested) == below


def test_a_per_length_profile_answers_only_its_own_budget():
    from edgebatch.probing.api import ProbeRequest

    search = ProbeRequest().search_settings((64, 128))
    same = dict(cached_search=search, cached_headroom=0.1, cached_budget_bytes=GIB, requested_search=search,
                requested_headroom=0.1, cached_per_length=True)
    assert reuse_problem(requested_budget_bytes=int(GIB * 0.98), **same) is None
    assert not answered_from_readings(GIB, int(GIB * 0.98), cached_per_length=True)
    assert "a probe per length answers only its own budget" in reuse_problem(requested_budget_bytes=int(GIB * 0.7), **same)


def test_the_profile_at_a_smaller_budget_carries_that_budget_and_its_verdicts():
    profile = load_profile(next(p for p in COMMITTED if "mobilenet_v2" in p.name))
    q = profile_question(profile, 0.70)
    answer = answer_at(profile.trials, profile.memory_model, q, profile.max_batch, profile.safe_batch)
    at = budget_answer.profile_at(profile, answer, q, "cli")
    assert (at.budget_bytes, at.budget_source, at.max_batch, at.safe_batch) == (
        q.budget_bytes, "cli", answer.max_batch, answer.safe_batch)
    assert all(not t.ok for t in at.trials if t.peak_bytes is not None and t.peak_bytes > q.fit_budget_bytes)
    assert at.predicted_ceiling == profile.memory_model.batch_for_bytes(q.fit_budget_bytes)
    assert at.to_dict()  # still a valid profile record


def _committed_profile_of_this_host():
    from edgebatch.probing.budget import device_facts

    fingerprint = device_facts("CPU:0").fingerprint
    return next((p for p in COMMITTED if p.name.startswith(fingerprint + "__mobilenet_v2")), None)


@pytest.mark.slow
@pytest.mark.parametrize("share", [0.95, 0.70])
def test_the_default_probe_answers_a_smaller_budget_from_the_committed_profile_without_a_trial(tmp_path, share):
    """The README's main job on a host with a committed profile: a budget under the profile's is
    answered by the scout's model identity and the profile's readings, no trial runs."""
    import shutil

    from edgebatch import probe

    path = _committed_profile_of_this_host()
    if path is None:
        pytest.skip("no committed mobilenet_v2 profile of this host's CPU in device_profiles/")
    shutil.copy(path, tmp_path / path.name)
    profile = load_profile(path)
    budget = int(profile.budget_bytes * share)
    lines = []
    answered = probe("mobilenet_v2", device="CPU:0", memory_budget=budget, allow_overcommit=True,
                     profiles_dir=tmp_path, progress=lines.append)
    # The committed profile's safe_batch came from the older rule (schema 2): the probe's own rule and
    # headroom read its trials again, not capped by that figure.
    assert profile.schema_version < SAFE_RULE_SCHEMA
    expected = answer_at(profile.trials, profile.memory_model, profile_question(profile, share, DEFAULT_HEADROOM),
                         profile.max_batch)
    assert (answered.budget_bytes, answered.max_batch, answered.safe_batch) == (
        budget, expected.max_batch, expected.safe_batch)
    assert answered.headroom == DEFAULT_HEADROOM and answered.schema_version == SCHEMA_VERSION
    assert any("its readings answer this smaller budget" in line for line in lines), lines
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name], "the cached file stays as it was"
    assert not any(line.lstrip().startswith("batch ") for line in lines), f"no trial runs: {lines}"
