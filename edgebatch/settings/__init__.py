"""Process settings a profile's ceilings hold under, and the check where training takes them.

A probe's peaks depend on settings of the process beside the model: TensorFlow's inter-op threads
(threads.py) and glibc's malloc arena limit (malloc_arenas.py). The profile records both;
Governor.from_profile and LengthCeilings.from_profile call `warn_on_mismatches`, so a training
process running otherwise hears it once, one line per setting. A setting recorded later belongs
here too. Importing this package does not import TensorFlow.
"""

from __future__ import annotations

from typing import Any

from edgebatch.settings import malloc_arenas, threads


def warn_on_mismatches(profile: Any) -> list[str]:
    """Warn for each setting this process runs otherwise than `profile` (duck-typed DeviceProfile)
    was measured with, pointing at the caller of the from_profile that called this; the lines."""
    lines = [threads.warn_on_mismatch(profile, stacklevel=4),
             malloc_arenas.warn_on_mismatch(profile, stacklevel=4)]
    return [line for line in lines if line is not None]
