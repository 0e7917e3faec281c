"""The stateful wrapper the training loop holds: `Governor.observe` applies `policy.step`.

It adds what a loop needs around the pure core: the current decision, a history of every change
(for logs, TensorBoard and the run report), checkpointing, and construction from a device profile.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any

from edgebatch.governor.policy import (
    Decision,
    GovernorConfig,
    GovernorConfigError,
    GovernorState,
    Observation,
    decision_for,
    initial_state,
    step,
)
from edgebatch.governor.sizes import legal_at_most
from edgebatch.settings import warn_on_mismatches

__all__ = ["Governor", "trainable_bytes"]

STATE_DICT_VERSION = 1


class Governor:
    """Holds a GovernorConfig, the current GovernorState and Decision, and the change history.

    `history` lists one dict per changed (or exhausted) decision: update, reason, micro_batch,
    accumulation_steps, effective_batch, lr_scale, pressure, oom.
    """

    def __init__(self, config: GovernorConfig, start_micro_batch: int | None = None) -> None:
        if not isinstance(config, GovernorConfig):
            raise GovernorConfigError(f"config must be a GovernorConfig, got {config!r}")
        self.config = config
        self.reset(start_micro_batch)

    def reset(self, start_micro_batch: int | None = None) -> None:
        """Start over (a new fit): fresh state, empty history, no remembered memory reading."""
        self.state: GovernorState = initial_state(self.config, start_micro_batch)
        self.decision: Decision = decision_for(self.config, self.state)
        self.history: list[dict[str, Any]] = []
        # The last limit/used bytes seen, so an OOM (reported without a reading) can still use the
        # memory model; a stale reading can only lower an OOM shrink further, never raise it.
        self._last_limit_bytes: int | None = None
        self._last_used_bytes: int | None = None
        self._last_measure: str | None = None

    def observe(self, observation: Observation) -> Decision:
        """Apply one observation (one per optimizer update, or an OOM at any time); return the decision."""
        if observation.limit_bytes is not None and observation.used_bytes is not None:
            self._last_limit_bytes = observation.limit_bytes
            self._last_used_bytes = observation.used_bytes
            self._last_measure = observation.measure
        self.state, self.decision = step(self.config, self.state, observation)
        if self.decision.changed or self.decision.exhausted:
            entry = _history_entry(self.state.updates, self.decision, observation.pressure, observation.oom)
            self.history.append(entry)
        return self.decision

    def on_oom(
        self,
        micro_batch: int,
        *,
        limit_bytes: int | None = None,
        used_bytes: int | None = None,
        running_micro_batch: int | None = None,
        measure: str | None = None,
    ) -> Decision:
        """A micro-batch of `micro_batch` examples ran out of memory: shrink now.

        `running_micro_batch`: the size the update was being split into when that piece failed
        (say 32 when the 4-example remainder of [32, 32, 32, 4] failed); by default a piece smaller
        than the current decision counts as a remainder of it (policy.py). Uses the last memory
        reading observed unless `limit_bytes`/`used_bytes` (in `measure`) are given. Check
        `decision.exhausted`: True means even the smallest micro-batch failed.
        """
        if limit_bytes is None or used_bytes is None:
            limit_bytes, used_bytes = self._last_limit_bytes, self._last_used_bytes
            measure = self._last_measure
        observation = Observation(
            pressure=None, oom=True, micro_batch=micro_batch, limit_bytes=limit_bytes, used_bytes=used_bytes,
            measure=measure, running_micro_batch=running_micro_batch,
        )
        return self.observe(observation)

    def state_dict(self) -> dict:
        """JSON-able snapshot for a checkpoint: state, history and the config it ran under."""
        return {
            "version": STATE_DICT_VERSION,
            "config": dataclasses.asdict(self.config),
            "state": self.state.to_dict(),
            "history": [dict(entry) for entry in self.history],
        }

    def load_state_dict(self, d: dict) -> None:
        """Restore a `state_dict` under this governor's config (which may differ: a resumed run).

        A micro-batch that is not legal under the current config (say, resumed on a smaller device)
        is lowered to the largest legal size below it; that counts as a change and starts the cooldown.
        """
        if not isinstance(d, dict) or "state" not in d:
            raise ValueError(f"governor state_dict must be a dict with a 'state' key, got {d!r}")
        if d.get("version", STATE_DICT_VERSION) > STATE_DICT_VERSION:
            raise ValueError(f"governor state_dict version {d['version']!r} is newer than {STATE_DICT_VERSION}")
        state = GovernorState.from_dict(d["state"])
        history = list(d.get("history", []))
        saved = state.micro_batch
        fitted = min(max(legal_at_most(saved, self.config.multiple), self.config.lower_batch), self.config.upper_batch)
        if fitted != saved:
            reason = f"resume: {saved} -> {fitted} (allowed {self.config.lower_batch}..{self.config.upper_batch})"
            state = dataclasses.replace(
                state, micro_batch=fitted, calm_streak=0, cooldown_left=self.config.cooldown_updates, last_reason=reason
            )
            decision = dataclasses.replace(decision_for(self.config, state), reason=reason, changed=True)
            history.append(_history_entry(state.updates, decision, pressure=None, oom=False))
        else:
            decision = decision_for(self.config, state)
        self.state, self.decision, self.history = state, decision, history

    @classmethod
    def from_profile(
        cls,
        profile: Any,
        effective_batch: int,
        *,
        use_max_batch: bool = False,
        model: Any = None,
        extra_bytes: float = 0.0,
        **config_overrides: Any,
    ) -> Governor:
        """A governor for `profile` (duck-typed DeviceProfile) training with `effective_batch`.

        Its ceiling is the profile's safe_batch, its memory model the profile's line in the
        profile's measure (applied only to the sensor that reads that measure: process RSS on CPU,
        allocator bytes on GPU), and it starts at min(effective_batch, ceiling). It warns when
        TensorFlow here runs another inter-op setting (edgebatch.settings.threads), or this process another
        malloc arena limit (edgebatch.settings.malloc_arenas), than the profile was measured with.

        Args:
            profile: a DeviceProfile (edgebatch.probe, edgebatch.cached_profile, or load_profile).
            effective_batch: examples per update.
            use_max_batch: take profile.max_batch as the ceiling instead of safe_batch.
            model: the Keras model to train: fit holds one gradient accumulator per trainable
                weight beside the probe's plain step, and the governor counts it.
            extra_bytes: any other memory training holds beside the step (a read-ahead buffer).
            **config_overrides: GovernorConfig fields; they win over what the profile says.

        Returns:
            A Governor in "fixed" mode for fit.

        Raises:
            GovernorConfigError: no ceiling in the profile, a negative extra_bytes, or an override
                GovernorConfig refuses.

        Example (runs in tests/test_docstring_examples.py):
            >>> import glob
            >>> from edgebatch import Governor
            >>> from edgebatch.profiles import load_profile
            >>> profile = load_profile(sorted(glob.glob("device_profiles/*mobilenet_v2*.json"))[0])
            >>> governor = Governor.from_profile(profile, effective_batch=4096)
            >>> governor.config.ceiling_batch == profile.safe_batch, governor.config.effective_batch
            (True, 4096)
        """
        ceiling = profile.max_batch if use_max_batch else profile.safe_batch
        warn_on_mismatches(profile)
        if ceiling is None:
            which = "max_batch" if use_max_batch else "safe_batch"
            raise GovernorConfigError(f"profile has no {which} to use as the ceiling, got {ceiling!r}")
        if isinstance(extra_bytes, bool) or not isinstance(extra_bytes, numbers.Real) or not extra_bytes >= 0:
            raise GovernorConfigError(f"extra_bytes must be a number >= 0, got {extra_bytes!r}")
        settings: dict[str, Any] = {"ceiling_batch": ceiling, "effective_batch": effective_batch}
        memory_model = getattr(profile, "memory_model", None)
        per_sample = getattr(memory_model, "per_sample_bytes", None)
        # A line that does not grow with batch cannot size anything (GovernorConfig refuses it). A
        # least-squares intercept can come out slightly negative; 0 is the conservative reading.
        if memory_model is not None and per_sample is not None and per_sample > 0:
            settings["fixed_bytes"] = max(0.0, float(memory_model.fixed_bytes))
            settings["per_sample_bytes"] = float(per_sample)
            settings["model_measure"] = getattr(profile, "measure", None)
            accumulators = 0 if model is None else trainable_bytes(model)
            settings["extra_bytes"] = float(extra_bytes) + accumulators
        settings.update(config_overrides)
        config = GovernorConfig(**settings)
        start = min(config.effective_batch, config.ceiling_batch)
        return cls(config, start_micro_batch=max(start, config.min_batch))


def trainable_bytes(model: Any) -> int:
    """Bytes of one copy of `model.trainable_variables` (what fit's gradient accumulators hold).

    Duck-typed (no TensorFlow import): each variable needs a fully known `.shape` and a `.dtype`
    that is a dtype name (Keras 3) or has `.size` in bytes (tf.DType).
    """
    import numpy as np

    variables = getattr(model, "trainable_variables", None)
    if variables is None:
        raise GovernorConfigError(f"model must have trainable_variables, got {model!r}")
    total = 0
    for variable in variables:
        dtype = variable.dtype
        itemsize = dtype.size if hasattr(dtype, "size") and not isinstance(dtype, str) else np.dtype(dtype).itemsize
        total += int(np.prod([int(dim) for dim in variable.shape], dtype=np.int64)) * int(itemsize)
    return total


def _history_entry(update: int, decision: Decision, pressure: float | None, oom: bool) -> dict[str, Any]:
    return {
        "update": update,
        "reason": decision.reason,
        "micro_batch": decision.micro_batch,
        "accumulation_steps": decision.accumulation_steps,
        "effective_batch": decision.effective_batch,
        "lr_scale": decision.lr_scale,
        "pressure": pressure,
        "oom": oom,
    }
