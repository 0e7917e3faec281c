"""The governor's named records: its configuration, what it observes, what it decides, its state.

Plain frozen dataclasses with no behaviour beyond validation and JSON conversion; the rules that
connect them live in `policy.py` (which re-exports these names). Pure: no TensorFlow, psutil or
pynvml.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, fields
from typing import Any

from edgebatch.errors import UsageError
from edgebatch.governor.sizes import legal_at_least, legal_at_most

__all__ = [
    "Decision",
    "GovernorConfig",
    "GovernorConfigError",
    "GovernorState",
    "LR_SCALINGS",
    "MEASURES",
    "MODES",
    "Observation",
]

MODES = ("fixed", "elastic")
LR_SCALINGS = ("none", "linear", "sqrt")
# What a byte count measures: the process's peak RSS (the probe's measure on CPU) or TensorFlow's
# allocator peak (on GPU). A memory model predicts one of them and is only comparable with a room
# read in the same measure.
MEASURES = ("process_peak", "allocator_peak")


class GovernorConfigError(UsageError, ValueError):
    """A governor setting is out of range. A UsageError (CLI exit 2) that is also a ValueError."""


def _integer(owner: Any, name: str, minimum: int, error: type[Exception], optional: bool = False) -> None:
    value = getattr(owner, name)
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise error(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise error(f"{name} must be >= {minimum}, got {value!r}")
    # numpy integers would make to_dict/json.dumps fail later: keep plain ints.
    object.__setattr__(owner, name, int(value))


def _real(
    owner: Any,
    name: str,
    error: type[Exception],
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    optional: bool = False,
) -> None:
    value = getattr(owner, name)
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise error(f"{name} must be a finite number, got {value!r}")
    too_low = low is not None and (value <= low if low_open else value < low)
    too_high = high is not None and (value >= high if high_open else value > high)
    if too_low or too_high:
        left = "(" if low_open else "["
        right = ")" if high_open else "]"
        span = f"{left}{'-inf' if low is None else low}, {'inf' if high is None else high}{right}"
        raise error(f"{name} must be in {span}, got {value!r}")
    object.__setattr__(owner, name, float(value))


@dataclass(frozen=True)
class GovernorConfig:
    """How the governor sizes micro-batches. Every field is checked on construction.

    See `policy.py` for the exact rules each field feeds. `psi_some_avg10_threshold` is an addition
    to the agreed API: memory PSI `some avg10` at or above it (percent of the last 10 s in which some
    task stalled on memory: the kernel is reclaiming hard) counts as pressure above the shrink
    threshold. Also added: `model_measure` (what the memory model predicts: "process_peak" or
    "allocator_peak", as a DeviceProfile's `measure`; it is applied only to readings in that
    measure), `extra_bytes` (memory `fit` adds that the probe's step did not have: gradient
    accumulators, the read-ahead buffer), `hard_limit_fraction` (a predicted load above it shrinks
    at once, even in a cooldown), and the OOM threshold's `threshold_safe_fraction` and
    `threshold_expiry_updates`.
    """

    ceiling_batch: int
    effective_batch: int
    min_batch: int = 1
    mode: str = "fixed"
    elastic_floor_batch: int | None = None
    lr_scaling: str = "none"
    grow_below_pressure: float = 0.60
    grow_patience: int = 5
    shrink_above_pressure: float = 0.90
    cooldown_updates: int = 20
    max_grow_factor: float = 2.0
    max_shrink_factor: float = 0.5
    oom_shrink_factor: float = 0.5
    slow_step_factor: float = 2.0
    slow_step_window: int = 20
    slow_step_patience: int = 2  # consecutive slow steps at one size before they count as pressure
    fixed_bytes: float | None = None
    per_sample_bytes: float | None = None
    target_pressure: float = 0.80
    multiple: int = 1
    psi_some_avg10_threshold: float = 10.0
    model_measure: str | None = None  # what fixed/per_sample_bytes predict; None: any reading
    extra_bytes: float = 0.0  # memory the model leaves out (fit's accumulators, read-ahead)
    hard_limit_fraction: float = 0.97  # predicted footprint above this share of the room: shrink now
    threshold_safe_fraction: float = 0.75  # below this share of an OOM threshold, grow multiplicatively
    threshold_expiry_updates: int = 500  # calm updates after which an OOM threshold is forgotten

    def __post_init__(self) -> None:
        err = GovernorConfigError
        _integer(self, "ceiling_batch", 1, err)
        _integer(self, "effective_batch", 1, err)
        _integer(self, "min_batch", 1, err)
        _integer(self, "multiple", 1, err)
        if self.mode not in MODES:
            raise err(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.lr_scaling not in LR_SCALINGS:
            raise err(f"lr_scaling must be one of {', '.join(LR_SCALINGS)}, got {self.lr_scaling!r}")
        _integer(self, "elastic_floor_batch", 1, err, optional=True)
        # In fixed mode these would be silently ignored; a setting that does nothing is a bug report.
        if self.mode != "elastic" and self.elastic_floor_batch is not None:
            raise err(f"elastic_floor_batch applies only to mode='elastic', got {self.elastic_floor_batch!r}")
        if self.mode != "elastic" and self.lr_scaling != "none":
            raise err(f"lr_scaling applies only to mode='elastic', got {self.lr_scaling!r}")
        if self.elastic_floor_batch is not None and self.elastic_floor_batch > self.effective_batch:
            raise err(
                f"elastic_floor_batch must be <= effective_batch ({self.effective_batch}), "
                f"got {self.elastic_floor_batch!r}"
            )
        _real(self, "shrink_above_pressure", err, low=0.0, low_open=True)
        _real(self, "grow_below_pressure", err, low=0.0, high=self.shrink_above_pressure, low_open=True, high_open=True)
        _integer(self, "grow_patience", 1, err)
        _integer(self, "cooldown_updates", 0, err)
        _real(self, "max_grow_factor", err, low=1.0, low_open=True)
        _real(self, "max_shrink_factor", err, low=0.0, high=1.0, low_open=True, high_open=True)
        _real(self, "oom_shrink_factor", err, low=0.0, high=1.0, low_open=True, high_open=True)
        _real(self, "slow_step_factor", err, low=1.0, low_open=True)
        # The median needs 3 samples at one size (see policy.py), so a shorter window never fires.
        _integer(self, "slow_step_window", 3, err)
        _integer(self, "slow_step_patience", 1, err)
        _real(self, "fixed_bytes", err, low=0.0, optional=True)
        _real(self, "per_sample_bytes", err, low=0.0, low_open=True, optional=True)
        if (self.fixed_bytes is None) != (self.per_sample_bytes is None):
            raise err(
                "fixed_bytes and per_sample_bytes come together (a memory model), got "
                f"fixed_bytes={self.fixed_bytes!r}, per_sample_bytes={self.per_sample_bytes!r}"
            )
        # Aiming the model at or above the shrink threshold would grow straight into a shrink.
        _real(self, "target_pressure", err, low=0.0, high=1.0, low_open=True)
        if self.target_pressure >= self.shrink_above_pressure:
            raise err(
                f"target_pressure must be below shrink_above_pressure ({self.shrink_above_pressure}), "
                f"got {self.target_pressure!r}"
            )
        _real(self, "psi_some_avg10_threshold", err, low=0.0, high=100.0, low_open=True)
        if self.model_measure is not None and self.model_measure not in MEASURES:
            raise err(f"model_measure must be one of {', '.join(MEASURES)} or None, got {self.model_measure!r}")
        _real(self, "extra_bytes", err, low=0.0)
        # At or below the target a growth to the model's fit would be shrunk straight back.
        _real(self, "hard_limit_fraction", err, low=self.target_pressure, high=1.0, low_open=True)
        _real(self, "threshold_safe_fraction", err, low=0.0, high=1.0, low_open=True, high_open=True)
        _integer(self, "threshold_expiry_updates", 1, err)
        if not self.has_memory_model and (self.model_measure is not None or self.extra_bytes > 0):
            raise err(
                "model_measure and extra_bytes need a memory model (fixed_bytes, per_sample_bytes), got "
                f"model_measure={self.model_measure!r}, extra_bytes={self.extra_bytes!r}"
            )
        if self.lower_batch > self.upper_batch:
            raise err(
                f"no micro-batch size is possible: min_batch {self.min_batch} (a multiple of {self.multiple} "
                f"once >= it: {self.lower_batch}) exceeds min(ceiling_batch {self.ceiling_batch}, "
                f"effective_batch {self.effective_batch}) rounded down to a legal size ({self.upper_batch})"
            )

    @property
    def upper_batch(self) -> int:
        """The largest micro-batch the governor uses: min(ceiling, effective batch), made legal.

        Above the effective batch a micro-batch would only be cut back to it (fixed mode) or exceed
        the target (elastic mode), so the effective batch bounds the micro-batch as well.
        """
        return legal_at_most(min(self.ceiling_batch, self.effective_batch), self.multiple)

    @property
    def lower_batch(self) -> int:
        """The smallest micro-batch the governor uses: min_batch, made legal (rounded up)."""
        return legal_at_least(self.min_batch, self.multiple)

    @property
    def has_memory_model(self) -> bool:
        return self.fixed_bytes is not None and self.per_sample_bytes is not None


@dataclass(frozen=True)
class Observation:
    """What the training loop saw since the last observation. All fields optional except pressure.

    `pressure`: the worst used/limit fraction of the whole device among the memory sensors, None
    when not read this time (rate-limited); the policy decides on it only when there is no room
    reading. A room reading is `limit_bytes` with `used_bytes`: the bytes in use under that limit
    by everything except this training (others), in `measure` ("process_peak": RSS against host
    or cgroup memory; "allocator_peak": TensorFlow's allocator against a GPU), so the room this job
    has is limit - used; `PressureReader` reports it so. `own_bytes`: this job's memory in that
    measure (logs only: pools keep it high whatever the micro-batch needs). `oom`: a micro-batch of
    `micro_batch` examples raised ResourceExhaustedError (or the process died of it) while the
    loop was splitting updates into pieces of `running_micro_batch` (None: see policy.py).
    """

    pressure: float | None
    oom: bool = False
    step_seconds: float | None = None
    micro_batch: int | None = None
    limit_bytes: int | None = None
    used_bytes: int | None = None
    psi_some_avg10: float | None = None
    measure: str | None = None
    own_bytes: int | None = None
    running_micro_batch: int | None = None

    def __post_init__(self) -> None:
        _real(self, "pressure", ValueError, low=0.0, optional=True)
        if not isinstance(self.oom, bool):
            raise ValueError(f"oom must be a bool, got {self.oom!r}")
        _real(self, "step_seconds", ValueError, low=0.0, optional=True)
        _integer(self, "micro_batch", 1, ValueError, optional=True)
        _integer(self, "limit_bytes", 1, ValueError, optional=True)
        _integer(self, "used_bytes", 0, ValueError, optional=True)
        _real(self, "psi_some_avg10", ValueError, low=0.0, optional=True)
        if self.measure is not None and self.measure not in MEASURES:
            raise ValueError(f"measure must be one of {', '.join(MEASURES)} or None, got {self.measure!r}")
        _integer(self, "own_bytes", 0, ValueError, optional=True)
        _integer(self, "running_micro_batch", 1, ValueError, optional=True)

    @property
    def room_bytes(self) -> int | None:
        """What others leave this job under the limit (limit - used), None without a room reading."""
        if self.limit_bytes is None or self.used_bytes is None:
            return None
        return self.limit_bytes - self.used_bytes


@dataclass(frozen=True)
class Decision:
    """What to run next. `exhausted` (an addition): an OOM came at the smallest micro-batch allowed."""

    micro_batch: int
    accumulation_steps: int
    effective_batch: int
    lr_scale: float
    reason: str
    changed: bool
    exhausted: bool = False


_STATE_INTS = ("micro_batch", "calm_streak", "cooldown_left", "updates", "oom_count")
# Added after the first release: a state dict without them (an older checkpoint) loads with these.
_STATE_DEFAULTS = {"threshold_batch": None, "threshold_calm_updates": 0, "oom_cooldown": False}


@dataclass(frozen=True)
class GovernorState:
    """Everything the governor remembers between observations; JSON-able through to_dict/from_dict.

    `recent_step_seconds`: the last `slow_step_window` (micro_batch, seconds) pairs, oldest first.
    `threshold_batch`: the smallest micro-batch that ran out of memory since the threshold was last
    forgotten (TCP's ssthresh), None when there is none; `threshold_calm_updates` counts the calm
    updates towards forgetting it; `oom_cooldown`: the cooldown running was started by an OOM.
    """

    micro_batch: int
    calm_streak: int
    cooldown_left: int
    updates: int
    recent_step_seconds: tuple[tuple[int, float], ...]
    oom_count: int
    last_reason: str
    threshold_batch: int | None = None
    threshold_calm_updates: int = 0
    oom_cooldown: bool = False

    def to_dict(self) -> dict:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["recent_step_seconds"] = [[batch, seconds] for batch, seconds in self.recent_step_seconds]
        return data

    @classmethod
    def from_dict(cls, d: dict) -> GovernorState:
        """Rebuild a state from `to_dict` output; ValueError naming the key on anything malformed."""
        if not isinstance(d, dict):
            raise ValueError(f"governor state must be a dict, got {d!r}")
        missing = [f.name for f in fields(cls) if f.name not in d and f.name not in _STATE_DEFAULTS]
        if missing:
            raise ValueError(f"governor state lacks {', '.join(missing)}: got keys {sorted(d)!r}")
        d = {**_STATE_DEFAULTS, **d}
        values: dict[str, Any] = {}
        for name in _STATE_INTS + ("threshold_calm_updates",):
            value = d[name]
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
                raise ValueError(f"governor state {name} must be an integer >= 0, got {value!r}")
            values[name] = int(value)
        if values["micro_batch"] < 1:
            raise ValueError(f"governor state micro_batch must be >= 1, got {d['micro_batch']!r}")
        threshold = d["threshold_batch"]
        if threshold is not None and (
            isinstance(threshold, bool) or not isinstance(threshold, numbers.Integral) or threshold < 1
        ):
            raise ValueError(f"governor state threshold_batch must be an integer >= 1 or null, got {threshold!r}")
        values["threshold_batch"] = None if threshold is None else int(threshold)
        if not isinstance(d["oom_cooldown"], bool):
            raise ValueError(f"governor state oom_cooldown must be a bool, got {d['oom_cooldown']!r}")
        values["oom_cooldown"] = d["oom_cooldown"]
        if not isinstance(d["last_reason"], str):
            raise ValueError(f"governor state last_reason must be a string, got {d['last_reason']!r}")
        recent = d["recent_step_seconds"]
        if not isinstance(recent, (list, tuple)):
            raise ValueError(f"governor state recent_step_seconds must be a list, got {recent!r}")
        pairs = []
        for pair in recent:
            try:
                batch, seconds = pair
                ok = (not isinstance(batch, bool) and isinstance(batch, numbers.Integral) and batch >= 1
                      and isinstance(seconds, numbers.Real) and math.isfinite(seconds) and seconds >= 0)
            except (TypeError, ValueError):
                ok = False
            if not ok:
                raise ValueError(f"governor state recent_step_seconds entries must be [batch, seconds], got {pair!r}")
            pairs.append((int(batch), float(seconds)))
        return cls(recent_step_seconds=tuple(pairs), last_reason=d["last_reason"], **values)
