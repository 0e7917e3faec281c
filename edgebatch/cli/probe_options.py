"""The options that say what a probe searches for, shared by `edgebatch probe` and `edgebatch fleet probe`.

Every default has one owner, ProbeRequest; the options only show it. Each keyword these options
produce is named exactly as edgebatch.probe's keyword argument.
"""

from __future__ import annotations

import click

from edgebatch.errors import UsageError
from edgebatch.probing.api import ProbeRequest
from edgebatch.probing.budget import MEMORY_BUDGET_ENV
from edgebatch.probing.strategy_option import check_strategy, deprecation_note
from edgebatch.models.zoo import BUILTIN_MODELS, OPTIMIZATIONS, OPTIMIZERS, PRECISIONS

_DEFAULTS = ProbeRequest()

_BUDGET_HELP = (
    "Memory the training process may use, e.g. 1.5GiB, 512MiB, 2GB or bytes (a unit-less figure under 1 MiB "
    "is refused). Default: ${env}, else on CPU the smaller of available RAM and the cgroup room, on GPU NVML's "
    "free memory."
)


def search_options(*, budget_help: str | None = None, budget_envvar: str | None = MEMORY_BUDGET_ENV):
    """A decorator adding the model, budget and search options to a click command.

    `budget_envvar` is the variable --memory-budget falls back to (None: none, as in a fleet probe,
    where each node reads its own).
    """
    options = [
        click.option("--model", "model_spec", default=_DEFAULTS.model, show_default=True, metavar="SPEC",
                     help="Built-in model (" + ", ".join(sorted(BUILTIN_MODELS)) + "), FILE.py:FUNCTION returning "
                          "an uncompiled Keras model, or a .keras file."),
        click.option("--memory-budget", default=None, metavar="SIZE", envvar=budget_envvar,
                     help=budget_help or _BUDGET_HELP.format(env=budget_envvar)),
        click.option("--allow-overcommit", is_flag=True,
                     help="Accept a --memory-budget above what the device can give now (trials may swap or be "
                          "killed)."),
        click.option("--precision", type=click.Choice(PRECISIONS), default=_DEFAULTS.precision, show_default=True,
                     help="Keras dtype policy."),
        click.option("--optimizer", type=click.Choice(OPTIMIZERS), default=_DEFAULTS.optimizer, show_default=True,
                     help="Optimizer whose state the probe includes in memory."),
        click.option("--optimize", type=click.Choice(OPTIMIZATIONS), default=_DEFAULTS.optimize, show_default=True,
                     help="Probe the model wrapped by TensorFlow Model Optimization: qat (quantize_model) or prune "
                          "(prune_low_magnitude). Needs a tf_keras model: built-ins are built with tf_keras, a "
                          "FILE.py:FUNCTION must return one (`import tf_keras`). Recorded in the model key."),
        click.option("--start", type=click.IntRange(min=1), default=_DEFAULTS.start, show_default=True,
                     help="First batch size tried."),
        click.option("--max-batch-limit", "--max-batch", "max_batch_limit", type=click.IntRange(min=1),
                     default=_DEFAULTS.max_batch_limit, show_default=True,
                     help="Never try a batch above this (--max-batch is an older name for it)."),
        click.option("--multiple", type=click.IntRange(min=1), default=_DEFAULTS.multiple, show_default=True,
                     help="Batch sizes are multiples of this (e.g. 8, or the replica count)."),
        click.option("--headroom", type=click.FloatRange(0, 1, max_open=True), default=_DEFAULTS.headroom,
                     show_default=True,
                     help="safe_batch's peak stays this share under the budget, beyond the spread measured "
                          "between processes: for what training adds to the probe's bare step."),
        click.option("--steps-per-trial", type=click.IntRange(min=1), default=_DEFAULTS.steps_per_trial,
                     show_default=True, help="Timed training steps per trial, after one warm-up step."),
        click.option("--trial-seconds", type=click.FloatRange(min=0, min_open=True),
                     default=_DEFAULTS.trial_seconds, show_default=True,
                     help="Stop a trial's timed steps after this long (at least one step runs)."),
        click.option("--inter-op-threads", type=click.IntRange(min=0), default=_DEFAULTS.inter_op_threads,
                     show_default=True,
                     help="TensorFlow inter-op threads in the probe's workers; 0: TensorFlow's own pool. With 1 "
                          "the ops of a step run one after another, so the peak is the same in every step and "
                          "process; with the pool it climbs for up to 30 steps, to a higher figure. The ceiling "
                          "holds for training with the same setting (edgebatch.set_inter_op_threads)."),
        click.option("--answer-readings", type=click.IntRange(min=1), default=_DEFAULTS.answer_readings,
                     show_default=True,
                     help="Fresh workers that measure the answer before slow_start gives it. Where one batch reads "
                          "differently between processes (seen on some hosts), their spread lowers "
                          "the budget readings must fit and the search goes on below; 1 turns the repeats off. Twice "
                          "as many once readings of one batch differ by more than 1%, or fresh workers both run and "
                          "run out of memory near the edge (a band, seen under hard limits)."),
        click.option("--tolerance", type=click.FloatRange(0, 1, min_open=True, max_open=True),
                     default=_DEFAULTS.tolerance, show_default=True,
                     help="How close the search brackets the edge: it stops once the last batch that fits and the "
                          "first that fails lie within this share of the one that fits (or one --multiple). Larger is "
                          "quicker and may answer up to that much lower."),
        click.option("--seq-lens", default=None, metavar="L1,L2,...",
                     help="Sequence lengths in tokens to probe a model with a variable sequence axis at, e.g. "
                          "64,128,256,512: the ceiling at each and a token memory model for any length. Default for "
                          "transformer_tiny and lstm_small: 64 doubling up to 512."),
        # Deprecated: kept so that scripts passing `--strategy slow_start` still run; never passed on.
        click.option("--strategy", default=None, metavar="slow_start", expose_value=False,
                     callback=_deprecated_strategy,
                     help="Deprecated: edgebatch has one search (slow_start); the peers' finders moved to the "
                          "benchmark suite (tools/bench/probe_bench.py, BENCHMARKS.md)."),
    ]

    def decorate(command):
        for option in reversed(options):
            command = option(command)
        return command

    return decorate


def _deprecated_strategy(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    """--strategy: a one-line note on stderr for the probe's own search, a usage error (exit 2) for any other."""
    del param
    if value is None:
        return
    try:
        check_strategy(value, f"--strategy {value}")
    except UsageError as error:
        raise click.UsageError(str(error), ctx) from None
    click.echo(f"note: {deprecation_note('--strategy')}", err=True)
