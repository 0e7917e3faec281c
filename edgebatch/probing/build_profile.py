"""The DeviceProfile a finished search gives: api.run_probe's last step before it saves.

summary.py reads the numbers from the trials (safe batch, throughput knee, memory line; per
length, per_length.py); this puts them together with what the probe knows of the device, the
model and the request (probe_run.ProbeRun), judged against the budget's fit figure.
"""

from __future__ import annotations

import dataclasses
import platform
from datetime import datetime, timezone
from importlib import metadata

from edgebatch.errors import ProbeError
from edgebatch.probing import per_length, summary
from edgebatch.probing.probe_run import ProbeRun
from edgebatch.profiles import SCHEMA_VERSION, DeviceProfile, MemoryModel, Trial
from edgebatch.units import format_bytes


def profile_of(run: ProbeRun, found, probe_seconds: float) -> DeviceProfile:
    """The profile of what the search `found`: per_length.search_lengths' results for a probe per
    length, else run_search's (trials, Done). No batch that fits is a ProbeError."""
    if run.lengths:
        return per_length_profile(run, found, probe_seconds)
    trials, final = found
    if final.max_batch is None:
        raise ProbeError(
            f"no batch of {run.request.multiple} or more fits the budget of {format_bytes(run.budget.bytes)} on "
            f"{run.device}: raise --memory-budget, use a smaller model or input, or lower --multiple"
        )
    return build_profile(run, trials, final.max_batch, probe_seconds)


def per_length_profile(run: ProbeRun, by_length: dict[int, tuple[list[Trial], int | None]],
                       probe_seconds: float) -> DeviceProfile:
    """The profile of a probe per length: the longest length's answer on top, every length in `per_length`."""
    request = run.request
    missing = [length for length, (_, max_batch) in by_length.items() if max_batch is None]
    if missing:
        raise ProbeError(
            f"no batch of {request.multiple} or more fits the budget of {format_bytes(run.budget.bytes)} on "
            f"{run.device} at {missing[0]} tokens: raise --memory-budget, probe shorter --seq-lens, or lower --multiple"
        )
    lengths_summary = per_length.summarise_lengths(by_length, run.budget.fit_bytes, request.headroom, request.multiple)
    longest = max(by_length)
    trials = [trial for length_trials, _ in by_length.values() for trial in length_trials]
    profile = build_profile(run, by_length[longest][0], by_length[longest][1], probe_seconds,
                            model=lengths_summary.lines[longest])
    return dataclasses.replace(
        profile, trials=tuple(trials), per_length=lengths_summary.per_length, token_model=lengths_summary.token_model
    )


def build_profile(run: ProbeRun, trials: list[Trial], max_batch: int, probe_seconds: float,
                  model: MemoryModel | None = None) -> DeviceProfile:
    """The profile of `trials`; `model` (a probe per length: the line at its longest length) replaces their own."""
    request, fit_budget = run.request, run.budget.fit_bytes
    model = model if model is not None else summary.memory_model_of(trials)
    # One reading of the trials for both: the safe batch stays under the search's answer and under
    # every failure that counts (summary.safe_batch_of), with no fallback of its own.
    safe = summary.safe_batch_of(trials, fit_budget, request.headroom, request.multiple, model, max_batch)
    predicted = model.batch_for_bytes(fit_budget) if model is not None and model.per_sample_bytes > 0 else None
    return DeviceProfile(
        schema_version=SCHEMA_VERSION,
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        versions=_versions(run),
        device=_device(run),
        model={
            "key": run.key,
            "name": run.name,
            "config_hash": run.model_facts["config_hash"],
            "inputs": run.model_facts["inputs"],
            "precision": request.precision,
            "optimizer": request.optimizer,
            "optimize": request.optimize,
            "parameters": run.model_facts["parameters"],
            "keras_flavor": run.model_facts["keras_flavor"],
        },
        budget_bytes=run.budget.bytes,
        budget_source=run.budget.source,
        measure=run.measure,
        headroom=request.headroom,
        max_batch=max_batch,
        safe_batch=safe if safe is not None else request.multiple,  # None only when no fit lies below a failure
        throughput_knee=summary.throughput_knee_of(trials, fit_budget),
        memory_model=model,
        predicted_ceiling=predicted,
        trials=tuple(trials),
        probe_seconds=round(probe_seconds, 2),
        search=request.search_settings(run.lengths),
    )


def _versions(run: ProbeRun) -> dict:
    return {
        "edgebatch": _version("edgebatch"),
        "tensorflow": run.model_facts["tensorflow"],
        "keras": _version("keras"),
        "python": platform.python_version(),
        # The packages a TFMOT probe's model came from (package metadata: no import here).
        **({"tf_keras": _version("tf-keras"), "tensorflow_model_optimization": _version("tensorflow-model-optimization")}
           if run.request.optimize != "none" else {}),
    }


def _device(run: ProbeRun) -> dict:
    facts = run.facts
    return {
        "fingerprint": run.fingerprint,
        "kind": facts.kind,
        "tf_device": run.device,
        "description": facts.description,
        "cores": facts.cores,
        "memory_total_bytes": facts.memory_total_bytes,
        "memory_limit_bytes": facts.memory_limit_bytes,
        "driver_version": facts.driver_version,
        "compute_capability": facts.compute_capability,
    }


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None
