"""How far under its budget a probe holds a trial's peak, and an answer below a bump.

Both depend on the TensorFlow inter-op threads the workers ran with (edgebatch/settings/threads.py): with
TensorFlow's own pool the same batch reads differently between processes and the edge of a bump
moves; with one thread (the default) neither does. The probe (api.py), the per-length token model
(token_fit.py), `edgebatch profile show` and the benchmarks read these from here, so every reading of a
profile judges its trials against the same figure.
"""

from __future__ import annotations

from edgebatch.probing.outcomes import BUMP_EDGE_FRACTION
from edgebatch.probing.worker import DEFAULT_INTER_OP_THREADS

# A trial fits when its peak is at most the budget less a measurement margin: max_batch must run
# in any fresh process, not just in the worker that measured it. With TensorFlow's inter-op pool
# one batch read up to 1.45% apart between processes; 2.5% covers that with 1% to spare
# (docs/probe-evidence.md, "Bumps"; docs/probe-rules.md, "MEASUREMENT_MARGIN").
MEASUREMENT_MARGIN = 0.025
# With one inter-op thread (the default) that spread falls to 0.05% on steady hosts
# (docs/tensorflow-memory.md, "Inter-op threads"); 1% is twenty times it, for what differs between
# two installs of one environment. Hosts whose processes draw one of two peak levels are not
# covered by it: the answer's repeats in new processes (outcomes.ANSWER_READINGS) measure that
# spread and lower the budget by it (docs/probe-rules.md, "MEASUREMENT_MARGIN_ONE_THREAD").
MEASUREMENT_MARGIN_ONE_THREAD = 0.01
# safe_batch's peak keeps this share under the budget the search judged by (--headroom's default):
# room for what the probe's bare step does not hold, a peak's late rise and fit's data and
# accumulator; 3% was measured too little (docs/probe-rules.md, "safe_batch").
DEFAULT_HEADROOM = 0.10
# Below a limit the budget does not see (an address-space cap), safe_batch keeps this share of the
# edge clear: the edge moved by a few percent between processes (summary.hidden_limit_edge_of).
HIDDEN_LIMIT_MARGIN = 0.10


def measurement_margin(inter_op_threads: int) -> float:
    """The share of the budget a trial's peak must stay under it by, for workers run with `inter_op_threads`."""
    return MEASUREMENT_MARGIN_ONE_THREAD if inter_op_threads == 1 else MEASUREMENT_MARGIN


def bump_edge_fraction(inter_op_threads: int) -> float:
    """How far slow_start's answer keeps below a bump that stands (SearchConfig.bump_edge_fraction).

    With TensorFlow's pool the batch where a bump begins moves between processes, so the answer
    keeps outcomes.BUMP_EDGE_FRACTION below it. With one inter-op thread it stays put, so the
    largest fit under the bump is the answer (docs/probe-evidence.md, "Bumps").
    """
    return 0.0 if inter_op_threads == 1 else BUMP_EDGE_FRACTION


def fit_budget_bytes(budget_bytes: int, inter_op_threads: int = DEFAULT_INTER_OP_THREADS) -> int:
    """The figure a trial's peak must stay under to count as fitting the budget."""
    return int(budget_bytes * (1 - measurement_margin(inter_op_threads)))
