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
from edgebatch.zoo import parse_model_spec

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


def scripted_search(budget_bytes, calls):
    """Stands in for api._search: reads the landscape at the setup's length, records what it was given."""

    def search(config, setup, workers, measure, progress, fork):
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
                                        "process_peak", lambda line: None, None, scripted_search(budget, calls))
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
