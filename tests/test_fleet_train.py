"""edgebatch.fleet.train: a fleet plan's share per device (pure), and a real two-worker job that Ray
Train starts on a local Ray (TF_CONFIG from Ray Train, MultiWorkerMirroredStrategy, fit with the
plan's shares), which must end with the plain loop's weights."""

import json
import os
import sys

import pytest

from edgebatch.errors import UsageError
from edgebatch.fleet.train import plan_share, train_on_ray

PLAN = {
    "plan": {"devices": [{"device_id": "fast-box", "label": "fast-box", "share": 12},
                         {"device_id": "slow-box", "label": "slow-box", "share": 4}]},
    "left_out": [{"device_id": "tiny-box", "label": "tiny-box", "reason": "alone it is no faster"}],
}
TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


def test_plan_share_by_label_by_hostname_and_from_a_file(tmp_path, monkeypatch):
    assert plan_share(PLAN, "fast-box") == 12 and plan_share(PLAN, "slow-box") == 4
    monkeypatch.setattr("socket.gethostname", lambda: "Slow_Box")  # named as fleet probes name nodes
    assert plan_share(PLAN) == 4
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(PLAN))
    assert plan_share(str(path), "fast-box") == 12


@pytest.mark.parametrize(
    "plan, label, message",
    [(PLAN, "tiny-box", "leaves device 'tiny-box' out \\(alone it is no faster\\)"),
     (PLAN, "other", "no device 'other' \\(it has fast-box, slow-box\\)"),
     ({"devices": []}, "x", "no plan.devices"),
     ("/nonexistent/plan.json", "x", "cannot read the fleet plan")],
)
def test_plan_share_errors_are_one_line_usage_errors(plan, label, message):
    with pytest.raises(UsageError, match=message) as error:
        plan_share(plan, label)
    assert "\n" not in str(error.value)


def test_train_on_ray_checks_its_arguments_before_starting_ray():
    with pytest.raises(UsageError, match="num_workers"):
        train_on_ray(lambda config: None, num_workers=0)
    with pytest.raises(UsageError, match="train_loop"):
        train_on_ray("not a function", num_workers=1)


@pytest.mark.slow
@pytest.mark.distributed
def test_ray_train_runs_the_planned_shares_and_matches_the_plain_loop(tmp_path):
    ray = pytest.importorskip("ray")
    pytest.importorskip("ray.train.tensorflow")
    sys.path.insert(0, os.path.join(TESTS_DIR, "support"))
    from ray_train_loop import train_loop

    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING",
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([os.path.join(TESTS_DIR, "support")]
                                                                       + sys.path)}})
    try:
        train_on_ray(train_loop, num_workers=2, storage_path=str(tmp_path / "ray"),
                     config={"plan": PLAN, "labels": ["fast-box", "slow-box"], "ceilings": {"fast-box": 8, "slow-box": 2},
                             "out": str(tmp_path), "tests_dir": TESTS_DIR})
    finally:
        ray.shutdown()
    workers = [json.loads((tmp_path / f"worker-{rank}.json").read_text()) for rank in (0, 1)]
    fast, slow = workers
    # Ray Train's TF_CONFIG ranks are fit's worker order; the plan's 12:4 split of 16 (the short
    # last update of 2 splits 2:0), each within its own governor's ceiling.
    assert [w["task_index"] for w in workers] == [0, 1]
    assert fast["shares"] == [12, 12, 12, 2] and slow["shares"] == [4, 4, 4, 0]
    assert fast["largest_micro_batch"] == 8 and slow["largest_micro_batch"] == 2
    assert fast["diff"] < 1e-4 and slow["diff"] < 1e-4
