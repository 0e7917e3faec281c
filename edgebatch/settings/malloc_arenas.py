"""glibc's malloc arena limit (MALLOC_ARENA_MAX) as a profile records it.

On some hosts one batch peaks at two levels between new processes, by how glibc splits memory
between its malloc arenas; one arena steadies most processes, not all (docs/probe-evidence.md,
"Probing per sequence length" and "Bumps"). The probe's workers inherit the environment, so
`MALLOC_ARENA_MAX=1 edgebatch probe ...` measures one-arena processes. The profile records the
setting (`search.malloc_arena_max`; None: glibc's own default), a cached profile is reused only
under the same one (probing/reuse.py), and its ceilings hold for training started under it
(`MALLOC_ARENA_MAX=1 python train.py`: glibc reads it once, when the process starts).
Governor.from_profile and LengthCeilings.from_profile warn (`warn_on_mismatch`, through
edgebatch/settings/__init__.py) when the training process runs under another setting than the
profile's.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from typing import Any

ENV_NAME = "MALLOC_ARENA_MAX"


def malloc_arena_max_in_effect(environ: Mapping[str, str] | None = None) -> int | None:
    """MALLOC_ARENA_MAX as glibc reads it: a positive whole number, else None (glibc's default;
    glibc ignores 0 and what is not a number)."""
    value = (os.environ if environ is None else environ).get(ENV_NAME, "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def describe(recorded: int | None) -> str:
    """A recorded setting for people: '1 (MALLOC_ARENA_MAX=1)' or glibc's default."""
    return "glibc's default (MALLOC_ARENA_MAX unset)" if recorded is None else f"{recorded} ({ENV_NAME}={recorded})"


def mismatch(recorded: int | None, running: int | None) -> str | None:
    """One line when ceilings measured under arena limit `recorded` are applied in a process running
    under `running`; None when they agree. Pure."""
    if recorded == running:
        return None
    fix = f"start training with {ENV_NAME}={recorded}" if recorded is not None else f"start training without {ENV_NAME}"
    return (
        f"the profile's ceilings were measured with malloc arena limit {describe(recorded)} and this process runs "
        f"with {describe(running)}: {fix}, or the peaks may differ from the profile's "
        f"(docs/probe-evidence.md, \"Probing per sequence length\")"
    )


def warn_on_mismatch(profile: Any, environ: Mapping[str, str] | None = None, stacklevel: int = 3) -> str | None:
    """Warn (one line, returned too) when this process runs under another arena limit than `profile`
    (duck-typed DeviceProfile) was measured with. A profile that did not record it counts as
    measured under glibc's default; an object without `search` is not checked."""
    search = getattr(profile, "search", None)
    if not isinstance(search, Mapping):
        return None
    line = mismatch(search.get("malloc_arena_max"), malloc_arena_max_in_effect(environ))
    if line is not None:
        warnings.warn(line, stacklevel=stacklevel)
    return line
