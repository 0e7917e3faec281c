"""The token memory model (edgebatch/probing/token_fit.py): tables of numbers, no TensorFlow."""

import pytest

from edgebatch.errors import UsageError
from edgebatch.probing import token_fit
from edgebatch.profiles import LengthCeiling, TokenMemoryModel

MIB = 1024**2


def exact(fixed, a, b, points):
    return [(batch, length, fixed + a * batch * length + b * batch * length**2) for batch, length in points]


@pytest.mark.parametrize(
    ("fixed", "a", "b"),
    [
        (900 * MIB, 20_000.0, 60.0),  # attention: both terms
        (700 * MIB, 35_000.0, 0.0),  # an LSTM: no quadratic term
        (800 * MIB, 0.0, 150.0),  # quadratic only
    ],
)
def test_exact_readings_give_back_the_coefficients(fixed, a, b):
    points = [(8, 64), (16, 64), (32, 64), (300, 64), (8, 512), (16, 512), (40, 512), (60, 256)]
    model = token_fit.fit_token_model(exact(fixed, a, b, points))
    assert model.fixed_bytes == pytest.approx(fixed, rel=1e-9)
    assert model.per_token_bytes == pytest.approx(a, rel=1e-6, abs=1e-6)
    assert model.per_token_squared_bytes == pytest.approx(b, rel=1e-6, abs=1e-9)
    assert model.r2 == pytest.approx(1.0)
    assert model.points == len(points) and model.lengths == (64, 256, 512)
    assert token_fit.trusted(model)


def test_a_slightly_negative_quadratic_term_is_fitted_without_it():
    # A linear landscape with noise that would pull b below zero: b is kept at 0, a absorbs it.
    readings = exact(700 * MIB, 35_000.0, 0.0, [(8, 64), (64, 64), (256, 64), (8, 512), (32, 512), (64, 512)])
    readings[-1] = (64, 512, readings[-1][2] - 2 * MIB)  # the longest, largest batch reads low
    model = token_fit.fit_token_model(readings)
    assert model.per_token_squared_bytes == 0.0 and model.per_token_bytes > 0


def test_forms_whose_columns_are_not_independent_are_skipped():
    # Every reading has 512 tokens in its batch: the B x L column is the intercept's, so only the
    # quadratic-only form can be solved, and it is exact here.
    readings = exact(90 * MIB, 0.0, 300.0, [(8, 64), (4, 128), (2, 256)])
    model = token_fit.fit_token_model(readings)
    assert model.per_token_bytes == 0.0
    assert model.per_token_squared_bytes == pytest.approx(300.0, rel=1e-9)
    assert model.fixed_bytes == pytest.approx(90 * MIB, rel=1e-9)


def test_each_batch_and_length_is_fitted_at_its_lowest_reading():
    # Processes read one batch at two levels (high draws of 5-7% at 512 tokens): the line is the low one.
    points = [(8, 64), (300, 64), (900, 64), (8, 512), (16, 512), (24, 512), (27, 512), (90, 256)]
    readings = exact(800 * MIB, 6_500.0, 95.0, points)
    high_draws = [(b, length, peak * 1.07) for b, length, peak in readings if length == 512 and b >= 16]
    model = token_fit.fit_token_model(readings + high_draws)
    assert model.fixed_bytes == pytest.approx(800 * MIB, rel=1e-9)
    assert model.per_token_bytes == pytest.approx(6_500.0, rel=1e-6)
    assert model.per_token_squared_bytes == pytest.approx(95.0, rel=1e-6)
    assert model.points == len(points) and model.r2 == pytest.approx(1.0)


def test_high_draws_above_the_line_are_left_out_but_a_bending_line_is_not_cleaned():
    points = [(8, 64), (300, 64), (600, 64), (900, 64), (8, 512), (16, 512), (24, 512), (90, 256), (60, 256),
              (80, 256), (95, 256), (96, 256)]
    readings = exact(800 * MIB, 6_500.0, 95.0, points)
    drawn = [(b, n, p + 130 * MIB) if (b, n) in {(80, 256), (96, 256)} else (b, n, p) for b, n, p in readings]
    model = token_fit.fit_token_model(drawn)
    assert model.points == len(points) - 2 and model.r2 == pytest.approx(1.0)
    assert model.per_token_bytes == pytest.approx(6_500.0, rel=1e-6)
    # Over a quarter of the points above the line is not a set of draws: every point stays.
    high = {(80, 256), (96, 256), (600, 64), (16, 512)}
    many = [(b, n, p + 130 * MIB) if (b, n) in high else (b, n, p) for b, n, p in readings]
    model = token_fit.fit_token_model(many)
    assert sum(1 for b, n, p in many if p > model.predict_bytes(b, n) * (1 + token_fit.HIGH_DRAW_FRACTION)) > 3
    assert model.points == len(points) and model.r2 < 1.0


def test_one_length_or_too_few_readings_fit_nothing():
    assert token_fit.fit_token_model(exact(MIB, 1.0, 1.0, [(8, 64), (16, 64), (32, 64)])) is None
    assert token_fit.fit_token_model(exact(MIB, 1.0, 1.0, [(8, 64), (16, 128)])) is None
    assert not token_fit.trusted(None)


def test_a_crooked_fit_is_not_trusted():
    readings = [(8, 64, 1000 * MIB), (16, 64, 600 * MIB), (32, 64, 1500 * MIB), (8, 512, 700 * MIB), (16, 512, 2000 * MIB)]
    model = token_fit.fit_token_model(readings)
    assert model is None or not token_fit.trusted(model)


def test_the_line_at_a_length_and_its_ceiling():
    model = TokenMemoryModel(1000 * MIB, 10_000.0, 100.0, 0.999, 8, (64, 512))
    per_sample = 10_000.0 * 256 + 100.0 * 256**2
    assert model.per_sample_bytes(256) == per_sample
    line = model.line_at(256)
    assert line.fixed_bytes == 1000 * MIB and line.per_sample_bytes == per_sample
    budget = 2000 * MIB
    batch = model.batch_for_bytes(budget, 256)
    assert model.predict_bytes(batch, 256) <= budget < model.predict_bytes(batch + 1, 256)
    assert model.batch_for_bytes(budget, 64) > batch > model.batch_for_bytes(budget, 512)


def test_a_ceiling_is_the_probed_one_where_probed_and_predicted_elsewhere():
    model = TokenMemoryModel(1000 * MIB, 10_000.0, 100.0, 0.999, 8, (64, 512))
    probed = {64: LengthCeiling(300, 270, 1900 * MIB), 512: LengthCeiling(20, 17, 1950 * MIB)}
    kwargs = dict(per_length=probed, token_model=model, fit_budget_bytes=2000 * MIB, headroom=0.1)
    assert token_fit.ceiling_at_length(64, **kwargs) == probed[64]
    predicted = token_fit.ceiling_at_length(256, **kwargs)
    assert not predicted.measured
    assert predicted.max_batch == model.batch_for_bytes(2000 * MIB, 256)
    assert predicted.safe_batch == model.batch_for_bytes(1800 * MIB, 256) < predicted.max_batch
    assert predicted.peak_bytes <= 2000 * MIB
    assert token_fit.ceiling_at_length(256, **kwargs, multiple=8).max_batch % 8 == 0
    with pytest.raises(ValueError, match="no trusted token memory model"):
        token_fit.ceiling_at_length(256, per_length=probed, token_model=None, fit_budget_bytes=1, headroom=0.1)


@pytest.mark.parametrize(
    ("text", "lengths"),
    [("64,128,256,512", (64, 128, 256, 512)), (" 256, 64 ", (64, 256)), ("128,128", (128,)), ((32, 16), (16, 32)),
     (None, None)],
)
def test_seq_lens_are_parsed_sorted_and_unique(text, lengths):
    assert token_fit.parse_seq_lens(text) == lengths


@pytest.mark.parametrize("text", ["", "64,,128", "64;128", "sixty", "64,-1", "0,64", "1.5"])
def test_bad_seq_lens_are_one_line_usage_errors(text):
    with pytest.raises(UsageError) as caught:
        token_fit.parse_seq_lens(text)
    assert "\n" not in str(caught.value) and "seq-lens" in str(caught.value)


@pytest.mark.parametrize(
    ("max_length", "ladder"),
    [(512, (64, 128, 256, 512)), (300, (64, 128, 256, 300)), (64, (32, 64)), (128, (64, 128)), (10, (5, 10)), (1, (1,))],
)
def test_the_default_ladder_doubles_up_to_the_longest(max_length, ladder):
    assert token_fit.default_lengths(max_length) == ladder


@pytest.mark.parametrize(
    ("lengths", "order"),
    [((64, 128, 256, 512), (64, 512, 128, 256)), ((64, 256), (64, 256)), ((128,), (128,)), ((512, 64, 128), (64, 512, 128))],
)
def test_the_two_ends_are_probed_first(lengths, order):
    assert token_fit.probe_order(lengths) == order


def test_a_profiles_ceiling_at_any_length_uses_its_budget_margin_and_headroom():
    from profile_factory import make_profile

    model = TokenMemoryModel(1000 * MIB, 10_000.0, 100.0, 0.999, 8, (64, 512))
    profile = make_profile(per_length={64: LengthCeiling(300, 270, 1900 * MIB)}, token_model=model,
                           budget_bytes=2048 * MIB, headroom=0.1)
    assert token_fit.profile_ceiling_at_length(profile, 64) == LengthCeiling(300, 270, 1900 * MIB)
    predicted = token_fit.profile_ceiling_at_length(profile, 256)
    assert predicted.max_batch == model.batch_for_bytes(2048 * MIB * 0.975, 256) and not predicted.measured
    # Probed with one inter-op thread (the default now): the margin is 1%, not the pool's 2.5%.
    one_thread = make_profile(per_length={64: LengthCeiling(300, 270, 1900 * MIB)}, token_model=model,
                              budget_bytes=2048 * MIB, headroom=0.1, search={"inter_op_threads": 1})
    assert token_fit.profile_ceiling_at_length(one_thread, 256).max_batch == model.batch_for_bytes(2048 * MIB * 0.99, 256)
    assert model.batch_for_bytes(2048 * MIB * 0.99, 256) > predicted.max_batch


def test_the_forms_tool_refits_a_kept_run_as_the_probe_does():
    """tools/bench/token_model_forms.py's first form is the probe's own fit (each batch and length at its
    lowest reading): on the kept b8a3557 run it predicts at 128 tokens what token_fit predicts from
    the same readings, one sample from the 308 the run's profile predicted with every reading
    fitted (docs/probe-evidence.md quotes it)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    results = root / "tools" / "bench" / "results" / "seq_lens_trial_readings_b8a3557.json"
    data = json.loads(results.read_text())
    run_predicted = {row["length"]: row["predicted_max_batch"] for row in data["rows"]}[128]
    model = token_fit.fit_token_model([(r["batch"], r["length"], r["peak_bytes"]) for r in data["trial_readings"]])
    today = model.batch_for_bytes(data["fit_limit_bytes"], 128)
    assert abs(today - run_predicted) <= 1, (today, run_predicted)
    out = subprocess.run([sys.executable, str(root / "tools" / "bench" / "token_model_forms.py"), str(results)],
                         capture_output=True, text=True, check=True).stdout
    probe_line = next(line for line in out.splitlines() if line.startswith("probe's form"))
    assert f"128: {today}," in probe_line, probe_line
    assert "RMS" in out and out.count("predicted ceilings") == 4


def _trial(batch, length, peak_mib, fresh=True, forked=False):
    from edgebatch.profiles.model import Trial

    return Trial(batch=batch, ok=True, error=None, peak_bytes=int(peak_mib * MIB), process_peak_bytes=None,
                 allocator_peak_bytes=None, step_seconds=1.0, samples_per_second=10.0, fresh=fresh,
                 forked=forked if fresh else None, seq_len=length)


def test_the_spread_is_read_within_each_length_not_across_them():
    from edgebatch.probing.summary import judged_budget_bytes, spread_fraction_of

    # Batch 8 at 64 and at 512 tokens: two lengths, not one batch read twice.
    across = [_trial(8, 64, 817.8), _trial(8, 512, 1039.9)]
    assert spread_fraction_of(across) == 0.0 and judged_budget_bytes(across, 1500 * MIB) == 1500 * MIB
    # 95 x 256 read 1,519.6 and 1,620.3 MiB in two new processes (seq_lens_two_valued_b201dfd.json).
    within = across + [_trial(95, 256, 1519.6), _trial(95, 256, 1620.3)]
    assert spread_fraction_of(within) == pytest.approx(1620.3 / 1519.6 - 1)
    assert judged_budget_bytes(within, 1500 * MIB) == int(1500 * MIB / (1620.3 / 1519.6))


def test_a_predicted_length_is_judged_under_the_widest_spread_a_probed_length_showed():
    from profile_factory import make_profile

    model = TokenMemoryModel(1000 * MIB, 10_000.0, 100.0, 0.999, 8, (64, 512))
    per_length = {64: LengthCeiling(300, 270, 1900 * MIB), 512: LengthCeiling(20, 17, 1950 * MIB)}
    steady = [_trial(300, 64, 1900), _trial(300, 64, 1900.5)]
    two_valued = steady + [_trial(20, 512, 1900), _trial(20, 512, 2050)]
    kwargs = dict(per_length=per_length, token_model=model, budget_bytes=2048 * MIB, headroom=0.1,
                  search={"inter_op_threads": 1})
    limit = 2048 * MIB * 0.99
    calm = token_fit.profile_ceiling_at_length(make_profile(trials=steady, **kwargs), 256)
    spread = 2050 / 1900 - 1
    lowered = token_fit.profile_ceiling_at_length(make_profile(trials=two_valued, **kwargs), 256)
    assert calm.max_batch == model.batch_for_bytes(int(limit / (1 + 0.5 / 1900)), 256)
    assert lowered.max_batch == model.batch_for_bytes(int(limit / (1 + spread)), 256) < calm.max_batch
    # A probed length keeps its own answer.
    assert token_fit.profile_ceiling_at_length(make_profile(trials=two_valued, **kwargs), 512) == per_length[512]


def test_the_profile_summary_does_not_take_two_lengths_of_one_batch_for_a_spread():
    from profile_factory import make_profile

    from edgebatch.cli.profile_text import format_profile

    model = TokenMemoryModel(800 * MIB, 6_500.0, 95.0, 0.999, 8, (64, 512))
    trials = [_trial(8, 64, 817.8), _trial(8, 512, 1039.9), _trial(26, 512, 1481.0), _trial(26, 512, 1481.3)]
    text = format_profile(make_profile(trials=trials, token_model=model, budget_bytes=1536 * MIB, headroom=0.1,
                                       per_length={64: LengthCeiling(900, 700, 1500 * MIB),
                                                   512: LengthCeiling(26, 20, 1481 * MIB)},
                                       search={"answer_readings": 3}))
    assert "repeated readings within 1%" in text, text
