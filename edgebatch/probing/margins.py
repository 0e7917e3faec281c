"""How far under its budget a probe holds a trial's peak, and an answer below a bump.

Both depend on the TensorFlow inter-op threads the workers ran with (edgebatch/threads.py): with
TensorFlow's own pool the same batch reads differently between processes and the edge of a bump
moves; with one thread (the default) neither does. The probe (api.py), the per-length token model
(token_fit.py), `edgebatch profile show` and the benchmarks read these from here, so every reading of a
profile judges its trials against the same figure.
"""

from __future__ import annotations

from edgebatch.probing.outcomes import BUMP_EDGE_FRACTION
from edgebatch.probing.worker import DEFAULT_INTER_OP_THREADS

# A trial fits when its peak is at most the budget less a measurement margin: max_batch must run
# in any fresh process, not just in the worker that measured it.
# With TensorFlow's inter-op pool (--inter-op-threads 0, or more than one thread) the same batch
# reads differently from one process to the next, more between runs at different times than back
# to back. small_cnn at 337: at most 1,594.5 MB in the probe worker that answered it, then
# 1,617.6 MB in a fresh process (1.45% more; with a 1% margin tests/test_probe_real.py failed 2
# runs in 5); back to back, four workers read 1,608.1-1,608.7 MB and four fresh processes
# 1,595.6-1,595.9 MB. 2.5% covers the widest spread seen with 1% to spare
# (memory_fit.PEAK_SPREAD_FRACTION: the same spread, for bumps).
MEASUREMENT_MARGIN = 0.025
# With one inter-op thread (the default) that spread is gone: three fresh processes each read
# transformer_tiny at 870 x 64 tokens at 1,487.7-1,488.3 MiB, small_cnn at 324 at 1,386.2-1,386.3,
# dense_wide at 300 at 1,540.9-1,541.3 and text_cnn at 700 at 1,112.6-1,113.1 (0.05% at most),
# and the same under two busy loops (docs/tensorflow-memory.md, "Inter-op threads"). The probe's
# fork-server workers read at or above fresh processes (their prewarm: small_cnn at 324, 1.37 GiB
# against 1,386 MiB). 1% is twenty times that spread, for what differs between two installs of one
# environment; a user's process that imports more than the worker has its own headroom, safe_batch's.
# Those figures are an Intel Xeon host's. On an AMD EPYC host some batches read one of two values
# at random between processes (small_cnn at 324: 1,427 MiB in 3 of 4, 1,549 MiB in the fourth),
# which no margin of this size covers; one malloc arena removed it in 6 of 6 processes
# (device_profiles/README.md, "Bumps"), but not mobilenet_v2's (1,364-1,512 MiB at 30). The
# margin does not claim to cover that case: the answer's repeats in new processes
# (outcomes.ANSWER_READINGS) measure it and lower the budget by it.
MEASUREMENT_MARGIN_ONE_THREAD = 0.01


def measurement_margin(inter_op_threads: int) -> float:
    """The share of the budget a trial's peak must stay under it by, for workers run with `inter_op_threads`."""
    return MEASUREMENT_MARGIN_ONE_THREAD if inter_op_threads == 1 else MEASUREMENT_MARGIN


def bump_edge_fraction(inter_op_threads: int) -> float:
    """How far slow_start's answer keeps below a bump that stands (SearchConfig.bump_edge_fraction).

    With TensorFlow's pool the batch where a bump begins moves between processes, so the answer
    keeps outcomes.BUMP_EDGE_FRACTION below it. With one inter-op thread it stays put: small_cnn's
    cliff read 1,392.5 MiB at 327 in two fresh processes and 1,557.3-1,558.4 MiB at 328 in three,
    and the probe's workers failed 328 too, so the largest fit under the bump is the answer.
    """
    return 0.0 if inter_op_threads == 1 else BUMP_EDGE_FRACTION


def fit_budget_bytes(budget_bytes: int, inter_op_threads: int = DEFAULT_INTER_OP_THREADS) -> int:
    """The figure a trial's peak must stay under to count as fitting the budget."""
    return int(budget_bytes * (1 - measurement_margin(inter_op_threads)))
