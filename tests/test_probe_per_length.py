"""A probe per sequence length, without TensorFlow: the search from a prior line, the orchestration
over lengths with a scripted search, which lengths a request resolves to, and the cache key."""

import dataclasses

import pytest
from test_probe_search import MIB, REPEATS, linear, runs, simulate, true_ceiling

from edgebatch.errors import UsageError
from edgebatch.probing import per_length, token_fit
from edgebatch.probing.api import ProbeRequest
from edgebatch.probing.outcomes import Done
from edgebatch.probing.reuse import reuse_problem
from edgebatch.probing.search import Run, SearchConfig, next_step
from edgebatch.profiles import MemoryModel, Trial, model_key
from edgebatch.models.zoo import parse_model_spec

# transformer_tiny on this machine kind (a probe at 64 and 256 tokens under 1.5 GiB): ~750 MiB
# before any batch, then a x B x L + b x B x L^2 with a ~6.6 kB and b ~108 B.
FIXED_MIB, A, B = 750, 6_645.0, 108.0


def peak_mib(batch, length):
    return FIXED_MIB + (A * batch * length + B * batch * length**2) / MIB


@pytest.mark.parametrize("error", [-0.15, -0.05, 0.0, 0.05, 0.15])
def test_a_search_from_a_prior_line_starts_under_its_ceiling_and_lands_on_the_true_one(error):
    budget = int(1500 * 0.975 * MIB)
    true_slope = (A * 128 + B * 128**2) / MIB
    peak = linear(FIXED_MIB, true_slope)
    prior = MemoryModel(FIXED_MIB * MIB, true_slope * (1 + error) * MIB, 0.999, 12)
    config = SearchConfig(budget_bytes=budget, prior_model=prior)
    first = next_step(config, [])
    assert first == Run(int(prior.batch_for_bytes(budget) * (1 - config.jump_margin)), fresh=True)
    answer, steps = simulate(config, peak)
    truth = true_ceiling(peak, budget)
    assert 0.98 * truth <= answer <= truth, (answer, truth, runs(steps))
    assert all(step.fresh for step in steps if isinstance(step, Run)), "every trial after a prior runs fresh"
    assert len(runs(steps)) <= 5 + REPEATS, runs(steps)


def test_without_a_prior_the_search_is_unchanged():
    config = SearchConfig(budget_bytes=2000 * MIB)
    assert next_step(config, []) == Run(8)


def scripted_search(budget_bytes, calls, workers):
    """Stands in for run_search with its workers bound (as the probe binds them): reads the
    landscape at the setup's length, records what it was given and the workers it would run in."""

    def search(config, setup):
        length = setup.sequence_length
        calls.append((length, config.prior_model, list(workers)))
        outcomes_peak = lambda b: int(peak_mib(b, length) * MIB)
        answer, steps = simulate(config, outcomes_peak)
        trials = []
        for step in steps:
            if isinstance(step, Run):
                peak = outcomes_peak(step.batch)
                ok = peak <= budget_bytes
                trials.append(Trial(step.batch, ok, None if ok else "over_budget", peak, peak, None, 0.1, 10.0,
                                    fresh=step.fresh))
        return trials, Done(answer)

    return search


class FakeWorker:
    def __init__(self):
        self.closed = False

    def close(self):
        self.closed = True


def test_lengths_are_searched_ends_first_and_later_ones_start_at_the_prediction():
    budget = int(1500 * 0.975 * MIB)
    calls = []
    scout = FakeWorker()
    workers = [scout]
    setup = dataclasses.make_dataclass("Setup", [("sequence_length", int)])(64)
    results = per_length.search_lengths((64, 128, 256, 512), SearchConfig(budget_bytes=budget), setup, workers,
                                        lambda line: None, scripted_search(budget, calls, workers))
    assert [length for length, _, _ in calls] == [64, 512, 128, 256]
    assert calls[0][2] == [scout] and scout.closed, "the scout serves the first length, then is closed"
    assert calls[0][1] is None and calls[1][1] is None, "the two ends are searched in full"
    assert calls[2][1] is not None and calls[3][1] is not None, "the middle starts from the token model"
    assert sorted(results) == [64, 128, 256, 512]
    for length, (trials, max_batch) in results.items():
        assert all(t.seq_len == length for t in trials)
        truth = true_ceiling(lambda b, n=length: peak_mib(b, n) * MIB, budget)
        assert 0.98 * truth <= max_batch <= truth
    shared = [len(results[n][0]) for n in (128, 256)]
    full = [len(results[n][0]) for n in (64, 512)]
    assert max(shared) < min(full), (shared, full)

    summary = per_length.summarise_lengths(results, budget, 0.10, 1)
    assert summary.per_length[64].max_batch > summary.per_length[256].max_batch > summary.per_length[512].max_batch
    for length, ceiling in summary.per_length.items():
        assert ceiling.safe_batch < ceiling.max_batch and ceiling.peak_bytes <= budget
    model = summary.token_model
    assert token_fit.trusted(model)
    assert model.per_token_bytes == pytest.approx(A, rel=0.02) and model.per_token_squared_bytes == pytest.approx(B, rel=0.02)
    predicted = token_fit.ceiling_at_length(384, per_length=None, token_model=model, fit_budget_bytes=budget, headroom=0.1)
    truth = true_ceiling(lambda b: peak_mib(b, 384) * MIB, budget)
    assert abs(predicted.max_batch - truth) <= 0.05 * truth


@pytest.mark.parametrize(
    ("model", "seq_lens", "lengths"),
    [
        ("transformer_tiny", None, (64, 128, 256, 512)),
        ("lstm_small", "64,256", (64, 256)),
        ("mobilenet_v2", None, None),
    ],
)
def test_the_lengths_a_request_resolves_to(model, seq_lens, lengths):
    assert per_length.resolve_lengths(parse_model_spec(model), seq_lens) == lengths


@pytest.mark.parametrize(
    ("model", "seq_lens", "match"),
    [
        ("mobilenet_v2", "64,128", "fixed input shape"),
        ("transformer_tiny", "64,1024", "at most 512 tokens"),
        ("transformer_tiny", "64,abc", "token counts separated by commas"),
    ],
)
def test_bad_lengths_are_one_line_usage_errors(model, seq_lens, match):
    with pytest.raises(UsageError, match=match) as caught:
        per_length.resolve_lengths(parse_model_spec(model), seq_lens)
    assert "\n" not in str(caught.value)
    with pytest.raises(UsageError):
        per_length.check_sequence_axis("mine", (64,), has_sequence_axis=False)
    per_length.check_sequence_axis("mine", (64,), has_sequence_axis=True)
    per_length.check_sequence_axis("mine", None, has_sequence_axis=False)


def test_the_profile_key_and_the_reuse_check_hold_the_lengths():
    args = ("transformer_tiny", "0123456789abcdef", [{"shape": [None], "dtype": "int32"}], "float32", "adam", "2.21.0")
    plain, short, long = model_key(*args), model_key(*args, seq_lens=(64, 128)), model_key(*args, seq_lens=(64, 512))
    assert len({plain, short, long}) == 3
    assert "-len64-512-" in long and "-len" not in plain
    assert model_key(*args, seq_lens=[512, 64]) == long
    assert model_key(*args, seq_lens=(64, 128, 512)) != long, "the hash holds every length, not just the ends"
    request = ProbeRequest(model="transformer_tiny")
    cached = request.search_settings((64, 512))
    assert cached["seq_lens"] == [64, 512] and "seq_lens" not in request.search_settings()
    same = dict(cached_search=cached, cached_headroom=0.1, cached_budget_bytes=10**9, requested_headroom=0.1,
                requested_budget_bytes=10**9)
    assert reuse_problem(requested_search=request.search_settings((64, 512)), **same) is None
    assert "--seq-lens" in reuse_problem(requested_search=request.search_settings((64, 256)), **same)
    assert "--seq-lens" in reuse_problem(requested_search=request.search_settings(), **same)


def test_seq_lens_are_checked_when_the_request_is():
    with pytest.raises(UsageError, match="seq-lens"):
        ProbeRequest(model="transformer_tiny", seq_lens="64,x").validate()


# transformer_tiny under 1 GiB on an AMD EPYC host, two runs of tests/test_probe_per_length_real.py's
# probe (2026-12-06): (length, batch, peak MiB, fresh, forked) of every measured trial. The scout
# was a new process at 32 tokens and a fork-server child at 128; near each edge a child's failure
# was read again in a new process, lower every time: 31.0-31.7 MiB in the first run; 25.6-28.4 MiB
# at five batches in the second, and 6.4 MiB at the sixth, where the new process drew a high level.
AMD_TRANSFORMER_TINY_1GIB_RUN1 = [
    (32, 8, 859.2, True, False), (32, 16, 864.9, False, False), (32, 32, 872.5, False, False),
    (32, 280, 973.4, True, True), (32, 360, 1006.7, True, True), (32, 376, 1005.4, True, True),
    (32, 390, 1009.9, True, True), (32, 397, 1008.8, True, True), (32, 404, 1013.8, True, True),
    (32, 404, 982.9, True, False), (32, 432, 1022.1, True, True), (32, 432, 991.2, True, False),
    (32, 449, 1027.4, True, True), (32, 440, 1024.4, True, True), (32, 432, 991.1, True, False),
    (128, 8, 903.8, True, True), (128, 16, 921.5, False, True), (128, 32, 959.6, False, True),
    (128, 52, 999.8, True, True), (128, 55, 1007.1, True, True), (128, 58, 1015.9, True, True),
    (128, 58, 984.5, True, False), (128, 61, 1029.2, True, True), (128, 59, 1016.4, True, True),
    (128, 59, 984.7, True, False), (128, 60, 1027.3, True, True), (128, 59, 984.7, True, False),
    (128, 60, 996.0, True, False), (128, 61, 996.8, True, False), (128, 65, 1031.4, True, True),
    (128, 63, 1030.4, True, True), (128, 62, 1029.7, True, True), (128, 61, 998.8, True, False),
]
AMD_TRANSFORMER_TINY_1GIB_RUN2 = [
    (32, 8, 852.3, True, False), (32, 16, 858.1, False, False), (32, 32, 865.6, False, False),
    (32, 292, 965.6, True, True), (32, 395, 997.1, True, True), (32, 431, 1011.4, True, True),
    (32, 441, 1013.8, True, True), (32, 441, 986.6, True, False), (32, 473, 1022.9, True, True),
    (32, 473, 996.1, True, False), (32, 482, 1025.6, True, True), (32, 473, 996.3, True, False),
    (128, 8, 892.4, True, True), (128, 16, 910.3, False, True), (128, 32, 948.5, False, True),
    (128, 56, 996.0, True, True), (128, 61, 1017.6, True, True), (128, 61, 1011.2, True, False),
    (128, 63, 1019.1, True, True), (128, 63, 992.9, True, False), (128, 64, 1019.2, True, True),
    (128, 64, 993.6, True, False), (128, 65, 1020.0, True, True), (128, 65, 1006.1, True, False),
    (128, 66, 1024.7, True, True), (128, 65, 991.9, True, False), (128, 65, 992.1, True, False),
    (128, 65, 991.6, True, False), (128, 65, 994.2, True, False),
]


def replayed_trials(rows, fit_budget_mib=1014):
    return [Trial(batch=batch, ok=peak <= fit_budget_mib, error=None if peak <= fit_budget_mib else "over_budget",
                  peak_bytes=int(peak * MIB), process_peak_bytes=int(peak * MIB),
                  allocator_peak_bytes=None, step_seconds=0.1, samples_per_second=batch / 0.1, fresh=fresh,
                  forked=forked, seq_len=length)
            for length, batch, peak, fresh, forked in rows]


@pytest.mark.parametrize("rows, lift_mib, edges", [
    (AMD_TRANSFORMER_TINY_1GIB_RUN1, 31.3, {32: (432, 991.1), 128: (61, 996.8)}),
    (AMD_TRANSFORMER_TINY_1GIB_RUN2, 26.5, {32: (473, 996.1), 128: (65, 991.6)}),
])
def test_childrens_steady_lift_is_taken_off_before_the_token_model_is_fitted(rows, lift_mib, edges):
    trials = replayed_trials(rows)
    as_read = token_fit.fit_token_model([(t.batch, t.seq_len, t.peak_bytes) for t in trials])
    assert not token_fit.trusted(as_read), "two levels in one fit: the runs that failed their real test"
    assert per_length.child_lift_bytes(trials) == pytest.approx(lift_mib * MIB, abs=0.2 * MIB)
    model = token_fit.fit_token_model(per_length.token_readings(trials))
    assert token_fit.trusted(model) and model.r2 >= 0.99
    # At the level of a new process: the edge's lowest new-process reading sits on it.
    for length, (batch, peak_mib) in edges.items():
        assert model.predict_bytes(batch, length) == pytest.approx(peak_mib * MIB, rel=0.01)
    by_length = {length: ([t for t in trials if t.seq_len == length], batch) for length, (batch, _) in edges.items()}
    summary = per_length.summarise_lengths(by_length, fit_budget_bytes=1014 * MIB, headroom=0.1, multiple=1)
    assert token_fit.trusted(summary.token_model)


def read_only_in_new_processes(rows):
    """The run as the search reads it since fac9320: a batch near the edge read in a new process at
    once, so each batch the run read both ways keeps only its new process's reading."""
    new_process_batches = {(length, batch) for length, batch, _, _, forked in rows if not forked and batch > 32}
    return [row for row in rows if not row[4] or (row[0], row[1]) not in new_process_batches]


@pytest.mark.parametrize("rows, lift_mib, edges", [
    (AMD_TRANSFORMER_TINY_1GIB_RUN1, 31.3, {32: (432, 991.1), 128: (61, 996.8)}),
    (AMD_TRANSFORMER_TINY_1GIB_RUN2, 26.5, {32: (473, 996.1), 128: (65, 991.6)}),
])
def test_without_pairs_the_lift_is_the_childrens_offset_in_one_fit(rows, lift_mib, edges):
    trials = replayed_trials(read_only_in_new_processes(rows))
    as_read = token_fit.fit_token_model([(t.batch, t.seq_len, t.peak_bytes) for t in trials])
    assert not token_fit.trusted(as_read), "new processes' edge readings under the children's line"
    # The scout's reused readings at 16 and 32 sit a little above a fresh process's: the fitted
    # offset comes out 6-17% under the lift the pairs measured (29.3 and 22.1 MiB).
    assert 0.8 * lift_mib * MIB <= per_length.child_lift_bytes(trials) <= lift_mib * MIB
    model = token_fit.fit_token_model(per_length.token_readings(trials))
    assert token_fit.trusted(model) and model.r2 >= 0.99
    for length, (batch, peak_mib) in edges.items():
        assert model.predict_bytes(batch, length) == pytest.approx(peak_mib * MIB, rel=0.01)


def test_pairs_that_disagree_are_not_overruled_by_the_fitted_offset():
    rows = [(32, 8, 852.3, True, False), (32, 16, 858.1, False, False), (32, 32, 865.6, False, False),
            (32, 400, 1013.8, True, True), (32, 400, 982.9, True, False),
            (32, 420, 1050.0, True, True), (32, 420, 990.0, True, False),
            (128, 8, 892.4, True, True), (128, 16, 910.3, False, True), (128, 32, 948.5, False, True),
            (128, 60, 1010.0, True, True)]
    trials = replayed_trials(rows)
    assert token_fit.children_offset_bytes(
        (t.batch, t.seq_len, t.peak_bytes, t.forked) for t in trials) is not None, "a fit would give one"
    assert per_length.child_lift_bytes(trials) == 0.0, "31 and 60 MiB: no steady amount, and two pairs read"


@pytest.mark.parametrize("rows, why", [
    ([(32, 400, 1013.8, True, True), (32, 400, 982.9, True, False)], "one pair cannot show the lift is steady"),
    ([(32, 400, 1013.8, True, True), (32, 400, 982.9, True, False),
      (32, 420, 1100.0, True, True), (32, 420, 990.0, True, False)], "31 and 110 MiB: no steady amount"),
    ([(32, 400, 1013.8, True, True), (32, 400, 982.9, False, False),
      (32, 420, 1020.0, True, True), (32, 420, 990.0, False, False)], "a reused worker's reading is no pair"),
    ([(32, batch, 900.0 + lift, True, True) for batch, lift in zip(range(100, 700, 100), (0, 50, 51, 52, 100, 150))]
     + [(32, batch, 900.0, True, False) for batch in range(100, 700, 100)], "three of six agree: half is no majority"),
])
def test_no_lift_is_taken_without_pairs_that_agree(rows, why):
    trials = replayed_trials(rows)
    assert per_length.child_lift_bytes(trials) == 0.0, why
    assert [peak for _, _, peak in per_length.token_readings(trials)] == [t.peak_bytes for t in trials]
