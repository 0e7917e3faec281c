"""Checkpoints that let governed training resume at the next unprocessed example.

One `tf.train.Checkpoint` holds the model, the optimizer, the data position (epoch, examples
consumed in it, updates, examples seen), the governor's state as a JSON string variable, the base
learning rate (the optimizer's own variable holds the *scaled* one in elastic mode), the model's
own variables one by one (`_model_variables`: BatchNormalization statistics, every Keras 3
SeedGenerator's state) and TensorFlow's global `tf.random.Generator`, so a resumed run draws the
same dropout masks and noise as an uninterrupted one. Not saved: stateful random ops without a
generator (tf.random.uniform in a layer), which Keras 3 layers do not use. All of it in one
checkpoint means a kill between two writes can never pair a model with another update's governor
or position. Written only at update boundaries, where the gradient accumulators are zero. With an
adaptive batch it also holds the controller's state and the previous update's gradient
(`extra_variables`); such a checkpoint and one without them do not restore into each other.
"""

from __future__ import annotations

import json
import math
from typing import Any

from dataclasses import dataclass

from edgebatch.errors import TrainingError
from edgebatch.training.records import Progress

__all__ = ["Restored", "TrainingCheckpoint"]


@dataclass(frozen=True)
class Restored:
    """What a checkpoint gave back besides the variables it restored in place."""

    progress: Progress
    governor_state: dict | None
    base_learning_rate: float | None
    adapt_state: dict | None = None


def _model_variables(model: Any) -> list:
    """Every trainable and non-trainable variable of the model, in the model's order.

    A Keras 3 model contributes no variables of its own to a tf.train.Checkpoint (its trainable
    ones reach the checkpoint only through the optimizer), so BatchNormalization's moving
    statistics and the SeedGenerator states (Keras 3 lists them as non-trainable variables)
    are saved through this list. Metric variables are left out: compile creates them late.
    """
    import tensorflow as tf

    variables = list(model.trainable_variables) + list(model.non_trainable_variables)
    # Keras 3's TensorFlow variable wraps a tf.Variable in `.value` (tf_keras's are tf.Variables).
    return [variable if isinstance(variable, tf.Variable) else variable.value for variable in variables]


class TrainingCheckpoint:
    """Save and restore (model, optimizer, Progress, governor state, base learning rate) in `directory`."""

    def __init__(self, directory: str, model: Any, optimizer: Any, max_to_keep: int = 3,
                 adapt_variables: list | None = None) -> None:
        """`adapt_variables`: the adaptive batch's extra variables (steps.AccumulatingSteps.previous);
        given (even empty), the checkpoint also holds the controller's JSON state."""
        import tensorflow as tf

        self.directory = str(directory)
        self._epoch = tf.Variable(0, dtype=tf.int64, trainable=False)
        self._examples_in_epoch = tf.Variable(0, dtype=tf.int64, trainable=False)
        self._updates = tf.Variable(0, dtype=tf.int64, trainable=False)
        self._examples_seen = tf.Variable(0, dtype=tf.int64, trainable=False)
        self._governor_json = tf.Variable("", dtype=tf.string, trainable=False)
        self._base_learning_rate = tf.Variable(math.nan, dtype=tf.float64, trainable=False)
        # A copy of the global generator's state, written at save and put back with reset() at
        # restore: a tracked tf.random.Generator came back wrong in 2 of ~15 resumes here.
        self._global_generator = tf.random.get_global_generator()
        self._global_generator_state = tf.Variable(tf.zeros_like(self._global_generator.state), trainable=False)
        adapt = {}
        self._adapt_json = None
        if adapt_variables is not None:
            self._adapt_json = tf.Variable("", dtype=tf.string, trainable=False)
            adapt = {"adapt_json": self._adapt_json, "adapt_variables": list(adapt_variables)}
        self._checkpoint = tf.train.Checkpoint(
            **adapt,
            model=model,
            optimizer=optimizer,
            epoch=self._epoch,
            examples_in_epoch=self._examples_in_epoch,
            updates=self._updates,
            examples_seen=self._examples_seen,
            governor_json=self._governor_json,
            base_learning_rate=self._base_learning_rate,
            model_variables=_model_variables(model),
            global_generator_state=self._global_generator_state,
        )
        self._manager = tf.train.CheckpointManager(self._checkpoint, self.directory, max_to_keep=max_to_keep)

    @property
    def latest(self) -> str | None:
        """Path prefix of the newest checkpoint in the directory, or None."""
        return self._manager.latest_checkpoint

    def save(self, progress: Progress, governor_state: dict, base_learning_rate: float | None,
             adapt_state: dict | None = None) -> str:
        """Write a checkpoint numbered by `progress.updates`; return its path prefix."""
        if self._adapt_json is not None:
            self._adapt_json.assign(json.dumps(adapt_state))
        self._epoch.assign(progress.epoch)
        self._examples_in_epoch.assign(progress.examples_in_epoch)
        self._updates.assign(progress.updates)
        self._examples_seen.assign(progress.examples_seen)
        self._governor_json.assign(json.dumps(governor_state))
        self._base_learning_rate.assign(math.nan if base_learning_rate is None else base_learning_rate)
        self._global_generator_state.assign(self._global_generator.state)
        return self._manager.save(checkpoint_number=progress.updates)

    def restore_latest(self) -> Restored | None:
        """Restore the newest checkpoint into the model and optimizer; None when there is none.

        A checkpoint of another model (variables that do not match), or one saved with an adaptive
        batch restored without one (or the other way round), is a TrainingError naming the path.
        """
        path = self.latest
        if path is None:
            return None
        try:
            status = self._checkpoint.restore(path)
            status.assert_existing_objects_matched()
            if self._adapt_json is None and _has_adapt_state(path):
                raise AssertionError("it was saved with an adaptive batch (fit's adapt=...); pass the same adapt")
        except (AssertionError, ValueError) as exc:
            raise TrainingError(f"cannot resume from checkpoint {path!r}: it does not match this model/optimizer ({exc})") from exc
        progress = Progress(
            epoch=int(self._epoch.numpy()),
            examples_in_epoch=int(self._examples_in_epoch.numpy()),
            updates=int(self._updates.numpy()),
            examples_seen=int(self._examples_seen.numpy()),
        )
        text = self._governor_json.numpy().decode("utf-8")
        try:
            governor_state = json.loads(text) if text else None
        except json.JSONDecodeError as exc:
            raise TrainingError(f"checkpoint {path!r} holds unreadable governor state {text[:80]!r}") from exc
        self._global_generator.reset(self._global_generator_state)
        base = float(self._base_learning_rate.numpy())
        adapt_state = None
        if self._adapt_json is not None:
            adapt_text = self._adapt_json.numpy().decode("utf-8")
            adapt_state = json.loads(adapt_text) if adapt_text else None
        return Restored(progress, governor_state, None if math.isnan(base) else base, adapt_state)


def _has_adapt_state(path: str) -> bool:
    """Whether the checkpoint at `path` holds an adaptive batch's state."""
    import tensorflow as tf

    return any(name.startswith("adapt_json") for name, _ in tf.train.list_variables(path))
