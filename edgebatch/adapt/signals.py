"""Cheap training statistics that say how large the effective batch *should* be. numpy only.

Everything here works on what a gradient-accumulating loop already has: flat gradient vectors
(the mean gradient of each micro-batch and of the whole update), squared norms, scalar losses and
per-example losses. No TensorFlow: a caller flattens its tensors (e.g. concatenates
`tf.reshape(g, [-1])` over the variables) and passes numpy arrays or plain floats.

- Gradient noise scale B_simple = tr(Sigma) / |G|^2 (McCandlish et al. 2018, appendix A): from
  two batch sizes (`two_batch_estimate`; `micro_batch_pair` gets both from one accumulated
  update's micro-batches), smoothed as a ratio of EMAs (`NoiseScaleState`).
- Direction agreement between consecutive update gradients (`AgreementState`).
- Loss plateau (`PlateauState`) and drift in the share of hard examples (`DriftState`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

__all__ = [
    "AgreementState",
    "DriftState",
    "NoiseScaleState",
    "PlateauState",
    "TwoBatchEstimate",
    "cosine_similarity",
    "drift_detected",
    "hard_share",
    "is_plateau",
    "mean_agreement",
    "micro_batch_pair",
    "noise_scale_samples",
    "pair_from_norms",
    "push_agreement",
    "push_loss",
    "squared_norm",
    "two_batch_estimate",
    "update_drift",
    "update_noise_scale",
]


def squared_norm(vector: np.ndarray | Sequence[float]) -> float:
    """|v|^2 of a flat gradient vector, in float64 whatever the input's precision."""
    flat = np.asarray(vector, dtype=np.float64).ravel()
    return float(np.dot(flat, flat))


# --- gradient noise scale ------------------------------------------------------------------------


@dataclass(frozen=True)
class TwoBatchEstimate:
    """One unbiased (noisy) estimate of |G|^2 and tr(Sigma) from a (small, big) batch pair."""

    gradient_sq_norm: float  # |G|^2, may be negative for a single pair
    trace_covariance: float  # tr(Sigma), per example


def two_batch_estimate(
    small_sq_norm: float, small_batch_samples: float, big_sq_norm: float, big_batch_samples: float
) -> TwoBatchEstimate:
    """McCandlish et al. (2018) appendix A: |G|^2 and tr(Sigma) from |g|^2 at two batch sizes.

    For i.i.d. examples with true gradient G and per-example covariance Sigma, the mean gradient
    g_B over B examples has E|g_B|^2 = |G|^2 + tr(Sigma) / B, so B_small < B_big give unbiased
    estimates of both unknowns:

        |G|^2     ~ (B_big |g_big|^2 - B_small |g_small|^2) / (B_big - B_small)
        tr(Sigma) ~ (|g_small|^2 - |g_big|^2) / (1 / B_small - 1 / B_big)

    `small_sq_norm` is |g_small|^2, the squared norm of a *mean* gradient over
    `small_batch_samples` examples; likewise for big. Unbiased when both are means of i.i.d.
    examples from the same distribution at the same weights (the big batch may contain the small
    one: each expectation holds on its own). Requires 0 < small_batch_samples < big_batch_samples.
    """
    if not 0 < small_batch_samples < big_batch_samples:
        raise ValueError(
            f"need 0 < small_batch_samples < big_batch_samples, got {small_batch_samples!r} and {big_batch_samples!r}"
        )
    b_small, b_big = float(small_batch_samples), float(big_batch_samples)
    gradient_sq = (b_big * big_sq_norm - b_small * small_sq_norm) / (b_big - b_small)
    trace = (small_sq_norm - big_sq_norm) / (1.0 / b_small - 1.0 / b_big)
    return TwoBatchEstimate(gradient_sq_norm=float(gradient_sq), trace_covariance=float(trace))


def micro_batch_pair(
    micro_gradients: Sequence[np.ndarray], micro_batch_samples: Sequence[int]
) -> tuple[float, float, float, float]:
    """(|g_small|^2, B_small, |g_big|^2, B_big) from the micro-batches of one accumulated update.

    `micro_gradients[i]` is the *mean* gradient over micro-batch i of `micro_batch_samples[i]`
    examples (disjoint examples, same weights). The big gradient is their example-weighted mean
    (the accumulated update), B_big = sum of the sizes; the small side is `pair_from_norms`'s.
    Needs >= 2 micro-batches.
    """
    if len(micro_gradients) != len(micro_batch_samples):
        raise ValueError(f"{len(micro_gradients)} gradients for {len(micro_batch_samples)} sizes")
    stacked = np.stack([np.asarray(g, dtype=np.float64).ravel() for g in micro_gradients])
    sizes = np.asarray(micro_batch_samples, dtype=np.float64)
    big = (sizes[:, None] * stacked).sum(axis=0) / sizes.sum() if len(sizes) else np.zeros(0)
    return pair_from_norms(np.einsum("ij,ij->i", stacked, stacked), micro_batch_samples, squared_norm(big))


def pair_from_norms(
    micro_sq_norms: Sequence[float], micro_batch_samples: Sequence[int], update_sq_norm: float
) -> tuple[float, float, float, float]:
    """(|g_small|^2, B_small, |g_big|^2, B_big) from squared norms only (what a training loop keeps).

    `micro_sq_norms[i]` = |g_i|^2 of micro-batch i's mean gradient; `update_sq_norm` = |g|^2 of the
    update's mean gradient over all of them. The small squared norm is the average of the |g_i|^2;
    since E|g_i|^2 = |G|^2 + tr(Sigma)/b_i, that average is exactly the expectation at B_small =
    the harmonic mean of the sizes (= b when all are b, so uneven remainders such as
    [32, 32, 32, 4] stay unbiased). B_big = the sum of the sizes. Needs >= 2 micro-batches.
    """
    if len(micro_sq_norms) != len(micro_batch_samples):
        raise ValueError(f"{len(micro_sq_norms)} norms for {len(micro_batch_samples)} sizes")
    if len(micro_sq_norms) < 2:
        raise ValueError("the two-batch estimate needs at least 2 micro-batches in the update")
    sizes = np.asarray(micro_batch_samples, dtype=np.float64)
    if np.any(sizes <= 0):
        raise ValueError(f"micro-batch sizes must be positive, got {list(micro_batch_samples)!r}")
    small_sq = float(np.mean(np.asarray(micro_sq_norms, dtype=np.float64)))
    small_batch = float(len(sizes) / np.sum(1.0 / sizes))
    return small_sq, small_batch, float(update_sq_norm), float(sizes.sum())


@dataclass(frozen=True)
class NoiseScaleState:
    """EMAs of the |G|^2 and tr(Sigma) estimates, kept apart (a ratio of EMAs, not an EMA of ratios).

    Each single estimate is very noisy (the |G|^2 one may be negative), so, as the paper advises,
    the numerator and the denominator are smoothed separately and B_simple is the ratio of the two
    EMAs, never an average of per-step ratios. The promise (tests/test_adapt_signals.py): on linear
    regression with Gaussian inputs, where B_simple is known in closed form, the ratio of EMAs over
    ~2000 (B_small=8, B_big=64) pairs lands within 20% of the exact value.

    `weight` is the EMA of 1 (1 - decay^n after n updates): dividing by it removes the start-at-zero
    bias of each EMA (as Adam does); it cancels in the ratio.
    """

    gradient_sq_ema: float = 0.0
    trace_ema: float = 0.0
    weight: float = 0.0
    count: int = 0


def update_noise_scale(state: NoiseScaleState, estimate: TwoBatchEstimate, decay: float = 0.99) -> NoiseScaleState:
    """Fold one two-batch estimate into both EMAs (decay in [0, 1): the weight kept of the past)."""
    if not 0.0 <= decay < 1.0:
        raise ValueError(f"decay must be in [0, 1), got {decay!r}")
    keep = 1.0 - decay
    return NoiseScaleState(
        gradient_sq_ema=decay * state.gradient_sq_ema + keep * estimate.gradient_sq_norm,
        trace_ema=decay * state.trace_ema + keep * estimate.trace_covariance,
        weight=decay * state.weight + keep,
        count=state.count + 1,
    )


def noise_scale_samples(state: NoiseScaleState) -> float | None:
    """B_simple = EMA(tr Sigma) / EMA(|G|^2), in examples; None before any estimate or while the
    |G|^2 EMA is <= 0 (the gradient is not yet resolved from the noise: no finite scale), and
    0.0 if the trace EMA is <= 0 (no measurable noise)."""
    if state.count == 0 or state.gradient_sq_ema <= 0.0:
        return None
    return max(state.trace_ema, 0.0) / state.gradient_sq_ema


# --- direction agreement -------------------------------------------------------------------------


def cosine_similarity(a: np.ndarray | Sequence[float], b: np.ndarray | Sequence[float]) -> float | None:
    """cos(a, b) of two flat gradients in float64; None when either is the zero vector."""
    x = np.asarray(a, dtype=np.float64).ravel()
    y = np.asarray(b, dtype=np.float64).ravel()
    if x.shape != y.shape:
        raise ValueError(f"gradients of different sizes: {x.size} and {y.size}")
    norms = math.sqrt(float(np.dot(x, x)) * float(np.dot(y, y)))
    if norms == 0.0:
        return None
    return max(-1.0, min(1.0, float(np.dot(x, y)) / norms))


@dataclass(frozen=True)
class AgreementState:
    """The last `window_updates` cosines between consecutive update gradients, oldest first.

    Near 1: successive updates point the same way (the batch is large enough for the gradient to
    dominate its noise: a larger one buys little direction but allows a larger step); near 0 or
    negative: noise or oscillation dominate.
    """

    cosines: tuple[float, ...] = ()


def push_agreement(state: AgreementState, cosine: float | None, window_updates: int) -> AgreementState:
    """Append one cosine (None, from a zero gradient, is skipped), keeping the last `window_updates`."""
    if window_updates < 1:
        raise ValueError(f"window_updates must be >= 1, got {window_updates!r}")
    if cosine is None:
        return state
    return AgreementState(cosines=(state.cosines + (float(cosine),))[-window_updates:])


def mean_agreement(state: AgreementState, window_updates: int) -> float | None:
    """Mean cosine over the window; None until the window is full (a half window is no evidence)."""
    if len(state.cosines) < window_updates:
        return None
    return sum(state.cosines[-window_updates:]) / window_updates


# --- loss plateau ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlateauState:
    """The last few losses fed at policy checks (one value per check, e.g. the mean loss since the
    previous check), oldest first. A plateau: the relative change |L_t - L_{t-1}| / |L_{t-1}| stays
    below a tolerance for a number of consecutive checks (is_plateau)."""

    losses: tuple[float, ...] = ()


def push_loss(state: PlateauState, loss: float, checks: int) -> PlateauState:
    """Append one check's loss, keeping the last `checks` + 1 (enough for `checks` changes)."""
    if checks < 1:
        raise ValueError(f"checks must be >= 1, got {checks!r}")
    if not math.isfinite(loss):
        return PlateauState()  # a non-finite loss breaks any plateau: start over
    return PlateauState(losses=(state.losses + (float(loss),))[-(checks + 1) :])


def is_plateau(state: PlateauState, checks: int = 5, relative_tolerance: float = 1e-3) -> bool:
    """True when each of the last `checks` relative changes |L_t - L_{t-1}| / |L_{t-1}| is below
    `relative_tolerance`. A previous loss of exactly 0 counts as a plateau only when L_t is 0 too."""
    if len(state.losses) < checks + 1:
        return False
    recent = state.losses[-(checks + 1) :]
    for previous, current in pairwise(recent):
        change = abs(current - previous)
        if previous == 0.0:
            if change != 0.0:
                return False
        elif change / abs(previous) >= relative_tolerance:
            return False
    return True


# --- drift ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DriftState:
    """The latest per-example losses in two consecutive windows, oldest first: `reference` (the
    examples before the recent ones) and `recent`. Drift: the share of *hard* examples (recent
    losses above a quantile of the reference) rising clearly above the share that quantile implies. Counted in examples, not updates, so the
    evidence is the same at any batch size (a quantile of one small batch is a biased estimate: of
    a single example it is that example's loss, the median's estimate, not the 90th percentile's)."""

    reference: tuple[float, ...] = ()
    recent: tuple[float, ...] = ()


def update_drift(
    state: DriftState,
    per_example_losses: np.ndarray | Sequence[float],
    recent_examples: int = 256,
    reference_examples: int = 1024,
) -> DriftState:
    """Append one batch's per-example losses to the recent window; what falls out of it (the oldest)
    moves into the reference window, whose oldest fall out. Non-finite losses are dropped."""
    if recent_examples < 1 or reference_examples < 1:
        raise ValueError(f"windows must hold >= 1 example, got {recent_examples!r} and {reference_examples!r}")
    losses = np.asarray(per_example_losses, dtype=np.float64).ravel()
    losses = losses[np.isfinite(losses)]
    if losses.size == 0:
        return state
    recent = state.recent + tuple(float(v) for v in losses)
    moved, recent = recent[: max(0, len(recent) - recent_examples)], recent[-recent_examples:]
    reference = (state.reference + moved)[-reference_examples:]
    return DriftState(reference=reference, recent=recent)


def hard_share(
    state: DriftState, quantile: float = 0.9, recent_examples: int = 256, reference_examples: int = 1024
) -> float | None:
    """Share of the recent losses above the reference window's `quantile`; None until both windows
    are full. About 1 - quantile while the loss distribution holds still, less while it falls."""
    if not 0.0 < quantile < 1.0:
        raise ValueError(f"quantile must be in (0, 1), got {quantile!r}")
    if len(state.recent) < recent_examples or len(state.reference) < reference_examples:
        return None
    threshold = float(np.quantile(np.asarray(state.reference), quantile))
    return float(np.mean(np.asarray(state.recent) > threshold))


def drift_detected(
    state: DriftState, quantile: float = 0.9, rise: float = 0.1, recent_examples: int = 256,
    reference_examples: int = 1024,
) -> bool:
    """True when the hard share exceeds (1 - quantile) + `rise` (by default: more than 20% of the
    recent examples above the reference's 90th percentile; with 256 recent examples the share's
    standard error at 10% is 1.9 points, so that is ~5 standard errors)."""
    share = hard_share(state, quantile, recent_examples, reference_examples)
    return share is not None and share > (1.0 - quantile) + rise
