"""The text `edgebatch probe` and `edgebatch profile show` print for one profile: the answer, then every trial."""

from __future__ import annotations

from edgebatch.units import format_bytes


def format_profile(profile) -> str:
    """The end-of-probe summary: the answer first, then every trial."""
    model = profile.memory_model
    lines = [
        f"{profile.model['name']} on {profile.device['tf_device']} ({profile.device['description']})",
        f"  budget            {format_bytes(profile.budget_bytes)} ({profile.budget_source}, measure: {profile.measure})",
        f"  max_batch         {profile.max_batch}",
        f"  safe_batch        {profile.safe_batch}   (headroom {profile.headroom:.0%})",
        f"  throughput_knee   {profile.throughput_knee}",
        f"  inter-op threads  {_inter_op_note(profile.search)}",
        f"  malloc arenas     {_arena_note(profile.search)}",
        f"  fresh repeats     {_spread_note(profile)}",
    ]
    if model is not None:
        lines.append(
            f"  memory model      {format_bytes(model.fixed_bytes)} + {format_bytes(model.per_sample_bytes)}/sample "
            f"(r2 {model.r2:.4f}), predicted ceiling {profile.predicted_ceiling}"
        )
    if profile.per_length:
        longest = max(profile.per_length)
        lines[1:1] = [f"  (max_batch, safe_batch and the memory model are at the longest length, {longest} tokens)"]
        lines.append(f"  {'tokens':>7}  {'max_batch':>9} {'safe_batch':>10} {'peak':>11}")
        for length, ceiling in sorted(profile.per_length.items()):
            lines.append(
                f"  {length:>7}  {ceiling.max_batch:>9} {ceiling.safe_batch:>10} {format_bytes(ceiling.peak_bytes):>11}"
            )
    token_model = profile.token_model
    if token_model is not None:
        lines.append(
            f"  token model       {format_bytes(token_model.fixed_bytes)} + {token_model.per_token_bytes:,.0f} bytes x batch x tokens + "
            f"{token_model.per_token_squared_bytes:,.1f} bytes x batch x tokens^2 (r2 {token_model.r2:.4f}, {token_model.points} readings)"
        )
    ran = sum(1 for trial in profile.trials if trial.measured)
    lines.append(f"  trials            {ran} run, {len(profile.trials) - ran} skipped, {profile.probe_seconds:.1f} s")
    lines.append("")
    tokens = profile.per_length is not None
    lines.append(f"  {'tokens  ' if tokens else ''}{'batch':>7}  {'result':<22} {'peak':>11} {'step s':>8} {'samples/s':>10}")
    for trial in sorted(profile.trials, key=lambda t: (t.seq_len or 0, t.batch)):
        result = "ok" if trial.ok else (trial.error or "failed").replace("_", " ")
        step = f"{trial.step_seconds:.3f}" if trial.step_seconds else "-"
        rate = f"{trial.samples_per_second:.1f}" if trial.samples_per_second else "-"
        length = f"{trial.seq_len or '-':>6}  " if tokens else ""
        lines.append(f"  {length}{trial.batch:>7}  {result:<22} {format_bytes(trial.peak_bytes):>11} {step:>8} {rate:>10}")
    return "\n".join(lines)


def _spread_note(profile) -> str:
    """How far repeated fresh readings of one batch differed, and what the answer was judged by."""
    from edgebatch.probing.budget import judged_bytes
    from edgebatch.probing.outcomes import SPREAD_NOISE_FRACTION
    from edgebatch.probing.summary import spread_fraction_of

    spread = spread_fraction_of(profile.trials)
    readings = (profile.search or {}).get("answer_readings", 1)
    if spread <= SPREAD_NOISE_FRACTION:
        return f"answer read in {readings} fresh worker(s); repeated readings within {SPREAD_NOISE_FRACTION:.0%}"
    judged = judged_bytes(profile)
    return (f"peaks differ between processes here: repeated readings of one batch {spread:.1%} apart, "
            f"so readings were judged against about {format_bytes(judged)}")


def _arena_note(search: dict) -> str:
    from edgebatch.settings import malloc_arenas

    recorded = (search or {}).get("malloc_arena_max")
    note = malloc_arenas.describe(recorded)
    return note if recorded is None else f"{note}: the ceilings hold for training started with the same"


def _inter_op_note(search: dict) -> str:
    from edgebatch.settings.threads import recorded_inter_op_threads

    threads = recorded_inter_op_threads(search)
    if threads == 0:
        return "0 (TensorFlow's own pool)"
    return f"{threads} (the ceilings hold for training with edgebatch.set_inter_op_threads({threads}))"
