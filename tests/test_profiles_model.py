"""DeviceProfile records: memory model arithmetic and the dict round trip."""

import json
import subprocess
import sys

import numpy as np
import pytest

from edgebatch.errors import ProfileError
from edgebatch.profiles import DeviceProfile, MemoryModel, Trial, utc_now_iso, validate_profile_dict
from profile_factory import GIB, MIB, make_profile


@pytest.mark.parametrize(
    ("fixed_bytes", "per_sample_bytes", "batch", "expected_bytes"),
    [
        (100.0, 10.0, 0, 100.0),
        (100.0, 10.0, 1, 110.0),
        (100.0, 10.0, 90, 1000.0),
        (849 * MIB, 11.6 * MIB, 64, 849 * MIB + 64 * 11.6 * MIB),
    ],
)
def test_predict_bytes_is_the_line(fixed_bytes, per_sample_bytes, batch, expected_bytes):
    memory_model = MemoryModel(fixed_bytes=fixed_bytes, per_sample_bytes=per_sample_bytes, r2=1.0, points=2)
    assert memory_model.predict_bytes(batch) == pytest.approx(expected_bytes)


@pytest.mark.parametrize(
    ("fixed_bytes", "per_sample_bytes", "budget_bytes", "expected_batch"),
    [
        (100.0, 10.0, 99.0, 0),  # not even the fixed part fits
        (100.0, 10.0, 100.0, 0),  # only batch 0 fits
        (100.0, 10.0, 109.9, 0),
        (100.0, 10.0, 110.0, 1),  # exactly on the line counts as fitting
        (100.0, 10.0, 1000.0, 90),
        (100.0, 10.0, 1009.0, 90),
        (100.0, 0.1, 100.3, 3),  # 100 + 0.1*3 is 100.30000000000001 in floats: must not over-count
        (849 * MIB, 11.6 * MIB, 2 * GIB, 103),  # MobileNetV2 line (docs/tensorflow-memory.md)
        (4 * MIB, 11.8 * MIB, 2 * GIB, 173),
    ],
)
def test_batch_for_bytes_is_the_largest_fitting_batch(fixed_bytes, per_sample_bytes, budget_bytes, expected_batch):
    memory_model = MemoryModel(fixed_bytes=fixed_bytes, per_sample_bytes=per_sample_bytes, r2=1.0, points=2)
    batch = memory_model.batch_for_bytes(budget_bytes)
    assert batch == expected_batch
    assert memory_model.predict_bytes(batch + 1) > budget_bytes
    if batch > 0:
        assert memory_model.predict_bytes(batch) <= budget_bytes


@pytest.mark.parametrize("per_sample_bytes", [0.0, -5.0])
def test_batch_for_bytes_refuses_a_line_that_does_not_grow(per_sample_bytes):
    memory_model = MemoryModel(fixed_bytes=100.0, per_sample_bytes=per_sample_bytes, r2=0.1, points=3)
    with pytest.raises(ValueError, match=repr(per_sample_bytes)):
        memory_model.batch_for_bytes(1000.0)


def test_memory_model_rejects_bad_arguments_quoting_them():
    memory_model = MemoryModel(fixed_bytes=100.0, per_sample_bytes=10.0, r2=1.0, points=2)
    with pytest.raises(ValueError, match="-1"):
        memory_model.predict_bytes(-1)
    with pytest.raises(ValueError, match="nan"):
        memory_model.batch_for_bytes(float("nan"))


def test_to_dict_from_dict_round_trip_is_equal():
    profile = make_profile()
    data = profile.to_dict()
    json.dumps(data, allow_nan=False)  # JSON-ready as is
    again = DeviceProfile.from_dict(json.loads(json.dumps(data)))
    assert again == profile
    assert again.to_dict() == data
    assert isinstance(again.trials, tuple)
    assert again.trials[-1].measured is False


def test_to_dict_does_not_alias_the_records_dicts():
    profile = make_profile()
    data = profile.to_dict()
    data["device"]["kind"] = "GPU"
    data["model"]["inputs"][0]["shape"][0] = 1
    assert profile.device["kind"] == "CPU"
    assert profile.model["inputs"][0]["shape"][0] == 96


def test_trials_given_as_a_list_are_stored_as_a_tuple():
    profile = make_profile(trials=list(make_profile().trials))
    assert isinstance(profile.trials, tuple)


def test_numpy_numbers_become_plain_python_numbers():
    trial = Trial(
        batch=np.int64(8), ok=True, error=None, peak_bytes=np.int64(900 * MIB), process_peak_bytes=None,
        allocator_peak_bytes=None, step_seconds=np.float32(0.5), samples_per_second=np.float64(16.0),
    )
    profile = make_profile(trials=(trial,), max_batch=np.int64(8), safe_batch=8, throughput_knee=None,
                           model={"inputs": [{"shape": (96, 96, 3), "dtype": "float32"}]})
    data = profile.to_dict()
    json.dumps(data, allow_nan=False)
    assert type(data["trials"][0]["batch"]) is int
    assert type(data["max_batch"]) is int
    assert data["model"]["inputs"][0]["shape"] == [96, 96, 3]
    validate_profile_dict(data)


def test_measured_is_optional_in_the_file_and_defaults_to_true():
    data = make_profile().to_dict()
    del data["trials"][0]["measured"]
    assert DeviceProfile.from_dict(data).trials[0].measured is True


def test_fresh_and_settled_round_trip_and_are_optional_in_the_file():
    import dataclasses

    profile = make_profile()
    first = dataclasses.replace(profile.trials[0], fresh=True, settled=False)
    data = make_profile(trials=(first, *profile.trials[1:])).to_dict()
    validate_profile_dict(data)
    again = DeviceProfile.from_dict(json.loads(json.dumps(data))).trials[0]
    assert (again.fresh, again.settled) == (True, False)
    del data["trials"][0]["fresh"], data["trials"][0]["settled"]
    older = DeviceProfile.from_dict(data).trials[0]
    assert (older.fresh, older.settled) == (False, None)


def test_forked_round_trips_and_is_absent_from_the_file_when_unknown():
    import dataclasses

    profile = make_profile()
    child, new_process = (dataclasses.replace(profile.trials[0], fresh=True, forked=forked) for forked in (True, False))
    data = make_profile(trials=(child, new_process, *profile.trials[1:])).to_dict()
    validate_profile_dict(data)
    again = DeviceProfile.from_dict(json.loads(json.dumps(data))).trials
    assert (again[0].forked, again[1].forked, again[2].forked) == (True, False, None)
    assert "forked" not in data["trials"][2]


def test_from_dict_validates_and_names_the_source():
    data = make_profile().to_dict()
    data["max_batch"] = "64"
    with pytest.raises(ProfileError, match=r"somewhere\.json.*\$\.max_batch"):
        DeviceProfile.from_dict(data, source="somewhere.json")


def test_path_name_joins_fingerprint_and_key():
    profile = make_profile(device={"fingerprint": "cpu-x-1c-1gib-00000000"}, model={"key": "m-float32-sgd-tf2.21-11111111"})
    assert profile.path_name == "cpu-x-1c-1gib-00000000__m-float32-sgd-tf2.21-11111111.json"
    assert profile.device_fingerprint == "cpu-x-1c-1gib-00000000"
    assert profile.model_key == "m-float32-sgd-tf2.21-11111111"


def test_utc_now_iso_is_accepted_as_created_at():
    stamp = utc_now_iso()
    assert stamp.endswith("Z")
    validate_profile_dict(make_profile(created_at=stamp).to_dict())


def test_package_imports_no_tensorflow_psutil_pynvml_or_jsonschema():
    code = (
        "import sys, edgebatch.profiles\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('tensorflow', 'keras', 'tf_keras', 'psutil', 'pynvml', 'numpy', 'jsonschema', 'filelock'))\n"
        "print(','.join(heavy))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert result.stdout.strip() == ""
