"""fit under MultiWorkerMirroredStrategy (training/workers.py, worker_loop.py): the share and merge
arithmetic (pure), and two real worker processes on 127.0.0.1 (tests/support/multi_worker_run.py)
that must end with the plain loop's weights and, in lockstep, identical governors."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgebatch.errors import UsageError
from edgebatch.governor import Observation
from edgebatch.training.workers import (
    MAX_OOM_EVENTS,
    WorkerStatus,
    decode_status,
    encode_status,
    merge_observations,
    share_range,
    worker_shares,
)

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "support", "multi_worker_run.py")


@pytest.mark.parametrize(
    "examples, weights, shares",
    [(16, [1, 1], [8, 8]), (15, [1, 1], [8, 7]), (16, [3, 1], [12, 4]), (2, [3, 1], [2, 0]),
     (10, [1, 1, 1], [4, 3, 3]), (7, [0.5, 0.25, 0.25], [3, 2, 2]), (5, [1, 0], [5, 0])],
)
def test_shares_are_proportional_and_sum_to_the_update(examples, weights, shares):
    assert worker_shares(examples, weights) == shares
    offsets = [share_range(examples, weights, i) for i in range(len(weights))]
    assert [count for _, count in offsets] == shares
    assert [offset for offset, _ in offsets] == list(np.cumsum([0] + shares[:-1]))


@pytest.mark.parametrize("weights", [[], [1, -1], [0, 0], [1, float("nan")], [True, 1]])
def test_bad_shares_are_usage_errors(weights):
    with pytest.raises(UsageError, match="worker_shares"):
        worker_shares(8, weights)


def test_a_status_survives_its_float_vector():
    status = WorkerStatus(
        gave_up=True, loss_sum=3.25, examples=12, oom_events=(8, 4), oom_count=2,
        observation=Observation(pressure=0.93, step_seconds=0.5, micro_batch=8, limit_bytes=25_000_000_000,
                                used_bytes=1_234_567_891, psi_some_avg10=1.5, measure="process_peak",
                                own_bytes=987_654_321, running_micro_batch=8),
    )
    assert decode_status(encode_status(status)) == status
    empty = WorkerStatus(gave_up=False, loss_sum=0.0, examples=0, oom_events=(), oom_count=0,
                         observation=Observation(pressure=None))
    assert decode_status(encode_status(empty)) == empty
    many = WorkerStatus(gave_up=False, loss_sum=1.0, examples=4, oom_events=tuple(range(1, 13)),
                        oom_count=12, observation=Observation(pressure=None))
    kept = decode_status(encode_status(many))
    assert kept.oom_count == 12 and kept.oom_events == tuple(range(13 - MAX_OOM_EVENTS, 13))


def test_the_worst_pressure_wins_with_the_slowest_step_and_largest_piece():
    calm = Observation(pressure=0.2, step_seconds=2.0, micro_batch=4, psi_some_avg10=3.0)
    pressed = Observation(pressure=0.95, step_seconds=1.0, micro_batch=8)
    room = Observation(pressure=None, limit_bytes=100, used_bytes=97, step_seconds=0.5)
    merged = merge_observations([calm, pressed])
    assert (merged.pressure, merged.step_seconds, merged.micro_batch, merged.psi_some_avg10) == (0.95, 2.0, 8, 3.0)
    assert merge_observations([calm, room]).used_bytes == 97  # 97% of the limit beats pressure 0.2
    nothing = merge_observations([Observation(pressure=None), Observation(pressure=None)])
    assert nothing.pressure is None and nothing.step_seconds is None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_workers(scenario: str) -> list[dict]:
    ports = f"{free_port()},{free_port()}"
    children = [subprocess.Popen([sys.executable, SCRIPT, scenario, str(i), ports], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for i in range(2)]
    results = []
    for child in children:
        try:
            out, err = child.communicate(timeout=420)
        except subprocess.TimeoutExpired:
            for other in children:
                other.kill()
            raise
        lines = [line for line in out.splitlines() if line.startswith("@@result ")]
        assert child.returncode == 0 and lines, err[-3000:]
        results.append(json.loads(lines[-1][len("@@result "):]))
    return results


@pytest.mark.slow
@pytest.mark.distributed
def test_lockstep_workers_agree_on_every_decision_and_match_the_plain_loop():
    first, second = run_workers("lockstep")
    for worker in (first, second):
        assert worker["error"] is None and worker["diff"] < 1e-4  # measured 6e-8
        assert worker["examples"] == [16, 16, 16, 2] * 2
    # Only worker 0 read pressure and only worker 1 ran out of memory, yet both governors moved
    # together, through the same states, to the same decisions.
    assert first["oom"] == [] and second["oom"] == [4]
    assert first["governor"] == second["governor"] and first["next_micro_batch"] == second["next_micro_batch"]
    assert first["next_micro_batch"][0] < 8 and first["governor"]["state"]["oom_count"] == 1
    assert first["losses"] == second["losses"]
    assert [sum(len(p) for p in w["micro_batches"]) for w in (first, second)] != [8, 8]  # pieces were split


@pytest.mark.slow
@pytest.mark.distributed
def test_planned_shares_with_own_governors_match_the_plain_loop_and_a_give_up_stops_every_worker():
    first, second = run_workers("shares")
    for worker in (first, second):
        assert worker["error"] is None and worker["diff"] < 1e-4  # measured 3e-8
    # 3:1 of 16 is 12 and 4 (of the short update of 2: 2 and 0); each worker splits its share by
    # its own governor (ceilings 5 and 2), worker 0 after an OOM of its own.
    assert [sum(p) for p in first["micro_batches"]] == [12, 12, 12, 2] * 2
    assert [sum(p) for p in second["micro_batches"]] == [4, 4, 4, 0] * 2
    assert max(max(p) for p in second["micro_batches"] if p) == 2 and first["micro_batches"][0][0] == 5
    assert first["oom"] == [5] and second["oom"] == []
    assert first["losses"] == pytest.approx(second["losses"], abs=1e-12)
    # A worker that cannot go lower stops every worker with one message, before any optimizer update.
    assert first["give_up"]["error"] and first["give_up"]["error"].split(" (this is")[0] == \
        second["give_up"]["error"].split(" (this is")[0]
    assert "worker(s) [1] of 2" in first["give_up"]["error"] and "update 2" in first["give_up"]["error"]


_REFUSALS = r'''
import json, os, sys
os.environ["CUDA_VISIBLE_DEVICES"] = "-1"
sys.path.insert(0, sys.argv[1])
import keras
import tensorflow as tf
from edgebatch.adapt import AdaptConfig
from edgebatch.errors import UsageError
from edgebatch.training import fit
from test_training_support import make_data, make_dataset, make_loss, make_model

strategy = tf.distribute.MultiWorkerMirroredStrategy()  # no TF_CONFIG: one worker, still multi-worker
x, y = make_data(16)
lines = {}
for name, extra in (("adapt", {"adapt": AdaptConfig()}),
                    ("loss_scale", {"optimizer": "loss_scale"})):
    with strategy.scope():
        model = make_model()
        optimizer = keras.optimizers.SGD(0.1)
        if extra.get("optimizer") == "loss_scale":
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    arguments = {key: value for key, value in extra.items() if key != "optimizer"}
    try:
        fit(model, make_dataset(x, y), loss=make_loss(), optimizer=optimizer, effective_batch=8, **arguments)
        lines[name] = None
    except UsageError as error:
        lines[name] = str(error)
with strategy.scope():
    model, optimizer = make_model(), keras.optimizers.SGD(0.1)
report = fit(model, make_dataset(x, y), loss=make_loss(), optimizer=optimizer, effective_batch=8)
lines["plain_updates"] = len(report.updates)
print("@@result " + json.dumps(lines))
'''


@pytest.mark.slow
@pytest.mark.distributed
def test_adapt_and_loss_scaling_are_refused_under_multi_worker_and_one_worker_runs():
    tests_dir = str(Path(__file__).resolve().parent)
    done = subprocess.run([sys.executable, "-c", _REFUSALS, tests_dir], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("@@result "))[9:])
    assert result["adapt"].startswith("adapt=... is not supported under MultiWorkerMirroredStrategy yet: its "
                                      "decisions come from each process's own gradient statistics")
    assert result["loss_scale"].startswith("loss scaling (LossScaleOptimizer) is not supported under "
                                           "MultiWorkerMirroredStrategy yet")
    assert all("\n" not in line for line in (result["adapt"], result["loss_scale"]))
    # Without TF_CONFIG the strategy is one worker: a plain fit runs (it used to fail on a task id of None).
    assert result["plain_updates"] == 2
