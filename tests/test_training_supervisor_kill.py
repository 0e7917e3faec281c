"""Real SIGKILLs under the supervisor: the resumed run ends with the plain loop's weights.

The child trains a tiny Dense model with `fit(..., checkpoint_dir=..., checkpoint_every_updates=1)`
and SIGKILLs itself (os.kill(os.getpid(), SIGKILL): the same signal the OOM killer sends) at
seeded random updates, each in one of three places:
- "mid_update": inside the compiled micro-step of the update's second micro-batch (a py_function
  in an identity layer), after the first micro-batch's gradients were accumulated;
- "after_apply": after the optimizer applied the update, before its checkpoint was written;
- "after_save": right after the update's checkpoint was written.
Each kill fires once (a file records it), so the supervisor's restarts finish the run.
"""

import json
import os
import random
import sys
import textwrap
from pathlib import Path

import pytest

from edgebatch.training import supervise
from edgebatch.training.hard_failure import ENV_HARD_FAILURE_MICRO_BATCH
from test_training_support import make_data, make_model, max_weight_diff, reference_weights

pytest.importorskip("tensorflow")

REPO = Path(__file__).resolve().parents[1]
EXAMPLES, EFFECTIVE, CEILING, EPOCHS = 48, 8, 3, 2  # 12 updates of [3, 3, 2] until a kill shrinks them
PHASES = ("mid_update", "after_apply", "after_save")

CHILD = textwrap.dedent(
    """
    import json, os, signal, sys
    from pathlib import Path

    import keras
    import tensorflow as tf

    from edgebatch.governor import Governor, GovernorConfig
    from edgebatch.training import fit
    from edgebatch.training.checkpoints import TrainingCheckpoint
    from test_training_support import make_data, make_dataset, make_loss, make_model, make_optimizer

    checkpoint_dir, work = sys.argv[1], Path(sys.argv[2])
    plan = {int(update): phase for update, phase in json.loads(os.environ["KILL_PLAN"]).items()}
    examples, effective, ceiling, epochs = (int(v) for v in sys.argv[3:7])
    # checkpoint_every_updates=1: the newest checkpoint's number is the last update this run kept.
    latest = tf.train.latest_checkpoint(checkpoint_dir)
    state = {"done": int(latest.rsplit("-", 1)[1]) if latest else 0, "micro": 0}
    index = len(list(work.glob("start-*.json")))
    (work / f"start-{index}.json").write_text(json.dumps({
        "resumed_after": state["done"], "hard_failure": os.environ.get("EDGEBATCH_HARD_FAILURE_MICRO_BATCH")}))
    updates_log = work / f"updates-{index}.jsonl"

    def kill_if(phase):
        update = state["done"] + 1 if phase == "mid_update" else state["done"]
        fired = work / f"killed-{update}"
        if plan.get(update) == phase and not fired.exists():
            fired.write_text(phase)
            os.kill(os.getpid(), signal.SIGKILL)

    def on_micro_step():
        state["micro"] += 1
        if state["micro"] == 2:  # the update's first micro-batch is already accumulated
            kill_if("mid_update")
        return 0

    class KillHook(keras.layers.Layer):
        def call(self, x):
            ran = tf.py_function(on_micro_step, [], tf.int32)
            with tf.control_dependencies([ran]):
                return tf.identity(x)

    def on_update(record):
        state["done"], state["micro"] = record.update, 0
        with updates_log.open("a") as log:
            log.write(json.dumps({"update": record.update, "micro_batches": list(record.micro_batches)}) + "\\n")
        kill_if("after_apply")  # applied; its checkpoint is written after this callback

    original_save = TrainingCheckpoint.save
    def save_then_maybe_kill(self, *args, **kwargs):
        path = original_save(self, *args, **kwargs)
        kill_if("after_save")
        return path
    TrainingCheckpoint.save = save_then_maybe_kill

    plain = make_model()
    model = keras.Sequential([keras.Input(plain.input_shape[1:]), *plain.layers[:1], KillHook(), *plain.layers[1:]])
    x, y = make_data(examples)
    fit(model, make_dataset(x, y), loss=make_loss(), optimizer=make_optimizer("adam"), effective_batch=effective,
        governor=Governor(GovernorConfig(ceiling_batch=ceiling, effective_batch=effective)), epochs=epochs,
        checkpoint_dir=checkpoint_dir, checkpoint_every_updates=1, decision_log=str(work / "decisions.jsonl"),
        on_update=on_update)
    (work / "final.json").write_text(json.dumps([w.tolist() for w in model.get_weights()]))
    """
)


def kill_plan(seed: int) -> dict[int, str]:
    """One kill per phase, in a seeded order, at seeded updates: not the first (so every restart has
    a checkpoint to resume from), not the last, and two apart (so every restarted child logs an
    update before the next kill)."""
    rng = random.Random(seed)
    while True:
        updates = sorted(rng.sample(range(2, EXAMPLES * EPOCHS // EFFECTIVE), len(PHASES)))
        if all(later - earlier >= 2 for earlier, later in zip(updates, updates[1:])):
            return dict(zip(updates, rng.sample(PHASES, len(PHASES))))


@pytest.mark.slow
@pytest.mark.parametrize("seed", [7])
def test_real_sigkills_under_the_supervisor_end_with_the_plain_weights(tmp_path, seed):
    plan = kill_plan(seed)
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    checkpoint_dir = tmp_path / "ckpt"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests")]),
               KILL_PLAN=json.dumps(plan), TF_CPP_MIN_LOG_LEVEL="2")
    env.pop(ENV_HARD_FAILURE_MICRO_BATCH, None)
    report = supervise([sys.executable, str(script), str(checkpoint_dir), str(tmp_path),
                        str(EXAMPLES), str(EFFECTIVE), str(CEILING), str(EPOCHS)],
                       checkpoint_dir=checkpoint_dir, max_restarts=len(plan), env=env, progress=None)

    assert report.exit_code == 0, report.summary()
    assert report.signals == ("SIGKILL",) * len(plan) and report.restarts == len(plan)
    killed = {int(p.name.split("-")[1]): p.read_text() for p in tmp_path.glob("killed-*")}
    assert killed == plan

    # Nothing lost, nothing applied twice: the plain loop's weights.
    start = make_model()  # the child's model holds these same layers around a weightless hook
    expected = reference_weights(*make_data(EXAMPLES), EFFECTIVE, "adam", epochs=EPOCHS, model=start)
    final = json.loads((tmp_path / "final.json").read_text())
    assert max_weight_diff(final, expected) < 1e-4

    # Each restart resumed after the last update it had checkpointed, and its governor was told
    # the micro-batch that was running; its first update ran below the size that was killed.
    starts = [json.loads((tmp_path / f"start-{i}.json").read_text()) for i in range(len(plan) + 1)]
    expected_resume = [0] + [u if phase == "after_save" else u - 1 for u, phase in plan.items()]
    assert [s["resumed_after"] for s in starts] == expected_resume
    told = [run.running_micro_batch for run in report.runs[:-1]]
    assert told[0] == CEILING and all(size is not None for size in told)
    assert [s["hard_failure"] for s in starts] == [None] + [str(size) for size in told]
    for index, size in enumerate(told, start=1):
        first = json.loads((tmp_path / f"updates-{index}.jsonl").read_text().splitlines()[0])
        assert first["update"] == expected_resume[index] + 1
        # Below the killed size, or at the smallest micro-batch if that was the one killed.
        assert max(first["micro_batches"]) < size or max(first["micro_batches"]) == size == 1
