"""The accumulating steps under a tf.distribute strategy (steps.py has the base and the one-device steps).

`MirroredSteps` (MirroredStrategy): the accumulators are ON_READ/SUM variables (each replica sums
its own gradients: no all-reduce per micro-step), the micro-step runs `strategy.run` with the
global piece and each replica slices its even share (replicas.replica_shares) by its replica id,
and the apply step runs the optimizer in replica context, where Keras sums the replicas' gradients
once. OOM safety across replicas: each replica's accumulator updates also wait for a scalar
all-reduce that completes only once every replica has all its gradients, so a replica that runs
out of memory leaves every replica's accumulators untouched. Every replica receives the whole
global piece's input tensor and slices it on its device (input copies are the global piece's
size, not the share's).

`WorkerSteps` (MultiWorkerMirroredStrategy, workers.py): each worker accumulates its own share
locally, with no collective in the micro-step; the optimizer's all-reduce sums the workers' sums.
"""

from __future__ import annotations

from typing import Any

from edgebatch.training.steps import AccumulatingSteps

__all__ = ["MirroredSteps", "WorkerSteps"]

# What an injected replica OOM allocates (float32 elements, 4 TiB): more than any device holds, so
# the allocator itself raises ResourceExhaustedError inside that replica's step.
_INJECTED_OOM_ELEMENTS = 1 << 40


class _StrategySteps(AccumulatingSteps):
    """What the steps under either strategy share: mirrored accumulators, the apply step in replica
    context and the reset; no gradient statistics yet."""

    statistics_supported = False

    def _scope(self) -> Any:
        return self.strategy.scope()

    def _accumulator_options(self) -> dict:
        # Each replica sums its own gradients (ON_READ: no all-reduce per micro-step); reading them
        # in the apply step's replica context gives the local sums, which the optimizer all-reduces
        # once per update.
        import tensorflow as tf

        return {"synchronization": tf.VariableSynchronization.ON_READ, "aggregation": tf.VariableAggregation.SUM}

    def _compile_apply_and_reset(self) -> None:
        import tensorflow as tf

        strategy = self.strategy
        self.apply_step = tf.function(self._mirrored_apply_step)
        self._reset = tf.function(lambda: strategy.run(self._zero_accumulators))
        _resolve_replica_group(strategy)

    def _mirrored_apply_step(self) -> None:
        self.traces["apply_step"] += 1
        self.strategy.run(self._replica_apply_step)

    def _replica_apply_step(self) -> None:
        # In replica context an ON_READ accumulator reads as this replica's own sum; the optimizer
        # all-reduces (sums) the gradients across replicas before updating the mirrored variables.
        self.optimizer.apply_gradients(zip([acc.read_value() for acc in self.accumulators], self.variables))
        self._zero_accumulators()

    def _reset_accumulators(self) -> None:
        self._reset()  # each replica zeroes its own sums


class MirroredSteps(_StrategySteps):
    """The steps under a MirroredStrategy (module docstring)."""

    injects_in_replica = True

    def _compile(self, signature: list) -> None:
        import tensorflow as tf

        # `oom_replica`: the replica that must run out of memory in this call (injection), -1: none.
        signature.append(tf.TensorSpec([], tf.int32, name="oom_replica"))
        self.micro_step = tf.function(self._mirrored_micro_step, input_signature=signature)
        self._compile_apply_and_reset()

    def run_piece(self, x: Any, y: Any, update_examples: Any, injected: str | None) -> tuple:
        """An injected OOM happens inside the last replica's step (a real allocation failure there),
        so it tests that the other replicas add nothing either."""
        import tensorflow as tf

        oom_replica = tf.constant(-1 if injected is None else self.replicas - 1, tf.int32)
        return self.micro_step(x, y, update_examples, oom_replica), None, None

    def _mirrored_micro_step(self, x: Any, y: Any, update_examples: Any, oom_replica: Any) -> Any:
        import tensorflow as tf

        self.traces["micro_step"] += 1
        per_replica = self.strategy.run(self._replica_micro_step, args=(x, y, update_examples, oom_replica))
        return self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    def _replica_micro_step(self, x: Any, y: Any, update_examples: Any, oom_replica: Any) -> Any:
        """One replica's share of a global piece: examples [start, start + size) as in replicas.replica_shares."""
        import tensorflow as tf

        context = tf.distribute.get_replica_context()
        replica = tf.cast(context.replica_id_in_sync_group, tf.int32)
        total = tf.shape(tf.nest.flatten(y)[0])[0]
        base, extra = total // self.replicas, total % self.replicas
        start = replica * base + tf.minimum(replica, extra)
        size = base + tf.cast(replica < extra, tf.int32)
        pick = lambda t: t[start : start + size]  # noqa: E731
        xs, ys = tf.nest.map_structure(pick, x), tf.nest.map_structure(pick, y)

        def barrier(ready: list) -> Any:
            # After this replica's gradients: the injected allocation (1 element unless this replica
            # must fail), then a scalar all-reduce that completes only when every replica got here.
            # The allocation is a stateful op, which Grappler neither folds nor prunes (measured: it
            # drops a reduce_sum over tf.fill(..., 0.0), and the injected OOM with it).
            with tf.control_dependencies(ready):
                elements = tf.where(tf.equal(replica, oom_replica), tf.constant(_INJECTED_OOM_ELEMENTS, tf.int64),
                                    tf.constant(1, tf.int64))
                token = tf.reduce_min(tf.random.uniform(tf.reshape(elements, [1]), dtype=tf.float32))
            return context.all_reduce(tf.distribute.ReduceOp.SUM, token)

        return self._accumulate_piece(xs, ys, update_examples, barrier)


class WorkerSteps(_StrategySteps):
    """The steps of one MultiWorkerMirroredStrategy worker: its own share, accumulated locally."""

    local_steps = True

    def _compile(self, signature: list) -> None:
        import tensorflow as tf

        self.micro_step = tf.function(self._worker_micro_step, input_signature=signature)
        self._compile_apply_and_reset()

    def _worker_micro_step(self, x: Any, y: Any, update_examples: Any) -> Any:
        """This worker's piece on its one replica; its local loss sum (no collective)."""
        self.traces["micro_step"] += 1
        per_replica = self.strategy.run(self._accumulate_piece, args=(x, y, update_examples))
        return self.strategy.experimental_local_results(per_replica)[0]


def _resolve_replica_group(strategy: Any) -> None:
    """Run one scalar all-reduce over the replicas before any step can fail.

    A collective that TensorFlow aborts (one replica ran out of memory while the others waited in
    the all-reduce) cancels every replica group whose members have not met yet, for the life of the
    process: if the very first micro-step ran out of memory, every later step would fail with
    "group is cancelled" (seen with MirroredStrategy on two logical CPUs). Once the group has met,
    an abort cancels only that step, and the retry runs.
    """
    import tensorflow as tf

    def replica_fn() -> Any:
        return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, tf.constant(1.0))

    tf.function(lambda: strategy.run(replica_fn))()

