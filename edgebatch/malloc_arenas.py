"""glibc's malloc arena limit (MALLOC_ARENA_MAX) as a profile records it.

On some hosts one batch peaks at two levels between new processes, by how glibc splits memory
between its malloc arenas: transformer_tiny at 307 x 128 tokens (Intel Xeon) read 1,495 MiB in
six processes of eight and 1,550 MiB in two as it is, and 1,481 MiB in all eight with
`MALLOC_ARENA_MAX=1`; small_cnn on an AMD EPYC host likewise (device_profiles/README.md,
"Probing per sequence length" and "Bumps"). The probe's workers inherit the environment, so
`MALLOC_ARENA_MAX=1 edgebatch probe ...` measures one-arena processes. The profile records the
setting (`search.malloc_arena_max`; None: glibc's own default), a cached profile is reused only
under the same one (probing/reuse.py), and its ceilings hold for training started under it
(`MALLOC_ARENA_MAX=1 python train.py`: glibc reads it once, when the process starts).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

ENV_NAME = "MALLOC_ARENA_MAX"


def malloc_arena_max_in_effect(environ: Mapping[str, str] | None = None) -> int | None:
    """MALLOC_ARENA_MAX as glibc reads it: a positive whole number, else None (glibc's default;
    glibc ignores 0 and what is not a number)."""
    value = (os.environ if environ is None else environ).get(ENV_NAME, "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def describe(recorded: int | None) -> str:
    """A recorded setting for people: '1 (MALLOC_ARENA_MAX=1)' or glibc's default."""
    return "glibc's default (MALLOC_ARENA_MAX unset)" if recorded is None else f"{recorded} ({ENV_NAME}={recorded})"
