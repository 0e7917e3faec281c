"""The stateful Governor wrapper: observe/on_oom, history, checkpoints, construction from a profile."""

import dataclasses
import json
from types import SimpleNamespace

import pytest

from edgebatch.governor import Governor, GovernorConfig, GovernorConfigError, Observation
from edgebatch.governor.governor import trainable_bytes

MiB = 1024 * 1024


def fake_profile(safe_batch=48, max_batch=64, memory_model=None, measure="process_peak"):
    return SimpleNamespace(
        safe_batch=safe_batch, max_batch=max_batch, memory_model=memory_model,
        budget_bytes=4096 * MiB, device={"kind": "CPU"}, measure=measure,
    )


def test_observe_records_only_changes_in_history():
    governor = Governor(GovernorConfig(ceiling_batch=64, effective_batch=128, grow_patience=2, cooldown_updates=1))
    governor.observe(Observation(pressure=0.5))
    governor.observe(Observation(pressure=0.95))
    governor.observe(Observation(pressure=0.95))  # cooldown
    assert len(governor.history) == 1
    entry = governor.history[0]
    assert entry == {
        "update": 2, "reason": "pressure 0.95 > 0.90: 64 -> 32", "micro_batch": 32, "accumulation_steps": 4,
        "effective_batch": 128, "lr_scale": 1.0, "pressure": 0.95, "oom": False,
    }
    assert governor.decision.micro_batch == 32 and governor.state.micro_batch == 32


def test_on_oom_shrinks_at_once_and_flags_exhaustion_at_one():
    governor = Governor(GovernorConfig(ceiling_batch=4, effective_batch=4))
    sizes = [governor.on_oom(governor.decision.micro_batch).micro_batch for _ in range(2)]
    assert sizes == [2, 1]
    decision = governor.on_oom(1)
    assert decision.exhausted and decision.micro_batch == 1
    assert [entry["oom"] for entry in governor.history] == [True, True, True]
    assert governor.state.oom_count == 3


def test_on_oom_uses_the_last_memory_reading_for_the_model():
    config = GovernorConfig(ceiling_batch=64, effective_batch=64, fixed_bytes=100 * MiB, per_sample_bytes=10 * MiB)
    governor = Governor(config)
    governor.observe(Observation(pressure=0.7, limit_bytes=1000 * MiB, used_bytes=600 * MiB))  # fits 10
    assert governor.on_oom(64).micro_batch == 10
    plain = Governor(config)
    assert plain.on_oom(64).micro_batch == 32


def test_state_dict_round_trip_through_json_continues_identically():
    config = GovernorConfig(ceiling_batch=64, effective_batch=128, grow_patience=2, cooldown_updates=3)
    trace = [0.95, 0.5, 0.4, 0.3, 0.3, 0.2, 0.92, 0.5, 0.5, 0.5, 0.4, 0.3, 0.3]
    original = Governor(config)
    for pressure in trace[:5]:
        original.observe(Observation(pressure=pressure, step_seconds=0.1, micro_batch=original.decision.micro_batch))
    resumed = Governor(config)
    resumed.load_state_dict(json.loads(json.dumps(original.state_dict())))
    assert resumed.state == original.state
    # A restored governor reports the decision its state implies, not the last change's reason.
    assert resumed.decision == dataclasses.replace(original.decision, reason="", changed=False)
    for pressure in trace[5:]:
        a = original.observe(Observation(pressure=pressure))
        b = resumed.observe(Observation(pressure=pressure))
        assert a == b
    assert resumed.history == original.history and len(resumed.history) >= 2


def test_load_state_dict_under_a_smaller_ceiling_lowers_the_micro_batch():
    big = Governor(GovernorConfig(ceiling_batch=64, effective_batch=64))
    small = Governor(GovernorConfig(ceiling_batch=40, effective_batch=64, multiple=8))
    small.load_state_dict(big.state_dict())
    assert small.state.micro_batch == 40 and small.decision.changed
    assert small.decision.reason.startswith("resume: 64 -> 40")
    assert small.state.cooldown_left == small.config.cooldown_updates


def test_load_state_dict_rejects_malformed_input():
    governor = Governor(GovernorConfig(ceiling_batch=8, effective_batch=8))
    with pytest.raises(ValueError, match="state"):
        governor.load_state_dict({"history": []})
    with pytest.raises(ValueError, match="micro_batch"):
        governor.load_state_dict({"state": {**governor.state.to_dict(), "micro_batch": "8"}})


def test_reset_starts_over():
    governor = Governor(GovernorConfig(ceiling_batch=64, effective_batch=64))
    governor.on_oom(64)
    governor.reset()
    assert governor.history == [] and governor.state.oom_count == 0 and governor.decision.micro_batch == 64


def test_from_profile_uses_safe_batch_and_the_memory_model():
    model = SimpleNamespace(fixed_bytes=849 * MiB, per_sample_bytes=11.6 * MiB)
    governor = Governor.from_profile(fake_profile(memory_model=model), effective_batch=128)
    assert governor.config.ceiling_batch == 48
    assert governor.config.fixed_bytes == 849 * MiB and governor.config.per_sample_bytes == 11.6 * MiB
    assert governor.decision.micro_batch == 48 and governor.decision.accumulation_steps == 3


@pytest.mark.parametrize("measure", ["process_peak", "allocator_peak"])
def test_from_profile_tags_the_memory_model_with_the_profiles_measure(measure):
    model = SimpleNamespace(fixed_bytes=100 * MiB, per_sample_bytes=10 * MiB)
    governor = Governor.from_profile(fake_profile(memory_model=model, measure=measure), effective_batch=48)
    assert governor.config.model_measure == measure
    other = "allocator_peak" if measure == "process_peak" else "process_peak"
    # others use 600 of 1000 MiB: in the model's measure it predicts 48 does not fit at all
    matching = Observation(pressure=0.7, limit_bytes=1000 * MiB, used_bytes=600 * MiB, measure=measure)
    assert governor.observe(matching).micro_batch == 10
    governor.reset()
    assert governor.observe(dataclasses.replace(matching, measure=other)).micro_batch == 48


def test_from_profile_counts_fits_accumulators_and_extra_bytes():
    model = SimpleNamespace(fixed_bytes=100 * MiB, per_sample_bytes=10 * MiB)
    tf_like = SimpleNamespace(size=4)  # a tf.DType says its size in bytes
    keras_model = SimpleNamespace(trainable_variables=[
        SimpleNamespace(shape=(256, 1024), dtype="float32"),  # 1 MiB (Keras 3 names its dtype)
        SimpleNamespace(shape=(1024,), dtype=tf_like),  # 4 KiB
        SimpleNamespace(shape=(512, 1024), dtype="float16"),  # 1 MiB
    ])
    assert trainable_bytes(keras_model) == 2 * MiB + 4096
    governor = Governor.from_profile(fake_profile(memory_model=model), effective_batch=48,
                                     model=keras_model, extra_bytes=8 * MiB)
    assert governor.config.extra_bytes == 10 * MiB + 4096
    plain = Governor.from_profile(fake_profile(), effective_batch=48, extra_bytes=8 * MiB)
    assert plain.config.extra_bytes == 0.0, "without a memory model there is nothing to add to"


@pytest.mark.parametrize("extra", [-1, float("nan"), "8"])
def test_from_profile_refuses_bad_extra_bytes(extra):
    with pytest.raises(GovernorConfigError, match="extra_bytes"):
        Governor.from_profile(fake_profile(), effective_batch=48, extra_bytes=extra)


def test_on_oom_of_a_remainder_piece_shrinks_from_the_running_size():
    governor = Governor(GovernorConfig(ceiling_batch=100, effective_batch=100), start_micro_batch=32)
    decision = governor.on_oom(4)  # [32, 32, 32, 4]: the last piece failed
    assert decision.micro_batch == 16 and governor.state.threshold_batch == 32
    told = Governor(GovernorConfig(ceiling_batch=100, effective_batch=100), start_micro_batch=64)
    assert told.on_oom(32, running_micro_batch=32).micro_batch == 16


def test_load_state_dict_accepts_a_checkpoint_from_before_the_threshold():
    governor = Governor(GovernorConfig(ceiling_batch=64, effective_batch=64))
    old = governor.state_dict()
    for key in ("threshold_batch", "threshold_calm_updates", "oom_cooldown"):
        del old["state"][key]
    governor.on_oom(64)
    governor.load_state_dict(json.loads(json.dumps(old)))
    assert governor.state.threshold_batch is None and governor.decision.micro_batch == 64


def test_from_profile_max_batch_small_effective_batch_and_overrides():
    governor = Governor.from_profile(fake_profile(), effective_batch=32, use_max_batch=True,
                                     mode="elastic", grow_patience=3)
    assert governor.config.ceiling_batch == 64 and governor.config.grow_patience == 3
    assert governor.config.fixed_bytes is None
    assert governor.decision.micro_batch == 32 and governor.decision.effective_batch == 32


def test_from_profile_rejects_a_bad_effective_batch():
    with pytest.raises(GovernorConfigError, match="0"):
        Governor.from_profile(fake_profile(), effective_batch=0)


def test_governor_refuses_a_non_config():
    with pytest.raises(GovernorConfigError, match="ceiling_batch"):
        Governor({"ceiling_batch": 8})
