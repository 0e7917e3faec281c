"""Device profiles: the cached result of a batch-size probe, one JSON file per (device, model).

Pure and fast: nothing here imports TensorFlow, psutil or pynvml. Field meanings and the file
layout are documented in device_profiles/README.md.
"""

from edgebatch.profiles.fingerprint import config_hash, device_fingerprint, model_key
from edgebatch.profiles.model import DeviceProfile, LengthCeiling, MemoryModel, TokenMemoryModel, Trial, utc_now_iso
from edgebatch.profiles.schema import PROFILE_SCHEMA, SCHEMA_VERSION, profile_problem, validate_profile_dict
from edgebatch.profiles.store import (
    LOCK_TIMEOUT_SECONDS,
    PROFILES_ENV_VAR,
    find_profile,
    list_profiles,
    load_profile,
    profile_path,
    resolve_profiles_dir,
    save_profile,
)

__all__ = [
    "LOCK_TIMEOUT_SECONDS",
    "PROFILE_SCHEMA",
    "PROFILES_ENV_VAR",
    "SCHEMA_VERSION",
    "DeviceProfile",
    "LengthCeiling",
    "MemoryModel",
    "TokenMemoryModel",
    "Trial",
    "config_hash",
    "device_fingerprint",
    "find_profile",
    "list_profiles",
    "load_profile",
    "model_key",
    "profile_path",
    "profile_problem",
    "resolve_profiles_dir",
    "save_profile",
    "utc_now_iso",
    "validate_profile_dict",
]
