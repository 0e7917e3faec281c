"""A scripted 100-update pressure trace through the Governor: shrink on the way up, regrow on the way
down, with the configured patience and cooldown."""

import math

import pytest

from edgebatch.governor import Governor, GovernorConfig, Observation


def rising_then_falling(updates=100, low=0.5, peak=0.95, end=0.3):
    half = updates // 2
    rise = [low + (peak - low) * i / (half - 1) for i in range(half)]
    fall = [peak + (end - peak) * i / (updates - half - 1) for i in range(updates - half)]
    return rise + fall


@pytest.mark.parametrize("patience, cooldown", [(5, 20), (3, 10), (8, 25)])
def test_trace_shrinks_then_regrows_with_patience_and_cooldown(patience, cooldown):
    pressures = rising_then_falling()
    governor = Governor(GovernorConfig(ceiling_batch=64, effective_batch=128, grow_patience=patience,
                                       cooldown_updates=cooldown))
    sizes = []
    for pressure in pressures:
        sizes.append(governor.observe(Observation(pressure=pressure)).micro_batch)

    # Expected timeline, from the pressures and the rules (update indices are 0-based here).
    shrink_at = next(i for i, p in enumerate(pressures) if p > 0.90)
    grow_at = next(
        i for i in range(shrink_at + cooldown + 1, len(pressures))
        if all(p < 0.60 for p in pressures[i - patience + 1 : i + 1])
    )
    assert 30 < shrink_at < 50 < grow_at < 100
    assert sizes[:shrink_at] == [64] * shrink_at
    assert sizes[shrink_at:grow_at] == [32] * (grow_at - shrink_at)
    assert sizes[grow_at:] == [64] * (len(pressures) - grow_at)

    assert [entry["update"] for entry in governor.history] == [shrink_at + 1, grow_at + 1]
    shrink, grow = governor.history
    assert shrink["reason"].startswith("pressure ") and shrink["reason"].endswith(": 64 -> 32")
    assert shrink["accumulation_steps"] == 4 and grow["accumulation_steps"] == 2
    assert grow["reason"] == f"calm {patience} updates < 0.60: 32 -> 64"
    assert grow["pressure"] == pytest.approx(pressures[grow_at])


def test_trace_with_a_rate_limited_reader_counts_patience_in_readings():
    # Readings only every 4th update (None otherwise, as PressureReader returns): growth needs
    # `patience` calm readings, so it comes later than with a reading every update.
    pressures = rising_then_falling()
    patience, cooldown, every = 3, 10, 4
    governor = Governor(GovernorConfig(ceiling_batch=64, effective_batch=64, grow_patience=patience,
                                       cooldown_updates=cooldown))
    read_at = [i % every == 0 for i in range(len(pressures))]
    for pressure, read in zip(pressures, read_at):
        governor.observe(Observation(pressure=pressure if read else None))
    shrink_at = next(i for i, p in enumerate(pressures) if p > 0.90 and read_at[i])
    calm_reads = [i for i, p in enumerate(pressures) if read_at[i] and p < 0.60 and i > shrink_at]
    grow_at = next(i for i in calm_reads[patience - 1 :] if i > shrink_at + cooldown)
    assert [entry["update"] for entry in governor.history] == [shrink_at + 1, grow_at + 1]
    assert governor.decision.micro_batch == 64


# --- traces against a simulated device ----------------------------------------------------------
# Readings are what PressureReader reports: the whole-device fraction (pressure), the limit, what
# others use under it (used_bytes), this job's own bytes and their measure. The job's pool is
# sticky, as TensorFlow's allocators and the process heap are: it holds the largest footprint run.

MiB = 1024 * 1024


def reading(limit_bytes, others_bytes, own_bytes, measure="process_peak"):
    return Observation(
        pressure=(others_bytes + own_bytes) / limit_bytes, limit_bytes=int(limit_bytes),
        used_bytes=int(others_bytes), own_bytes=int(own_bytes), measure=measure,
    )


def run_hidden_edge(governor, updates, edge_at):
    """Each update runs the governor's size; a size above edge_at(update) OOMs (on_oom, then retry)."""
    sizes, ooms = [], 0
    for update in range(updates):
        while governor.decision.micro_batch > edge_at(update):
            ooms += 1
            assert not governor.on_oom(governor.decision.micro_batch).exhausted
        sizes.append(governor.decision.micro_batch)
        governor.observe(Observation(pressure=0.30))
    return sizes, ooms


def test_hidden_edge_costs_a_handful_of_ooms_and_settles_near_it():
    # Before the OOM threshold: ~20 OOMs in 400 updates (one per cooldown), each ~10 s on CPU.
    governor = Governor(GovernorConfig(ceiling_batch=64, effective_batch=64))
    sizes, ooms = run_hidden_edge(governor, 400, edge_at=lambda update: 40)
    assert ooms <= 5
    assert governor.state.oom_count == ooms
    settled = sizes[200:]
    assert all(30 <= size <= 40 for size in settled), sorted(set(settled))
    assert max(settled) == 40, "additive growth reaches the edge itself"
    assert governor.state.threshold_batch is not None and governor.state.threshold_batch > 40


def test_the_threshold_expires_so_a_freed_device_is_reclaimed():
    cfg = GovernorConfig(ceiling_batch=64, effective_batch=64, threshold_expiry_updates=150)
    governor = Governor(cfg)
    sizes, ooms = run_hidden_edge(governor, 600, edge_at=lambda update: 40 if update < 300 else 1000)
    assert max(sizes[:300]) <= 40
    assert sizes[-1] == 64 and governor.state.threshold_batch is None
    first_64 = sizes.index(64, 300)
    assert first_64 < 300 + 2 * 150 + 60, first_64  # raised at one expiry, forgotten at the next


def test_calm_streak_does_not_count_in_the_cooldown_after_an_oom():
    # grow_patience 5, cooldown 20: growth may come 5 calm updates after the cooldown ends, not at once
    governor = Governor(GovernorConfig(ceiling_batch=64, effective_batch=64))
    governor.on_oom(64)
    assert governor.decision.micro_batch == 32
    changes = []
    for update in range(1, 40):
        if governor.observe(Observation(pressure=0.30)).changed:
            changes.append(update)
    assert changes == [20 + 5]
    assert governor.decision.micro_batch == 48  # x2 capped at the safe point 0.75 x 64


# A CPU job modelled by its profile: RSS = 849 MiB + 11.6 MiB/sample (MobileNetV2, 96x96).
MODEL = {"fixed_bytes": 849 * MiB, "per_sample_bytes": 11.6 * MiB, "model_measure": "process_peak"}


def need_bytes(micro_batch):
    return MODEL["fixed_bytes"] + MODEL["per_sample_bytes"] * micro_batch


@pytest.mark.parametrize("with_model", [True, False])
def test_a_constant_own_pool_reading_neither_ratchets_nor_freezes(with_model):
    # The job's own RSS is 95% of the limit all along (its pool from an earlier, larger run); others
    # use ~0. Before: without a model 256 -> 1 by halving; with one, no reading was ever calm again.
    limit = 16 * 1024 * MiB
    cfg = GovernorConfig(ceiling_batch=256, effective_batch=256, **(MODEL if with_model else {}))
    governor = Governor(cfg, start_micro_batch=16)
    sizes = []
    for _ in range(400):
        sizes.append(governor.decision.micro_batch)
        governor.observe(reading(limit, others_bytes=10 * MiB, own_bytes=0.95 * limit))
    assert all(later >= earlier for earlier, later in zip(sizes, sizes[1:])), "never shrinks"
    assert sizes[-1] == 256


def test_a_neighbour_that_takes_memory_and_leaves_is_followed_down_and_back_up():
    limit = 4096 * MiB
    cfg = GovernorConfig(ceiling_batch=128, effective_batch=128, **MODEL)
    governor = Governor(cfg)
    pool = 0.0
    sizes, events = [], []

    def neighbour(update):
        return 1500 * MiB if 100 <= update < 250 else 50 * MiB

    for update in range(400):
        size = governor.decision.micro_batch
        pool = max(pool, need_bytes(size))
        assert neighbour(update) + pool <= limit, f"OOM at update {update}, size {size}"
        sizes.append(size)
        decision = governor.observe(reading(limit, neighbour(update), pool))
        if decision.changed:
            events.append((update, decision.micro_batch))
    alone_fit = math.floor((0.8 * limit - 50 * MiB - MODEL["fixed_bytes"]) / MODEL["per_sample_bytes"])
    shared_fit = math.floor((0.8 * limit - 1500 * MiB - MODEL["fixed_bytes"]) / MODEL["per_sample_bytes"])
    assert alone_fit > 128 and shared_fit == 79
    assert sizes[:101] == [128] * 101
    assert events[0] == (100, shared_fit), events  # followed down at the first reading
    assert sizes[101:251] == [shared_fit] * 150, "the sticky pool does not ratchet it lower"
    assert 128 in sizes[251:] and sizes[-1] == 128
    back_at = sizes.index(128, 251)
    assert back_at <= 250 + 5 + 1, back_at  # patience 5, then x2 capped at 128
