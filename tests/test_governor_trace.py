"""A scripted 100-update pressure trace through the Governor: shrink on the way up, regrow on the way
down, with the configured patience and cooldown."""

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
