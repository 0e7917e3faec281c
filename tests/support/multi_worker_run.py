"""One worker of a two-worker MultiWorkerMirroredStrategy job on 127.0.0.1, running edgebatch.fit.

tests/test_training_multi_worker.py starts two of these (worker 0 and 1) with TF_CONFIG built from
the ports it gives; each prints one line "@@result {json}" with its FitReport summary, its final
weights' distance to the plain loop and, on a give-up, the error.

usage: python multi_worker_run.py SCENARIO INDEX PORT0,PORT1   (lockstep | shares)

`shares` then runs a second fit in which worker 1 runs out of memory at every micro-batch from its
2nd update on: every worker must stop with the same TrainingError (reported as "give_up").
"""

import json
import os
import sys

scenario, index, ports = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",")
os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": [f"127.0.0.1:{port}" for port in ports]},
                                      "task": {"type": "worker", "index": index}})
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ["CUDA_VISIBLE_DEVICES"] = "-1"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/, for the helpers

import tensorflow as tf  # noqa: E402

from edgebatch.errors import TrainingError  # noqa: E402
from edgebatch.governor import Governor, GovernorConfig  # noqa: E402
from edgebatch.training import fit, inject_oom  # noqa: E402
from test_training_support import (  # noqa: E402
    FixedPressure,
    make_data,
    make_dataset,
    make_loss,
    make_model,
    make_optimizer,
    max_weight_diff,
    reference_weights,
)

EFFECTIVE = 16


def main() -> dict:
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    x, y = make_data(50)  # 3 x 16 + 2: the epoch's last update is short
    with strategy.scope():
        model = make_model()
        optimizer = make_optimizer("adam")
    kwargs = {}
    if scenario == "lockstep":
        # Same governor everywhere; only worker 0 reads high pressure (the governor shrinks after
        # the first update's reading, every worker with it), only worker 1 runs out of memory.
        governor = Governor(GovernorConfig(ceiling_batch=8, effective_batch=EFFECTIVE, cooldown_updates=0,
                                           slow_step_factor=1e9))
        reader = FixedPressure(0.99 if index == 0 else 0.1)
        failures = [3] if index == 1 else []
    elif scenario == "shares":
        # A 3:1 plan: worker 0 takes 12 of 16 in pieces of up to 5, worker 1 takes 4 in pieces of 2,
        # each deciding for itself; worker 0 runs out of memory once.
        ceiling = 5 if index == 0 else 2
        governor = Governor(GovernorConfig(ceiling_batch=ceiling, effective_batch=EFFECTIVE, slow_step_factor=1e9))
        reader = None
        failures = [2] if index == 0 else []
        kwargs["worker_shares"] = [3, 1]
    error = None
    with inject_oom(failures):
        try:
            report = fit(model, make_dataset(x, y), loss=make_loss(), optimizer=optimizer, effective_batch=EFFECTIVE,
                         governor=governor, pressure_reader=reader, epochs=2, **kwargs)
        except TrainingError as exc:
            report, error = None, str(exc)
    expected = reference_weights(x, y, EFFECTIVE, "adam", epochs=2)
    result = {"index": index, "error": error, "diff": max_weight_diff(model.get_weights(), expected)}
    if report is not None:
        result.update({
            "examples": [r.examples for r in report.updates],
            "micro_batches": [list(r.micro_batches) for r in report.updates],
            "next_micro_batch": [r.next_micro_batch for r in report.updates],
            "losses": [r.loss for r in report.updates],
            "oom": [e.micro_batch for e in report.oom_events],
            "governor": governor.state_dict(),
        })
    if scenario == "shares":
        result["give_up"] = give_up(strategy, x, y)
    return result


def give_up(strategy, x, y) -> dict:
    """Worker 1's micro-batches all run out of memory from its 2nd update on (its first runs 2 pieces)."""
    with strategy.scope():
        model = make_model()
        optimizer = make_optimizer("sgd")
    governor = Governor(GovernorConfig(ceiling_batch=4, effective_batch=EFFECTIVE, slow_step_factor=1e9))
    with inject_oom(list(range(3, 40)) if index == 1 else []):
        try:
            report = fit(model, make_dataset(x, y), loss=make_loss(), optimizer=optimizer, effective_batch=EFFECTIVE,
                         governor=governor, worker_shares=[1, 1])
            return {"error": None, "updates": len(report.updates)}
        except TrainingError as exc:
            return {"error": str(exc), "weights_moved_by_update_1": max_weight_diff(
                model.get_weights(), make_model().get_weights()) > 0}


if __name__ == "__main__":
    print("@@result " + json.dumps(main()), flush=True)
