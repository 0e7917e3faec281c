"""Device fingerprints and model keys: stable for the same facts, different for different ones."""

import hashlib
import json
import re

import pytest

from edgebatch.profiles import config_hash, device_fingerprint, model_key
from edgebatch.profiles.schema import SAFE_NAME_RE

GIB = 1024**3
MIB = 1024**2
CPU = ("CPU", "AMD EPYC 7763 64-Core Processor", 2, 24 * GIB)
GPU = ("GPU", "NVIDIA H200", 132, 143771 * MIB, "550.54.15")
MODEL = {
    "name": "mobilenet_v2",
    "config_hash": "0123456789abcdef",
    "inputs": [{"shape": [96, 96, 3], "dtype": "float32"}],
    "precision": "float32",
    "optimizer": "adam",
    "tf_version": "2.21.0",
}


def _is_safe_name(name):
    return bool(SAFE_NAME_RE.match(name)) and "__" not in name


def test_same_facts_same_fingerprint():
    assert device_fingerprint(*CPU) == device_fingerprint(*CPU)
    assert device_fingerprint(*GPU) == device_fingerprint(*GPU)


def test_fingerprint_reads_like_the_device():
    fingerprint = device_fingerprint(*CPU)
    assert re.fullmatch(r"cpu-amd-epyc-7763-2c-24gib-[0-9a-f]{8}", fingerprint), fingerprint
    assert device_fingerprint(*GPU).startswith("gpu-nvidia-h200-132c-141gib-")
    assert _is_safe_name(device_fingerprint("CPU", "Intel(R) Xeon(R) CPU E5-2680 v4 @ 2.40GHz", 4, None))


def test_minor_driver_update_keeps_the_fingerprint():
    assert device_fingerprint("GPU", "NVIDIA H200", 132, 141 * GIB, "550.54") == device_fingerprint(
        "GPU", "NVIDIA H200", 132, 141 * GIB, "550.90"
    )


def test_major_driver_update_changes_the_fingerprint():
    assert device_fingerprint("GPU", "NVIDIA H200", 132, 141 * GIB, "550.54") != device_fingerprint(
        "GPU", "NVIDIA H200", 132, 141 * GIB, "555.42"
    )


def test_this_machine_kinds_reported_memory_is_far_from_a_rounding_edge():
    """MemTotal here is 24,683,792 kB (23.54 GiB): rounding to the nearest GiB sat 40 MiB from 23gib."""
    reported = 24_683_792 * 1024
    kind, description, cores, _ = CPU
    fingerprint = device_fingerprint(kind, description, cores, reported)
    assert "-24gib-" in fingerprint
    # A boot that reserves 500 MiB more, or installs the whole 24 GiB, keeps the key.
    for moved in (reported - 500 * MIB, 24 * GIB, 23 * GIB + 1):
        assert device_fingerprint(kind, description, cores, moved) == fingerprint
    assert device_fingerprint(kind, description, cores, 23 * GIB) != fingerprint


def test_a_memory_limit_is_part_of_the_fingerprint():
    kind, description, cores, memory = CPU
    host = device_fingerprint(kind, description, cores, memory)
    contained = device_fingerprint(kind, description, cores, memory, memory_limit_bytes=4 * GIB)
    assert contained != host
    assert "-24gib-lim4gib-" in contained
    assert device_fingerprint(kind, description, cores, memory, memory_limit_bytes=1536 * MIB) != contained
    assert "-lim1536mib-" in device_fingerprint(kind, description, cores, memory, memory_limit_bytes=1536 * MIB)
    assert _is_safe_name(contained)


def test_no_limit_keeps_the_key_that_committed_profiles_were_saved_under():
    """device_profiles/ holds profiles keyed before limits counted: they must still be found."""
    assert device_fingerprint("CPU", "AMD EPYC", 2, 25_275_990_016) == "cpu-amd-epyc-2c-24gib-fdd90336"


def test_a_bad_memory_limit_is_refused():
    kind, description, cores, memory = CPU
    for bad in (0, -1, True):
        with pytest.raises(ValueError, match="memory_limit_bytes"):
            device_fingerprint(kind, description, cores, memory, memory_limit_bytes=bad)


def test_a_few_mib_of_reported_memory_keep_the_fingerprint():
    kind, description, cores, memory = CPU
    assert device_fingerprint(kind, description, cores, memory) == device_fingerprint(
        kind, description, cores, memory - 37 * MIB
    )


@pytest.mark.parametrize(
    "changed",
    [
        ("GPU", "AMD EPYC 7763 64-Core Processor", 2, 24 * GIB),
        ("CPU", "AMD EPYC 7742 64-Core Processor", 2, 24 * GIB),
        ("CPU", "AMD EPYC 7763 64-Core Processor", 4, 24 * GIB),
        ("CPU", "AMD EPYC 7763 64-Core Processor", 2, 32 * GIB),
        ("CPU", "AMD EPYC 7763 64-Core Processor", None, 24 * GIB),
    ],
)
def test_different_hardware_different_fingerprint(changed):
    assert device_fingerprint(*changed) != device_fingerprint(*CPU)


def test_description_whitespace_and_kind_case_do_not_matter():
    kind, description, cores, memory = CPU
    assert device_fingerprint("cpu", f"  {description.replace(' ', '  ')} ", cores, memory) == device_fingerprint(*CPU)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [(("TPU", "x", 1, 1), "TPU"), (("CPU", "x", 0, 1), "0"), (("CPU", "x", 1, -1), "-1")],
)
def test_fingerprint_rejects_bad_facts_quoting_them(arguments, message):
    with pytest.raises(ValueError, match=message):
        device_fingerprint(*arguments)


def test_model_key_reads_like_the_model():
    key = model_key(**MODEL)
    assert re.fullmatch(r"mobilenet_v2-float32-adam-tf2\.21-[0-9a-f]{8}", key), key
    assert key == model_key(**MODEL)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("name", "resnet50"),
        ("config_hash", "fedcba9876543210"),
        ("inputs", [{"shape": [128, 128, 3], "dtype": "float32"}]),
        ("inputs", [{"shape": [96, 96, 3], "dtype": "float16"}]),
        ("precision", "mixed_float16"),
        ("optimizer", "sgd"),
        ("tf_version", "2.22.0"),
    ],
)
def test_different_model_different_key(field, value):
    assert model_key(**{**MODEL, field: value}) != model_key(**MODEL)


def test_tf_patch_release_keeps_the_key():
    assert model_key(**{**MODEL, "tf_version": "2.21.3"}) == model_key(**MODEL)
    assert model_key(**{**MODEL, "tf_version": "2.21.0-rc1"}) == model_key(**MODEL)


def test_model_key_is_file_name_safe_whatever_the_name():
    key = model_key(**{**MODEL, "name": "My__Model/../../etc passwd", "optimizer": "Adam W", "precision": "__"})
    assert _is_safe_name(key), key
    assert "/" not in key


def test_config_hash_is_sha256_of_sorted_json():
    config = {"b": [1, 2], "a": {"y": 1.5, "x": None}}
    expected = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]
    assert config_hash(config) == expected
    assert config_hash({"a": {"x": None, "y": 1.5}, "b": [1, 2]}) == expected
    assert config_hash({"a": {"x": None, "y": 1.5}, "b": [2, 1]}) != expected
    assert re.fullmatch(r"[0-9a-f]{16}", expected)
