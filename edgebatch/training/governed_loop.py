"""`_GovernedLoop`: the loop `fit` (loop.py) runs, whose micro-batch a Governor sets, update by update.

One optimizer update (`_GovernedLoop._run_update`): take the next `decision.effective_batch`
examples, split them into micro-batches of the governor's size and run the accumulating micro-step
on each (steps.py: exact mean-loss gradients whatever the split); on ResourceExhaustedError tell
the governor and re-split what is left at its new size, keeping the gradients already accumulated,
so no example is lost or counted twice; then apply the gradients once, read memory pressure, let
the governor observe the update, log it, and checkpoint when due. A run resumed from a checkpoint
ends with the weights of an uninterrupted one when the data order is fixed.

docs/training-design.md, "governed_loop", says how exact an update is (BatchNormalization, Dropout,
TFMOT), how resume works, how the loop runs under MirroredStrategy, MultiWorkerMirroredStrategy
and an adaptive batch, and which OOMs it can recover from.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from typing import Any

from edgebatch.errors import TrainingError
from edgebatch.governor import Governor, Observation, split_micro_batches
from edgebatch.training.checkpoints import TrainingCheckpoint
from edgebatch.training.data import ExampleBuffer, slice_examples
from edgebatch.training.hard_failure import RunningMarker, take_hard_failure_micro_batch
from edgebatch.training.injection import next_injected_oom
from edgebatch.training.learning_rate import LearningRateScaler
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


class _GovernedLoop:
    """The state of one fit call; `run()` is the whole loop."""

    def __init__(self, *, model, dataset, element_spec, loss, optimizer, governor, epochs, checkpoint_dir,
                 checkpoint_every_updates, max_checkpoints_to_keep, pressure_reader, max_updates, on_update,
                 run_log, callbacks, fixed_micro_batch, strategy=None, adaptive=None, length_ceilings=None,
                 count_tokens=False, length_window_examples=None) -> None:
        self.model = model
        self.dataset = dataset
        self.element_spec = element_spec
        self.governor = governor
        self.epochs = int(epochs)
        self.every = checkpoint_every_updates
        self.reader = pressure_reader
        self.max_updates = max_updates
        self.on_update = on_update
        self.log = run_log
        self.callbacks = callbacks
        self.fixed_micro_batch = fixed_micro_batch
        self.epoch_loss_sum = 0.0  # this call's loss x examples in the current epoch (callback logs)
        self.epoch_examples = 0
        self.batch_in_epoch = 0
        self.adaptive = adaptive
        self.length_ceilings = length_ceilings
        self.count_tokens = count_tokens
        self.length_window_examples = length_window_examples
        self.lengths: list[int] | None = None  # the current update's example lengths, in its order
        self.running_micro_batch = 0  # the governor's micro-batch the update's last split used
        self.optimizer = optimizer
        self.pruning = PruningSteps(model)
        self.chunk_examples = max(1, min(MAX_READ_CHUNK_EXAMPLES, governor.config.effective_batch))
        self.steps = AccumulatingSteps(model, loss, optimizer, element_spec, strategy, statistics=adaptive is not None)
        self.checkpoint = (
            TrainingCheckpoint(checkpoint_dir, model, optimizer, max_checkpoints_to_keep,
                               adapt_variables=None if adaptive is None else self.steps.previous)
            if checkpoint_dir else None
        )
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
        self.scaler = LearningRateScaler(optimizer, scaling, base_learning_rate)
        self.report = FitReport(resumed_from=self.progress if restored is not None else None)
        self.history_start = len(governor.history)
        # A supervisor restarted this process after a kill (supervisor.py): that size failed.
        hard_failure_micro_batch = take_hard_failure_micro_batch()
        if hard_failure_micro_batch is not None:
            # Said to be the running size: the restored state may be larger (checkpointed before a
            # shrink), and a smaller failed piece would otherwise count as its remainder.
            governor.on_oom(hard_failure_micro_batch, running_micro_batch=hard_failure_micro_batch)
        self.marker = RunningMarker(checkpoint_dir) if checkpoint_dir else None

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
        """One optimizer update.

        1. Take the next `decision.effective_batch` examples of the epoch (fewer at its end).
        2. Split them into micro-batches of the governor's size (`split_micro_batches`) and run the
           accumulating micro-step on each (steps.py: exact mean-loss gradients whatever the split).
        3. On ResourceExhaustedError (real, or injected by injection.py) tell the governor
           (`on_oom(size)`) and re-split what is left of the update, starting with the failed
           examples, at its new size; gradients already accumulated stay (a failed micro-step adds
           nothing), so no example is lost or counted twice. If the governor cannot shrink any
           more, save a checkpoint (when a directory is given) and raise TrainingError.
        4. Apply the accumulated gradients once, read memory pressure, let the governor observe the
           update, log it, and checkpoint when due.
        """
        decision = self.governor.decision
        if self.callbacks is not None:
            self.callbacks.on_train_batch_begin(self.batch_in_epoch)
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
        started = time.perf_counter()
        self.scaler.apply(lr_scale)
        sizes, loss_sums, ooms, measured = self._accumulate(flat_examples, examples)
        shared = self._before_apply(sizes, loss_sums, ooms, examples)
        import tensorflow as tf

        try:
            update_statistics = self.steps.update_statistics() if adaptive is not None else None
            self.steps.apply_step()
        except (tf.errors.ResourceExhaustedError, MemoryError) as exc:
            # apply_gradients may have moved some variables already: a checkpoint now would be torn,
            # so the last periodic one stays the one to resume from.
            message = f"the optimizer update {self.progress.updates + 1} ran out of memory: {_first_line(exc)}"
            self.log.write_error(message, update=self.progress.updates + 1)
            raise TrainingError(message) from exc
        loss_mean = self._loss_mean(loss_sums, examples, shared)
        step_seconds = time.perf_counter() - started
        seconds = input_seconds + step_seconds
        observation = self._read_observation(shared)
        # An update that hit an OOM spent 11-14 s failing (docs/tensorflow-memory.md, "Address-space
        # caps"): its time says nothing about speed.
        # With an adaptive batch an update's piece count changes with its effective batch: the
        # governor compares step times at one micro-batch size, so it gets the time per piece.
        governed_seconds = step_seconds if adaptive is None else step_seconds * max(sizes) / examples
        largest = max(sizes, default=None)  # None: a worker with no share of this update
        if self.length_ceilings is not None and sizes:
            largest = self.running_micro_batch  # pieces by length: the governor's units
        # Updates of variable-length examples differ in work by their lengths (256 docstrings an
        # update, by length window, took 0.04-5.2 s in one piece), so their times are no memory
        # signal: the governor's slow-step rule gets none (it halved the micro-batch there;
        # tools/length_window_step_times.py).
        comparable = not ooms and self.lengths is None
        observation = dataclasses.replace(
            observation, oom=False, step_seconds=governed_seconds if comparable else None, micro_batch=largest
        )
        if self.fixed_micro_batch:
            # batch_norm="fixed_micro_batch": no reading may move the micro-batch (only on_oom does).
            after = self._governor_observe(Observation(pressure=None, oom=False, micro_batch=largest), shared)
        else:
            after = self._governor_observe(observation, shared)
        adapt_record = None
        if adaptive is not None:
            adapt_decision, reading = adaptive.observe(
                update=self.progress.updates + 1, examples=examples, sizes=sizes,
                piece_sq_norms=measured[0], per_example=measured[1], update_statistics=update_statistics,
                loss_mean=loss_mean, schedule_rate=adaptive.scheduled_rate(self.optimizer, self.scaler.schedule),
                memory_micro_batch_samples=after.micro_batch,
            )
            adapt_record = adaptive.record(adapt_decision, reading)
        self.progress = Progress(
            epoch=self.progress.epoch,
            examples_in_epoch=self.progress.examples_in_epoch + examples,
            updates=self.progress.updates + 1,
            examples_seen=self.progress.examples_seen + examples,
        )
        record = UpdateRecord(
            update=self.progress.updates, epoch=self.progress.epoch, examples=examples,
            micro_batches=tuple(sizes), piece_lengths=self._piece_lengths(sizes), tokens=tokens,
            effective_batch=wanted, loss=loss_mean,
            pressure=observation.pressure, seconds=seconds,
            samples_per_second=examples / seconds if seconds > 0 else float("inf"),
            oom_events=len(ooms), changed=after.changed, reason=after.reason,
            next_micro_batch=self._split_size(after.micro_batch),
            next_effective_batch=after.effective_batch if adaptive is None else adaptive.effective_batch_samples,
            lr_scale=lr_scale, step_seconds=step_seconds, input_seconds=input_seconds, adapt=adapt_record,
        )
        self.report.updates.append(record)
        self.report.examples_seen += examples
        self.log.write_update(record, ooms)
        self.epoch_loss_sum += loss_mean * examples
        self.epoch_examples += examples
        if self.callbacks is not None:
            self.callbacks.on_train_batch_end(self.batch_in_epoch, {"loss": loss_mean})
        self.batch_in_epoch += 1
        if self.on_update is not None:
            self.on_update(record)

    def _split_size(self, memory_micro_batch: int) -> int:
        """The size an update is split with: the governor's micro-batch, or adapt's smaller one. With
        length ceilings it stays the governor's (its units); adapt's bound then caps each piece in
        examples instead (_pieces)."""
        if self.adaptive is None or self.length_ceilings is not None:
            return memory_micro_batch
        return self.adaptive.split_micro_batch(memory_micro_batch)

    def _accumulate(self, flat_examples: list, examples: int) -> tuple[list[int], list, list[OomEvent], tuple]:
        """Run the update's micro-batches; (sizes that ran, their loss sums, OOM events, and with
        statistics on (adapt) their squared gradient norms and per-example losses)."""
        import tensorflow as tf

        update_examples = tf.constant(float(examples))
        if self.pruning:
            self.pruning.begin_update()
        start, count = self._piece_range(examples)
        governor = self._oom_governor()
        running = self._split_size(governor.decision.micro_batch)
        pending = self._pieces(start, count, running) if count else []
        if pending:
            self._note_running(pending, running)
        offset, sizes, loss_sums, ooms = start, [], [], []
        piece_sq_norms, per_example = [], []
        while pending:
            size = pending[0]
            x, y = slice_examples(self.element_spec, flat_examples, offset, size)
            if self.pruning:
                self.pruning.before_micro_step()  # one pruning step per update (pruning.py)
            injected = next_injected_oom()
            try:
                loss_sum, piece_sq_norm, losses = self.steps.run_piece(x, y, update_examples, injected)
                loss_sums.append(loss_sum)
                if self.steps.statistics:
                    piece_sq_norms.append(piece_sq_norm)
                    per_example.append(losses)
            except (tf.errors.ResourceExhaustedError, MemoryError) as exc:
                # MemoryError: Python's own allocation failed (seen under an address-space cap
                # while tracing, tools/bench); an out-of-memory all the same.
                decision = self._tell_oom(governor, offset, size, running)
                event = OomEvent(
                    update=self.progress.updates + 1, epoch=self.progress.epoch, micro_batch=size,
                    example_offset=offset, next_micro_batch=decision.micro_batch,
                    injected=injected is not None, gave_up=decision.exhausted,
                    message=_oom_message(exc, injected, self.steps),
                )
                ooms.append(event)
                self.report.oom_events.append(event)
                if decision.exhausted:
                    self._give_up(event, exc)  # raises, unless a worker group decides together
                    break
                # Re-split from the failed piece on: its examples run again, in smaller pieces.
                running = self._split_size(decision.micro_batch)
                pending = self._pieces(offset, start + count - offset, running)
                self._note_running(pending, running)
                continue
            sizes.append(size)
            offset += size
            pending.pop(0)
        self.running_micro_batch = running
        return sizes, loss_sums, ooms, (piece_sq_norms, per_example)

    def _pieces(self, offset: int, count: int, micro_batch: int) -> list[int]:
        """Sizes of the pieces for examples [offset, offset + count) of the update: the governor's
        micro-batch each, or with length ceilings as each piece's lengths allow (length_ceilings.py),
        and no more than adapt's bound in examples."""
        if self.length_ceilings is None or self.lengths is None:
            return split_micro_batches(count, micro_batch)
        cap = None if self.adaptive is None else self.adaptive.pieces_bound_samples()
        return self.length_ceilings.split(self.lengths[offset : offset + count], micro_batch, self._upper(), cap)

    def _piece_lengths(self, sizes: list[int]) -> tuple[int, ...] | None:
        """The longest example (tokens) of each piece that ran, with length ceilings; else None."""
        if self.length_ceilings is None or self.lengths is None:
            return None
        offsets = itertools.accumulate(sizes, initial=0)
        return tuple(self._piece_length(offset, size) for offset, size in zip(offsets, sizes))

    def _piece_length(self, offset: int, size: int) -> int | None:
        """The longest example (tokens) of the piece at `offset`; None without length ceilings."""
        if self.length_ceilings is None or self.lengths is None:
            return None
        return max(self.lengths[offset : offset + size])

    def _tell_oom(self, governor: Governor, offset: int, size: int, running: int) -> Any:
        """The governor's decision after the piece at `offset` ran out of memory, in its own units."""
        length = self._piece_length(offset, size)
        if length is None:
            return governor.on_oom(size)
        units = self.length_ceilings.governor_size(size, length, running, self._upper())
        return governor.on_oom(units, running_micro_batch=running)

    def _upper(self) -> int:
        """The largest micro-batch the governor may decide: its decisions over this are its share."""
        config = self.governor.config
        return max(1, min(config.ceiling_batch, config.effective_batch))

    def _piece_range(self, examples: int) -> tuple[int, int]:
        """(first example, count) of the update that this process trains on: all of it here."""
        return 0, examples

    def _oom_governor(self) -> Governor:
        """The governor that decides OOM retries during an update."""
        return self.governor

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

    def _note_running(self, pending: list[int], running: int) -> None:
        """Record the split's largest piece before it runs, for a supervisor to read after a kill
        (with length ceilings the governor's micro-batch: pieces are counted in its units there)."""
        if self.marker is not None:
            self.marker.note(running if self.length_ceilings is not None else max(pending))

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


def _oom_message(exc: Exception, injected: str | None, steps: AccumulatingSteps) -> str:
    """OomEvent.message: the error's telling line; for an injected replica OOM, also why it happened."""
    if injected is not None and steps.injects_in_replica:
        return f"{injected} (in replica {steps.replicas - 1} of {steps.replicas}): {_first_line(exc)}"
    return _first_line(exc)


def _first_line(exc: Exception) -> str:
    """The telling line of a TensorFlow error: its first line is often just "Graph execution error:"."""
    text = getattr(exc, "message", None) or str(exc)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    telling = next((line for line in lines if "OOM" in line or "out of memory" in line.lower()), lines[0])
    return telling[:300]
