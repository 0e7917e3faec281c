"""When a cached profile answers a new probe request, and in one line why not.

Pure: plain values in, a reason (or None) out. The device and the model are already matched by the
profile's file name (device fingerprint, which includes the memory limit that applies, and model
key); what is left is everything else that changes the answer:

- the search settings: the batch limit, the multiple, the strategy, the steps and seconds a trial
  runs, TensorFlow's inter-op threads in the workers (a profile without the field was measured
  with TensorFlow's own pool, 0), the fresh readings of the answer (without the field: 1), glibc's
  malloc arena limit in the probe's environment (without the field: unset), the search's tolerance
  (without the field: 2%), and the headroom (it decides `safe_batch`). `start` is left out:
  it changes where the search begins, not where it ends. A profile that records no `search`
  settings (written by a version before they were recorded) is not reused.
- the budget, explicit or default, within BUDGET_TOLERANCE_FRACTION. A default budget is the RAM
  available when the probe starts, which moves with whatever else runs; within 3% the profile's
  trials still bracket the answer (fresh processes differ by 1-2% in peak memory anyway, see
  device_profiles/README.md), beyond it the answer moves by about as much.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from edgebatch import malloc_arenas
from edgebatch.probing.outcomes import DEFAULT_TOLERANCE
from edgebatch.threads import UNRECORDED_INTER_OP_THREADS
from edgebatch.units import format_bytes

BUDGET_TOLERANCE_FRACTION = 0.03

# Settings recorded in a profile's `search` dict that change its answer, with their names for people.
ANSWER_SETTINGS = {
    "max_batch_limit": "--max-batch-limit",
    "multiple": "--multiple",
    "strategy": "--strategy",
    "steps_per_trial": "--steps-per-trial",
    "trial_seconds": "--trial-seconds",
    # A probe per sequence length records its lengths (the model key holds them too).
    "seq_lens": "--seq-lens",
    "inter_op_threads": "--inter-op-threads",
    "answer_readings": "--answer-readings",
    "tolerance": "--tolerance",
    # glibc's malloc arena limit in the probe's environment (edgebatch/malloc_arenas.py).
    "malloc_arena_max": "the malloc arena limit",
}
# What a setting was when a profile does not record it: written before the setting existed (the
# answer was read once before repeats were made).
# How a setting's value reads in the one-line reason, where str() does not say it.
VALUE_TEXT = {"malloc_arena_max": malloc_arenas.describe}
UNRECORDED_SETTINGS = {"inter_op_threads": UNRECORDED_INTER_OP_THREADS, "answer_readings": 1, "malloc_arena_max": None,
                       # Always 2% before it could be set.
                       "tolerance": DEFAULT_TOLERANCE}


def reuse_problem(
    *,
    cached_search: Mapping[str, Any] | None,
    cached_headroom: float,
    cached_budget_bytes: int,
    requested_search: Mapping[str, Any],
    requested_headroom: float,
    requested_budget_bytes: int,
) -> str | None:
    """None when the cached profile answers the request; else why not, as one line for people."""
    if not cached_search:
        return "it records no search settings (written by an older edgebatch)"
    for name, option in ANSWER_SETTINGS.items():
        cached = cached_search.get(name, UNRECORDED_SETTINGS.get(name))
        requested = requested_search.get(name)
        if cached != requested:
            words = VALUE_TEXT.get(name, str)
            return f"it was probed with {option} {words(cached)}, this probe asks for {words(requested)}"
    if abs(cached_headroom - requested_headroom) > 1e-9:
        return f"it was probed with --headroom {cached_headroom}, this probe asks for {requested_headroom}"
    if abs(cached_budget_bytes - requested_budget_bytes) > BUDGET_TOLERANCE_FRACTION * requested_budget_bytes:
        return (
            f"its budget {format_bytes(cached_budget_bytes)} differs from this probe's "
            f"{format_bytes(requested_budget_bytes)} by more than {BUDGET_TOLERANCE_FRACTION:.0%}"
        )
    return None
