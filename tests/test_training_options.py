"""fit's records (training/options.py) and its effective batch given once: the new forms train
exactly as the old keywords did, and the old keywords still work and warn once."""

import inspect
import json
import warnings

import pytest

from edgebatch.errors import UsageError
from edgebatch.governor import Governor, GovernorConfig
from edgebatch.training import Checkpointing, Logs, Sequences, fit, inject_oom
from edgebatch.training import options
from test_training_support import (
    make_data,
    make_dataset,
    make_loss,
    make_model,
    make_optimizer,
    max_weight_diff,
    reference_weights,
)

tf = pytest.importorskip("tensorflow")

EFFECTIVE = 8


@pytest.fixture
def fresh_warnings(monkeypatch):
    """Every old keyword warns again (each warns once per process)."""
    monkeypatch.setattr(options, "_warned", set())


def governor(ceiling=3):
    # No step counts as slow: on a busy machine a slow step would shrink one run and not another.
    return Governor(GovernorConfig(ceiling_batch=ceiling, effective_batch=EFFECTIVE, slow_step_factor=1e9))


def run(x, y, **kwargs):
    model = make_model()
    report = fit(model, make_dataset(x, y), loss=make_loss(), optimizer=make_optimizer("adam"), **kwargs)
    return model, report


def test_fit_takes_no_more_keywords_than_keras_fit():
    parameters = inspect.signature(fit).parameters.values()
    keywords = [p for p in parameters if p.kind in (p.KEYWORD_ONLY, p.VAR_KEYWORD)]
    assert len(keywords) <= 16, [p.name for p in keywords]


def test_effective_batch_given_once_in_the_governor_trains_as_given_twice():
    x, y = make_data(36)
    expected = reference_weights(x, y, EFFECTIVE, "adam")
    with inject_oom([2]):
        once, report = run(x, y, governor=governor())
    with inject_oom([2]):
        twice, _ = run(x, y, governor=governor(), effective_batch=EFFECTIVE)
    assert [record.examples for record in report.updates] == [8, 8, 8, 8, 4]
    assert max_weight_diff(once.get_weights(), expected) < 1e-4
    assert max_weight_diff(once.get_weights(), twice.get_weights()) == 0.0


def test_effective_batch_missing_or_disagreeing_is_a_usage_error():
    x, y = make_data(8)
    with pytest.raises(UsageError, match="needs effective_batch"):
        run(x, y)
    with pytest.raises(UsageError, match="governor must be an edgebatch.governor.Governor"):
        run(x, y, governor="big")
    with pytest.raises(UsageError, match="differs from the governor.*give it once"):
        run(x, y, governor=governor(), effective_batch=4)


def test_checkpointing_record_resumes_like_the_old_keywords(tmp_path, fresh_warnings):
    x, y = make_data(36)
    expected = reference_weights(x, y, EFFECTIVE, "adam", epochs=2)
    record = Checkpointing(dir=str(tmp_path / "new"), every_updates=3, max_to_keep=2)
    _, first = run(x, y, governor=governor(), epochs=2, max_updates=7, checkpointing=record)
    model, second = run(x, y, governor=governor(), epochs=2, checkpointing=record)
    assert len(first.checkpoints) == 3 and second.resumed_from.updates == 7
    assert max_weight_diff(model.get_weights(), expected) < 1e-4

    old_dir = str(tmp_path / "old")
    with pytest.warns(DeprecationWarning, match=r"checkpoint_dir= is deprecated: pass checkpointing=Checkpointing\(dir="):
        _, old_first = run(x, y, governor=governor(), epochs=2, max_updates=7, checkpoint_dir=old_dir,
                           checkpoint_every_updates=3, max_checkpoints_to_keep=2)
    old_model, _ = run(x, y, governor=governor(), epochs=2, checkpoint_dir=old_dir)
    assert len(old_first.checkpoints) == 3
    assert max_weight_diff(old_model.get_weights(), model.get_weights()) == 0.0


def test_logs_record_and_the_old_keywords_write_the_same_decision_log(tmp_path, fresh_warnings):
    x, y = make_data(24)
    run(x, y, governor=governor(), logs=Logs(log_dir=str(tmp_path / "tb"), decision_log=str(tmp_path / "new.jsonl")))
    with pytest.warns(DeprecationWarning, match="decision_log= is deprecated"):
        run(x, y, governor=governor(), decision_log=str(tmp_path / "old.jsonl"))

    def micro_batches(name):
        return [json.loads(line)["micro_batches"] for line in (tmp_path / name).read_text().splitlines()]

    assert micro_batches("new.jsonl") == micro_batches("old.jsonl") == [[3, 3, 2]] * 3
    assert any((tmp_path / "tb").rglob("*tfevents*"))


def test_sequences_record_is_checked_as_the_old_keywords_were(fresh_warnings):
    x, y = make_data(8)
    with pytest.raises(UsageError, match="batch_unit='tokens' applies to examples of variable length"):
        run(x, y, effective_batch=EFFECTIVE, sequences=Sequences(batch_unit="tokens"))
    with pytest.warns(DeprecationWarning, match=r"sequences=Sequences\(batch_unit="), \
            pytest.raises(UsageError, match="batch_unit='tokens' applies to examples of variable length"):
        run(x, y, effective_batch=EFFECTIVE, batch_unit="tokens")
    with pytest.raises(UsageError, match="batch_unit must be one of"):
        run(x, y, effective_batch=EFFECTIVE, sequences=Sequences(batch_unit="bytes"))


def test_an_old_keyword_warns_once_per_process(fresh_warnings):
    x, y = make_data(8)
    with pytest.warns(DeprecationWarning) as first:
        run(x, y, effective_batch=EFFECTIVE, log_dir=None)
    ours = [w for w in first if "is deprecated: pass" in str(w.message)]
    assert [str(w.message) for w in ours] == [
        "fit's log_dir= is deprecated: pass logs=Logs(log_dir=...) (edgebatch.training.options)"]
    assert ours[0].filename == __file__  # points at fit's caller
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run(x, y, effective_batch=EFFECTIVE, log_dir=None)


def test_a_record_given_both_ways_or_a_wrong_record_or_keyword_is_refused(tmp_path):
    x, y = make_data(8)
    with pytest.raises(UsageError, match=r"give checkpointing=Checkpointing\(...\) or checkpoint_dir=..., not both"):
        run(x, y, effective_batch=EFFECTIVE, checkpointing=Checkpointing(str(tmp_path)), checkpoint_dir=str(tmp_path))
    with pytest.raises(UsageError, match="checkpoint_every_updates=2 needs a checkpoint_dir"):
        run(x, y, effective_batch=EFFECTIVE, checkpoint_every_updates=2)
    with pytest.raises(UsageError, match="checkpointing must be an edgebatch.training.Checkpointing"):
        run(x, y, effective_batch=EFFECTIVE, checkpointing=str(tmp_path))
    with pytest.raises(UsageError, match="checkpointing.every_updates must be an integer >= 1, got 0"):
        run(x, y, effective_batch=EFFECTIVE, checkpointing=Checkpointing(str(tmp_path), every_updates=0))
    with pytest.raises(TypeError, match="unexpected keyword argument 'batch_size'"):
        run(x, y, effective_batch=EFFECTIVE, batch_size=8)


def test_the_records_are_public_names():
    import edgebatch

    assert {"Checkpointing", "Logs", "Sequences"} <= set(edgebatch.__all__)
    assert edgebatch.Checkpointing is Checkpointing
    assert Checkpointing("d") == Checkpointing(dir="d", every_updates=None, max_to_keep=3)
    assert Sequences() == Sequences(length_ceilings=None, batch_unit="examples", length_window_examples=None)
