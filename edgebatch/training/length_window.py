"""Updates of similar lengths: examples sorted by length over a window longer than one update.

With fit's `length_window_examples` the dataset is read in windows of that many consecutive
examples; each window is sorted by length (stable) and cut into updates (`effective_batch`
examples each, or in tokens with `batch_unit="tokens"`), so an update holds examples of similar
length and its pieces pad little. The window's updates then run in a shuffled order seeded by
(epoch, window index), so a resumed run reads the window holding its position again and skips
the updates it already ran (`updates_done`). Every example is still used once per epoch and each
update's gradient is still the exact mean over its examples; which examples share an update
changes. Why a window and not tf.data's bucketing: docs/training-design.md, "length_window".

Pure logic: `plan_window` and `updates_done` take lengths and counts; `WindowedExamples` wraps
data.ExampleBuffer and uses only numpy.
"""

from __future__ import annotations

from typing import Any

from edgebatch.errors import UsageError

__all__ = ["WindowedExamples", "plan_window", "updates_done", "window_seed"]

# Mixed with the epoch and the window's index: the shuffle of a window's updates.
WINDOW_SHUFFLE_SEED = 20261203


def window_seed(epoch: int, window_index: int) -> list[int]:
    """The seed of one window's update order: fixed by where the window is, so a resumed run draws it again."""
    return [WINDOW_SHUFFLE_SEED, int(epoch), int(window_index)]


def plan_window(lengths: list[int], update_size: int, count_tokens: bool, seed: list[int]) -> list[list[int]]:
    """The window's updates, in the order they run: lists of positions in the window.

    Positions are sorted by length (stable, so equal lengths keep the dataset's order) and cut into
    consecutive groups of `update_size` examples, or, with `count_tokens`, into the fewest
    consecutive examples whose lengths reach `update_size` tokens (as data.ExampleBuffer.take_tokens
    cuts the stream). The groups are then shuffled with `seed` (numpy's default generator).
    """
    import numpy as np

    if update_size < 1:
        raise ValueError(f"update_size must be >= 1, got {update_size}")
    order = sorted(range(len(lengths)), key=lambda position: lengths[position])
    groups: list[list[int]] = []
    current: list[int] = []
    tokens = 0
    for position in order:
        current.append(position)
        tokens += lengths[position]
        if (tokens if count_tokens else len(current)) >= update_size:
            groups.append(current)
            current, tokens = [], 0
    if current:
        groups.append(current)
    shuffled = np.random.default_rng(seed).permutation(len(groups))
    return [groups[int(index)] for index in shuffled]


def updates_done(plan: list[list[int]], consumed_examples: int) -> int:
    """How many of the plan's updates `consumed_examples` examples of the window ran; ValueError when
    no prefix of the plan holds exactly that many (the checkpoint was made with other settings)."""
    total = 0
    for done, group in enumerate(plan):
        if total == consumed_examples:
            return done
        total += len(group)
    if total == consumed_examples:
        return len(plan)
    raise ValueError(f"{consumed_examples} examples consumed in this window is no whole number of its updates")


class WindowedExamples:
    """ExampleBuffer's `take`/`take_tokens`/`at_end`/`pop_read_seconds`, each update taken from a
    length-sorted window (module docstring; window_seed for the shuffle). `buffer` must start at the window holding
    `consumed_in_epoch` (its skip is `window_start(consumed_in_epoch)`)."""

    def __init__(self, buffer: Any, window_examples: int, update_size: int, count_tokens: bool, epoch: int,
                 consumed_in_epoch: int) -> None:
        self._buffer = buffer
        self._window_examples = int(window_examples)
        self._update_size = int(update_size)
        self._count_tokens = bool(count_tokens)
        self._epoch = int(epoch)
        self._window_index = consumed_in_epoch // self._window_examples
        self._pending: list[list[Any]] = []  # the current window's remaining updates, as flat arrays
        # Examples of the first window read that ran before a resume; None once that window is planned.
        self._skip_updates_examples: int | None = consumed_in_epoch - self._window_index * self._window_examples

    @staticmethod
    def window_start(consumed_in_epoch: int, window_examples: int) -> int:
        """Where the window holding example `consumed_in_epoch` of the epoch begins."""
        return consumed_in_epoch // window_examples * window_examples

    def pop_read_seconds(self) -> float:
        return self._buffer.pop_read_seconds()

    def _fill(self) -> bool:
        """Read and plan the next window; False when the epoch has no example left."""
        from edgebatch.training.sequences import example_lengths

        while not self._pending:
            taken = self._buffer.take(self._window_examples)
            if taken is None:
                return False
            flat, _ = taken
            lengths = example_lengths(flat)
            if lengths is None:
                raise ValueError("a length window needs examples of variable length")
            plan = plan_window(lengths, self._update_size, self._count_tokens,
                               window_seed(self._epoch, self._window_index))
            skip = 0
            if self._skip_updates_examples is not None:
                try:
                    skip = updates_done(plan, self._skip_updates_examples)
                except ValueError as exc:
                    raise UsageError(
                        f"the checkpoint stopped {self._skip_updates_examples} examples into length window "
                        f"{self._window_index}, which is no whole number of its updates: resume with the "
                        "effective_batch, batch_unit and length_window_examples it was made with"
                    ) from exc
                self._skip_updates_examples = None
            self._pending = [[array[group] for array in flat] for group in plan[skip:]]
            self._window_index += 1
        return True

    def at_end(self) -> bool:
        return not self._fill()

    def _next(self) -> tuple[list[Any], int] | None:
        if not self._fill():
            return None
        flat = self._pending.pop(0)
        return flat, len(flat[0])

    def take(self, count: int) -> tuple[list[Any], int] | None:
        """The next update of the window (`count` is the update size it was planned with)."""
        if count != self._update_size:
            raise ValueError(f"the window was planned for updates of {self._update_size}, asked for {count}")
        return self._next()

    def take_tokens(self, tokens: int) -> tuple[list[Any], int] | None:
        return self.take(tokens)
