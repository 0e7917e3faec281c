"""fit's side of the supervisor, in process: it records the running micro-batch in checkpoint_dir and
reports a killed predecessor's size to its governor once."""

import json
import os

import pytest

from edgebatch.errors import UsageError
from edgebatch.governor import Governor, GovernorConfig
from edgebatch.training import fit, inject_oom
from edgebatch.training.hard_failure import ENV_HARD_FAILURE_MICRO_BATCH, MARKER_FILE
from test_training_support import (
    make_data,
    make_dataset,
    make_loss,
    make_model,
    make_optimizer,
    max_weight_diff,
    reference_weights,
)

pytest.importorskip("tensorflow")

EFFECTIVE, CEILING = 8, 4


def governed_fit(x, y, model=None, governor=None, **kwargs):
    model = model if model is not None else make_model()
    governor = governor if governor is not None else Governor(GovernorConfig(ceiling_batch=CEILING,
                                                                             effective_batch=EFFECTIVE))
    report = fit(model, make_dataset(x, y), loss=make_loss(), optimizer=make_optimizer("adam"),
                 effective_batch=EFFECTIVE, governor=governor, **kwargs)
    return model, report


def marker(directory):
    return json.loads((directory / MARKER_FILE).read_text())["micro_batch"]


def test_fit_records_the_running_micro_batch(tmp_path):
    x, y = make_data(20)  # updates of 8, 8 and a last one of 4
    _, report = governed_fit(x, y, checkpoint_dir=str(tmp_path), max_updates=1)
    assert report.updates[0].micro_batches == (CEILING, CEILING)
    assert marker(tmp_path) == CEILING
    with inject_oom([1]):  # the shrink is recorded before the smaller pieces run
        _, report = governed_fit(x, y, checkpoint_dir=str(tmp_path), max_updates=2)
    assert report.oom_events[0].next_micro_batch == marker(tmp_path) < CEILING


def test_no_marker_without_a_checkpoint_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    x, y = make_data(8)
    governed_fit(x, y)
    assert not any(tmp_path.rglob(MARKER_FILE))


def test_a_restarted_fit_tells_its_governor_once_and_keeps_the_plain_weights(tmp_path, monkeypatch):
    x, y = make_data(32)
    expected = reference_weights(x, y, EFFECTIVE, "adam", epochs=1)
    model = make_model()
    _, first = governed_fit(x, y, model=model, checkpoint_dir=str(tmp_path), checkpoint_every_updates=1, max_updates=2)
    assert [u.micro_batches for u in first.updates] == [(CEILING, CEILING)] * 2

    # What the supervisor does after the process died running micro-batch CEILING.
    monkeypatch.setenv(ENV_HARD_FAILURE_MICRO_BATCH, str(marker(tmp_path)))
    governor = Governor(GovernorConfig(ceiling_batch=CEILING, effective_batch=EFFECTIVE))
    model, second = governed_fit(x, y, governor=governor, checkpoint_dir=str(tmp_path), checkpoint_every_updates=1)
    assert ENV_HARD_FAILURE_MICRO_BATCH not in os.environ  # taken once
    assert second.resumed_from.updates == 2
    assert second.decisions[0]["oom"] is True
    assert governor.state.threshold_batch == CEILING  # remembered as a failed size (TCP's ssthresh)
    assert all(max(u.micro_batches) < CEILING for u in second.updates[:1])
    assert max_weight_diff(model.get_weights(), expected) < 1e-4


def test_a_malformed_value_is_a_usage_error(monkeypatch):
    monkeypatch.setenv(ENV_HARD_FAILURE_MICRO_BATCH, "big")
    x, y = make_data(8)
    with pytest.raises(UsageError, match="EDGEBATCH_HARD_FAILURE_MICRO_BATCH must be .* got 'big'"):
        governed_fit(x, y)


class _ProcessDied(BaseException):
    """Stands for a kill at one exact point: fit catches no BaseException, and nothing after it runs."""


def test_a_save_cut_before_its_state_file_resumes_from_the_previous_checkpoint(tmp_path, monkeypatch):
    """The window a SIGKILL test cannot aim at: the checkpoint's data files are written, the
    `checkpoint` state file (which TensorFlow replaces atomically) does not name it yet. The newest
    complete checkpoint wins, so the cut update is re-run and nothing is applied twice."""
    from tensorflow.python.checkpoint import checkpoint_management

    x, y = make_data(32)
    expected = reference_weights(x, y, EFFECTIVE, "adam", epochs=1)
    write_state = checkpoint_management.update_checkpoint_state_internal

    def die_before_naming_the_third(save_dir, model_checkpoint_path, *args, **kwargs):
        if model_checkpoint_path.endswith("-3"):
            raise _ProcessDied()
        return write_state(save_dir, model_checkpoint_path, *args, **kwargs)

    monkeypatch.setattr(checkpoint_management, "update_checkpoint_state_internal", die_before_naming_the_third)
    with pytest.raises(_ProcessDied):
        governed_fit(x, y, checkpoint_dir=str(tmp_path), checkpoint_every_updates=1)
    monkeypatch.undo()
    assert (tmp_path / "ckpt-3.index").exists()  # update 3's checkpoint data is on disk, unnamed

    model, report = governed_fit(x, y, checkpoint_dir=str(tmp_path), checkpoint_every_updates=1)
    assert report.resumed_from.updates == 2
    assert [u.update for u in report.updates] == [3, 4]
    assert max_weight_diff(model.get_weights(), expected) < 1e-4
