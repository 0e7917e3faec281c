"""Checkpoints that let governed training resume at the next unprocessed example.

One `tf.train.Checkpoint` holds the model, the optimizer, the data position (epoch, examples
consumed in it, updates, examples seen), the governor's state as a JSON string variable and the
base learning rate (the optimizer's own variable holds the *scaled* one in elastic mode). Keeping
all of it in one checkpoint (not a sidecar file) means a kill between two writes can never pair a
model with another update's governor or position. Checkpoints are written only at update
boundaries, where the gradient accumulators are zero, so they are not saved.
"""

from __future__ import annotations

import json
import math
from typing import Any

from edgebatch.errors import TrainingError
from edgebatch.training.records import Progress

__all__ = ["TrainingCheckpoint"]


class TrainingCheckpoint:
    """Save and restore (model, optimizer, Progress, governor state, base learning rate) in `directory`."""

    def __init__(self, directory: str, model: Any, optimizer: Any, max_to_keep: int = 3) -> None:
        import tensorflow as tf

        self.directory = str(directory)
        self._epoch = tf.Variable(0, dtype=tf.int64, trainable=False)
        self._examples_in_epoch = tf.Variable(0, dtype=tf.int64, trainable=False)
        self._updates = tf.Variable(0, dtype=tf.int64, trainable=False)
        self._examples_seen = tf.Variable(0, dtype=tf.int64, trainable=False)
        self._governor_json = tf.Variable("", dtype=tf.string, trainable=False)
        self._base_learning_rate = tf.Variable(math.nan, dtype=tf.float64, trainable=False)
        self._checkpoint = tf.train.Checkpoint(
            model=model,
            optimizer=optimizer,
            epoch=self._epoch,
            examples_in_epoch=self._examples_in_epoch,
            updates=self._updates,
            examples_seen=self._examples_seen,
            governor_json=self._governor_json,
            base_learning_rate=self._base_learning_rate,
        )
        self._manager = tf.train.CheckpointManager(self._checkpoint, self.directory, max_to_keep=max_to_keep)

    @property
    def latest(self) -> str | None:
        """Path prefix of the newest checkpoint in the directory, or None."""
        return self._manager.latest_checkpoint

    def save(self, progress: Progress, governor_state: dict, base_learning_rate: float | None) -> str:
        """Write a checkpoint numbered by `progress.updates`; return its path prefix."""
        self._epoch.assign(progress.epoch)
        self._examples_in_epoch.assign(progress.examples_in_epoch)
        self._updates.assign(progress.updates)
        self._examples_seen.assign(progress.examples_seen)
        self._governor_json.assign(json.dumps(governor_state))
        self._base_learning_rate.assign(math.nan if base_learning_rate is None else base_learning_rate)
        return self._manager.save(checkpoint_number=progress.updates)

    def restore_latest(self) -> tuple[Progress, dict | None, float | None] | None:
        """Restore the newest checkpoint into the model and optimizer; None when there is none.

        Returns (progress, governor state dict or None, base learning rate or None). A checkpoint
        of another model (variables that do not match) is a TrainingError naming the path.
        """
        path = self.latest
        if path is None:
            return None
        try:
            status = self._checkpoint.restore(path)
            status.assert_existing_objects_matched()
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
        base = float(self._base_learning_rate.numpy())
        return progress, governor_state, None if math.isnan(base) else base
