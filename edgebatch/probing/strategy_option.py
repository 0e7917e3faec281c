"""The `strategy` option of `edgebatch probe` and edgebatch.probe, deprecated: the probe has one search.

The peers' finders it once chose between are benchmark baselines: they live in
tools/bench/finders.py and run on the probe's own trial runner there (tools/bench/probe_bench.py).
The probe's own search's name is still accepted, with a one-line deprecation note; any other name
is a one-line UsageError that says where the finders went. Pure: no TensorFlow.
"""

from __future__ import annotations

import warnings

from edgebatch.errors import UsageError
from edgebatch.probing.search import SLOW_START

# The names the option took before the peers' finders moved to the benchmark suite.
MOVED_FINDERS = ("binsearch", "binsearch_checked", "power", "shrink_x0.9", "shrink_x0.5", "one_shot_estimate")
BENCH_COMMAND = "python tools/bench/probe_bench.py --finder {name} --model MODEL"


def check_strategy(strategy: str, shown: str) -> None:
    """Return for the probe's own search; raise a one-line UsageError for any other.

    Args:
        strategy: the name asked for.
        shown: the option as the user wrote it, e.g. "--strategy power" or "strategy='power'".

    Raises:
        UsageError: any name but the probe's own search's, saying where the peers' finders went.
    """
    if strategy == SLOW_START.name:
        return
    if strategy in MOVED_FINDERS:
        raise UsageError(
            f"{shown}: the peers' finders moved to the benchmark suite; from a source checkout run "
            f"`{BENCH_COMMAND.format(name=strategy)}`, or leave the option out for edgebatch's own search"
        )
    raise UsageError(
        f"unknown {shown}: edgebatch has one search ({SLOW_START.name}), so leave the option out; the peers' "
        "finders moved to the benchmark suite (`python tools/bench/probe_bench.py --help` in a source checkout)"
    )


def deprecation_note(option: str) -> str:
    """The one line said where the probe's own search is asked for by name: the option goes away."""
    return (f"{option} is deprecated and will be removed: edgebatch has one search ({SLOW_START.name}), "
            "so leave the option out")


def deprecated_strategy(strategy: str) -> None:
    """edgebatch.probe's `strategy` keyword: a FutureWarning, shown to users, for the probe's own
    search; a UsageError (check_strategy) for any other."""
    check_strategy(strategy, f"strategy={strategy!r}")
    # stacklevel 3: the warning names the line that called edgebatch.probe.
    warnings.warn(deprecation_note("edgebatch.probe(strategy=...)"), FutureWarning, stacklevel=3)
