"""The train loop tests/test_fleet_train.py hands to edgebatch.fleet.train.train_on_ray.

Each Ray Train worker finds its device's share in the plan by the label its rank stands for
(config["labels"][rank]: both workers run on this one host, so the hostname cannot tell them apart),
trains the shared tiny model under MultiWorkerMirroredStrategy with that share, and writes what it
found to config["out"]/worker-<rank>.json.
"""

import json
import os
import sys


def train_loop(config):
    os.environ["CUDA_VISIBLE_DEVICES"] = "-1"
    sys.path.insert(0, config["tests_dir"])
    import ray.train
    import tensorflow as tf

    from edgebatch.fleet.train import plan_share
    from edgebatch.governor import Governor, GovernorConfig
    from edgebatch.training import fit
    from test_training_support import (
        make_data,
        make_dataset,
        make_loss,
        make_model,
        make_optimizer,
        max_weight_diff,
        reference_weights,
    )

    rank = ray.train.get_context().get_world_rank()
    label = config["labels"][rank]
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    x, y = make_data(50)
    with strategy.scope():
        model = make_model()
        optimizer = make_optimizer("adam")
    governor = Governor(GovernorConfig(ceiling_batch=config["ceilings"][label], effective_batch=16))
    report = fit(model, make_dataset(x, y), loss=make_loss(), optimizer=optimizer, effective_batch=16,
                 governor=governor, worker_shares=plan_share(config["plan"], label))
    found = {
        "rank": rank, "label": label, "task_index": strategy.cluster_resolver.task_id,
        "shares": [sum(r.micro_batches) for r in report.updates],
        "largest_micro_batch": max(max(r.micro_batches, default=0) for r in report.updates),
        "diff": max_weight_diff(model.get_weights(), reference_weights(x, y, 16, "adam")),
    }
    with open(os.path.join(config["out"], f"worker-{rank}.json"), "w") as handle:
        json.dump(found, handle)
