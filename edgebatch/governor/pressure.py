"""The governor's sensor adapter: reads memory sensors now and then, returns Observation fields.

`PressureReader.read()` is called once per optimizer update. It reads at most once every
`every_n_updates` calls AND at most once every `min_interval_seconds` (both must have passed; the
first call always reads), so the sensors cost little however fast the steps are; otherwise it
returns `Observation(pressure=None)`, which the policy treats as "no reading" (see policy.py).
Merge in the step fields yourself: `dataclasses.replace(obs, step_seconds=..., micro_batch=...)`.

Each source (allocator, gpu, host: see PressureReader) gives a pressure and a room reading in a
measure; the observation's pressure is the worst source's (the whole device, for logs), and its
room reading the one with the least room in the reader's `measure`, which the policy decides on.
A source that raises is warned about once (by name) and skipped: a sensor glitch should not end a
training run.
"""

from __future__ import annotations

import math
import numbers
import re
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from edgebatch.governor.records import MEASURES, Observation

__all__ = ["PressureReader", "SourceReading", "SOURCE_NAMES", "parse_device"]

SOURCE_NAMES = ("allocator", "gpu", "host")

_DEVICE = re.compile(r"^(?:/(?:physical_)?device:|/)?(CPU|GPU):(\d+)$", re.IGNORECASE)


def parse_device(device: str) -> tuple[str, int]:
    """('GPU', 1) from 'GPU:1', '/device:GPU:1' or '/GPU:1'; ValueError quoting anything else."""
    match = _DEVICE.match(device.strip()) if isinstance(device, str) else None
    if match is None:
        raise ValueError(f"device must look like 'CPU:0' or 'GPU:1', got {device!r}")
    return match.group(1).upper(), int(match.group(2))


def _is_integer_at_least(value: Any, minimum: int) -> bool:
    return not isinstance(value, bool) and isinstance(value, numbers.Integral) and value >= minimum


@dataclass(frozen=True)
class SourceReading:
    """One source's contribution: pressure (used/limit) and the bytes behind it, in `measure`."""

    name: str
    pressure: float
    limit_bytes: int | None
    used_bytes: int | None  # in use under limit_bytes by everything but this training
    measure: str | None = None
    own_bytes: int | None = None  # this training's bytes in that measure


class PressureReader:
    """Rate-limited worst-of memory pressure for the governor (see the module docstring for when it reads).

    Sources (each a zero-argument callable returning a sensor record or None; tests inject fakes).
    Each reading has a measure: the byte count a memory model of this job would predict there.
    - "allocator": `edgebatch.sensors.read_allocator(device)` -> .current_bytes. Measure
      "allocator_peak". Pressure = current / budget_bytes (on a GPU without a budget: / the GPU's
      NVML total). The allocator holds only this training's memory, so others use 0 under it; own =
      max(current, peak).
    - "gpu" (GPU devices only): `edgebatch.sensors.read_gpu_memory(nvml_index)`. Measure
      "allocator_peak". Pressure = used / total, all processes included; others = used - our
      allocator's peak bytes (TensorFlow's GPU allocator keeps its pool at about the peak, so the peak
      estimates what NVML counts as ours). TensorFlow reserves most of a GPU up front unless memory
      growth is on, which makes this read ~1.0 always: enable memory growth
      (edgebatch.sensors.enable_memory_growth) or leave it out.
    - "host": `edgebatch.sensors.read_host_memory()`. Measure "process_peak". Pressure =
      used_fraction (RAM and cgroup, the worse); limit = limit_bytes; others = (limit -
      available_to_process) - process RSS; own = process RSS. Its PSI `some_avg10` is passed through
      as `psi_some_avg10`.
    The observation's pressure is the worst source's (the whole device, for logs). Its room reading
    (limit_bytes, used_bytes = what others use, measure, own_bytes) is the one with the least room
    (limit - others) among the readings in the reader's `measure` (default: "process_peak" on CPU,
    "allocator_peak" on GPU, the probe's measure there, so a profile's memory model applies to it);
    without a reading in that measure, the worst source's. The policy decides on the room (policy.py),
    not on the whole-device fraction that this job's own cached pools keep high.
    """

    def __init__(
        self,
        device: str = "CPU:0",
        budget_bytes: int | None = None,
        every_n_updates: int = 10,
        min_interval_seconds: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
        sources: Mapping[str, Callable[[], Any]] | None = None,
        measure: str | None = None,
    ) -> None:
        self.device_kind, self.device_index = parse_device(device)
        self.device = f"{self.device_kind}:{self.device_index}"
        if measure is not None and measure not in MEASURES:
            raise ValueError(f"measure must be one of {', '.join(MEASURES)} or None, got {measure!r}")
        #: The measure whose room the observation reports (the memory model's, see the class docstring).
        self.measure = measure or ("process_peak" if self.device_kind == "CPU" else "allocator_peak")
        if budget_bytes is not None and not _is_integer_at_least(budget_bytes, 1):
            raise ValueError(f"budget_bytes must be a positive integer or None, got {budget_bytes!r}")
        if not _is_integer_at_least(every_n_updates, 1):
            raise ValueError(f"every_n_updates must be an integer >= 1, got {every_n_updates!r}")
        if (
            isinstance(min_interval_seconds, bool)
            or not isinstance(min_interval_seconds, numbers.Real)
            or not math.isfinite(min_interval_seconds)
            or min_interval_seconds < 0
        ):
            raise ValueError(f"min_interval_seconds must be a finite number >= 0, got {min_interval_seconds!r}")
        if not callable(clock):
            raise ValueError(f"clock must be callable, got {clock!r}")
        if sources is not None:
            unknown = sorted(set(sources) - set(SOURCE_NAMES))
            if unknown:
                raise ValueError(f"unknown pressure sources {unknown!r}; known: {', '.join(SOURCE_NAMES)}")
            not_callable = sorted(name for name, source in sources.items() if not callable(source))
            if not_callable:
                raise ValueError(f"pressure sources must be callables, got non-callables for {not_callable!r}")
        self.budget_bytes = None if budget_bytes is None else int(budget_bytes)
        self.every_n_updates = int(every_n_updates)
        self.min_interval_seconds = float(min_interval_seconds)
        self._clock = clock
        self._sources: dict[str, Callable[[], Any]] | None = None if sources is None else dict(sources)
        self._calls_since_read = 0
        self._last_read_at: float | None = None
        self._warned: set[str] = set()
        self.reads = 0
        #: The readings behind the last observation that read (by source name), for logs.
        self.last_readings: dict[str, SourceReading] = {}

    def read(self, force: bool = False) -> Observation:
        """Call once per update. An Observation with pressure (and limit/used/PSI) when due or forced;
        Observation(pressure=None) when rate-limited."""
        self._calls_since_read += 1
        now = self._clock()
        due = (
            force
            or self._last_read_at is None
            or (
                self._calls_since_read >= self.every_n_updates
                and now - self._last_read_at >= self.min_interval_seconds
            )
        )
        if not due:
            return Observation(pressure=None)
        self._calls_since_read = 0
        self._last_read_at = now
        self.reads += 1
        return self._read_now()

    def _read_now(self) -> Observation:
        if self._sources is None:
            self._sources = self._default_sources()
        raw = {name: self._call(name, source) for name, source in self._sources.items()}
        readings: dict[str, SourceReading] = {}
        allocator, gpu, host = raw.get("allocator"), raw.get("gpu"), raw.get("host")
        psi_some_avg10 = None
        if allocator is not None:
            limit = self.budget_bytes
            if limit is None and gpu is not None and self.device_kind == "GPU":
                limit = gpu.total_bytes
            if limit:
                own = max(int(allocator.current_bytes), int(allocator.peak_bytes))
                readings["allocator"] = SourceReading(
                    "allocator", allocator.current_bytes / limit, int(limit), 0, "allocator_peak", own
                )
        if gpu is not None and gpu.total_bytes > 0:
            ours = 0
            if allocator is not None and self.device_kind == "GPU":
                ours = max(allocator.current_bytes, allocator.peak_bytes)
            readings["gpu"] = SourceReading(
                "gpu", gpu.used_bytes / gpu.total_bytes, int(gpu.total_bytes),
                max(0, int(gpu.used_bytes) - int(ours)), "allocator_peak", int(ours),
            )
        if host is not None:
            limit = int(host.limit_bytes)
            used = limit - int(host.available_to_process_bytes)
            rss = int(host.process_rss_bytes)
            not_ours = max(0, used - rss)
            readings["host"] = SourceReading(
                "host", float(host.used_fraction), limit if limit > 0 else None, not_ours, "process_peak", rss
            )
            psi = getattr(host, "psi", None)
            if psi is not None and psi.some_avg10 is not None:
                psi_some_avg10 = float(psi.some_avg10)
        self.last_readings = readings
        if not readings:
            return Observation(pressure=None, psi_some_avg10=psi_some_avg10)
        worst = max(readings.values(), key=lambda reading: reading.pressure)
        with_room = [r for r in readings.values() if r.limit_bytes is not None and r.used_bytes is not None]
        matching = [r for r in with_room if r.measure == self.measure]
        if matching:
            binding = min(matching, key=lambda reading: reading.limit_bytes - reading.used_bytes)
        else:
            binding = worst if worst in with_room else None
        return Observation(
            pressure=max(0.0, worst.pressure),
            limit_bytes=None if binding is None else binding.limit_bytes,
            used_bytes=None if binding is None else binding.used_bytes,
            measure=None if binding is None else binding.measure,
            own_bytes=None if binding is None else binding.own_bytes,
            psi_some_avg10=psi_some_avg10,
        )

    def _call(self, name: str, source: Callable[[], Any]) -> Any:
        try:
            return source()
        except Exception as exc:  # noqa: BLE001 - any sensor failure degrades to "no reading"
            if name not in self._warned:
                self._warned.add(name)
                warnings.warn(
                    f"edgebatch: memory source {name!r} failed ({type(exc).__name__}: {exc}); skipping it",
                    RuntimeWarning,
                    stacklevel=3,
                )
            return None

    def _default_sources(self) -> dict[str, Callable[[], Any]]:
        from edgebatch import sensors

        device = self.device
        sources: dict[str, Callable[[], Any]] = {
            "allocator": lambda: sensors.read_allocator(device),
            "host": sensors.read_host_memory,
        }
        if self.device_kind == "GPU":
            nvml_index = self._nvml_index(sensors)
            if nvml_index is not None:
                sources["gpu"] = lambda: sensors.read_gpu_memory(nvml_index)
        return sources

    def _nvml_index(self, sensors: Any) -> int | None:
        """NVML's index for TensorFlow's GPU:<n> (CUDA_VISIBLE_DEVICES renumbers; NVML does not)."""
        import os

        try:
            visible = sensors.visible_nvml_indices(sensors.list_gpus(), os.environ.get("CUDA_VISIBLE_DEVICES"))
        except Exception as exc:  # noqa: BLE001
            warnings.warn(f"edgebatch: cannot map {self.device} to an NVML GPU ({exc}); skipping NVML", RuntimeWarning)
            return None
        return visible[self.device_index] if self.device_index < len(visible) else None
