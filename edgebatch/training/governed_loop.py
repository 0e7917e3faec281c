"""`_GovernedLoop`: the loop `fit` (loop.py) runs, whose micro-batch a Governor sets, update by update.

One optimizer update (`_GovernedLoop._run_update`) is take -> accumulate -> observe -> record: take
the next `decision.effective_batch` examples; split them into micro-batches of the governor's size
and run the accumulating micro-step on each (steps.py: exact mean-loss gradients whatever the
split), on ResourceExhaustedError telling the governor and re-splitting what is left at its new
size, so no example is lost or counted twice (pieces.py), then apply the gradients once; read
memory pressure and let the governor observe the update; log it. The loop checkpoints when due. A
run resumed from a checkpoint ends with the weights of an uninterrupted one when the data order is
fixed. The loop is built from records (loop_parts.py, options.py).

docs/training-design.md, "governed_loop", says how exact an update is (BatchNormalization, Dropout,
TFMOT), how resume works, how the loop runs under MirroredStrategy, MultiWorkerMirroredStrategy
and an adaptive batch, and which OOMs it can recover from.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from edgebatch.errors import TrainingError
from edgebatch.governor import Observation
from edgebatch.training.checkpoints import TrainingCheckpoint
from edgebatch.training.data import ExampleBuffer
from edgebatch.training.hard_failure import RunningMarker, take_hard_failure_micro_batch
from edgebatch.training.learning_rate import LearningRateScaler
from edgebatch.training.loop_parts import Control, Measured, Observed, Ran, Schedule, Taken, Trainee
from edgebatch.training.options import Checkpointing, Sequences
from edgebatch.training.piece_cost import PieceTimes
from edgebatch.training.pieces import PieceRunner, first_line
from edgebatch.training.pruning import PruningSteps
from edgebatch.training.records import FitReport, OomEvent, Progress, UpdateRecord
from edgebatch.training.steps import AccumulatingSteps

# Examples read from the dataset per chunk: big enough that tf.data's per-element overhead is
# amortised, small enough that the buffer stays near one update's worth of examples.
MAX_READ_CHUNK_EXAMPLES = 1024


def _by_length(flat_examples: list) -> list:
    """Variable-length examples of one update in order of length (sequences.py); others as they are."""
    from edgebatch.training.sequences import length_order

    order = length_order(flat_examples)
    return flat_examples if order is None else [array[order] for array in flat_examples]


class _GovernedLoop(PieceRunner):
    """The state of one fit call; `run()` is the whole loop."""

    def __init__(self, *, trainee: Trainee, control: Control, schedule: Schedule,
                 checkpointing: Checkpointing | None = None, sequences: Sequences = Sequences()) -> None:
        """`sequences.length_ceilings`: a LengthCeilings or None (fit resolves what the user gave)."""
        model, optimizer, governor, adaptive = trainee.model, trainee.optimizer, control.governor, control.adaptive
        self.model = model
        self.dataset = trainee.dataset
        self.element_spec = trainee.element_spec
        self.governor = governor
        self.epochs = int(schedule.epochs)
        self.every = None if checkpointing is None else checkpointing.every_updates
        self.reader = control.pressure_reader
        self.max_updates = schedule.max_updates
        self.on_update = schedule.on_update
        self.log = schedule.run_log
        self.callbacks = schedule.callbacks
        self.fixed_micro_batch = control.fixed_micro_batch
        self.epoch_loss_sum = 0.0  # this call's loss x examples in the current epoch (callback logs)
        self.epoch_examples = 0
        self.batch_in_epoch = 0
        self.adaptive = adaptive
        self.length_ceilings = sequences.length_ceilings
        # A piece cost is refined from the pieces' own times (piece_cost.PieceTimes).
        learns = self.length_ceilings is not None and self.length_ceilings.piece_cost is not None
        self.piece_times = PieceTimes() if learns else None
        self.piece_seconds: list[float] = []  # the last update's pieces' seconds, in order
        self.count_tokens = sequences.batch_unit == "tokens"
        self.length_window_examples = sequences.length_window_examples
        self.lengths: list[int] | None = None  # the current update's example lengths, in its order
        self.running_micro_batch = 0  # the governor's micro-batch the update's last split used
        self.optimizer = optimizer
        self.pruning = PruningSteps(model)
        self.chunk_examples = max(1, min(MAX_READ_CHUNK_EXAMPLES, governor.config.effective_batch))
        self.steps = AccumulatingSteps(model, trainee.loss, optimizer, trainee.element_spec, trainee.strategy,
                                       statistics=adaptive is not None)
        checkpoint_dir = None if checkpointing is None else checkpointing.dir
        self.checkpoint = (
            TrainingCheckpoint(checkpoint_dir, model, optimizer, checkpointing.max_to_keep,
                               adapt_variables=None if adaptive is None else self.steps.previous)
            if checkpoint_dir else None
        )
        self._restore()
        self.history_start = len(governor.history)
        # A supervisor restarted this process after a kill (supervisor.py): that size failed.
        hard_failure_micro_batch = take_hard_failure_micro_batch()
        if hard_failure_micro_batch is not None:
            # Said to be the running size: the restored state may be larger (checkpointed before a
            # shrink), and a smaller failed piece would otherwise count as its remainder.
            governor.on_oom(hard_failure_micro_batch, running_micro_batch=hard_failure_micro_batch)
        self.marker = RunningMarker(checkpoint_dir) if checkpoint_dir else None

    def _restore(self) -> None:
        """Progress, governor, adapt state and learning-rate scaler from the latest checkpoint, if any."""
        governor, adaptive = self.governor, self.adaptive
        self.progress = Progress()
        self.saved_progress: Progress | None = None
        restored = self.checkpoint.restore_latest() if self.checkpoint is not None else None
        base_learning_rate = None
        if restored is not None:
            self.progress, base_learning_rate = restored.progress, restored.base_learning_rate
            self.saved_progress = self.progress
            if restored.governor_state is not None:
                governor.load_state_dict(restored.governor_state)
            if adaptive is not None and restored.adapt_state is not None:
                adaptive.controller.load_state_dict(restored.adapt_state)
        scaling = governor.config.lr_scaling != "none" or (adaptive is not None and adaptive.controller.config.lr_rule != "none")
        self.scaler = LearningRateScaler(self.optimizer, scaling, base_learning_rate)
        self.report = FitReport(resumed_from=self.progress if restored is not None else None)

    def run(self) -> FitReport:
        started = time.perf_counter()
        try:
            if self.pruning:
                self.pruning.begin_training()
            if self.callbacks is not None:
                self.model.stop_training = False
                self.callbacks.on_train_begin()
            while self.progress.epoch < self.epochs:
                buffer = self._epoch_buffer()
                self._begin_epoch()
                stopped = self._train_epoch(buffer)
                if stopped == "max_updates":
                    self.report.stopped_by_max_updates = True
                    break
                if stopped == "callback" or self._stop_requested():  # e.g. EarlyStopping at on_epoch_end
                    self.report.stopped_by_callback = True
                    break
            if self.checkpoint is not None and self.saved_progress != self.progress:
                self._save()
            if self.callbacks is not None:
                last = self.report.updates[-1].loss if self.report.updates else None
                self.callbacks.on_train_end(None if last is None else {"loss": last})
        finally:
            if self.pruning:
                self.pruning.remask()
                self.report.pruning_step = self.pruning.step
            self.scaler.restore()
            self.log.close()
            self.report.seconds = time.perf_counter() - started
            self.report.decisions = [dict(entry) for entry in self.governor.history[self.history_start :]]
            self.report.traces = dict(self.steps.traces)
            self.report.final_progress = self.progress
            if self.length_ceilings is not None:
                self.report.piece_cost = self.length_ceilings.piece_cost
            if self.adaptive is not None:
                self.report.adapt_changes = list(self.adaptive.changes)
        return self.report

    def _train_epoch(self, buffer: ExampleBuffer) -> str | None:
        """Run the rest of the current epoch; "max_updates" or "callback" when that stopped it first."""
        while True:
            if buffer.at_end():  # only when nothing was left at the epoch's start (resumed at its end)
                self._finish_epoch()
                return None
            if self.max_updates is not None and self.progress.updates >= self.max_updates:
                return "max_updates"
            self._run_update(buffer)
            ended = buffer.at_end()
            stop = self._stop_requested()
            if ended:
                self._finish_epoch()
            elif stop:
                self._end_epoch_callbacks(self.progress.epoch)  # as model.fit does when stopped mid-epoch
            if self.every is not None and self.progress.updates % self.every == 0:
                self._save()
            if stop:
                return "callback"
            if ended:
                return None

    def _epoch_buffer(self) -> Any:
        """The rest of the current epoch's examples, as ExampleBuffer or, with a length window, WindowedExamples."""
        consumed = self.progress.examples_in_epoch
        if self.length_window_examples is None:
            return ExampleBuffer(self.dataset, consumed, self.chunk_examples)
        from edgebatch.training.length_window import WindowedExamples  # numpy: not at import time

        start = WindowedExamples.window_start(consumed, self.length_window_examples)
        return WindowedExamples(
            ExampleBuffer(self.dataset, start, self.chunk_examples), self.length_window_examples,
            self.governor.config.effective_batch, self.count_tokens, self.progress.epoch, consumed,
        )

    def _stop_requested(self) -> bool:
        """A callback set model.stop_training (checked after each update and each epoch, as model.fit does)."""
        return self.callbacks is not None and bool(getattr(self.model, "stop_training", False))

    def _begin_epoch(self) -> None:
        self.epoch_loss_sum, self.epoch_examples, self.batch_in_epoch = 0.0, 0, 0
        if self.callbacks is not None:
            self.callbacks.on_epoch_begin(self.progress.epoch)

    def _end_epoch_callbacks(self, epoch: int) -> None:
        if self.callbacks is not None:
            logs = {"loss": self.epoch_loss_sum / self.epoch_examples} if self.epoch_examples else {}
            self.callbacks.on_epoch_end(epoch, logs)

    def _finish_epoch(self) -> None:
        if self.pruning:
            self.pruning.remask()
        self._end_epoch_callbacks(self.progress.epoch)
        self.progress = dataclasses.replace(self.progress, epoch=self.progress.epoch + 1, examples_in_epoch=0)
        self.report.epochs_completed += 1

    def _save(self) -> str:
        adapt_state = None if self.adaptive is None else self.adaptive.controller.state_dict()
        path = self.checkpoint.save(self.progress, self.governor.state_dict(), self.scaler.base_learning_rate, adapt_state)
        self.saved_progress = self.progress
        self.report.checkpoints.append(path)
        return path

    def _run_update(self, buffer: ExampleBuffer) -> None:
        """One optimizer update: take -> accumulate -> observe -> record (module docstring)."""
        decision = self.governor.decision
        if self.callbacks is not None:
            self.callbacks.on_train_batch_begin(self.batch_in_epoch)
        taken = self._take(buffer, decision)
        ran = self._accumulate(taken)
        observed = self._observe(taken, ran)
        self._record(taken, ran, observed)

    def _take(self, buffer: ExampleBuffer, decision: Any) -> Taken:
        """The next `decision.effective_batch` examples of the epoch (fewer at its end; adapt's
        effective batch with adapt, tokens with batch_unit="tokens"), in order of length."""
        adaptive = self.adaptive
        wanted = decision.effective_batch if adaptive is None else adaptive.effective_batch_samples
        lr_scale = decision.lr_scale if adaptive is None else adaptive.lr_scale()
        flat_examples, examples = buffer.take_tokens(wanted) if self.count_tokens else buffer.take(wanted)
        flat_examples = _by_length(flat_examples)
        from edgebatch.training.sequences import example_lengths  # numpy: not at import time

        self.lengths = example_lengths(flat_examples)  # None for fixed-length examples
        tokens = None if self.lengths is None else sum(self.lengths)
        # The wait for examples (this take, and the read-ahead since the last update) is not step
        # time: a slow input pipeline must not look like memory pressure to the governor.
        input_seconds = buffer.pop_read_seconds()
        return Taken(flat_examples, examples, wanted, lr_scale, tokens, input_seconds)

    def _accumulate(self, taken: Taken) -> Ran:
        """Run the update's pieces at the governor's size (`_run_pieces`: OOMs shrink it and the rest
        is re-split, gradients already accumulated stay), then apply the gradients once."""
        import tensorflow as tf

        started = time.perf_counter()
        self.scaler.apply(taken.lr_scale)
        sizes, loss_sums, ooms, pieces_measured = self._run_pieces(taken.flat_examples, taken.examples)
        shared = self._before_apply(sizes, loss_sums, ooms, taken.examples)
        measured = None
        try:
            if self.adaptive is not None:
                measured = Measured(*pieces_measured, update_statistics=self.steps.update_statistics())
            self.steps.apply_step()
        except (tf.errors.ResourceExhaustedError, MemoryError) as exc:
            # apply_gradients may have moved some variables already: a checkpoint now would be torn,
            # so the last periodic one stays the one to resume from.
            message = f"the optimizer update {self.progress.updates + 1} ran out of memory: {first_line(exc)}"
            self.log.write_error(message, update=self.progress.updates + 1)
            raise TrainingError(message) from exc
        loss_mean = self._loss_mean(loss_sums, taken.examples, shared)
        return Ran(sizes, ooms, shared, loss_mean, time.perf_counter() - started, measured)

    def _observe(self, taken: Taken, ran: Ran) -> Observed:
        """Read memory pressure and let the governor (and adapt) observe the update."""
        adaptive, sizes = self.adaptive, ran.sizes
        observation = self._read_observation(ran.shared)
        # An update that hit an OOM spent 11-14 s failing (docs/tensorflow-memory.md, "Address-space
        # caps"): its time says nothing about speed.
        # With an adaptive batch an update's piece count changes with its effective batch: the
        # governor compares step times at one micro-batch size, so it gets the time per piece.
        governed_seconds = ran.step_seconds if adaptive is None else ran.step_seconds * max(sizes) / taken.examples
        largest = max(sizes, default=None)  # None: a worker with no share of this update
        if self.length_ceilings is not None and sizes:
            largest = self.running_micro_batch  # pieces by length: the governor's units
        # Updates of variable-length examples differ in work by their lengths (256 docstrings an
        # update, by length window, took 0.04-5.2 s in one piece), so their times are no memory
        # signal: the governor's slow-step rule gets none (it halved the micro-batch there;
        # tools/length_window_step_times.py).
        comparable = not ran.ooms and self.lengths is None
        observation = dataclasses.replace(
            observation, oom=False, step_seconds=governed_seconds if comparable else None, micro_batch=largest
        )
        if self.fixed_micro_batch:
            # batch_norm="fixed_micro_batch": no reading may move the micro-batch (only on_oom does).
            after = self._governor_observe(Observation(pressure=None, oom=False, micro_batch=largest), ran.shared)
        else:
            after = self._governor_observe(observation, ran.shared)
        adapt_record = None
        if adaptive is not None:
            adapt_decision, reading = adaptive.observe(
                update=self.progress.updates + 1, examples=taken.examples, sizes=sizes, measured=ran.measured,
                loss_mean=ran.loss_mean, schedule_rate=adaptive.scheduled_rate(self.optimizer, self.scaler.schedule),
                memory_micro_batch_samples=after.micro_batch,
                times=None if ran.ooms else (tuple(self.piece_seconds), ran.step_seconds),
            )
            adapt_record = adaptive.record(adapt_decision, reading)
        return Observed(observation.pressure, after, adapt_record)

    def _record(self, taken: Taken, ran: Ran, observed: Observed) -> None:
        """Count the update, log its UpdateRecord and tell callbacks and on_update."""
        examples, sizes, after, loss_mean = taken.examples, ran.sizes, observed.after, ran.loss_mean
        seconds = taken.input_seconds + ran.step_seconds
        self.progress = Progress(
            epoch=self.progress.epoch,
            examples_in_epoch=self.progress.examples_in_epoch + examples,
            updates=self.progress.updates + 1,
            examples_seen=self.progress.examples_seen + examples,
        )
        record = UpdateRecord(
            update=self.progress.updates, epoch=self.progress.epoch, examples=examples,
            micro_batches=tuple(sizes), piece_lengths=self._piece_lengths(sizes), tokens=taken.tokens,
            piece_seconds=None if self.length_ceilings is None else tuple(self.piece_seconds),
            effective_batch=taken.wanted, loss=loss_mean,
            pressure=observed.pressure, seconds=seconds,
            samples_per_second=examples / seconds if seconds > 0 else float("inf"),
            oom_events=len(ran.ooms), changed=after.changed, reason=after.reason,
            next_micro_batch=self._split_size(after.micro_batch),
            next_effective_batch=after.effective_batch if self.adaptive is None else self.adaptive.effective_batch_samples,
            lr_scale=taken.lr_scale, step_seconds=ran.step_seconds, input_seconds=taken.input_seconds,
            adapt=observed.adapt,
        )
        self.report.updates.append(record)
        self._learn_piece_cost(record)
        self.report.examples_seen += examples
        self.log.write_update(record, ran.ooms)
        self.epoch_loss_sum += loss_mean * examples
        self.epoch_examples += examples
        if self.callbacks is not None:
            self.callbacks.on_train_batch_end(self.batch_in_epoch, {"loss": loss_mean})
        self.batch_in_epoch += 1
        if self.on_update is not None:
            self.on_update(record)

    def _before_apply(self, sizes: list[int], loss_sums: list, ooms: list[OomEvent], examples: int) -> Any:
        """What must happen between the pieces and the optimizer update (nothing here; workers exchange)."""
        return None

    def _loss_mean(self, loss_sums: list, examples: int, shared: Any) -> float:
        import tensorflow as tf

        return float(tf.add_n(loss_sums)) / examples  # one host sync per update: the step is done

    def _read_observation(self, shared: Any) -> Observation:
        return self.reader.read() if self.reader is not None else Observation(pressure=None)

    def _governor_observe(self, observation: Observation, shared: Any) -> Any:
        return self.governor.observe(observation)
