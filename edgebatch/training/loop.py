"""`fit`: a custom training loop whose micro-batch a Governor sets, update by update.

Recipe of one optimizer update (see `_GovernedLoop._run_update`):
1. take the next `decision.effective_batch` examples of the epoch (fewer at its end);
2. split them into micro-batches of the governor's size (`split_micro_batches`) and run the
   accumulating micro-step on each (steps.py: exact mean-loss gradients whatever the split);
3. on ResourceExhaustedError (real, or injected by injection.py) tell the governor
   (`on_oom(size)`), and re-split what is left of the update, starting with the failed examples,
   at the governor's new size; gradients already accumulated stay (a failed micro-step adds
   nothing), so no example is lost or counted twice; if the governor cannot shrink any more, save
   a checkpoint (when a directory is given) and raise TrainingError;
4. apply the accumulated gradients once, read memory pressure, let the governor observe the
   update, log it, and checkpoint when due.

Resume: with `checkpoint_dir` holding a checkpoint, fit restores model, optimizer, governor and
the data position and continues at the next unprocessed example (`dataset.skip`), ending with the
weights of an uninterrupted run, provided the dataset yields the same order for a given epoch
(each epoch iterates the dataset afresh: shuffle with a fixed seed and
`reshuffle_each_iteration=False`, or shuffle before each epoch yourself, if you need shuffling).
`epochs` and `max_updates` count the whole run, including what the checkpoint already did.

Only OOMs that TensorFlow raises can be recovered. On CPU with TensorFlow's default oneDNN
kernels, running out of address space can crash the process instead (FACTS.md; the RLIMIT_AS test
runs with TF_ENABLE_ONEDNN_OPTS=0 for that reason), and a cgroup memory limit SIGKILLs it; for
those, checkpoints are the recovery. Layers that write state in the forward pass
(BatchNormalization's moving statistics) see a failed-and-retried micro-batch twice.
"""

from __future__ import annotations

import dataclasses
import numbers
import time
from typing import Any, Callable

from edgebatch.errors import TrainingError, UsageError
from edgebatch.governor import Governor, GovernorConfig, Observation, PressureReader, split_micro_batches
from edgebatch.training.checkpoints import TrainingCheckpoint
from edgebatch.training.data import ExampleBuffer, check_element_spec, slice_examples
from edgebatch.training.hard_failure import RunningMarker, take_hard_failure_micro_batch
from edgebatch.training.injection import injected_oom_plan, next_injected_oom
from edgebatch.training.learning_rate import LearningRateScaler
from edgebatch.training.observability import RunLog
from edgebatch.training.records import FitReport, OomEvent, Progress, UpdateRecord
from edgebatch.training.steps import AccumulatingSteps, refuse_unsupported_precision

__all__ = ["fit"]

# Examples read from the dataset per chunk: big enough that tf.data's per-element overhead is
# amortised, small enough that the buffer stays near one update's worth of examples.
MAX_READ_CHUNK_EXAMPLES = 1024


def fit(
    model: Any,
    dataset: Any,
    *,
    loss: Any,
    optimizer: Any,
    effective_batch: int,
    governor: Governor | None = None,
    epochs: int = 1,
    log_dir: str | None = None,
    checkpoint_dir: str | None = None,
    checkpoint_every_updates: int | None = None,
    decision_log: str | None = None,
    pressure_reader: PressureReader | None = None,
    max_updates: int | None = None,
    max_checkpoints_to_keep: int = 3,
    on_update: Callable[[UpdateRecord], None] | None = None,
) -> FitReport:
    """Train `model` on `dataset` with governor-sized micro-batches and gradient accumulation.

    `dataset`: tf.data.Dataset of unbatched (x, y) examples, consumed in order; each update takes
    `effective_batch` consecutive examples (the governor's decision.effective_batch in elastic
    mode; the last update of an epoch may take fewer). `loss`: a Keras loss object (its reduction
    is replaced by the exact mean over the update) or a callable returning per-example losses.
    `governor`: defaults to Governor(GovernorConfig(ceiling_batch=effective_batch,
    effective_batch=effective_batch)); it is used as given (not reset) unless a checkpoint restores
    it. `pressure_reader`: read once per update (it rate-limits itself); without one the governor
    only reacts to OOMs and slow steps. `checkpoint_dir`: resume from / save to it, every
    `checkpoint_every_updates` updates and at the end. `max_updates`: stop after this many updates
    in total. `on_update(record)` is called after every update (progress printing, test hooks).
    TensorBoard scalars go to `log_dir`, one JSON line per update to `decision_log`
    (observability.py). Returns a FitReport of this call.
    """
    _check_arguments(effective_batch, epochs, checkpoint_dir, checkpoint_every_updates, max_updates,
                     max_checkpoints_to_keep, on_update)
    element_spec = check_element_spec(dataset)
    if governor is None:
        governor = Governor(GovernorConfig(ceiling_batch=effective_batch, effective_batch=effective_batch))
    elif not isinstance(governor, Governor):
        raise UsageError(f"governor must be an edgebatch.governor.Governor, got {governor!r}")
    elif governor.config.effective_batch != effective_batch:
        raise UsageError(
            f"effective_batch {effective_batch!r} differs from the governor's "
            f"config.effective_batch {governor.config.effective_batch!r}: build the governor for the same batch"
        )
    refuse_unsupported_precision(model, optimizer)
    injected_oom_plan()  # a malformed EDGEBATCH_INJECT_OOM fails now, before any work
    _build_optimizer(optimizer, model.trainable_variables)
    loop = _GovernedLoop(
        model=model, dataset=dataset, element_spec=element_spec, loss=loss, optimizer=optimizer,
        governor=governor, epochs=epochs, checkpoint_dir=checkpoint_dir,
        checkpoint_every_updates=checkpoint_every_updates, max_checkpoints_to_keep=max_checkpoints_to_keep,
        pressure_reader=pressure_reader, max_updates=max_updates, on_update=on_update,
        run_log=RunLog(log_dir, decision_log),
    )
    return loop.run()


def _check_arguments(effective_batch, epochs, checkpoint_dir, checkpoint_every_updates, max_updates,
                     max_checkpoints_to_keep, on_update) -> None:
    for name, value, optional in (
        ("effective_batch", effective_batch, False),
        ("epochs", epochs, False),
        ("checkpoint_every_updates", checkpoint_every_updates, True),
        ("max_updates", max_updates, True),
        ("max_checkpoints_to_keep", max_checkpoints_to_keep, False),
    ):
        if optional and value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise UsageError(f"{name} must be an integer >= 1, got {value!r}")
    if checkpoint_every_updates is not None and checkpoint_dir is None:
        raise UsageError(f"checkpoint_every_updates={checkpoint_every_updates!r} needs a checkpoint_dir")
    if on_update is not None and not callable(on_update):
        raise UsageError(f"on_update must be callable, got {on_update!r}")


def _build_optimizer(optimizer: Any, variables: list) -> None:
    """Create the optimizer's slots now: before a checkpoint restores them, outside tf.function."""
    if not callable(getattr(optimizer, "build", None)):
        return  # tf_keras legacy optimizers create slots on first use (apply_step then traces twice)
    # Keras 3 says `built`; tf_keras sets `_built` in build() (and returns early when it is set).
    if not getattr(optimizer, "built", getattr(optimizer, "_built", False)):
        optimizer.build(variables)


class _GovernedLoop:
    """The state of one fit call; `run()` is the whole loop."""

    def __init__(self, *, model, dataset, element_spec, loss, optimizer, governor, epochs, checkpoint_dir,
                 checkpoint_every_updates, max_checkpoints_to_keep, pressure_reader, max_updates, on_update,
                 run_log) -> None:
        self.dataset = dataset
        self.element_spec = element_spec
        self.governor = governor
        self.epochs = int(epochs)
        self.every = checkpoint_every_updates
        self.reader = pressure_reader
        self.max_updates = max_updates
        self.on_update = on_update
        self.log = run_log
        self.chunk_examples = max(1, min(MAX_READ_CHUNK_EXAMPLES, governor.config.effective_batch))
        self.checkpoint = (
            TrainingCheckpoint(checkpoint_dir, model, optimizer, max_checkpoints_to_keep) if checkpoint_dir else None
        )
        self.progress = Progress()
        self.saved_progress: Progress | None = None
        restored = self.checkpoint.restore_latest() if self.checkpoint is not None else None
        base_learning_rate = None
        if restored is not None:
            self.progress, governor_state, base_learning_rate = restored
            self.saved_progress = self.progress
            if governor_state is not None:
                governor.load_state_dict(governor_state)
        self.scaler = LearningRateScaler(optimizer, governor.config.lr_scaling != "none", base_learning_rate)
        self.steps = AccumulatingSteps(model, loss, optimizer, element_spec)
        self.report = FitReport(resumed_from=self.progress if restored is not None else None)
        self.history_start = len(governor.history)
        # A supervisor restarted this process after a kill (supervisor.py): that size failed.
        hard_failure_micro_batch = take_hard_failure_micro_batch()
        if hard_failure_micro_batch is not None:
            governor.on_oom(hard_failure_micro_batch)
        self.marker = RunningMarker(checkpoint_dir) if checkpoint_dir else None

    def run(self) -> FitReport:
        started = time.perf_counter()
        try:
            while self.progress.epoch < self.epochs:
                buffer = ExampleBuffer(self.dataset, self.progress.examples_in_epoch, self.chunk_examples)
                if not self._train_epoch(buffer):
                    self.report.stopped_by_max_updates = True
                    break
            if self.checkpoint is not None and self.saved_progress != self.progress:
                self._save()
        finally:
            self.log.close()
            self.report.seconds = time.perf_counter() - started
            self.report.decisions = [dict(entry) for entry in self.governor.history[self.history_start :]]
            self.report.traces = dict(self.steps.traces)
            self.report.final_progress = self.progress
        return self.report

    def _train_epoch(self, buffer: ExampleBuffer) -> bool:
        """Run the rest of the current epoch; False when max_updates stopped it first."""
        while True:
            if buffer.at_end():  # only when nothing was left at the epoch's start (resumed at its end)
                self._finish_epoch()
                return True
            if self.max_updates is not None and self.progress.updates >= self.max_updates:
                return False
            self._run_update(buffer)
            ended = buffer.at_end()
            if ended:
                self._finish_epoch()
            if self.every is not None and self.progress.updates % self.every == 0:
                self._save()
            if ended:
                return True

    def _finish_epoch(self) -> None:
        self.progress = dataclasses.replace(self.progress, epoch=self.progress.epoch + 1, examples_in_epoch=0)
        self.report.epochs_completed += 1

    def _save(self) -> str:
        path = self.checkpoint.save(self.progress, self.governor.state_dict(), self.scaler.base_learning_rate)
        self.saved_progress = self.progress
        self.report.checkpoints.append(path)
        return path

    def _run_update(self, buffer: ExampleBuffer) -> None:
        started = time.perf_counter()
        decision = self.governor.decision
        flat_examples, examples = buffer.take(decision.effective_batch)
        self.scaler.apply(decision.lr_scale)
        sizes, loss_sums, ooms = self._accumulate(flat_examples, examples)
        import tensorflow as tf

        try:
            self.steps.apply_step()
        except (tf.errors.ResourceExhaustedError, MemoryError) as exc:
            # apply_gradients may have moved some variables already: a checkpoint now would be torn,
            # so the last periodic one stays the one to resume from.
            message = f"the optimizer update {self.progress.updates + 1} ran out of memory: {_first_line(exc)}"
            self.log.write_error(message, update=self.progress.updates + 1)
            raise TrainingError(message) from exc
        loss_mean = float(tf.add_n(loss_sums)) / examples  # one host sync per update
        seconds = time.perf_counter() - started
        observation = self.reader.read() if self.reader is not None else Observation(pressure=None)
        # An update that hit an OOM spent ~10 s failing (FACTS.md): its time says nothing about speed.
        observation = dataclasses.replace(
            observation, oom=False, step_seconds=None if ooms else seconds, micro_batch=max(sizes)
        )
        after = self.governor.observe(observation)
        self.progress = Progress(
            epoch=self.progress.epoch,
            examples_in_epoch=self.progress.examples_in_epoch + examples,
            updates=self.progress.updates + 1,
            examples_seen=self.progress.examples_seen + examples,
        )
        record = UpdateRecord(
            update=self.progress.updates, epoch=self.progress.epoch, examples=examples,
            micro_batches=tuple(sizes), effective_batch=decision.effective_batch, loss=loss_mean,
            pressure=observation.pressure, seconds=seconds,
            samples_per_second=examples / seconds if seconds > 0 else float("inf"),
            oom_events=len(ooms), changed=after.changed, reason=after.reason,
            next_micro_batch=after.micro_batch, next_effective_batch=after.effective_batch,
            lr_scale=decision.lr_scale,
        )
        self.report.updates.append(record)
        self.report.examples_seen += examples
        self.log.write_update(record, ooms)
        if self.on_update is not None:
            self.on_update(record)

    def _accumulate(self, flat_examples: list, examples: int) -> tuple[list[int], list, list[OomEvent]]:
        """Run the update's micro-batches; (sizes that ran, their loss sums, OOM events)."""
        import tensorflow as tf

        update_examples = tf.constant(float(examples))
        pending = split_micro_batches(examples, self.governor.decision.micro_batch)
        self._note_running(pending)
        offset, sizes, loss_sums, ooms = 0, [], [], []
        while pending:
            size = pending[0]
            x, y = slice_examples(self.element_spec, flat_examples, offset, size)
            injected = next_injected_oom()
            try:
                if injected is not None:
                    raise tf.errors.ResourceExhaustedError(None, None, injected)
                loss_sums.append(self.steps.micro_step(x, y, update_examples))
            except (tf.errors.ResourceExhaustedError, MemoryError) as exc:
                # MemoryError: Python's own allocation failed (seen under an address-space cap
                # while tracing, tools/bench); an out-of-memory all the same.
                decision = self.governor.on_oom(size)
                event = OomEvent(
                    update=self.progress.updates + 1, epoch=self.progress.epoch, micro_batch=size,
                    example_offset=offset, next_micro_batch=decision.micro_batch,
                    injected=injected is not None, gave_up=decision.exhausted,
                    message=_first_line(exc),
                )
                ooms.append(event)
                self.report.oom_events.append(event)
                if decision.exhausted:
                    self._give_up(event, exc)
                # Re-split from the failed piece on: its examples run again, in smaller pieces.
                pending = split_micro_batches(examples - offset, decision.micro_batch)
                self._note_running(pending)
                continue
            sizes.append(size)
            offset += size
            pending.pop(0)
        return sizes, loss_sums, ooms

    def _note_running(self, pending: list[int]) -> None:
        """Record the split's largest piece before it runs, for a supervisor to read after a kill."""
        if self.marker is not None:
            self.marker.note(max(pending))

    def _give_up(self, event: OomEvent, exc: Exception) -> None:
        """The smallest micro-batch ran out of memory: save what is done and stop with TrainingError."""
        import tensorflow as tf

        try:
            self.steps.reset_accumulators()
        except (tf.errors.ResourceExhaustedError, MemoryError):  # the accumulators die with this fit
            # Under a real cap zeros_like itself can run out (seen: ResourceExhaustedError from
            # ZerosLike in tests/test_training_real_oom.py's child); that error must not replace
            # the one that says what happened and where the checkpoint is.
            pass
        where = ""
        if self.checkpoint is not None:
            # Progress is still at the start of this update and the weights are untouched by it,
            # so this checkpoint resumes by redoing the whole update.
            where = f"; checkpoint saved to {self._save()!r}, call fit again with the same checkpoint_dir to resume"
        message = (
            f"a micro-batch of {event.micro_batch} example(s) still ran out of memory at update {event.update} "
            f"(epoch {event.epoch}, examples {self.progress.examples_in_epoch + event.example_offset}.. of the epoch) "
            f"and the governor cannot go lower (min_batch={self.governor.config.min_batch}){where}. "
            f"Free memory or use a smaller model. Last error: {event.message}"
        )
        self.log.write_error(message, update=event.update, micro_batch=event.micro_batch)
        raise TrainingError(message) from exc


def _first_line(exc: Exception) -> str:
    """The telling line of a TensorFlow error: its first line is often just "Graph execution error:"."""
    text = getattr(exc, "message", None) or str(exc)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    telling = next((line for line in lines if "OOM" in line or "out of memory" in line.lower()), lines[0])
    return telling[:300]
