"""Pictures of a device profile: memory and throughput against batch size.

matplotlib is imported when a plot is asked for (the `plots` extra); nothing else needs it.
"""

from __future__ import annotations

from pathlib import Path

from edgebatch.errors import UsageError

GIB = 1024**3


def plot_profile(profile, output: str | Path) -> Path:
    """Write a PNG: peak memory per trial with the fitted line, budget and safe budget; samples/s."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise UsageError("plotting needs matplotlib: pip install 'edgebatch[plots]'") from error
    output = Path(output)
    if output.suffix.lower() != ".png":
        raise UsageError(f"plot output must be a .png file, got {str(output)!r}")
    measured = sorted((t for t in profile.answer_trials if t.measured and t.peak_bytes is not None), key=lambda t: t.batch)
    failed = [t for t in profile.answer_trials if t.measured and t.peak_bytes is None]
    figure, (memory_axes, rate_axes) = plt.subplots(1, 2, figsize=(11, 4.2))
    fits = [t for t in measured if t.ok]
    over = [t for t in measured if not t.ok]
    memory_axes.scatter([t.batch for t in fits], [t.peak_bytes / GIB for t in fits], color="tab:blue", label="trial fits")
    if over:
        memory_axes.scatter([t.batch for t in over], [t.peak_bytes / GIB for t in over], color="tab:orange",
                            marker="s", label="trial over budget")
    for trial in failed:
        memory_axes.axvline(trial.batch, color="tab:red", linestyle=":", linewidth=1)
    if failed:
        memory_axes.plot([], [], color="tab:red", linestyle=":", label="OOM / worker killed")
    largest = max([t.batch for t in profile.answer_trials] + [profile.max_batch])
    model = profile.memory_model
    if model is not None:
        memory_axes.plot([0, largest], [model.fixed_bytes / GIB, model.predict_bytes(largest) / GIB],
                         color="gray", linewidth=1, label=f"fit (r2 {model.r2:.3f})")
    memory_axes.axhline(profile.budget_bytes / GIB, color="black", label="budget")
    memory_axes.axhline(profile.budget_bytes * (1 - profile.headroom) / GIB, color="black", linestyle="--",
                        label=f"safe budget ({profile.headroom:.0%} headroom)")
    memory_axes.axvline(profile.max_batch, color="tab:green", linewidth=1, label=f"max_batch {profile.max_batch}")
    memory_axes.set_xlabel("batch size")
    memory_axes.set_ylabel(f"peak memory, GiB ({profile.measure.replace('_', ' ')})")
    memory_axes.legend(fontsize=8)
    rated = [t for t in fits if t.samples_per_second]
    rate_axes.plot([t.batch for t in rated], [t.samples_per_second for t in rated], marker="o")
    if profile.throughput_knee:
        rate_axes.axvline(profile.throughput_knee, color="tab:purple", linestyle="--",
                          label=f"knee {profile.throughput_knee}")
        rate_axes.legend(fontsize=8)
    rate_axes.set_xscale("log", base=2)
    rate_axes.set_xlabel("batch size")
    rate_axes.set_ylabel("samples / s")
    figure.suptitle(f"{profile.model['name']} on {profile.device['tf_device']} ({profile.device['description']})")
    figure.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    temporary = output.with_name(output.name + ".tmp.png")
    try:
        figure.savefig(temporary, dpi=110)
        temporary.replace(output)  # no half-written picture if interrupted
    except BaseException:  # a failed or interrupted save (Ctrl-C, SIGTERM) leaves no temporary either
        temporary.unlink(missing_ok=True)
        raise
    finally:
        plt.close(figure)
    return output
