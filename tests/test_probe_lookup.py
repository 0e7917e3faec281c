"""edgebatch.cached_profile: training code finds the profile the probe cached for its model."""

import pytest

from edgebatch import cached_profile, probe
from edgebatch.errors import UsageError


@pytest.fixture(scope="module")
def mlp_profile(tmp_path_factory):
    directory = tmp_path_factory.mktemp("profiles")
    # A limit of 64 keeps it to four small trials in one worker; one reading of the answer (a repeat
    # is a new process with a TensorFlow import, and lookup does not depend on it).
    profile = probe("mlp", device="CPU:0", max_batch_limit=64, profiles_dir=directory, answer_readings=1)
    return directory, profile


def test_finds_the_profile_by_name_and_by_model_object(mlp_profile):
    from edgebatch.models.zoo import build_model, parse_model_spec

    directory, profile = mlp_profile
    by_name = cached_profile("mlp", device="CPU:0", profiles_dir=directory)
    assert by_name is not None and by_name.model["key"] == profile.model["key"]
    assert by_name.max_batch == profile.max_batch
    model = build_model(parse_model_spec("mlp"))
    assert model.name == "mlp"  # the probe keys built-ins by name, objects by model.name
    assert cached_profile(model, device="CPU:0", profiles_dir=directory).model["key"] == profile.model["key"]


def test_another_optimizer_or_an_empty_directory_has_no_profile(mlp_profile, tmp_path):
    directory, _ = mlp_profile
    assert cached_profile("mlp", device="CPU:0", optimizer="sgd", profiles_dir=directory) is None
    assert cached_profile("mlp", device="CPU:0", profiles_dir=tmp_path) is None


def test_bad_options_are_usage_errors():
    with pytest.raises(UsageError, match="precision 'fp8'"):
        cached_profile("mlp", precision="fp8")
    with pytest.raises(UsageError, match="optimizer 'lamb'"):
        cached_profile("mlp", optimizer="lamb")
    with pytest.raises(UsageError, match="optimize 'int8'"):
        cached_profile("mlp", optimize="int8")


@pytest.mark.parametrize("flavor", ["keras", "tf_keras"])
def test_the_same_architecture_built_twice_in_a_process_has_one_key(flavor):
    import importlib

    from edgebatch.probing.trial import architecture_description
    from edgebatch.profiles.fingerprint import config_hash

    keras = importlib.import_module(flavor)

    def build(units=3):
        return keras.Sequential([keras.Input((4,)), keras.layers.Dense(units), keras.layers.Dense(2)])

    first, second = build(), build()
    assert first.layers[0].name != second.layers[0].name  # Keras numbers unnamed layers per process
    assert config_hash(architecture_description(first)) == config_hash(architecture_description(second))
    assert config_hash(architecture_description(build(5))) != config_hash(architecture_description(first))


def test_looking_up_by_name_keeps_the_callers_dtype_policy(mlp_profile):
    """Building the model to compute its key sets Keras's global policy; the caller's comes back."""
    import keras

    directory, _ = mlp_profile
    before = keras.mixed_precision.global_policy().name
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        assert cached_profile("mlp", device="CPU:0", profiles_dir=directory) is not None
        assert keras.mixed_precision.global_policy().name == "mixed_bfloat16"
    finally:
        keras.mixed_precision.set_global_policy(before)
