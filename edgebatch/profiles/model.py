"""The device profile as named records: what a batch-size probe found, in memory.

A profile is plain data (no TensorFlow, no I/O): the probe builds one, `store.save_profile` writes it,
and everything that reads it gets the same frozen records back. `to_dict`/`from_dict` are the only
bridge to JSON; `from_dict` validates first so a hand-edited or truncated file never becomes a
half-filled record.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

# The schema owns the version and imports nothing from here, so the records sit above it (no cycle).
from edgebatch.profiles.schema import validate_profile_dict


@dataclass(frozen=True)
class Trial:
    """One batch size the probe tried (or ruled out from the memory model without running it).

    `error` is None for a successful trial, else one of "oom", "over_budget", "worker_killed",
    "predicted_over_budget", or the message of whatever else went wrong.
    `peak_bytes` is the figure compared with the budget: the process resident peak on CPU, the
    allocator peak on GPU (the profile's `measure` says which).
    """

    batch: int
    ok: bool
    error: str | None
    peak_bytes: int | None
    process_peak_bytes: int | None
    allocator_peak_bytes: int | None
    step_seconds: float | None
    samples_per_second: float | None
    measured: bool = True
    fresh: bool = False
    settled: bool | None = None
    # False when samples_per_second timed the warm-up step (one step longer than trial_seconds):
    # not steady-state throughput. None when not recorded (older profiles, trials that did not run).
    steady: bool | None = None
    # The sequence length (tokens) of the trial's examples in a probe per length; None otherwise.
    seq_len: int | None = None
    # The trial's worker: True when forked from the probe's fork server, False when a new process
    # (as training is); None when not recorded (older profiles record it on fresh trials only).
    forked: bool | None = None


@dataclass(frozen=True)
class MemoryModel:
    """Least-squares line peak_bytes = fixed_bytes + per_sample_bytes x batch over successful trials.

    Peak memory is linear in batch to within ~13 MiB over a wide range, with steps and dips of
    +-40 MiB at fine scale (docs/tensorflow-memory.md#mobilenetv2-line and the sections after it),
    so the line predicts the neighbourhood of the ceiling, not the ceiling itself; the probe still
    has to try batches near the boundary.
    """

    fixed_bytes: float
    per_sample_bytes: float
    r2: float
    points: int

    def predict_bytes(self, batch: int) -> float:
        """Predicted peak bytes at `batch`."""
        if isinstance(batch, bool) or batch < 0:
            raise ValueError(f"batch must be a non-negative integer, got {batch!r}")
        return self.fixed_bytes + self.per_sample_bytes * batch

    def batch_for_bytes(self, budget_bytes: float) -> int:
        """Largest batch whose predicted peak fits in `budget_bytes` (0 if none does).

        Raises ValueError when the line does not grow with batch (per_sample_bytes <= 0): such a fit
        bounds nothing, and returning a huge number would read as "any batch fits".
        """
        if isinstance(budget_bytes, bool) or not math.isfinite(budget_bytes):
            raise ValueError(f"budget_bytes must be a finite number, got {budget_bytes!r}")
        if not self.per_sample_bytes > 0:
            raise ValueError(
                f"memory model does not grow with batch (per_sample_bytes={self.per_sample_bytes!r}): "
                "it cannot bound the batch size"
            )
        if self.fixed_bytes > budget_bytes:
            return 0
        batch = int((budget_bytes - self.fixed_bytes) // self.per_sample_bytes)
        # Floor division of floats can land one off either way; settle on the exact boundary.
        while batch > 0 and self.predict_bytes(batch) > budget_bytes:
            batch -= 1
        while self.predict_bytes(batch + 1) <= budget_bytes:
            batch += 1
        return batch


@dataclass(frozen=True)
class LengthCeiling:
    """The answer at one sequence length of a probe per length (`DeviceProfile.per_length`).

    `peak_bytes` is the measured peak of the trial at `max_batch`; `measured` is False only for a
    prediction from the token memory model (probing/token_fit.ceiling_at_length), never stored.
    """

    max_batch: int
    safe_batch: int
    peak_bytes: int | None
    measured: bool = True


@dataclass(frozen=True)
class TokenMemoryModel:
    """peak_bytes = fixed_bytes + per_token_bytes x B x L + per_token_squared_bytes x B x L^2.

    B is the batch, L the sequence length in tokens; least squares over the trials of every probed
    length (probing/token_fit.py). `lengths` are the lengths whose readings were fitted.
    """

    fixed_bytes: float
    per_token_bytes: float
    per_token_squared_bytes: float
    r2: float
    points: int
    lengths: tuple[int, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.lengths, tuple):
            object.__setattr__(self, "lengths", tuple(self.lengths))

    def per_sample_bytes(self, length: int) -> float:
        """What one more sample of `length` tokens adds to the peak."""
        return self.per_token_bytes * length + self.per_token_squared_bytes * length * length

    def predict_bytes(self, batch: int, length: int) -> float:
        return self.fixed_bytes + self.per_sample_bytes(length) * batch

    def line_at(self, length: int) -> MemoryModel:
        """The model at one length as a line in batch, the form the search steers by."""
        return MemoryModel(
            fixed_bytes=self.fixed_bytes, per_sample_bytes=self.per_sample_bytes(length), r2=self.r2, points=self.points
        )

    def batch_for_bytes(self, budget_bytes: float, length: int) -> int:
        """Largest batch of `length`-token samples whose predicted peak fits `budget_bytes` (0 if none)."""
        return self.line_at(length).batch_for_bytes(budget_bytes)


@dataclass(frozen=True)
class DeviceProfile:
    """The cached result of one probe: one device (fingerprint) x one model (key).

    Field meanings, units and how each is measured: device_profiles/README.md.
    """

    schema_version: int
    created_at: str
    versions: dict
    device: dict
    model: dict
    budget_bytes: int
    budget_source: str
    measure: str
    headroom: float
    max_batch: int
    safe_batch: int
    throughput_knee: int | None
    memory_model: MemoryModel | None
    predicted_ceiling: int | None
    trials: tuple[Trial, ...]
    probe_seconds: float
    search: dict
    # A probe per sequence length (schema 2): length -> its ceiling, and the token memory model
    # fitted over every length. None for other probes and in schema-1 files. The fields above are
    # then the answer at the longest length, which every shorter length fits too.
    per_length: dict[int, LengthCeiling] | None = None
    token_model: TokenMemoryModel | None = None

    def __post_init__(self) -> None:
        # A probe naturally collects trials in a list; store a tuple whatever was passed, so the
        # record cannot change under whoever holds it and equality does not depend on list/tuple.
        if not isinstance(self.trials, tuple):
            object.__setattr__(self, "trials", tuple(self.trials))

    @property
    def answer_trials(self) -> tuple[Trial, ...]:
        """The trials the top-level answer was read from: a probe per length's longest length, else all.

        Batches of different lengths do not share a memory or throughput curve, so plots, fleet
        reports and plans read these.
        """
        if not self.per_length:
            return self.trials
        longest = max(self.per_length)
        return tuple(trial for trial in self.trials if trial.seq_len == longest)

    @property
    def device_fingerprint(self) -> str:
        return self.device["fingerprint"]

    @property
    def model_key(self) -> str:
        return self.model["key"]

    @property
    def path_name(self) -> str:
        """The file name this profile is stored under: `<device fingerprint>__<model key>.json`."""
        return f"{self.device['fingerprint']}__{self.model['key']}.json"

    def to_dict(self) -> dict:
        """A JSON-ready dict (plain Python types only) in the layout of the profile file."""
        data = {
            "schema_version": self.schema_version,
            "created_at": self.created_at,
            "versions": copy.deepcopy(self.versions),
            "device": copy.deepcopy(self.device),
            "model": copy.deepcopy(self.model),
            "budget_bytes": self.budget_bytes,
            "budget_source": self.budget_source,
            "measure": self.measure,
            "headroom": self.headroom,
            "max_batch": self.max_batch,
            "safe_batch": self.safe_batch,
            "throughput_knee": self.throughput_knee,
            "memory_model": None if self.memory_model is None else _memory_model_dict(self.memory_model),
            "predicted_ceiling": self.predicted_ceiling,
            "trials": [_trial_dict(trial) for trial in self.trials],
            "probe_seconds": self.probe_seconds,
            "search": copy.deepcopy(self.search),
        }
        if self.per_length is not None:
            data["per_length"] = {
                str(length): {"max_batch": c.max_batch, "safe_batch": c.safe_batch, "peak_bytes": c.peak_bytes}
                for length, c in sorted(self.per_length.items())
            }
        if self.token_model is not None:
            data["token_model"] = _token_model_dict(self.token_model)
        return _plain(data)

    @classmethod
    def from_dict(cls, data: dict, source: str = "<memory>") -> DeviceProfile:
        """Validate `data` (see schema.validate_profile_dict) and build the profile.

        `source` names where the data came from (a file path) in the ProfileError if it is invalid.
        """
        validate_profile_dict(data, source=source)
        memory_model = data["memory_model"]
        return cls(
            schema_version=data["schema_version"],
            created_at=data["created_at"],
            versions=copy.deepcopy(data["versions"]),
            device=copy.deepcopy(data["device"]),
            model=copy.deepcopy(data["model"]),
            budget_bytes=data["budget_bytes"],
            budget_source=data["budget_source"],
            measure=data["measure"],
            headroom=float(data["headroom"]),
            max_batch=data["max_batch"],
            safe_batch=data["safe_batch"],
            throughput_knee=data["throughput_knee"],
            memory_model=None
            if memory_model is None
            else MemoryModel(
                fixed_bytes=float(memory_model["fixed_bytes"]),
                per_sample_bytes=float(memory_model["per_sample_bytes"]),
                r2=float(memory_model["r2"]),
                points=memory_model["points"],
            ),
            predicted_ceiling=data["predicted_ceiling"],
            trials=tuple(_trial_from_dict(trial) for trial in data["trials"]),
            probe_seconds=float(data["probe_seconds"]),
            search=copy.deepcopy(data["search"]),
            per_length=None
            if data.get("per_length") is None
            else {
                int(length): LengthCeiling(entry["max_batch"], entry["safe_batch"], entry["peak_bytes"])
                for length, entry in data["per_length"].items()
            },
            token_model=None if data.get("token_model") is None else _token_model_from_dict(data["token_model"]),
        )


def utc_now_iso() -> str:
    """Now as ISO-8601 UTC to the second, the form `created_at` takes: 'YYYY-MM-DDThh:mm:ssZ'."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _trial_dict(trial: Trial) -> dict:
    return {
        "batch": trial.batch,
        "ok": trial.ok,
        "error": trial.error,
        "peak_bytes": trial.peak_bytes,
        "process_peak_bytes": trial.process_peak_bytes,
        "allocator_peak_bytes": trial.allocator_peak_bytes,
        "step_seconds": trial.step_seconds,
        "samples_per_second": trial.samples_per_second,
        "measured": trial.measured,
        "fresh": trial.fresh,
        "settled": trial.settled,
        "steady": trial.steady,
        **({"seq_len": trial.seq_len} if trial.seq_len is not None else {}),
        **({"forked": trial.forked} if trial.forked is not None else {}),
    }


def _trial_from_dict(data: dict) -> Trial:
    def _float_or_none(value: Any) -> float | None:
        return None if value is None else float(value)

    return Trial(
        batch=data["batch"],
        ok=data["ok"],
        error=data["error"],
        peak_bytes=data["peak_bytes"],
        process_peak_bytes=data["process_peak_bytes"],
        allocator_peak_bytes=data["allocator_peak_bytes"],
        step_seconds=_float_or_none(data["step_seconds"]),
        samples_per_second=_float_or_none(data["samples_per_second"]),
        # Optional in the file: a trial that does not say was measured (the common case).
        measured=data.get("measured", True),
        # Optional too: profiles written before edgebatch recorded it.
        fresh=data.get("fresh", False),
        settled=data.get("settled"),
        steady=data.get("steady"),
        seq_len=data.get("seq_len"),
        forked=data.get("forked"),
    )


def _memory_model_dict(memory_model: MemoryModel) -> dict:
    return {
        "fixed_bytes": memory_model.fixed_bytes,
        "per_sample_bytes": memory_model.per_sample_bytes,
        "r2": memory_model.r2,
        "points": memory_model.points,
    }


def _token_model_dict(model: TokenMemoryModel) -> dict:
    return {
        "fixed_bytes": model.fixed_bytes,
        "per_token_bytes": model.per_token_bytes,
        "per_token_squared_bytes": model.per_token_squared_bytes,
        "r2": model.r2,
        "points": model.points,
        "lengths": list(model.lengths),
    }


def _token_model_from_dict(data: dict) -> TokenMemoryModel:
    return TokenMemoryModel(
        fixed_bytes=float(data["fixed_bytes"]),
        per_token_bytes=float(data["per_token_bytes"]),
        per_token_squared_bytes=float(data["per_token_squared_bytes"]),
        r2=float(data["r2"]),
        points=data["points"],
        lengths=tuple(data["lengths"]),
    )


def _plain(value: Any) -> Any:
    """Turn tuples into lists and NumPy scalars/arrays into Python ones, so the dict is JSON-ready.

    The probe computes batches and peaks with NumPy; an `np.int64` would otherwise fail JSON
    encoding and JSON Schema's "integer" check. Anything else is left as is for validation to judge.
    """
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if type(value).__module__ == "numpy" and hasattr(value, "tolist"):
        return value.tolist()
    return value
