"""Micro-batch ceilings by sequence length: how many examples of a given length one piece may hold.

A probe per length (`edgebatch probe --seq-lens`, probing/per_length.py) finds a ceiling at each
probed length: at 64 tokens a transformer fits several times the batch it fits at 512. `fit` trains
variable-length examples sorted by length within each update (sequences.py); with a
`LengthCeilings` it cuts the update into pieces whose size follows the length of the examples in
them, instead of one micro-batch size for every piece.

The rules, all pure (no TensorFlow): buckets come from the probed lengths and nothing between them
is predicted (`ceiling_at`); the governor's micro-batch is a share of every length's ceiling
(`piece_limit`); a piece that runs out of memory is told to the governor in its units
(`governor_size`); `split` cuts an update into pieces: with a `piece_cost` (from a profile's step
times) where the predicted time is least (piece_cost.py), else each piece as large as it may be.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from edgebatch.errors import UsageError
from edgebatch.training.piece_cost import PieceCost

__all__ = ["LengthCeilings"]


@dataclass(frozen=True)
class LengthCeilings:
    """Ceilings (examples per micro-batch) at probed sequence lengths (tokens), ascending by length;
    `piece_cost`, when known, says where to cut an update (split)."""

    table: tuple[tuple[int, int], ...]
    piece_cost: PieceCost | None = None

    def __post_init__(self) -> None:
        if not self.table:
            raise UsageError("length ceilings need at least one (length, ceiling) pair")
        lengths = [length for length, _ in self.table]
        if lengths != sorted(set(lengths)):
            raise UsageError(f"length ceilings must have distinct lengths in ascending order, got {lengths}")
        for length, ceiling in self.table:
            for name, value in (("length", length), ("ceiling", ceiling)):
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise UsageError(f"length ceilings: every {name} must be an integer >= 1, got {value!r}")

    @classmethod
    def from_mapping(cls, ceilings: Mapping[int, int]) -> LengthCeilings:
        """From {length in tokens: micro-batch ceiling}, e.g. {64: 120, 256: 40}."""
        return cls(tuple(sorted((int(length), int(ceiling)) for length, ceiling in ceilings.items())))

    @classmethod
    def from_profile(cls, profile: Any, *, use_max_batch: bool = False) -> LengthCeilings:
        """From a probe per length's profile (`DeviceProfile.per_length`): each length's safe_batch,
        or its max_batch with `use_max_batch` (as Governor.from_profile chooses its ceiling). Warns,
        as Governor.from_profile does, when this process runs another inter-op or malloc arena
        setting than the profile was measured with. The probe's step times at its lengths give
        `piece_cost` (None where too few trials were timed)."""
        from edgebatch.settings import warn_on_mismatches

        warn_on_mismatches(profile)
        per_length = getattr(profile, "per_length", None)
        if not per_length:
            raise UsageError(
                "this profile has no per-length ceilings: probe the model with --seq-lens "
                "(e.g. edgebatch probe --model transformer_tiny --seq-lens 64,128,256)"
            )
        which = "max_batch" if use_max_batch else "safe_batch"
        table = {}
        for length, entry in per_length.items():
            ceiling = getattr(entry, which)
            if ceiling is None:
                raise UsageError(f"the profile has no {which} at length {length}: probe that length again")
            table[int(length)] = int(ceiling)
        ceilings = cls.from_mapping(table)
        return dataclasses.replace(ceilings, piece_cost=PieceCost.from_trials(getattr(profile, "trials", ())))

    @property
    def reference_ceiling(self) -> int:
        """The largest ceiling in the table (the shortest length's): fit's default governor's
        ceiling_batch, which gives the governor its finest steps."""
        return max(ceiling for _, ceiling in self.table)

    def ceiling_at(self, length: int) -> int:
        """The ceiling for a piece whose longest example has `length` tokens.

        The probed lengths are the bucket boundaries: an example of L tokens falls in the bucket of
        the shortest probed length >= L and gets that length's ceiling. A piece is padded only to
        its own longest example, never past its bucket's boundary, so it needs at most the memory
        the probe measured at that boundary (memory grows with length). No prediction between
        probed lengths is trusted: the token memory model put an unprobed length 5.9% low in
        BENCHMARKS.md, which would be an unsafe ceiling.

        Beyond the longest probed length `Lmax` the ceiling is C(Lmax) x (Lmax / L)^2, rounded down
        (at least 1). Per-example memory of the form a x L + b x L^2 (a, b >= 0: the token memory
        model's form) grows by at most (L / Lmax)^2 from Lmax to L, so this never exceeds the real
        ceiling.
        """
        for boundary, ceiling in self.table:
            if length <= boundary:
                return ceiling
        longest, ceiling = self.table[-1]
        return max(1, math.floor(ceiling * (longest / length) ** 2))

    def piece_limit(self, governor_micro_batch: int, length: int, upper: int) -> int:
        """Examples a piece may hold when its longest example has `length` tokens: the governor's
        share (micro-batch over `upper`) of that length's ceiling, never above the ceiling itself,
        at least 1.

        The governor keeps deciding one number, its micro-batch g, and g over the largest it may
        decide (`upper`: the smaller of its ceiling_batch and effective batch) is the share of memory
        it allows: the same share of the ceiling at every length. Without pressure that is each
        length's whole ceiling; under pressure every length's pieces shrink with g. The finer the
        governor's steps, the further a piece of short examples can shrink before g reaches 1: fit's
        default governor has ceiling_batch = `reference_ceiling`.
        """
        ceiling = self.ceiling_at(length)
        return max(1, min(ceiling, math.floor(governor_micro_batch * ceiling / upper)))

    def governor_size(self, examples: int, length: int, running_micro_batch: int, upper: int) -> int:
        """A piece of `examples` at `length` in the governor's units (at most `running_micro_batch`):
        n examples at length L count as n / C(L) x upper, rounded up. How a piece that ran out of
        memory is told to the governor."""
        size = math.ceil(examples * upper / self.ceiling_at(length))
        return max(1, min(size, running_micro_batch))

    def split(self, lengths: Sequence[int], governor_micro_batch: int, upper: int,
              max_examples: int | None = None) -> list[int]:
        """Piece sizes for consecutive examples of these lengths, each at most the limit at its
        longest example and at most `max_examples`; they sum to len(lengths). fit passes an update in
        order of length, where cutting packs best.

        With a `piece_cost` the cut has the least predicted time (PieceCost.cut: a piece is cut where
        padding it would cost more than another step); without one each piece is as large as it may
        be (greedy), whatever its padding.

        With an adaptive batch `max_examples` is the controller's bound that keeps at least two
        pieces per update (training/adaptive.py), which the governor's share alone does not give
        where the short lengths' ceilings hold a whole update."""
        cap = math.inf if max_examples is None else max(1, int(max_examples))

        def limit_at(length: int) -> int:
            return int(min(cap, self.piece_limit(governor_micro_batch, length, upper)))

        if self.piece_cost is not None:
            return self.piece_cost.cut(lengths, limit_at)
        sizes = []
        start = 0
        while start < len(lengths):
            size, longest = 1, lengths[start]
            while start + size < len(lengths):
                longer = max(longest, lengths[start + size])
                if size + 1 > limit_at(longer):
                    break
                size, longest = size + 1, longer
            sizes.append(size)
            start += size
        return sizes
