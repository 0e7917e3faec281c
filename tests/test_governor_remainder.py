"""A failing remainder piece through the real training loop: the governor shrinks from the size
that was running (32), not from the 4-example piece (which would leave 2: 50 accumulation steps)."""

import pytest

from edgebatch.governor import Governor, GovernorConfig
from edgebatch.training import fit, inject_oom
from test_training_support import make_data, make_dataset, make_loss, make_model, make_optimizer, max_weight_diff
from test_training_support import reference_weights

tf = pytest.importorskip("tensorflow")

EFFECTIVE = 100


def test_an_oom_in_the_remainder_piece_shrinks_from_the_running_size():
    x, y = make_data(200)
    expected = reference_weights(x, y, EFFECTIVE, "sgd")
    model = make_model()
    governor = Governor(GovernorConfig(ceiling_batch=32, effective_batch=EFFECTIVE))
    with inject_oom([4]):  # [32, 32, 32, 4]: the 4th execution is the remainder piece
        report = fit(model, make_dataset(x, y), loss=make_loss(), optimizer=make_optimizer("sgd"),
                     effective_batch=EFFECTIVE, governor=governor)
    [event] = report.oom_events
    assert (event.update, event.micro_batch, event.example_offset) == (1, 4, 96)
    assert event.next_micro_batch == 16 and not event.gave_up
    assert [record.micro_batches for record in report.updates] == [(32, 32, 32, 4), (16,) * 6 + (4,)]
    assert governor.state.threshold_batch == 32
    assert max_weight_diff(model.get_weights(), expected) < 1e-4
