"""fit under tf.distribute.MultiWorkerMirroredStrategy: shares, local accumulation, one exchange per update.

Every worker process runs `fit` on the same dataset in the same order, with one device each. An
update takes the same N examples on every worker; worker w trains on its share (`share_range`:
even, or proportional to `worker_shares`), accumulating locally in micro-batches of its own size
with no collective, each piece adding sum(its losses) / N, so the summed gradients are the mean
over the N examples whatever each worker's split, OOM retries and share. An OOM is retried where
it happens; once its pieces are done every worker joins one `exchange` (an all-gather of a small
status vector), then the optimizer's all-reduce applies the update once. Decisions are lockstep
without `worker_shares`, each worker's own with them. Design and its reasons: docs/training-design.md,
"workers".

Not supported under this strategy yet: more than one device per worker, checkpoints, the
adaptive batch, loss-scale optimizers (each a one-line UsageError).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace
from typing import Any, Sequence

import numpy as np

from edgebatch.errors import UsageError
from edgebatch.governor import Observation
from edgebatch.governor.records import MEASURES

__all__ = [
    "MAX_OOM_EVENTS",
    "WorkerGroup",
    "WorkerStatus",
    "decode_status",
    "encode_status",
    "merge_observations",
    "share_range",
    "worker_shares",
]

# OOM events one worker reports per update (more are counted, the last ones kept): at this many the
# governor is at its smallest size for any ceiling under 2^8.
MAX_OOM_EVENTS = 8
_OBSERVATION_FIELDS = ("pressure", "step_seconds", "micro_batch", "limit_bytes", "used_bytes", "psi_some_avg10",
                       "measure", "own_bytes", "running_micro_batch")
_HEAD = 4  # gave_up, loss_sum, examples, oom count


def worker_shares(update_examples: int, weights: Sequence[float]) -> list[int]:
    """Examples of each worker in an update of `update_examples`: proportional to `weights`, largest
    remainders first (ties to the lower index), summing to the update. Pure."""
    if not weights or any(isinstance(w, bool) or not isinstance(w, numbers.Real) or not w >= 0 for w in weights):
        raise UsageError(f"worker_shares must be non-negative numbers, one per worker, got {list(weights)!r}")
    total = float(sum(weights))
    if not total > 0 or not math.isfinite(total):
        raise UsageError(f"worker_shares must have a positive, finite sum, got {list(weights)!r}")
    exact = [update_examples * w / total for w in weights]
    shares = [math.floor(e) for e in exact]
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - shares[i]), i))
    for i in order[: update_examples - sum(shares)]:
        shares[i] += 1
    return shares


def share_range(update_examples: int, weights: Sequence[float], index: int) -> tuple[int, int]:
    """(offset, count) of worker `index`'s examples within the update."""
    shares = worker_shares(update_examples, weights)
    return sum(shares[:index]), shares[index]


@dataclass(frozen=True)
class WorkerStatus:
    """What one worker reports after its pieces of an update."""

    gave_up: bool
    loss_sum: float
    examples: int
    oom_events: tuple[int, ...]  # the micro-batch sizes that ran out of memory, oldest first
    oom_count: int
    observation: Observation


def encode_status(status: WorkerStatus) -> np.ndarray:
    """A fixed-length float64 vector (NaN for None): what the all-gather carries."""
    head = [float(status.gave_up), status.loss_sum, float(status.examples), float(status.oom_count)]
    events = [float(size) for size in status.oom_events[-MAX_OOM_EVENTS:]]
    slots = events + [math.nan] * (MAX_OOM_EVENTS - len(events))
    obs = status.observation
    fields = []
    for name in _OBSERVATION_FIELDS:
        value = getattr(obs, name)
        if name == "measure":
            value = None if value is None else MEASURES.index(value)
        fields.append(math.nan if value is None else float(value))
    return np.asarray(head + slots + fields, dtype=np.float64)


def decode_status(vector: np.ndarray) -> WorkerStatus:
    values = [float(v) for v in vector]
    gave_up, loss_sum, examples, oom_count = values[:_HEAD]
    slots = values[_HEAD : _HEAD + MAX_OOM_EVENTS]
    events = tuple(int(size) for size in slots if not math.isnan(size))
    raw = dict(zip(_OBSERVATION_FIELDS, values[_HEAD + MAX_OOM_EVENTS :]))
    fields: dict[str, Any] = {}
    for name, value in raw.items():
        if math.isnan(value):
            fields[name] = None
        elif name == "measure":
            fields[name] = MEASURES[int(value)]
        elif name in ("micro_batch", "limit_bytes", "used_bytes", "own_bytes", "running_micro_batch"):
            fields[name] = int(value)
        else:
            fields[name] = value
    return WorkerStatus(gave_up=bool(gave_up), loss_sum=loss_sum, examples=int(examples), oom_events=events,
                        oom_count=int(oom_count), observation=Observation(**fields))


def status_length() -> int:
    return _HEAD + MAX_OOM_EVENTS + len(_OBSERVATION_FIELDS)


def _load(observation: Observation) -> float:
    """How hard memory is pressed, to rank workers: the reading's pressure, else what others use of
    the limit, else -inf (nothing read)."""
    if observation.pressure is not None:
        return observation.pressure
    if observation.limit_bytes and observation.used_bytes is not None:
        return observation.used_bytes / observation.limit_bytes
    return -math.inf


def merge_observations(observations: Sequence[Observation]) -> Observation:
    """One observation for lockstep workers: the most pressed worker's reading (worst pressure wins;
    ties to the lower index), with the slowest step, the largest micro-batch and the highest PSI of
    all. Pure."""
    worst = max(range(len(observations)), key=lambda i: (_load(observations[i]), -i))

    def largest(name: str) -> Any:
        values = [getattr(o, name) for o in observations if getattr(o, name) is not None]
        return max(values) if values else None

    return replace(observations[worst], step_seconds=largest("step_seconds"), micro_batch=largest("micro_batch"),
                   psi_some_avg10=largest("psi_some_avg10"))


class WorkerGroup:
    """This process's place among MultiWorkerMirroredStrategy workers, and the per-update exchange."""

    def __init__(self, strategy: Any, shares: Sequence[float] | float | None) -> None:
        """`shares`: one weight per worker (in worker order), or this worker's own weight (a number:
        every worker passes its own, e.g. its device's share in a fleet plan, and they are
        gathered here, a collective), or None for even shares in lockstep."""
        import tensorflow as tf

        self.strategy = strategy
        resolver = strategy.cluster_resolver
        # Without TF_CONFIG the strategy is one worker and names no task: it is worker 0 of 1.
        self.index = int(resolver.task_id or 0)
        self.count = len(resolver.cluster_spec().as_dict().get("worker", [])) or 1
        local = int(strategy.num_replicas_in_sync) // self.count
        if local != 1:
            raise UsageError(
                f"fit under MultiWorkerMirroredStrategy needs one device per worker, this worker has {local}: "
                "make one device visible per worker process (e.g. CUDA_VISIBLE_DEVICES)"
            )
        def replica_fn(vector: Any) -> Any:
            return vector[None]

        def gatherer(length: int) -> Any:
            @tf.function(input_signature=[tf.TensorSpec([length], tf.float64)])
            def gather(vector: Any) -> Any:
                return strategy.gather(strategy.run(replica_fn, args=(vector,)), axis=0)

            return gather

        self._gather = gatherer(status_length())
        own = isinstance(shares, numbers.Real) and not isinstance(shares, bool)
        if own:
            # Every worker gives its own weight; a bad one is checked after the gather, so that
            # every worker raises the same error instead of leaving the others waiting in it.
            mine = float(shares) if math.isfinite(float(shares)) else math.nan
            shares = [float(v) for v in gatherer(1)(tf.constant([mine], tf.float64)).numpy().ravel()]
        elif shares is not None and (isinstance(shares, (str, bytes)) or not isinstance(shares, Sequence)):
            raise UsageError(f"worker_shares must be a list of numbers (one per worker) or this worker's "
                             f"number, got {shares!r}")
        if shares is not None and len(shares) != self.count:
            raise UsageError(f"worker_shares has {len(shares)} entries for {self.count} workers: give one per worker")
        self.lockstep = shares is None
        self.weights = [1.0] * self.count if shares is None else list(shares)
        worker_shares(self.count, self.weights)  # checks the weights now, before any work
        self.weights = [float(w) for w in self.weights]

    def share(self, update_examples: int) -> tuple[int, int]:
        """(offset, count) of this worker's examples in an update of `update_examples`."""
        return share_range(update_examples, self.weights, self.index)

    def exchange(self, status: WorkerStatus) -> list[WorkerStatus]:
        """Every worker's status, in worker order (a collective: every worker must call it once per update)."""
        import tensorflow as tf

        gathered = self._gather(tf.constant(encode_status(status), tf.float64)).numpy()
        return [decode_status(row) for row in gathered]
