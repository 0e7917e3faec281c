"""Where a governed run's per-update records go besides the FitReport: TensorBoard and a JSONL log.

- `log_dir`: tf.summary scalars per update, step = update number: edgebatch/micro_batch (the
  largest micro-batch that ran: the real batch size the device saw), accumulation_steps,
  effective_batch (examples in the update), loss, samples_per_second, step_seconds (the step
  without waiting for input), input_seconds, oom_events, lr_scale and pressure (only when it was
  read); with an adaptive batch (fit's `adapt=`) also edgebatch/adapt/<name> for each statistic
  that was measured (noise_scale_samples, cosine, mean_cosine, loss_change, hard_share,
  schedule_lr_ratio) and next_effective_batch.
- `decision_log`: a JSON Lines file with ONE OBJECT PER UPDATE (not per change: a reader filters on
  "changed"), `{"event": "update", ...UpdateRecord.to_dict(), "ooms": [OomEvent...]}`, plus one
  `{"event": "training_error", ...}` line if training had to stop. The file is appended to (a
  resumed run continues the same log) and flushed per line (a killed run leaves whole lines).
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import asdict
from typing import Any

from edgebatch.training.records import OomEvent, UpdateRecord

__all__ = ["RunLog"]


# The adaptive batch's statistics written to TensorBoard (UpdateRecord.adapt keys).
_ADAPT_SCALARS = ("noise_scale_samples", "cosine", "mean_cosine", "loss_change", "hard_share",
                  "schedule_lr_ratio", "next_effective_batch")


@functools.cache
def _scalar_metadata() -> Any:
    import tensorflow as tf

    return tf.compat.v1.SummaryMetadata(plugin_data=tf.compat.v1.SummaryMetadata.PluginData(plugin_name="scalars"))


class RunLog:
    """Writes each update to TensorBoard (`log_dir`) and/or a JSONL file (`decision_log`); both optional."""

    def __init__(self, log_dir: str | os.PathLike | None, decision_log: str | os.PathLike | None) -> None:
        self._writer = None
        self._jsonl = None
        if log_dir is not None:
            import tensorflow as tf

            self._writer = tf.summary.create_file_writer(str(log_dir))
        if decision_log is not None:
            parent = os.path.dirname(os.fspath(decision_log))
            if parent:
                os.makedirs(parent, exist_ok=True)
            self._jsonl = open(decision_log, "a", encoding="utf-8")

    def write_update(self, record: UpdateRecord, ooms: list[OomEvent]) -> None:
        if self._writer is not None:
            self._write_summaries(record)
        self._write_line({"event": "update", **record.to_dict(), "ooms": [asdict(event) for event in ooms]})

    def write_error(self, message: str, **fields: Any) -> None:
        self._write_line({"event": "training_error", "message": message, **fields})

    def _write_line(self, data: dict[str, Any]) -> None:
        if self._jsonl is not None:
            self._jsonl.write(json.dumps(data) + "\n")
            self._jsonl.flush()

    def _write_summaries(self, record: UpdateRecord) -> None:
        import tensorflow as tf

        scalars = {
            "micro_batch": record.largest_micro_batch,
            "accumulation_steps": record.accumulation_steps,
            "effective_batch": record.examples,
            "loss": record.loss,
            "samples_per_second": record.samples_per_second,
            "step_seconds": record.step_seconds,
            "input_seconds": record.input_seconds,
            "oom_events": record.oom_events,
            "lr_scale": record.lr_scale,
        }
        if record.pressure is not None:
            scalars["pressure"] = record.pressure
        if record.adapt is not None:
            for name in _ADAPT_SCALARS:
                value = record.adapt.get(name)
                if value is not None:
                    scalars[f"adapt/{name}"] = value
        with self._writer.as_default(step=record.update):
            for name, value in scalars.items():
                # tf.summary.scalar needs the tensorboard package, which TensorFlow 2.21 no longer
                # installs; this is what it writes, so TensorBoard's scalar dashboard shows it.
                tf.summary.write(f"edgebatch/{name}", tf.constant(float(value), tf.float32),
                                 metadata=_scalar_metadata())

    def close(self) -> None:
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
            self._writer = None
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None
