"""Profile validation: each kind of bad file gives one line naming the source, the place and the fix."""

import jsonschema
import pytest

from edgebatch.errors import ProfileError
from edgebatch.profiles import PROFILE_SCHEMA, SCHEMA_VERSION, profile_problem, validate_profile_dict
from profile_factory import make_profile

SOURCE = "/profiles/cpu-x__m-y.json"


def _problem_message(data):
    with pytest.raises(ProfileError) as caught:
        validate_profile_dict(data, source=SOURCE)
    message = str(caught.value)
    assert "\n" not in message
    assert SOURCE in message
    return message


def test_schema_is_a_valid_draft_2020_12_schema():
    jsonschema.Draft202012Validator.check_schema(PROFILE_SCHEMA)
    assert PROFILE_SCHEMA["$schema"].endswith("/2020-12/schema")


def test_the_factory_profile_is_valid_for_jsonschema_and_for_us():
    data = make_profile().to_dict()
    jsonschema.Draft202012Validator(PROFILE_SCHEMA).validate(data)
    validate_profile_dict(data)
    assert profile_problem(data) is None


def test_gpu_profile_with_driver_facts_is_valid():
    profile = make_profile(
        device={"kind": "GPU", "tf_device": "GPU:0", "description": "NVIDIA H200", "cores": 132,
                "driver_version": "550.54.15", "compute_capability": "9.0"},
        measure="allocator_peak", budget_source="nvml_free", memory_model=None, predicted_ceiling=None,
    )
    validate_profile_dict(profile.to_dict())


@pytest.mark.parametrize(
    ("edit", "expected_fragments"),
    [
        (lambda d: d["trials"][0].__setitem__("batch", "8"), ["$.trials[0].batch", "'8' is not of type 'integer'"]),
        (lambda d: d.__setitem__("trials", []), ["$.trials", "non-empty"]),
        (lambda d: d.__setitem__("headroom", 1.0), ["$.headroom", "1.0"]),
        (lambda d: d.__setitem__("headroom", -0.1), ["$.headroom", "-0.1"]),
        (lambda d: d.__setitem__("safe_batch", 65), ["$.safe_batch", "65", "max_batch 64"]),
        (lambda d: d.__setitem__("measure", "rss"), ["$.measure", "'rss'"]),
        (lambda d: d["device"].__setitem__("kind", "TPU"), ["$.device.kind", "'TPU'"]),
        (lambda d: d["device"].pop("fingerprint"), ["$.device", "'fingerprint' is a required property"]),
        (lambda d: d.__setitem__("surprise", 1), ["$", "'surprise' was unexpected"]),
        (lambda d: d.__setitem__("memory_model", {"fixed_bytes": 1.0}), ["$.memory_model", "required"]),
        (lambda d: d["trials"][1].__setitem__("step_seconds", float("nan")), ["$.trials[1].step_seconds", "nan"]),
        (lambda d: d.__setitem__("created_at", "yesterday"), ["$.created_at", "'yesterday'", "ISO-8601"]),
        (lambda d: d.__setitem__("created_at", "2025-06-01T12:00:00+02:00"), ["$.created_at", "UTC"]),
        (lambda d: d["model"].__setitem__("key", "a__b"), ["$.model.key", "'a__b'", "file name"]),
        (lambda d: d["device"].__setitem__("fingerprint", "../etc"), ["$.device.fingerprint", "'../etc'"]),
        (lambda d: d.__setitem__("trials", "x" * 1000), ["$.trials", " ... ", "is not of type 'array'"]),
    ],
)
def test_each_problem_gets_one_line_with_path_and_fix(edit, expected_fragments):
    data = make_profile().to_dict()
    edit(data)
    message = _problem_message(data)
    assert "is invalid at" in message
    assert "delete it or re-run `edgebatch probe --force`" in message
    for fragment in expected_fragments:
        assert fragment in message, message
    assert len(message) < 400, message


def test_newer_schema_version_asks_for_an_upgrade():
    data = make_profile().to_dict()
    data["schema_version"] = SCHEMA_VERSION + 1
    message = _problem_message(data)
    assert (
        f"written by a newer edgebatch (schema {SCHEMA_VERSION + 1}; this one reads {SCHEMA_VERSION}): "
        "upgrade edgebatch or re-probe with --force"
    ) in message


@pytest.mark.parametrize("version", [0, -1, "1", 1.0, True, None])
def test_unknown_or_malformed_schema_version_is_refused(version):
    data = make_profile().to_dict()
    data["schema_version"] = version
    message = _problem_message(data)
    assert "schema_version" in message
    assert "re-run `edgebatch probe --force`" in message


def test_missing_schema_version_says_it_is_not_a_profile():
    data = make_profile().to_dict()
    del data["schema_version"]
    assert "not an edgebatch device profile" in _problem_message(data)


@pytest.mark.parametrize("data", [[], "profile", 3, None])
def test_top_level_must_be_an_object(data):
    assert "must be a JSON object" in _problem_message(data)


def test_safe_batch_equal_to_max_batch_is_fine():
    validate_profile_dict(make_profile(safe_batch=64, max_batch=64).to_dict())


def test_extra_keys_in_the_free_form_dicts_are_kept():
    data = make_profile(device={"numa_nodes": 1}).to_dict()
    validate_profile_dict(data)
    assert data["device"]["numa_nodes"] == 1
