"""The record one probe's steps share (api.run_probe): the request as resolved, and what the scout said.

It is built once the scout names its model, before its trace, so that a cached profile can answer
then (api._reused); the scout's facts are added once it is ready. build_profile.py builds the
profile from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from edgebatch.probing.budget import Budget, DeviceFacts
from edgebatch.probing.worker import BASELINE_FIELDS

if TYPE_CHECKING:
    from edgebatch.probing.api import ProbeRequest


@dataclass(frozen=True, kw_only=True)
class ProbeRun:
    """One probe: what was asked, of which device and model, and where its profiles live.

    `model_facts` are the ready scout's facts (worker.py): None until then, while a cached profile
    may still answer without them.
    """

    request: ProbeRequest
    # The lengths of a probe per length (per_length.resolve_lengths); None for a plain probe.
    lengths: tuple[int, ...] | None
    device: str
    facts: DeviceFacts  # completed from the scout's GPU details where NVML sees none
    budget: Budget
    directory: Path
    name: str
    fingerprint: str
    key: str
    model_facts: dict | None = None

    @property
    def measure(self) -> str:
        """What the worker's trials measure (worker.measure_of)."""
        return self.model_facts["measure"]

    @property
    def baseline_bytes(self) -> int | None:
        """What the worker holds before any trial batch, by that measure: where one-shot estimators start."""
        return self.model_facts.get(BASELINE_FIELDS[self.measure])
