"""Drive a search's next-step function against scripted devices: shared by the search's tests and the
benchmark finders' (no TensorFlow)."""

from edgebatch.probing.search import Done, Outcome, Run, Skip, next_step

MIB = 1024**2


def simulate(config, peak_of, crash_above=None, limit=100, lift_fraction=0.0, fails_once=(), outcomes=None,
             decide=next_step):
    """Drive the search to Done against a device whose peak at batch b is peak_of(b).

    crash_above: batches above it raise a real OOM (ran=False) instead of reporting a peak.
    lift_fraction: a reused worker reads (1 + lift_fraction) x what the batch adds over batch 1
    (memory kept from earlier trials); a fresh trial, or the very first, reads the true peak.
    fails_once: batches whose first trial dies (a transient: the worker killed once).
    outcomes: a list to record every outcome in (the caller reads them afterwards).
    decide: the next-step function (a Finder's next_step): edgebatch's search by default.
    Returns (answer, list of steps taken).
    """
    outcomes = [] if outcomes is None else outcomes
    steps = []
    for _ in range(limit):
        step = decide(config, outcomes)
        steps.append(step)
        if isinstance(step, Done):
            return step.max_batch, steps
        fresh = step.fresh if isinstance(step, Run) else False
        if isinstance(step, Skip):
            outcomes.append(Outcome(step.batch, ran=False, peak_bytes=step.predicted_peak_bytes, measured=False))
        elif step.batch in fails_once and not any(o.batch == step.batch and o.measured for o in outcomes):
            outcomes.append(Outcome(step.batch, ran=False, fresh=fresh))
        elif crash_above is not None and step.batch > crash_above:
            outcomes.append(Outcome(step.batch, ran=False, fresh=fresh))
        else:
            lift = 0 if fresh or not outcomes else lift_fraction * (peak_of(step.batch) - peak_of(1))
            outcomes.append(Outcome(step.batch, ran=True, peak_bytes=int(peak_of(step.batch) + lift), fresh=fresh))
    raise AssertionError(f"search did not finish in {limit} steps: {steps}")


def linear(fixed_mib, per_sample_mib):
    return lambda batch: (fixed_mib + per_sample_mib * batch) * MIB


def true_ceiling(peak_of, budget, upper=100_000):
    return max(b for b in range(1, upper) if peak_of(b) <= budget) if peak_of(1) <= budget else 0


def runs(steps):
    return [s.batch for s in steps if isinstance(s, Run)]


def piecewise(points_gib):
    """Peak at batch b interpolated between measured (batch, GiB) readings."""
    def peak(batch):
        for (b0, p0), (b1, p1) in zip(points_gib, points_gib[1:]):
            if b0 <= batch <= b1:
                return (p0 + (p1 - p0) * (batch - b0) / (b1 - b0)) * 1024**3
        raise ValueError(batch)
    return peak
