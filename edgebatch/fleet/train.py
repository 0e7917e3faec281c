"""Train a mixed fleet together on Ray: Ray Train starts the workers, a fleet plan gives their shares.

Ray Train's TensorflowTrainer starts `num_workers` workers (one per node when each asks for the
node's whole resources) and sets TF_CONFIG for MultiWorkerMirroredStrategy (`train_on_ray` shows
the whole recipe). Ray assigns the ranks, and the plan knows devices by node label, so each worker
looks up its own share (`plan_share`: by this host's name, or a label you give) and passes that one
number to `fit(worker_shares=...)`. fit gathers every worker's number and splits each update in
proportion (training/workers.py). Each worker's own governor sets its micro-batch within its own
device's ceiling.

`plan_share` reads what `edgebatch fleet plan --json` prints (`plan.devices[].label` and
`share`). A device the plan left out, or a label it does not name, is a UsageError, raised before
any training. Ray (with its `train` extra) is imported only when `train_on_ray` runs (the `fleet`
extra installs it).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgebatch.errors import UsageError
from edgebatch.fleet.cluster import FleetError, connect

__all__ = ["plan_share", "train_on_ray"]


def _load_plan(plan: dict | str | Path) -> dict:
    if isinstance(plan, dict):
        return plan
    try:
        return json.loads(Path(plan).read_text())
    except (OSError, ValueError) as error:
        raise UsageError(f"cannot read the fleet plan {str(plan)!r} ({error}): pass `edgebatch fleet plan --json` "
                         "output, as a dict or a file") from error


def plan_share(plan: dict | str | Path, label: str | None = None) -> int:
    """This device's share of each update in a fleet plan (`edgebatch fleet plan --json` output).

    `label`: the device's label in the plan; default this host's name as the fleet names nodes
    (lower case, unsafe characters as "-", fleet/nodes.py). UsageError when the plan left the
    device out (with its reason) or does not name it.
    """
    from edgebatch.fleet.nodes import node_label

    data = _load_plan(plan)
    label = label if label is not None else node_label("", "", socket.gethostname(), with_id=False)
    try:
        devices = data["plan"]["devices"]
    except (KeyError, TypeError) as error:
        raise UsageError("the fleet plan has no plan.devices: pass `edgebatch fleet plan --json` output") from error
    for device in devices:
        if device.get("label") == label or device.get("device_id") == label:
            return int(device["share"])
    for left in data.get("left_out", []):
        if left.get("label") == label or left.get("device_id") == label:
            raise UsageError(f"the fleet plan leaves device {label!r} out ({left.get('reason')}): "
                             "run without this node, or plan again")
    names = ", ".join(str(device.get("label")) for device in devices)
    raise UsageError(f"the fleet plan has no device {label!r} (it has {names}): pass label=... or plan again")


def train_on_ray(
    train_loop: Callable[[dict], Any],
    *,
    num_workers: int,
    config: dict | None = None,
    address: str = "local",
    use_gpu: bool = False,
    resources_per_worker: dict | None = None,
    storage_path: str | None = None,
) -> Any:
    """Run `train_loop(config)` on `num_workers` Ray Train workers under TF_CONFIG; Ray Train's Result.

    Usage:

        from edgebatch.fleet.train import plan_share, train_on_ray

        def train_loop(config):                        # runs in every Ray Train worker
            import tensorflow as tf, edgebatch
            strategy = tf.distribute.MultiWorkerMirroredStrategy()   # Ray Train has set TF_CONFIG
            with strategy.scope():
                model = build_model(); optimizer = make_optimizer()
            edgebatch.fit(model, dataset, loss=..., optimizer=optimizer, effective_batch=512,
                          governor=governor_from_this_devices_profile,
                          worker_shares=plan_share(config["plan"]))  # this worker's share, gathered in fit

        train_on_ray(train_loop, num_workers=2, config={"plan": plan_json}, address="auto")

    `address`: "local" (a one-node Ray started here), "auto" or "HOST:PORT" (connected as a fleet
    probe connects: fleet/cluster.py `connect`, which checks the port first). `resources_per_worker`: e.g. {"CPU": 8} to place one worker
    per node; default one CPU (or one GPU with `use_gpu`).
    """
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise UsageError(f"num_workers must be an integer >= 1, got {num_workers!r}")
    if not callable(train_loop):
        raise UsageError(f"train_loop must be a function of one argument (the config), got {train_loop!r}")
    connect(address, needs="training on Ray")
    try:
        from ray.train import RunConfig, ScalingConfig
        from ray.train.tensorflow import TensorflowTrainer
    except ImportError as error:
        raise FleetError(f"training on Ray needs Ray Train ({error}): pip install 'edgebatch[fleet]'") from error
    trainer = TensorflowTrainer(
        train_loop,
        train_loop_config=dict(config or {}),
        scaling_config=ScalingConfig(num_workers=num_workers, use_gpu=use_gpu,
                                     resources_per_worker=resources_per_worker),
        run_config=RunConfig(storage_path=storage_path),
    )
    return trainer.fit()
