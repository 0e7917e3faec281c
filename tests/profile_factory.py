"""A valid DeviceProfile for tests to start from: `make_profile(**overrides)`.

The numbers are the MobileNetV2 (96x96x3) CPU measurements in
docs/tensorflow-memory.md#mobilenetv2-line, so a test that reads them sees realistic magnitudes.
Overrides replace top-level fields; for the dict fields (versions, device, model, search) an
override dict is MERGED into the default one, so `make_profile(device={"kind": "GPU"})` changes only
the kind. The device fingerprint and model key are derived from the facts unless given explicitly.
"""

from __future__ import annotations

import dataclasses

from edgebatch.profiles import (
    SCHEMA_VERSION,
    DeviceProfile,
    MemoryModel,
    Trial,
    config_hash,
    device_fingerprint,
    model_key,
    save_profile,
)

MIB = 1024**2
GIB = 1024**3

_DICT_FIELDS = ("versions", "device", "model", "search")


def make_trial(batch: int, peak_mib: float | None, *, ok: bool = True, error: str | None = None,
               step_seconds: float | None = None, measured: bool = True) -> Trial:
    """A CPU trial whose peak is the process peak, with the allocator peak ~850 MiB lower.

    See docs/tensorflow-memory.md#mobilenetv2-line.
    """
    peak_bytes = None if peak_mib is None else int(peak_mib * MIB)
    return Trial(
        batch=batch,
        ok=ok,
        error=error,
        peak_bytes=peak_bytes,
        process_peak_bytes=peak_bytes,
        allocator_peak_bytes=None if peak_bytes is None else max(0, peak_bytes - 850 * MIB),
        step_seconds=step_seconds,
        samples_per_second=None if not step_seconds else batch / step_seconds,
        measured=measured,
    )


def default_trials() -> tuple[Trial, ...]:
    return (
        make_trial(8, 953, step_seconds=0.13),
        make_trial(16, 1035, step_seconds=0.20),
        make_trial(32, 1209, step_seconds=0.32),
        make_trial(64, 1593, step_seconds=0.71),
        make_trial(128, 2341, ok=False, error="over_budget", step_seconds=1.66),
        make_trial(256, None, ok=False, error="predicted_over_budget", measured=False),
    )


def make_profile(**overrides) -> DeviceProfile:
    versions = {"edgebatch": "0.1.0", "tensorflow": "2.21.0", "keras": "3.15.1", "python": "3.11.9"}
    device = {
        "kind": "CPU",
        "tf_device": "CPU:0",
        "description": "AMD EPYC 7763 64-Core Processor",
        "cores": 2,
        "memory_total_bytes": 24 * GIB,
        "driver_version": None,
        "compute_capability": None,
    }
    model = {
        "name": "mobilenet_v2",
        "config_hash": config_hash({"name": "mobilenet_v2", "alpha": 1.0, "classes": 10}),
        "inputs": [{"shape": [96, 96, 3], "dtype": "float32"}],
        "precision": "float32",
        "optimizer": "adam",
        "parameters": 2_270_794,
        "keras_flavor": "keras3",
    }
    search = {"strategy": "slow_start", "start": 8, "multiple": 1, "max_batch_limit": 4096, "steps_per_trial": 3}
    merged = {"versions": versions, "device": device, "model": model, "search": search}
    for name in _DICT_FIELDS:
        merged[name] = {**merged[name], **overrides.pop(name, {})}
    device, model = merged["device"], merged["model"]
    device.setdefault(
        "fingerprint",
        device_fingerprint(
            device["kind"], device["description"], device["cores"], device["memory_total_bytes"],
            device["driver_version"],
        ),
    )
    model.setdefault(
        "key",
        model_key(
            model["name"], model["config_hash"], model["inputs"], model["precision"], model["optimizer"],
            merged["versions"]["tensorflow"],
        ),
    )
    fields = {
        "schema_version": SCHEMA_VERSION,
        "created_at": "2025-06-01T12:00:00Z",
        **merged,
        "budget_bytes": 2 * GIB,
        "budget_source": "cli",
        "measure": "process_peak",
        "headroom": 0.1,
        "max_batch": 64,
        "safe_batch": 64,
        "throughput_knee": 32,
        "memory_model": MemoryModel(fixed_bytes=849 * MIB, per_sample_bytes=11.6 * MIB, r2=0.9991, points=4),
        "predicted_ceiling": 103,
        "trials": default_trials(),
        "probe_seconds": 41.5,
    }
    unknown = set(overrides) - {field.name for field in dataclasses.fields(DeviceProfile)}
    if unknown:
        raise TypeError(f"make_profile got unknown fields {sorted(unknown)}")
    fields.update(overrides)
    return DeviceProfile(**fields)


def write_repeatedly(profiles_dir: str, probe_seconds: float, times: int) -> None:
    """Save the default profile `times` times, tagged by probe_seconds (a multiprocessing target)."""
    profile = make_profile(probe_seconds=probe_seconds)
    for _ in range(times):
        save_profile(profile, profiles_dir)
