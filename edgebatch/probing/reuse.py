"""When a cached profile answers a new probe request, and in one line why not. Pure.

The device and model are matched by the profile's file name (fingerprint, memory limit included,
and model key). What is left:
- the search settings that change the answer (ANSWER_SETTINGS; an unrecorded one takes its old
  default, UNRECORDED_SETTINGS; `start` only moves the path). A profile that records no settings
  (an older edgebatch) is not reused.
- the headroom and the safe-batch rule: safe_batch is a pure function of the readings, so a
  profile probed with another headroom, or summarised by an older rule (schema before
  SAFE_RULE_SCHEMA), answers from its readings (answered_from_readings). A per-length profile
  answers only its own headroom.
- the budget. A profile answers every budget up to its own: one below it from its readings
  (budget_answer.py), one up to BUDGET_TOLERANCE_FRACTION above it with its answer as it stands,
  since a default budget (the RAM available now) moves with whatever else runs and fresh
  processes differ by 1-2% in peak memory anyway. A larger budget probes again, and so does a
  per-length profile more than that below its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from edgebatch.settings import malloc_arenas
from edgebatch.probing.outcomes import DEFAULT_TOLERANCE
from edgebatch.profiles.schema import SAFE_RULE_SCHEMA
from edgebatch.settings.threads import UNRECORDED_INTER_OP_THREADS
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
    # glibc's malloc arena limit in the probe's environment (edgebatch/settings/malloc_arenas.py).
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
    cached_per_length: bool = False,
) -> str | None:
    """None when the cached profile answers the request (its own answer, or one read from its
    readings where answered_below says so); else why not, as one line for people."""
    if not cached_search:
        return "it records no search settings (written by an older edgebatch)"
    for name, option in ANSWER_SETTINGS.items():
        cached = cached_search.get(name, UNRECORDED_SETTINGS.get(name))
        requested = requested_search.get(name)
        if cached != requested:
            words = VALUE_TEXT.get(name, str)
            return f"it was probed with {option} {words(cached)}, this probe asks for {words(requested)}"
    if cached_per_length and not _same_headroom(cached_headroom, requested_headroom):
        return (f"it was probed with --headroom {cached_headroom}, this probe asks for {requested_headroom}, "
                "and a probe per length answers only its own")
    return _budget_problem(cached_budget_bytes, requested_budget_bytes, cached_per_length)


def answered_from_readings(cached_budget_bytes: int, requested_budget_bytes: int, cached_per_length: bool = False,
                           same_safe_rule: bool = True) -> bool:
    """Whether a reused profile's answer is read again from its readings (budget_answer.py), rather
    than given as it stands: at a budget below its own, or where its safe batch followed another
    headroom or an older rule (`same_safe_rule` False: safe_rule_matches)."""
    return not cached_per_length and (requested_budget_bytes < cached_budget_bytes or not same_safe_rule)


def safe_rule_matches(cached_schema_version: int, cached_headroom: float, requested_headroom: float) -> bool:
    """Whether the cached safe_batch is the one this request's rule gives: same headroom, and a
    schema that already derived it as summary.safe_batch_of does now."""
    return cached_schema_version >= SAFE_RULE_SCHEMA and _same_headroom(cached_headroom, requested_headroom)


def _same_headroom(cached_headroom: float, requested_headroom: float) -> bool:
    return abs(cached_headroom - requested_headroom) <= 1e-9


def _budget_problem(cached_budget_bytes: int, requested_budget_bytes: int, cached_per_length: bool) -> str | None:
    slack = BUDGET_TOLERANCE_FRACTION * requested_budget_bytes
    if requested_budget_bytes - cached_budget_bytes > slack:
        return (
            f"its budget {format_bytes(cached_budget_bytes)} is below this probe's "
            f"{format_bytes(requested_budget_bytes)} by more than {BUDGET_TOLERANCE_FRACTION:.0%}: "
            "a larger budget needs readings it does not hold"
        )
    if cached_per_length and cached_budget_bytes - requested_budget_bytes > slack:
        return (
            f"its budget {format_bytes(cached_budget_bytes)} differs from this probe's "
            f"{format_bytes(requested_budget_bytes)} by more than {BUDGET_TOLERANCE_FRACTION:.0%}, "
            "and a probe per length answers only its own budget"
        )
    return None
