"""fit's loop on one worker of a MultiWorkerMirroredStrategy (the design: workers.py).

`WorkerLoop` is governed_loop._GovernedLoop with four steps changed:
- the pieces cover this worker's share of the update only (`_piece_range`);
- in lockstep, OOM retries are decided on a copy of the governor (`_oom_governor`), so every
  worker's real governor later goes through the same transitions;
- before the optimizer update, every worker joins the exchange (`_before_apply`). A give-up
  anywhere makes every worker raise the same TrainingError, before any of them enters the
  optimizer's all-reduce;
- the update's loss is the sum over all workers (`_loss_mean`). The governor then observes the
  merged reading after replaying every worker's OOMs (lockstep), or its own reading (own
  decisions) (`_governor_observe`).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from edgebatch.errors import TrainingError
from edgebatch.governor import Governor, Observation
from edgebatch.training.governed_loop import _GovernedLoop
from edgebatch.training.records import OomEvent
from edgebatch.training.workers import WorkerGroup, WorkerStatus, merge_observations

__all__ = ["WorkerLoop"]


class WorkerLoop(_GovernedLoop):
    """The governed loop of one worker process (module docstring)."""

    def __init__(self, *, workers: WorkerGroup, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.workers = workers
        self._trial_governor: Governor | None = None
        self._gave_up: tuple[OomEvent, Exception] | None = None

    def _piece_range(self, examples: int) -> tuple[int, int]:
        self._pieces_started = time.perf_counter()
        return self.workers.share(examples)

    def _oom_governor(self) -> Governor:
        self._gave_up = None
        if not self.workers.lockstep:
            return self.governor
        trial = Governor(self.governor.config)
        trial.load_state_dict(self.governor.state_dict())
        self._trial_governor = trial
        return trial

    def _give_up(self, event: OomEvent, exc: Exception) -> None:
        # Not yet: the other workers learn it in the exchange, and all stop together.
        self._gave_up = (event, exc)

    def _before_apply(self, sizes: list[int], loss_sums: list, ooms: list[OomEvent], examples: int) -> Any:
        import tensorflow as tf

        observation = self.reader.read() if self.reader is not None else Observation(pressure=None)
        # The pieces' time and size go into the exchange, so lockstep governors all see the same.
        observation = dataclasses.replace(observation, step_seconds=time.perf_counter() - self._pieces_started,
                                          micro_batch=max(sizes, default=None))
        loss_sum = float(tf.add_n(loss_sums)) if loss_sums else 0.0
        status = WorkerStatus(
            gave_up=self._gave_up is not None, loss_sum=loss_sum, examples=sum(sizes),
            oom_events=tuple(event.micro_batch for event in ooms), oom_count=len(ooms),
            observation=observation,
        )
        statuses = self.workers.exchange(status)
        failed = [i for i, s in enumerate(statuses) if s.gave_up]
        if failed:
            self.steps.reset_accumulators()
            update = self.progress.updates + 1
            here = f": {self._gave_up[0].message}" if self._gave_up is not None else ""
            message = (
                f"worker(s) {failed} of {self.workers.count} ran out of memory at their smallest micro-batch "
                f"(min_batch={self.governor.config.min_batch}) in update {update}; every worker stops "
                f"(this is worker {self.workers.index}{here}). Free memory or give the worker a smaller share"
            )
            self.log.write_error(message, update=update)
            cause = self._gave_up[1] if self._gave_up is not None else None
            raise TrainingError(message) from cause
        return statuses

    def _loss_mean(self, loss_sums: list, examples: int, shared: Any) -> float:
        return sum(status.loss_sum for status in shared) / examples

    def _read_observation(self, shared: Any) -> Observation:
        # Read before the exchange; own-decision governors see the whole update's time (set by the loop).
        return shared[self.workers.index].observation

    def _governor_observe(self, observation: Observation, shared: Any) -> Any:
        if not self.workers.lockstep:
            return self.governor.observe(observation)
        for status in shared:  # every worker's OOMs, in worker order, on every worker
            for micro_batch in status.oom_events:
                self.governor.on_oom(micro_batch)
        merged = dataclasses.replace(merge_observations([status.observation for status in shared]), oom=False)
        if any(status.oom_count for status in shared):
            merged = dataclasses.replace(merged, step_seconds=None)  # a failing update's time says nothing
        return self.governor.observe(merged)
