"""Schema 2: a probe per sequence length's fields, and every older profile still loading."""

import dataclasses
import json
from pathlib import Path

import pytest
from profile_factory import MIB, make_profile

from edgebatch.errors import ProfileError
from edgebatch.profiles import (
    SCHEMA_VERSION,
    LengthCeiling,
    TokenMemoryModel,
    list_profiles,
    load_profile,
    validate_profile_dict,
)
from edgebatch.profiles.model import DeviceProfile
from edgebatch.profiles.schema import READABLE_SCHEMA_VERSIONS

COMMITTED = Path(__file__).resolve().parent.parent / "device_profiles"


def per_length_profile():
    trials = [dataclasses.replace(t, seq_len=512) for t in make_profile().trials]
    return make_profile(
        trials=tuple(trials),
        per_length={64: LengthCeiling(300, 270, 1900 * MIB), 512: LengthCeiling(64, 58, 1593 * MIB)},
        token_model=TokenMemoryModel(900 * MIB, 20_000.0, 60.0, 0.995, 9, (64, 512)),
        model={"inputs": [{"shape": [None], "dtype": "int32"}]},
    )


def test_the_schema_went_up_and_still_reads_version_1():
    # 3: safe_batch's one measured margin (tests/test_probe_safe_margin.py).
    assert SCHEMA_VERSION == 3 and READABLE_SCHEMA_VERSIONS == (1, 2, 3)


def test_every_committed_profile_loads_and_the_schema_1_ones_read_as_before():
    entries = list_profiles(COMMITTED)
    assert entries, "device_profiles/ holds committed profiles"
    versions = {json.loads(path.read_text())["schema_version"] for path, _ in entries}
    assert 1 in versions, "a schema-1 profile is committed: older files must keep loading"
    for path, item in entries:
        assert not isinstance(item, Exception), f"{path.name}: {item}"
        assert json.loads(path.read_text())["schema_version"] in READABLE_SCHEMA_VERSIONS
        assert item.per_length is None and item.token_model is None  # no probe per length is committed
        assert all(t.seq_len is None for t in item.trials)
        again = DeviceProfile.from_dict(item.to_dict())
        assert again == item


def test_a_per_length_profile_round_trips():
    profile = per_length_profile()
    data = profile.to_dict()
    assert data["schema_version"] == SCHEMA_VERSION
    assert data["per_length"] == {
        "64": {"max_batch": 300, "safe_batch": 270, "peak_bytes": 1900 * MIB},
        "512": {"max_batch": 64, "safe_batch": 58, "peak_bytes": 1593 * MIB},
    }
    assert data["token_model"]["lengths"] == [64, 512]
    assert all(trial["seq_len"] == 512 for trial in data["trials"])
    again = DeviceProfile.from_dict(json.loads(json.dumps(data)))
    assert again == profile


def test_a_plain_profile_writes_no_per_length_fields():
    data = make_profile().to_dict()
    assert "per_length" not in data and "token_model" not in data
    assert all("seq_len" not in trial for trial in data["trials"])


@pytest.mark.parametrize(
    ("edit", "where"),
    [
        (lambda d: d["per_length"]["64"].update(safe_batch=301), "$.per_length.64.safe_batch"),
        (lambda d: d["per_length"].update({"sixty": d["per_length"]["64"]}), "$.per_length"),
        (lambda d: d["per_length"]["64"].pop("peak_bytes"), "$.per_length.64"),
        (lambda d: d["token_model"].update(per_token_bytes=-1.0), "$.token_model.per_token_bytes"),
        (lambda d: d["token_model"].update(lengths=[64]), "$.token_model.lengths"),
        (lambda d: d["trials"][0].update(seq_len=0), "$.trials[0].seq_len"),
        (lambda d: d.update(schema_version=1), "$.schema_version"),
    ],
)
def test_bad_per_length_fields_are_one_line_errors(edit, where):
    data = per_length_profile().to_dict()
    edit(data)
    with pytest.raises(ProfileError) as caught:
        validate_profile_dict(data, "x.json")
    message = str(caught.value)
    assert "\n" not in message and f"at {where}" in message, message


def test_a_saved_per_length_profile_loads_from_its_file(tmp_path):
    from edgebatch.profiles import save_profile

    profile = per_length_profile()
    path = save_profile(profile, tmp_path)
    assert load_profile(path) == profile


def test_plots_and_fleet_read_the_longest_lengths_trials_only():
    profile = per_length_profile()
    short = dataclasses.replace(profile.trials[0], seq_len=64, batch=300)
    mixed = dataclasses.replace(profile, trials=(short, *profile.trials))
    assert mixed.answer_trials == profile.trials
    plain = make_profile()
    assert plain.answer_trials == plain.trials
