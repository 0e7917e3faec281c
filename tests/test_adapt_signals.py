"""edgebatch.adapt.signals: the noise-scale estimator against a problem where B_simple is exact,
and each detector on constructed statistics. numpy only, fixed seeds, seconds."""

import math

import numpy as np
import pytest

from edgebatch.adapt.signals import (
    AgreementState,
    DriftState,
    NoiseScaleState,
    PlateauState,
    TwoBatchEstimate,
    cosine_similarity,
    drift_detected,
    hard_share,
    is_plateau,
    mean_agreement,
    micro_batch_pair,
    noise_scale_samples,
    push_agreement,
    push_loss,
    squared_norm,
    two_batch_estimate,
    update_drift,
    update_noise_scale,
)

# --- linear regression with a closed-form gradient noise scale --------------------------------
#
# Loss per example 0.5 (x.w - y)^2 with y = x.w* + eps, x ~ N(0, I_D), eps ~ N(0, s2). At a fixed w
# with d = w - w*, the per-example gradient is g = x (x.d) - x eps, so
#   G = E[g] = d,   E[g g^T] = (|d|^2 + s2) I + 2 d d^T   (Isserlis: E[x x^T d d^T x x^T] = |d|^2 I + 2 d d^T)
#   Sigma = (|d|^2 + s2) I + d d^T,   tr(Sigma) = D (|d|^2 + s2) + |d|^2,
# and B_simple = tr(Sigma) / |G|^2 exactly.

FEATURES = 10
NOISE_VARIANCE = 1.0


def exact_noise_scale(d):
    sq = float(d @ d)
    return (FEATURES * (sq + NOISE_VARIANCE) + sq) / sq


def per_example_gradients(rng, d, examples):
    x = rng.normal(size=(examples, FEATURES))
    eps = rng.normal(scale=math.sqrt(NOISE_VARIANCE), size=examples)
    return x * (x @ d - eps)[:, None]


def offset(rng):
    d = rng.normal(size=FEATURES)
    return d / np.linalg.norm(d)  # |G|^2 = 1, B_simple = 21


def test_closed_form_matches_a_huge_sample():
    # The formula the estimator is judged against is itself right.
    rng = np.random.default_rng(0)
    d = offset(rng)
    g = per_example_gradients(rng, d, 400_000)
    sampled = np.trace(np.cov(g.T)) / squared_norm(g.mean(axis=0))
    assert sampled == pytest.approx(exact_noise_scale(d), rel=0.03)


def test_two_batch_estimate_is_exact_on_expected_squared_norms():
    # E|g_B|^2 = |G|^2 + tr(Sigma)/B: fed the expectations, the estimator returns both unknowns.
    gradient_sq, trace = 2.5, 80.0
    estimate = two_batch_estimate(gradient_sq + trace / 8, 8, gradient_sq + trace / 64, 64)
    assert estimate.gradient_sq_norm == pytest.approx(gradient_sq)
    assert estimate.trace_covariance == pytest.approx(trace)


@pytest.mark.parametrize("small, big", [(8, 8), (64, 8), (0, 8)])
def test_two_batch_estimate_needs_two_distinct_sizes(small, big):
    with pytest.raises(ValueError, match="small_batch_samples"):
        two_batch_estimate(1.0, small, 0.5, big)


@pytest.mark.parametrize("decay", [0.99, 0.999])
def test_ema_noise_scale_recovers_the_exact_b_simple_within_20_percent(decay):
    rng = np.random.default_rng(1)
    d = offset(rng)
    exact = exact_noise_scale(d)
    state, naive_ratios = NoiseScaleState(), []
    for _ in range(2000):
        g = per_example_gradients(rng, d, 64)
        small_sq, big_sq = squared_norm(g[:8].mean(axis=0)), squared_norm(g.mean(axis=0))
        state = update_noise_scale(state, two_batch_estimate(small_sq, 8, big_sq, 64), decay)
        naive_ratios.append((small_sq, big_sq))
    assert state.count == 2000
    assert noise_scale_samples(state) == pytest.approx(exact, rel=0.20)
    # The test can fail: taking |g_big|^2 for |G|^2 (ignoring its tr(Sigma)/64 bias) is > 20% off.
    small_mean, big_mean = np.mean(naive_ratios, axis=0)
    naive_trace = (small_mean - big_mean) / (1 / 8 - 1 / 64)
    assert abs(naive_trace / big_mean - exact) / exact > 0.20


def test_micro_batches_of_one_update_give_the_pair_for_free():
    rng = np.random.default_rng(2)
    d = offset(rng)
    state = NoiseScaleState()
    for _ in range(1000):
        g = per_example_gradients(rng, d, 64)
        micro = [g[i : i + 8].mean(axis=0) for i in range(0, 64, 8)]
        state = update_noise_scale(state, two_batch_estimate(*micro_batch_pair(micro, [8] * 8)), 0.999)
    assert noise_scale_samples(state) == pytest.approx(exact_noise_scale(d), rel=0.20)


def test_micro_batch_pair_with_a_remainder_uses_the_harmonic_mean_and_the_weighted_mean():
    micro = [np.array([1.0, 0.0]), np.array([3.0, 0.0]), np.array([0.0, 2.0])]
    small_sq, small_batch, big_sq, big_batch = micro_batch_pair(micro, [4, 4, 2])
    assert small_sq == pytest.approx((1 + 9 + 4) / 3)
    assert small_batch == pytest.approx(3 / (1 / 4 + 1 / 4 + 1 / 2))
    assert big_batch == 10.0
    assert big_sq == pytest.approx((16 / 10) ** 2 + (4 / 10) ** 2)  # (4*1 + 4*3) / 10, 2*2 / 10


def test_micro_batch_pair_refuses_a_single_micro_batch():
    with pytest.raises(ValueError, match="at least 2"):
        micro_batch_pair([np.ones(3)], [8])


def test_noise_scale_is_a_ratio_of_emas_not_an_ema_of_ratios():
    state = NoiseScaleState()
    for estimate in [TwoBatchEstimate(1.0, 10.0), TwoBatchEstimate(0.1, 10.0)]:
        state = update_noise_scale(state, estimate, decay=0.5)
    # EMAs (bias cancels): |G|^2 0.25+0.05, tr 2.5+5 -> 25 exactly; the mean of ratios would be 55.
    assert noise_scale_samples(state) == pytest.approx((0.5 * 0.5 * 10 + 0.5 * 10) / (0.5 * 0.5 * 1 + 0.5 * 0.1))


def test_noise_scale_is_unknown_before_estimates_and_while_the_gradient_is_unresolved():
    assert noise_scale_samples(NoiseScaleState()) is None
    state = update_noise_scale(NoiseScaleState(), TwoBatchEstimate(-0.2, 10.0))
    assert noise_scale_samples(state) is None
    assert noise_scale_samples(update_noise_scale(NoiseScaleState(), TwoBatchEstimate(1.0, -3.0))) == 0.0


# --- direction agreement ---------------------------------------------------------------------------


def test_cosine_similarity():
    assert cosine_similarity([1.0, 0.0], [2.0, 0.0]) == pytest.approx(1.0)
    assert cosine_similarity([1.0, 0.0], [0.0, 3.0]) == pytest.approx(0.0)
    assert cosine_similarity([1.0, 1.0], [-1.0, -1.0]) == pytest.approx(-1.0)
    assert cosine_similarity([0.0, 0.0], [1.0, 0.0]) is None


def test_agreement_window_is_unknown_until_full_then_the_mean_of_the_last_values():
    state = AgreementState()
    for cosine in [0.9, None, 0.7]:
        state = push_agreement(state, cosine, window_updates=3)
    assert mean_agreement(state, 3) is None  # the None (a zero gradient) was skipped
    for cosine in [0.5, 0.1]:
        state = push_agreement(state, cosine, window_updates=3)
    assert state.cosines == (0.7, 0.5, 0.1)
    assert mean_agreement(state, 3) == pytest.approx(0.433333, abs=1e-6)


# --- loss plateau ------------------------------------------------------------------------------------


def feed(losses, checks=5):
    state = PlateauState()
    for loss in losses:
        state = push_loss(state, loss, checks)
    return state


@pytest.mark.parametrize(
    "losses, plateau",
    [
        ([1.0, 1.0005, 1.0009, 1.0002, 1.0, 0.9995], True),  # 5 changes, each < 0.1%
        ([2.0, 1.0, 1.0005, 1.0009, 1.0002, 1.0, 0.9995], True),  # the old drop left the window
        ([1.0, 1.0005, 1.0009, 1.0002, 1.0], False),  # only 4 changes
        ([1.0, 1.0005, 1.0009, 1.0030, 1.0, 0.9995], False),  # one change of 0.2%
        ([1.0, 0.9, 0.8, 0.7, 0.6, 0.5], False),  # still learning
        ([0.0] * 6, True),
        ([1.0, 1.0, 1.0, float("nan"), 1.0, 1.0, 1.0], False),  # NaN restarts the window
    ],
)
def test_plateau_needs_five_small_relative_changes(losses, plateau):
    assert is_plateau(feed(losses), checks=5, relative_tolerance=1e-3) is plateau


# --- drift ------------------------------------------------------------------------------------------


def drift_after(batches):
    state = DriftState()
    for losses in batches:
        state = update_drift(state, losses)
    return state


def test_steady_or_falling_losses_show_no_drift():
    rng = np.random.default_rng(3)
    steady = drift_after(rng.exponential(1.0, size=(60, 256)))
    assert hard_share(steady) == pytest.approx(0.1, abs=0.06)
    assert not drift_detected(steady)
    falling = drift_after([rng.exponential(1.0 / (1 + 0.05 * i), size=256) for i in range(60)])
    assert hard_share(falling) < 0.1 and not drift_detected(falling)


@pytest.mark.parametrize("batch", [1, 8, 256])
def test_a_rising_share_of_hard_examples_is_drift_at_any_batch_size(batch):
    rng = np.random.default_rng(4)
    easy = list(rng.exponential(1.0, size=(4096 // batch, batch)))
    # A shifted stream: half of the examples now have 5x the loss (~37% above the old 90th percentile).
    shifted = [np.where(rng.random(batch) < 0.5, rng.exponential(5.0, batch), rng.exponential(1.0, batch))
               for _ in range(256 // batch)]
    state = drift_after(easy)
    assert not drift_detected(state)
    state = drift_after(easy + shifted)
    assert drift_detected(state) and hard_share(state) > 0.25


def test_drift_waits_for_both_windows_to_fill():
    state = drift_after([np.ones(8)] * 4 + [np.full(8, 10.0)] * 2)  # 32 + 16 examples
    assert hard_share(state, recent_examples=16, reference_examples=64) is None
    assert not drift_detected(state, recent_examples=16, reference_examples=64)
    small = DriftState()
    for losses in [np.ones(8)] * 4 + [np.full(8, 10.0)] * 2:
        small = update_drift(small, losses, recent_examples=16, reference_examples=32)
    assert hard_share(small, recent_examples=16, reference_examples=32) == 1.0
    assert drift_detected(small, recent_examples=16, reference_examples=32)


def test_windows_keep_their_sizes_and_drop_non_finite_losses():
    state = update_drift(DriftState(), [1.0, float("nan"), 2.0, float("inf"), 3.0], recent_examples=2,
                         reference_examples=2)
    assert state.recent == (2.0, 3.0) and state.reference == (1.0,)
    state = update_drift(state, [4.0, 5.0, 6.0], recent_examples=2, reference_examples=2)
    assert state.recent == (5.0, 6.0) and state.reference == (3.0, 4.0)
