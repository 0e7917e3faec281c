"""Fault injection: make chosen micro-batch executions fail as if they ran out of memory.

A real out-of-memory takes ~10 s to surface on CPU and cannot be placed at an exact step
(docs/tensorflow-memory.md#address-space-caps), so OOM recovery is tested by declaring which
micro-batch executions must fail:

- the environment: `EDGEBATCH_INJECT_OOM=2,5,6` fails the 2nd, 5th and 6th micro-batch executions
  counted over the whole process (every attempt counts, including retries of a failed piece);
- in code: `with inject_oom([2, 5, 6]): fit(...)` fails the 2nd, 5th and 6th executions counted
  from the moment the block is entered (so a test does not depend on what ran before it).

The training loop calls `next_injected_oom()` once before each micro-batch execution; when it
returns a message the loop raises `tf.errors.ResourceExhaustedError` with it instead of running the
micro-batch, so an injected failure takes the same recovery path as a real one and has no side
effects on the model. Pure Python: no TensorFlow here.
"""

from __future__ import annotations

import contextlib
import numbers
import os
from typing import Iterable, Iterator

from edgebatch.errors import UsageError

__all__ = ["ENV_INJECT_OOM", "inject_oom", "injected_oom_plan", "next_injected_oom", "parse_oom_indices"]

ENV_INJECT_OOM = "EDGEBATCH_INJECT_OOM"

# Micro-batch executions counted in this process (attempts, failed or not).
_executions = 0
# Active `inject_oom` blocks: (executions when the block was entered, indices relative to that).
_scopes: list[tuple[int, frozenset[int]]] = []
# The last environment text parsed and its result, so the per-micro-batch check costs a dict lookup.
_env_cache: tuple[str, frozenset[int]] = ("", frozenset())


def parse_oom_indices(text: str, source: str = ENV_INJECT_OOM) -> frozenset[int]:
    """`"2,5,6"` -> {2, 5, 6}; an empty or blank text -> no index. UsageError quoting anything else."""
    if not isinstance(text, str):
        raise UsageError(f"{source} must be a string like '2,5,6', got {text!r}")
    indices = set()
    for part in text.split(","):
        part = part.strip()
        if not part and not text.strip():
            continue
        if not (part.isascii() and part.isdigit()) or int(part) < 1:
            raise UsageError(
                f"{source} must list 1-based micro-batch numbers separated by commas, like '2,5,6'; "
                f"got {text!r} (bad entry {part!r})"
            )
        indices.add(int(part))
    return frozenset(indices)


def injected_oom_plan() -> frozenset[int]:
    """The indices `EDGEBATCH_INJECT_OOM` asks for now (parsed and validated; UsageError if malformed).

    The training loop calls this once at the start so a typo fails the run before any work, not at
    the first micro-batch.
    """
    global _env_cache
    text = os.environ.get(ENV_INJECT_OOM, "")
    if text != _env_cache[0]:
        _env_cache = (text, parse_oom_indices(text))
    return _env_cache[1]


def next_injected_oom() -> str | None:
    """Count one micro-batch execution; return why it must fail, or None to run it."""
    global _executions
    _executions += 1
    if _executions in injected_oom_plan():
        return f"injected OOM: {ENV_INJECT_OOM} lists micro-batch execution {_executions} of this process"
    for entered_at, indices in _scopes:
        relative = _executions - entered_at
        if relative in indices:
            return f"injected OOM: inject_oom({sorted(indices)}) lists micro-batch execution {relative} of the block"
    return None


@contextlib.contextmanager
def inject_oom(indices: Iterable[int]) -> Iterator[frozenset[int]]:
    """Within the block, the micro-batch executions numbered `indices` (1-based, counted from the
    block's start) fail with an injected ResourceExhaustedError. Blocks may nest.

    Args:
        indices: micro-batch executions to fail, e.g. [2, 5, 6].

    Yields:
        The set of numbers it injects.

    Raises:
        UsageError: `indices` is not a collection of integers >= 1.
    """
    if isinstance(indices, (str, bytes)):
        raise UsageError(f"inject_oom takes micro-batch numbers like [2, 5, 6], got {indices!r}")
    try:
        values = list(indices)
    except TypeError:
        raise UsageError(f"inject_oom takes micro-batch numbers like [2, 5, 6], got {indices!r}") from None
    for value in values:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise UsageError(f"inject_oom takes 1-based micro-batch numbers (integers >= 1), got {indices!r}")
    scope = (_executions, frozenset(int(value) for value in values))
    _scopes.append(scope)
    try:
        yield scope[1]
    finally:
        _scopes.remove(scope)
