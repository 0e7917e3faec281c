"""Step 2 of a governed update, its pieces: split the update's examples at the governor's size
(by length with length ceilings), run each accumulating micro-step, and on ResourceExhaustedError
tell the governor and re-split what is left of the update at its new size, starting with the failed
examples; gradients already accumulated stay (a failed micro-step adds nothing), so no example is
lost or counted twice. If the governor cannot shrink any more, save a checkpoint (when a directory
is given) and raise TrainingError.

`PieceRunner` is a part of governed_loop._GovernedLoop (a base class holding only methods: the state
is the loop's); worker_loop.WorkerLoop changes `_piece_range`, `_oom_governor` and `_give_up`.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from typing import Any

from edgebatch.errors import TrainingError
from edgebatch.governor import Governor, split_micro_batches
from edgebatch.training.data import slice_examples
from edgebatch.training.injection import next_injected_oom
from edgebatch.training.records import OomEvent
from edgebatch.training.steps import AccumulatingSteps

__all__ = ["PieceRunner", "first_line"]


class PieceRunner:
    """The pieces of one update, with OOM retry (module docstring)."""

    def _split_size(self, memory_micro_batch: int) -> int:
        """The size an update is split with: the governor's micro-batch, or adapt's smaller one. With
        length ceilings it stays the governor's (its units); adapt's bound then caps each piece in
        examples instead (_pieces)."""
        if self.adaptive is None or self.length_ceilings is not None:
            return memory_micro_batch
        return self.adaptive.split_micro_batch(memory_micro_batch)

    def _run_pieces(self, flat_examples: list, examples: int) -> tuple[list[int], list, list[OomEvent], tuple]:
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
        piece_sq_norms, per_example, seconds = [], [], []
        while pending:
            size = pending[0]
            x, y = slice_examples(self.element_spec, flat_examples, offset, size)
            if self.pruning:
                self.pruning.before_micro_step()  # one pruning step per update (pruning.py)
            injected = next_injected_oom()
            try:
                piece_started = time.perf_counter()
                loss_sum, piece_sq_norm, losses = self.steps.run_piece(x, y, update_examples, injected)
                seconds.append(time.perf_counter() - piece_started)
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
        self.piece_seconds = seconds
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

    def _learn_piece_cost(self, record: Any) -> None:
        """Time this update's pieces into the piece cost fit cuts by (piece_cost.PieceTimes), and
        cut by the refitted cost once it has one. Not the call's first update (it traces), nor one
        that ran out of memory."""
        if self.piece_times is None or record.oom_events or len(self.report.updates) < 2:
            return
        self.piece_times.add(record.micro_batches, record.piece_lengths, self.piece_seconds)
        refitted = self.piece_times.refit()
        if refitted is not None:
            self.length_ceilings = dataclasses.replace(self.length_ceilings, piece_cost=refitted)

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
            where = f"; checkpoint saved to {self._save()!r}, call fit again with the same checkpointing dir to resume"
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
        return f"{injected} (in replica {steps.replicas - 1} of {steps.replicas}): {first_line(exc)}"
    return first_line(exc)


def first_line(exc: Exception) -> str:
    """The telling line of a TensorFlow error: its first line is often just "Graph execution error:"."""
    text = getattr(exc, "message", None) or str(exc)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    telling = next((line for line in lines if "OOM" in line or "out of memory" in line.lower()), lines[0])
    return telling[:300]
