"""Feeding governed training: consecutive unbatched examples, taken one update at a time.

The loop asks for `effective_batch` examples per update; the governor may change that number
(elastic mode) and the micro-batch split at any update, so the dataset cannot be batched once up
front. Instead it is read in fixed-size chunks (`dataset.batch(chunk)`, far cheaper than one
Python iteration per example) into a buffer, and each update takes exactly the next N examples
from the buffer as numpy arrays, which are then sliced into micro-batches. Example order is the
dataset's order, so a run is reproducible and resumable by skipping consumed examples
(`dataset.skip`, which re-reads the epoch up to that point).

A batched dataset (what `model.fit` users have) is unbatched first (`prepare_dataset`). Resuming by
skipping is only right when every iteration of the dataset yields the same order, so with a
checkpoint directory `refuse_unreplayable_order` refuses a dataset that shuffles differently each
iteration or in each process (found in the dataset's graph; a random order made elsewhere, e.g. in
a Python generator, cannot be seen and is the caller's to keep fixed).
"""

from __future__ import annotations

import time
from typing import Any

from edgebatch.errors import UsageError

__all__ = ["ExampleBuffer", "check_element_spec", "prepare_dataset", "refuse_unreplayable_order", "slice_examples"]


def _model_input_ranks(model: Any) -> list[int] | None:
    """Ranks (batch axis included) of the model's inputs, or None when the model does not say."""
    try:
        inputs = model.inputs
    except (AttributeError, ValueError):  # subclassed models without an Input
        return None
    if not inputs:
        return None
    ranks = [getattr(tensor, "shape", None) for tensor in inputs]
    if any(shape is None or len(shape) is None for shape in ranks):
        return None
    return [len(shape) for shape in ranks]


# Datasets that keep their input's batching: looking through them finds the op that made it.
_KEEPS_BATCHING = {
    "_CacheDataset", "_FilterDataset", "_MapDataset", "_OptionsDataset", "_ParallelMapDataset", "_PrefetchDataset",
    "_RepeatDataset", "_ShuffleDataset", "_SkipDataset", "_TakeDataset", "_AssertCardinalityDataset",
}


def batched_by_structure(dataset: Any) -> bool | None:
    """Whether the pipeline's last batching step batches (True) or unbatches (False); False for a
    source read as it is (from_tensor_slices, from_generator, ...); None when a step in between may
    change the structure (zip, interleave, window, ...) and the shapes must decide."""
    current = dataset
    while True:
        name = type(current).__name__
        if "Unbatch" in name:
            return False
        if "Batch" in name:  # batch, padded_batch, ragged_batch, parallel batch
            return True
        try:
            inputs = current._inputs() if callable(getattr(current, "_inputs", None)) else None
        except NotImplementedError:  # a dataset class that does not list its inputs
            return None
        if inputs == [] or _is_from_generator(current):
            return False
        if name not in _KEEPS_BATCHING or not inputs or len(inputs) != 1:
            return None
        current = inputs[0]


def _is_from_generator(dataset: Any) -> bool:
    """Dataset.from_generator: a flat_map over one tensor whose function builds a GeneratorDataset."""
    if type(dataset).__name__ != "_FlatMapDataset":
        return False
    graph = getattr(getattr(getattr(dataset, "_map_func", None), "function", None), "graph", None)
    return graph is not None and any(op.type == "GeneratorDataset" for op in graph.get_operations())


def _looks_batched(spec: Any, model: Any, dataset: Any = None) -> bool:
    import tensorflow as tf

    x_leaves = [leaf for leaf in tf.nest.flatten(spec[0]) if isinstance(leaf, tf.TensorSpec)]
    ranks = _model_input_ranks(model)
    if ranks is not None and len(ranks) == len(x_leaves) and all(leaf.shape.rank is not None for leaf in x_leaves):
        # The model's input rank counts the batch axis: an element of that rank is a batch.
        return all(leaf.shape.rank == rank for leaf, rank in zip(x_leaves, ranks))
    # Without input shapes, the pipeline says it where it can: variable-length examples (token
    # sequences with per-token labels) have an unknown first axis in every component, as a batch does.
    structure = None if dataset is None else batched_by_structure(dataset)
    if structure is not None:
        return structure
    # Otherwise: a batched dataset's components all start with an unknown (batch) dimension, and
    # examples that share one size cannot all have an unknown first axis unless they are
    # variable-length, which cannot be stacked either.
    leaves = tf.nest.flatten(spec)
    return all(leaf.shape.rank and leaf.shape[0] is None for leaf in leaves)


def prepare_dataset(dataset: Any, model: Any) -> tuple[Any, Any, bool]:
    """(dataset of single examples, its element spec, whether it was unbatched here).

    A batched dataset is unbatched: fit makes its own micro-batches, and the batches the dataset
    had do not matter (an update takes `effective_batch` consecutive examples).
    """
    spec = check_element_spec(dataset)
    if not _looks_batched(spec, model, dataset):
        return dataset, spec, False
    dataset = dataset.unbatch()
    return dataset, check_element_spec(dataset), True


_RESHUFFLES = (
    "with checkpoint_dir, the dataset must yield the same order each epoch, but it reshuffles each "
    "iteration (shuffle's reshuffle_each_iteration=True is the default): use "
    "shuffle(buffer_size, seed=N, reshuffle_each_iteration=False), or leave out checkpoint_dir"
)
_UNSEEDED_SHUFFLE = (
    "with checkpoint_dir, the dataset must yield the same order in every process, but it shuffles "
    "without a seed: use shuffle(buffer_size, seed=N, reshuffle_each_iteration=False)"
)


def _check_shuffle(reshuffle: bool, seeds: list[Any]) -> None:
    import tensorflow as tf

    if reshuffle:
        raise UsageError(_RESHUFFLES)
    # Op seed and global seed both unset: TensorFlow passes (0, 0) and draws fresh seeds.
    if [None if seed is None else tf.get_static_value(seed) for seed in seeds] == [0, 0]:
        raise UsageError(_UNSEEDED_SHUFFLE)


def _check_function_ops(operations: list) -> None:
    """The rules of refuse_unreplayable_order for the ops of a dataset function (map, interleave)."""
    for op in operations:
        attrs = op.node_def.attr
        if "seed" in attrs and "seed2" in attrs and attrs["seed"].i == 0 and attrs["seed2"].i == 0:
            # A stateful random op (tf.random.uniform in a map function) without op or global seed.
            raise UsageError(
                f"with checkpoint_dir, the dataset must yield the same examples in every process, but it draws "
                f"random numbers without a seed ({op.type} {op.name!r}): pass seed= to the random op, or use "
                "tf.random.stateless_* with a seed"
            )
        if op.type.startswith(("ShuffleDataset", "ShuffleAndRepeatDataset")):  # a dataset built inside
            _check_shuffle(bool(attrs["reshuffle_each_iteration"].b) if "reshuffle_each_iteration" in attrs else False,
                           list(op.inputs[2:4]))


def refuse_unreplayable_order(dataset: Any) -> None:
    """UsageError when resuming by `skip` cannot replay the dataset's order (checkpoint_dir given).

    `shuffle(..., reshuffle_each_iteration=True)` (tf.data's default) draws a new order for every
    epoch, and a shuffle without a seed (op seed 0 and no global seed: both graph seeds 0) draws a
    new order in every process, as does a stateful random op (augmentation in a map function)
    without a seed, so skipping the examples a checkpoint consumed would skip other examples than
    those trained on. The pipeline is walked as Python objects (each dataset's inputs, and the ops
    of its traced functions): serializing its graph would copy every in-memory tensor in it
    (measured: +360 MiB and 1.6 s for a 188 MB from_tensor_slices), and fails past 2 GB.
    """
    seen: set[int] = set()
    pending = [dataset]
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if "Shuffle" in type(current).__name__ and hasattr(current, "_reshuffle_each_iteration"):
            _check_shuffle(bool(current._reshuffle_each_iteration),
                           [getattr(current, "_seed", None), getattr(current, "_seed2", None)])
        for value in vars(current).values():
            graph = getattr(getattr(value, "function", None), "graph", None)  # StructuredFunctionWrapper
            if graph is not None and hasattr(graph, "get_operations"):
                _check_function_ops(graph.get_operations())
        inputs = getattr(current, "_inputs", None)
        if callable(inputs):
            pending.extend(inputs())


def check_element_spec(dataset: Any) -> Any:
    """The dataset's (x, y) element spec; UsageError when it is not unbatched (x, y) dense examples."""
    import tensorflow as tf

    if not isinstance(dataset, tf.data.Dataset):
        raise UsageError(f"dataset must be a tf.data.Dataset of unbatched (x, y) examples, got {dataset!r}")
    spec = dataset.element_spec
    if not isinstance(spec, (tuple, list)) or len(spec) != 2:
        raise UsageError(f"dataset elements must be (x, y) pairs, got element_spec {spec!r}")
    for leaf in tf.nest.flatten(spec):
        if not isinstance(leaf, tf.TensorSpec):
            raise UsageError(f"dataset components must be dense tensors, got {leaf!r} in element_spec {spec!r}")
    return spec


def slice_examples(structure: Any, flat_arrays: list[Any], start: int, size: int) -> Any:
    """Examples [start, start + size) of `flat_arrays`, packed like the dataset's element spec."""
    import tensorflow as tf

    from edgebatch.training.sequences import pad_rows

    pieces = [array[start : start + size] for array in flat_arrays]
    # Variable-length components (object arrays of per-example arrays) are padded to the piece's longest.
    pieces = [pad_rows(piece) if piece.dtype == object else piece for piece in pieces]
    return tf.nest.pack_sequence_as(structure, pieces)


def _host_rows(tensor: Any) -> Any:
    """A chunk's component as numpy: a dense array, or for a ragged one an object array of rows."""
    import tensorflow as tf

    if isinstance(tensor, tf.RaggedTensor):
        from edgebatch.training.sequences import ragged_rows

        if tensor.ragged_rank != 1:
            raise UsageError(
                f"examples may vary in length along one axis only (their first), got a component with "
                f"{tensor.ragged_rank} ragged axes: pad the others in the dataset"
            )
        return ragged_rows(tensor.flat_values.numpy(), tensor.row_splits.numpy())
    return tensor.numpy()


class ExampleBuffer:
    """Reads one epoch of `dataset` (after skipping `skip_examples`) in chunks; `take(n)` returns
    the next n examples as flat numpy arrays (fewer at the end of the epoch, None when it is over).
    `pop_read_seconds()` returns the time spent waiting for the dataset since it was last called."""

    def __init__(self, dataset: Any, skip_examples: int, chunk_examples: int) -> None:
        import tensorflow as tf

        from edgebatch.training.sequences import is_variable

        if skip_examples:
            dataset = dataset.skip(skip_examples)
        # Variable-length examples (sequences.py) are read as ragged rows and padded per piece later.
        self._ragged = any(is_variable(leaf) for leaf in tf.nest.flatten(dataset.element_spec))
        batched = dataset.ragged_batch(chunk_examples) if self._ragged else dataset.batch(chunk_examples)
        self._iterator = iter(batched.prefetch(tf.data.AUTOTUNE))
        self._chunks: list[list[Any]] = []
        self._buffered = 0
        self._ended = False
        self._read_seconds = 0.0

    def pop_read_seconds(self) -> float:
        """Seconds spent waiting for the dataset since the last call (the input part of an update)."""
        seconds, self._read_seconds = self._read_seconds, 0.0
        return seconds

    def _read_chunk(self) -> bool:
        if self._ended:
            return False
        import tensorflow as tf

        started = time.perf_counter()
        try:
            chunk = next(self._iterator)
        except StopIteration:
            self._ended = True
            return False
        finally:
            self._read_seconds += time.perf_counter() - started
        arrays = [_host_rows(tensor) for tensor in tf.nest.flatten(chunk)]
        self._chunks.append(arrays)
        self._buffered += len(arrays[0])
        return True

    def at_end(self) -> bool:
        """True when no example is left in this epoch (reads ahead one chunk to find out)."""
        return self._buffered == 0 and not self._read_chunk()

    def take_tokens(self, tokens: int) -> tuple[list[Any], int] | None:
        """Like `take`, for the fewest next examples whose lengths (sequences.example_lengths) sum to
        at least `tokens` (at least one example; fewer tokens at the epoch end); None at the end."""
        import numpy as np

        from edgebatch.training.sequences import example_lengths

        lengths = [n for chunk in self._chunks for n in (example_lengths(chunk) or [])]
        while sum(lengths) < tokens and self._read_chunk():
            lengths += example_lengths(self._chunks[-1]) or []
        if self._buffered == 0:
            return None
        reached = np.cumsum(lengths) >= tokens
        count = int(np.argmax(reached)) + 1 if reached.any() else self._buffered
        return self.take(count)

    def take(self, count: int) -> tuple[list[Any], int] | None:
        """(flat arrays of the next `count` examples or fewer, their number); None at the epoch end."""
        import numpy as np

        while self._buffered < count and self._read_chunk():
            pass
        if self._buffered == 0:
            return None
        if len(self._chunks) == 1:
            joined = self._chunks[0]
        else:
            joined = [np.concatenate(parts) for parts in zip(*self._chunks)]
        taken = min(count, self._buffered)
        rest = [array[taken:] for array in joined]
        self._buffered -= taken
        self._chunks = [rest] if self._buffered else []
        return [array[:taken] for array in joined], taken
