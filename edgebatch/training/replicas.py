"""Micro-batches over the replicas of a tf.distribute.MirroredStrategy: pure integer decisions.

Under a strategy, fit's micro-batch is the GLOBAL micro-batch: one micro-step runs it on all
replicas at once, each replica on its share. The governor decides once per update in Python, so
every replica applies the same decision; these functions keep that decision legal (no TensorFlow
here; table-tested in tests/test_training_mirrored.py):

- the governor's sizes are multiples of the replica count (GovernorConfig.multiple a multiple of
  it, min_batch at least it), so every governed piece splits evenly (`replica_shares`);
- the per-device ceiling bounds each replica's share, so the global ceiling is the smallest
  per-device ceiling times the replica count (`global_ceiling`): synchronous replicas wait for the
  slowest, and an even split cannot give a larger device more;
- only the last piece of an update can be uneven (the end of an epoch, or an effective batch that
  is not a multiple): shares differ by at most one, a share may be 0, and the update's gradient
  stays exact: each replica adds sum(its losses) / update_examples.
"""

from __future__ import annotations

import numbers
from typing import Any, Sequence

from edgebatch.errors import UsageError

__all__ = [
    "check_governor_for_replicas",
    "global_ceiling",
    "mirrored_governor_config",
    "replica_shares",
    "round_to_replicas",
]


def _positive(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise UsageError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def round_to_replicas(micro_batch: int, replicas: int) -> int:
    """The largest multiple of `replicas` <= `micro_batch`; UsageError when it would be 0.

    >>> round_to_replicas(15, 2)
    14
    """
    micro_batch = _positive("micro_batch", micro_batch)
    replicas = _positive("replicas", replicas)
    if micro_batch < replicas:
        raise UsageError(
            f"a global micro-batch of {micro_batch} cannot give each of the {replicas} replicas an example: "
            f"the ceiling must be at least the replica count"
        )
    return micro_batch - micro_batch % replicas


def replica_shares(piece: int, replicas: int) -> list[int]:
    """Examples of each replica for a global piece: as even as possible, larger shares first.

    >>> replica_shares(8, 2), replica_shares(5, 2), replica_shares(1, 2)
    ([4, 4], [3, 2], [1, 0])
    """
    piece = _positive("piece", piece, 0)
    replicas = _positive("replicas", replicas)
    base, extra = divmod(piece, replicas)
    return [base + (1 if replica < extra else 0) for replica in range(replicas)]


def global_ceiling(per_device_ceilings: Sequence[int]) -> int:
    """The global micro-batch ceiling for synchronous replicas with these per-device ceilings.

    Each replica gets an equal share, so the smallest device bounds them all:
    min(per-device ceilings) x replicas. (Unequal shares that use the larger devices fully are what
    `edgebatch fleet plan` computes; MirroredStrategy in fit splits evenly.)

    >>> global_ceiling([32, 20])
    40
    """
    ceilings = [_positive("per-device ceiling", value) for value in per_device_ceilings]
    if not ceilings:
        raise UsageError("global_ceiling needs at least one per-device ceiling")
    return min(ceilings) * len(ceilings)


def check_governor_for_replicas(config: Any, replicas: int) -> str | None:
    """Why a GovernorConfig cannot drive `replicas` synchronous replicas, or None when it can.

    Its sizes are global micro-batches: they must be multiples of the replica count (multiple),
    never below it (min_batch), and its largest one must give each replica an example.
    """
    replicas = _positive("replicas", replicas)
    if replicas == 1:
        return None
    fix = (f"build it with GovernorConfig(multiple={replicas}, min_batch={replicas}, "
           f"ceiling_batch=<per-device ceiling> x {replicas}, ...) or use mirrored_governor_config")
    if config.multiple % replicas:
        return (f"under MirroredStrategy with {replicas} replicas the governor's micro-batches are global and must be "
                f"multiples of {replicas}, but its multiple is {config.multiple}: {fix}")
    if config.upper_batch < replicas:
        return (f"the governor's largest micro-batch {config.upper_batch} is below the {replicas} replicas "
                f"(each needs an example): {fix}")
    if config.lower_batch < replicas:
        return (f"the governor may shrink to {config.lower_batch}, below the {replicas} replicas "
                f"(min_batch {config.min_batch}): {fix}")
    return None


def mirrored_governor_config(effective_batch: int, replicas: int, ceiling_batch: int | None = None, **options: Any) -> Any:
    """A GovernorConfig for `replicas` synchronous replicas: global sizes in multiples of `replicas`.

    `ceiling_batch` is the GLOBAL ceiling (see `global_ceiling`), default `effective_batch`; it is
    rounded down to a multiple of `replicas` (UsageError when below `replicas`). `options` go to
    GovernorConfig as they are.
    """
    from edgebatch.governor import GovernorConfig

    effective_batch = _positive("effective_batch", effective_batch)
    replicas = _positive("replicas", replicas)
    ceiling = effective_batch if ceiling_batch is None else _positive("ceiling_batch", ceiling_batch)
    ceiling = round_to_replicas(min(ceiling, effective_batch), replicas)
    options.setdefault("multiple", replicas)
    options.setdefault("min_batch", replicas)
    return GovernorConfig(ceiling_batch=ceiling, effective_batch=effective_batch, **options)
