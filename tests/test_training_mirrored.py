"""fit under tf.distribute.MirroredStrategy: the replica arithmetic (tables, no TensorFlow) and real
runs on two logical CPU devices in a fresh process (tests/support/mirrored_run.py), whose weights
must reach the plain loop's within 1e-4 with micro-batch changes and OOMs injected in one replica."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgebatch.errors import UsageError
from edgebatch.governor import GovernorConfig
from edgebatch.training.replicas import (
    check_governor_for_replicas,
    global_ceiling,
    mirrored_governor_config,
    replica_shares,
    round_to_replicas,
)

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "tests" / "support" / "mirrored_run.py"


@pytest.mark.parametrize("micro_batch,replicas,expected", [
    (16, 2, 16), (15, 2, 14), (2, 2, 2), (3, 2, 2), (7, 1, 7), (11, 4, 8), (12, 3, 12),
])
def test_round_to_replicas_rounds_down(micro_batch, replicas, expected):
    assert round_to_replicas(micro_batch, replicas) == expected


@pytest.mark.parametrize("micro_batch,replicas", [(1, 2), (3, 4)])
def test_round_to_replicas_refuses_a_ceiling_below_the_replicas(micro_batch, replicas):
    with pytest.raises(UsageError, match="at least the replica count"):
        round_to_replicas(micro_batch, replicas)


@pytest.mark.parametrize("piece,replicas,expected", [
    (8, 2, [4, 4]), (5, 2, [3, 2]), (1, 2, [1, 0]), (0, 2, [0, 0]), (7, 3, [3, 2, 2]), (6, 1, [6]),
])
def test_replica_shares_are_even_and_cover_the_piece(piece, replicas, expected):
    shares = replica_shares(piece, replicas)
    assert shares == expected
    assert sum(shares) == piece and max(shares) - min(shares) <= 1


@pytest.mark.parametrize("ceilings,expected", [([32], 32), ([32, 20], 40), ([8, 8, 8], 24), ([1, 64], 2)])
def test_global_ceiling_is_the_smallest_device_times_the_replicas(ceilings, expected):
    assert global_ceiling(ceilings) == expected


@pytest.mark.parametrize("config,replicas,problem", [
    (GovernorConfig(ceiling_batch=8, effective_batch=16), 1, None),
    (GovernorConfig(ceiling_batch=8, effective_batch=16, multiple=2, min_batch=2), 2, None),
    (GovernorConfig(ceiling_batch=8, effective_batch=16, multiple=4, min_batch=4), 2, None),
    (GovernorConfig(ceiling_batch=8, effective_batch=16), 2, "multiple is 1"),
    (GovernorConfig(ceiling_batch=8, effective_batch=16, multiple=3, min_batch=3), 2, "multiple is 3"),
    (GovernorConfig(ceiling_batch=8, effective_batch=16, multiple=2), 2, "may shrink to 1"),
    (GovernorConfig(ceiling_batch=1, effective_batch=16, multiple=2), 2, "largest micro-batch 1"),
])
def test_check_governor_for_replicas(config, replicas, problem):
    found = check_governor_for_replicas(config, replicas)
    if problem is None:
        assert found is None
    else:
        assert problem in found and f"multiple={replicas}" in found


def test_mirrored_governor_config_rounds_the_global_ceiling_down():
    config = mirrored_governor_config(15, 2)
    assert (config.multiple, config.min_batch, config.upper_batch, config.lower_batch) == (2, 2, 14, 2)
    assert mirrored_governor_config(16, 2, ceiling_batch=global_ceiling([5, 9])).upper_batch == 10
    assert mirrored_governor_config(16, 2, cooldown_updates=0).cooldown_updates == 0
    with pytest.raises(UsageError, match="at least the replica count"):
        mirrored_governor_config(16, 2, ceiling_batch=1)


def run_scenario(name: str, *args: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="-1", TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("EDGEBATCH_INJECT_OOM", None)
    done = subprocess.run([sys.executable, str(SCRIPT), name, *args], env=env, capture_output=True, text=True,
                          timeout=240)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, f"{name} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return json.loads(lines[-1][len("RESULT "):])


def assert_replicated_run(result: dict, effective: int, examples: int, ceiling: int) -> None:
    assert result["diff"] < 1e-4, result
    assert result["replicas"] == 2 and result["variable_type"] == "MirroredVariable"
    assert result["examples_seen"] == examples
    assert result["traces"] == {"micro_step": 1, "apply_step": 1}
    for count, pieces in zip(result["examples"], result["micro_batches"]):
        assert sum(pieces) == count <= effective
        assert max(pieces) <= ceiling
        # Every governed piece is a multiple of the replicas; only an update's last may be odd.
        assert all(piece % 2 == 0 for piece in pieces[:-1]), pieces
    for event in result["oom"]:
        assert event["injected"] and not event["gave_up"]
        assert "replica 1 of 2" in event["message"] and "OOM when allocating" in event["message"]
        assert event["micro_batch"] % 2 == 0 and event["next"] % 2 == 0 and event["next"] < event["micro_batch"]


@pytest.mark.slow
def test_mirrored_fit_matches_the_plain_loop_with_replica_ooms():
    result = run_scenario("exact")
    for name in ("adam", "sgd"):  # adam: fit inside strategy.scope(); sgd: outside it
        run = result[name]
        assert_replicated_run(run, effective=16, examples=50, ceiling=8)
        assert run["examples"] == [16, 16, 16, 2]
    assert [(e["micro_batch"], e["offset"], e["next"]) for e in result["adam"]["oom"]] == [(8, 8, 4)]
    assert result["adam"]["micro_batches"][0] == [8, 4, 4]  # the failed 8 ran again as 4 + 4
    assert [(e["micro_batch"], e["offset"], e["next"]) for e in result["sgd"]["oom"]] == [(8, 0, 4)]


@pytest.mark.slow
def test_mirrored_fit_follows_micro_batch_changes_and_uneven_last_pieces():
    result = run_scenario("changes")
    assert_replicated_run(result, effective=15, examples=150, ceiling=12)
    assert result["examples"] == [15] * 10
    sizes = {pieces[0] for pieces in result["micro_batches"]}
    assert len(sizes) >= 4, result["micro_batches"]  # shrunk by pressure, grown back, shrunk by the OOM
    assert any("->" in reason and "pressure" in reason for reason in result["reasons"])
    assert any("->" in reason and "calm" in reason for reason in result["reasons"])
    assert len(result["oom"]) == 1
    # Odd remainders (15 = 12 + 3, 8 + 7, ...) ran with uneven replica shares and stayed exact.
    assert any(pieces[-1] % 2 for pieces in result["micro_batches"])


@pytest.mark.slow
def test_mirrored_fit_refuses_what_it_cannot_run():
    found = run_scenario("refusals")
    assert "not built under its scope" in found["model_outside_scope"]
    assert "optimizer SGD was created outside its scope" in found["optimizer_outside_scope"]
    assert "multiple is 1" in found["governor_multiple"]
    assert "may shrink to 1" in found["governor_min_batch"]
    assert "at least the replica count" in found["ceiling_below_replicas"]
    assert "at least the replica count" in found["effective_below_replicas"]
    assert found["accepted"] is None
    assert all("\n" not in message for message in found.values() if message)


@pytest.mark.slow
def test_mirrored_fit_gives_up_at_the_smallest_global_micro_batch_and_the_next_fit_runs():
    result = run_scenario("give_up")
    assert "micro-batch of 2 example(s) still ran out of memory" in result["message"]
    assert result["unchanged"] == 0.0
    # The very first micro-step failed; the replica group was resolved before it, so the
    # collectives of the next fit still run (see steps._resolve_replica_group).
    after = result["after"]
    assert after["diff"] < 1e-4 and after["examples"] == [16] and after["micro_batches"] == [[4, 4, 4, 4]]


@pytest.mark.slow
def test_keras_integration_under_mirrored_strategy_equals_plain_fit():
    result = run_scenario("keras")
    assert result["replicas"] == 2
    assert result["diff"] < 1e-4 and result["trained"] > 1e-3
    assert result["loss"] == pytest.approx(result["plain_loss"], rel=1e-5)  # the tracker sees unscaled losses
    assert result["accuracy"] == pytest.approx(result["plain_accuracy"])
    assert [d["micro_batch"] for d in result["decisions"]] == [4, 2, 4, 8]  # global sizes, all even
    assert result["batches"] == 8 and result["traces"] in (2, 4)  # one trace per replica (Keras may trace twice)
    assert "multiple is 1" in result["refused"]


@pytest.mark.slow
def test_mirrored_fit_resumes_from_a_checkpoint(tmp_path):
    result = run_scenario("resume", str(tmp_path / "checkpoints"))
    assert result["first_updates"] == 3 and result["resumed_from"] == 3
    assert_replicated_run(result, effective=16, examples=52, ceiling=6)
    assert result["examples"] == [2, 16, 16, 16, 2]  # the rest of epoch 0, then epoch 1
    assert result["micro_batches"][1] == [6, 6, 4]
