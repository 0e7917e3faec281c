"""What a device profile file must look like, and one-line errors when it does not.

`PROFILE_SCHEMA` is a JSON Schema (draft 2020-12) of the file; `validate_profile_dict` checks it plus
what JSON Schema cannot say well (cross-field rules, timestamps, finite numbers, file-name-safe
keys) and reports the FIRST problem as a single line naming the file and the fix, because the
person reading it is at a terminal and the fix is nearly always "re-probe".
"""

from __future__ import annotations

import functools
import math
import re
from datetime import datetime, timedelta
from typing import Any

from edgebatch.errors import ProfileError

#: Bumped when a field changes meaning or a field is added; a reader refuses newer files.
#: 2: a probe per sequence length adds `per_length`, `token_model` and the trials' `seq_len`.
#: 3: safe_batch reads each batch at its highest new-process reading, only at or below max_batch,
#: with the spread between processes counted once (summary.line_safe_batch); before, every reading
#: (children's and those above max_batch too), which left it at 0.36-0.63 of max_batch.
SCHEMA_VERSION = 3
#: Older versions this edgebatch still reads. Version 2 only added optional fields.
#: A version-1 or -2 safe_batch is smaller than version 3's, never larger: still under the budget.
READABLE_SCHEMA_VERSIONS = (1, 2, 3)
#: The first schema whose safe_batch follows summary.safe_batch_of's rule; a reused older profile
#: answers from its readings instead (probing/reuse.py).
SAFE_RULE_SCHEMA = 3
#: The oldest schema whose answers (max_batch, safe_batch, ...) mean what this one's do: a fleet
#: report calls profiles of an older schema stale (their safe_batch follows the older rule).
ANSWERS_UNCHANGED_SINCE = SAFE_RULE_SCHEMA

REPROBE_FIX = "delete it or re-run `edgebatch probe --force`"

# Fingerprints and keys become file names joined by "__" (see DeviceProfile.path_name): they must
# hold no path separators and no "__" of their own, or two profiles could claim one name.
SAFE_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")

_MAX_MESSAGE_CHARS = 160

_COUNT = {"type": "integer", "minimum": 0}
_OPTIONAL_COUNT = {"type": ["integer", "null"], "minimum": 0}
_OPTIONAL_SECONDS = {"type": ["number", "null"], "minimum": 0}
_BATCH = {"type": "integer", "minimum": 1}
_TEXT = {"type": "string", "minLength": 1}
_OPTIONAL_TEXT = {"type": ["string", "null"]}

_TRIAL_SCHEMA = {
    "type": "object",
    "required": [
        "batch",
        "ok",
        "error",
        "peak_bytes",
        "process_peak_bytes",
        "allocator_peak_bytes",
        "step_seconds",
        "samples_per_second",
    ],
    "additionalProperties": False,
    "properties": {
        "batch": _BATCH,
        "ok": {"type": "boolean"},
        "error": _OPTIONAL_TEXT,
        "peak_bytes": _OPTIONAL_COUNT,
        "process_peak_bytes": _OPTIONAL_COUNT,
        "allocator_peak_bytes": _OPTIONAL_COUNT,
        "step_seconds": _OPTIONAL_SECONDS,
        "samples_per_second": _OPTIONAL_SECONDS,
        "measured": {"type": "boolean", "default": True},
        "fresh": {"type": "boolean", "default": False},
        "settled": {"type": ["boolean", "null"], "default": None},
        "steady": {"type": ["boolean", "null"], "default": None},
        # Schema 2: the sequence length of a probe per length's trial.
        "seq_len": {"type": ["integer", "null"], "minimum": 1, "default": None},
        # Optional: whether a fresh trial's worker was a fork-server child (absent in older files).
        "forked": {"type": ["boolean", "null"], "default": None},
    },
}

# Schema 2, probes per sequence length only (absent otherwise): keys are lengths in tokens.
_PER_LENGTH_SCHEMA = {
    "type": ["object", "null"],
    "propertyNames": {"pattern": "^[1-9][0-9]*$"},
    "additionalProperties": {
        "type": "object",
        "required": ["max_batch", "safe_batch", "peak_bytes"],
        "additionalProperties": False,
        "properties": {"max_batch": _BATCH, "safe_batch": _BATCH, "peak_bytes": _OPTIONAL_COUNT},
    },
}

_TOKEN_MODEL_SCHEMA = {
    "type": ["object", "null"],
    "required": ["fixed_bytes", "per_token_bytes", "per_token_squared_bytes", "r2", "points", "lengths"],
    "additionalProperties": False,
    "properties": {
        "fixed_bytes": {"type": "number"},
        "per_token_bytes": {"type": "number", "minimum": 0},
        "per_token_squared_bytes": {"type": "number", "minimum": 0},
        "r2": {"type": "number"},
        "points": {"type": "integer", "minimum": 3},
        "lengths": {"type": "array", "minItems": 2, "items": {"type": "integer", "minimum": 1}},
    },
}

_MEMORY_MODEL_SCHEMA = {
    "type": ["object", "null"],
    "required": ["fixed_bytes", "per_sample_bytes", "r2", "points"],
    "additionalProperties": False,
    "properties": {
        "fixed_bytes": {"type": "number"},
        "per_sample_bytes": {"type": "number"},
        # r2 of a least-squares line with intercept lies in [0, 1]; it is not bounded here because
        # a fit with every y equal has no defined r2 and the probe may report it as 0 or 1.
        "r2": {"type": "number"},
        # A line needs two points.
        "points": {"type": "integer", "minimum": 2},
    },
}

# The nested dicts (versions, device, model, search) list what must be there and leave room for
# more: they are free-form dicts in DeviceProfile, so extra keys survive a round trip.
PROFILE_SCHEMA: dict = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "edgebatch device profile",
    "description": "The cached result of a batch-size probe: one device x one model. See device_profiles/README.md.",
    "type": "object",
    "required": [
        "schema_version",
        "created_at",
        "versions",
        "device",
        "model",
        "budget_bytes",
        "budget_source",
        "measure",
        "headroom",
        "max_batch",
        "safe_batch",
        "throughput_knee",
        "memory_model",
        "predicted_ceiling",
        "trials",
        "probe_seconds",
        "search",
    ],
    "additionalProperties": False,
    "properties": {
        "schema_version": {"enum": list(READABLE_SCHEMA_VERSIONS)},
        "created_at": _TEXT,
        "versions": {
            "type": "object",
            "required": ["edgebatch", "tensorflow", "keras", "python"],
            "properties": {
                "edgebatch": _TEXT,
                "tensorflow": _OPTIONAL_TEXT,
                "keras": _OPTIONAL_TEXT,
                "python": _TEXT,
            },
        },
        "device": {
            "type": "object",
            "required": [
                "fingerprint",
                "kind",
                "tf_device",
                "description",
                "cores",
                "memory_total_bytes",
                "driver_version",
                "compute_capability",
            ],
            "properties": {
                "fingerprint": _TEXT,
                "kind": {"enum": ["CPU", "GPU"]},
                "tf_device": _TEXT,
                "description": {"type": "string"},
                "cores": {"type": ["integer", "null"], "minimum": 1},
                "memory_total_bytes": _OPTIONAL_COUNT,
                # Added after schema 1 shipped, so optional: a cgroup limit under the total, or null.
                "memory_limit_bytes": _OPTIONAL_COUNT,
                "driver_version": _OPTIONAL_TEXT,
                "compute_capability": _OPTIONAL_TEXT,
            },
        },
        "model": {
            "type": "object",
            "required": [
                "key",
                "name",
                "config_hash",
                "inputs",
                "precision",
                "optimizer",
                "parameters",
                "keras_flavor",
            ],
            "properties": {
                "key": _TEXT,
                "name": _TEXT,
                "config_hash": _TEXT,
                "inputs": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["shape", "dtype"],
                        "properties": {
                            # None marks a dimension the model leaves open (the batch, a sequence).
                            "shape": {"type": "array", "items": {"type": ["integer", "null"], "minimum": 1}},
                            "dtype": _TEXT,
                        },
                    },
                },
                "precision": _TEXT,
                "optimizer": _TEXT,
                "parameters": _COUNT,
                "keras_flavor": {"enum": ["keras3", "tf_keras"]},
            },
        },
        "budget_bytes": {"type": "integer", "minimum": 1},
        "budget_source": _TEXT,
        "measure": {"enum": ["process_peak", "allocator_peak", "device_used"]},
        "headroom": {"type": "number", "minimum": 0, "exclusiveMaximum": 1,
                     "description": "the share safe_batch's peak keeps under the budget the search judged by"},
        "max_batch": {**_BATCH, "description": "the largest batch every fresh reading put under the budget: the edge"},
        "safe_batch": {**_BATCH, "description": "the batch to train with: at most max_batch, its readings "
                                                "along the memory line under the budget less the headroom"},
        "throughput_knee": {"type": ["integer", "null"], "minimum": 1},
        "memory_model": _MEMORY_MODEL_SCHEMA,
        "predicted_ceiling": _OPTIONAL_COUNT,
        "trials": {"type": "array", "minItems": 1, "items": _TRIAL_SCHEMA},
        "probe_seconds": {"type": "number", "minimum": 0},
        "per_length": _PER_LENGTH_SCHEMA,
        "token_model": _TOKEN_MODEL_SCHEMA,
        "search": {
            "type": "object",
            "required": ["strategy", "start", "multiple", "max_batch_limit", "steps_per_trial"],
            "properties": {
                "strategy": _TEXT,
                "start": _BATCH,
                "multiple": _BATCH,
                "max_batch_limit": _BATCH,
                "steps_per_trial": _BATCH,
            },
        },
    },
}


@functools.lru_cache(maxsize=1)
def _validator() -> Any:
    # jsonschema costs ~70 ms to import (attrs, referencing): pay it when a profile is checked,
    # not whenever the CLI imports this package for `--help`.
    import jsonschema

    return jsonschema.Draft202012Validator(PROFILE_SCHEMA)


def validate_profile_dict(data: dict, source: str = "<memory>") -> None:
    """Raise ProfileError (one line: source, first problem, fix) unless `data` is a valid profile."""
    version_problem = _schema_version_problem(data)
    if version_problem is not None:
        raise ProfileError(f"device profile {source} {version_problem}")
    problem = profile_problem(data)
    if problem is not None:
        raise ProfileError(f"device profile {source} is invalid {problem}; {REPROBE_FIX}")


def profile_problem(data: Any) -> str | None:
    """The first problem in `data` as "at <JSON path>: <message>", or None if it is a valid profile.

    Unlike validate_profile_dict this raises nothing, so a writer can word its own error around it.
    """
    if not isinstance(data, dict):
        return f"at $: the top level must be a JSON object, got {type(data).__name__}"
    # Before the schema: NaN fails every `minimum` with a message that hides the real cause.
    non_finite = _first_non_finite(data, "$")
    if non_finite is not None:
        path, value = non_finite
        return f"at {path}: {value!r} is not a finite number (JSON cannot hold it)"
    from jsonschema.exceptions import best_match

    error = best_match(_validator().iter_errors(data))
    if error is not None:
        return f"at {_json_path(error.absolute_path)}: {_shorten(error.message)}"
    return _cross_field_problem(data)


def _schema_version_problem(data: Any) -> str | None:
    """A version mismatch gets its own wording: the file may be fine, just not for this edgebatch."""
    if not isinstance(data, dict):
        return None  # profile_problem words this one
    if "schema_version" not in data:
        return f"has no schema_version: it is not an edgebatch device profile; {REPROBE_FIX}"
    version = data["schema_version"]
    if isinstance(version, bool) or not isinstance(version, int):
        return f"has schema_version {_shorten(repr(version))}, not an integer; {REPROBE_FIX}"
    if version > SCHEMA_VERSION:
        return (
            f"was written by a newer edgebatch (schema {version}; this one reads {SCHEMA_VERSION}): "
            "upgrade edgebatch or re-probe with --force"
        )
    if version not in READABLE_SCHEMA_VERSIONS:
        return f"has unknown schema_version {version} (this edgebatch reads {SCHEMA_VERSION}); {REPROBE_FIX}"
    return None


def _cross_field_problem(data: dict) -> str | None:
    if data["safe_batch"] > data["max_batch"]:
        return (
            f"at $.safe_batch: safe_batch {data['safe_batch']} is larger than max_batch {data['max_batch']} "
            "(the safe batch fits a smaller budget)"
        )
    for length, entry in sorted((data.get("per_length") or {}).items()):
        if entry["safe_batch"] > entry["max_batch"]:
            return (
                f"at $.per_length.{length}.safe_batch: safe_batch {entry['safe_batch']} is larger than max_batch "
                f"{entry['max_batch']} (the safe batch fits a smaller budget)"
            )
    if data["schema_version"] < 2 and any(key in data for key in ("per_length", "token_model")):
        return "at $.schema_version: per_length and token_model need schema_version 2 or later"
    for path, name in (("$.device.fingerprint", data["device"]["fingerprint"]), ("$.model.key", data["model"]["key"])):
        if not SAFE_NAME_RE.match(name) or "__" in name:
            return (
                f"at {path}: {_shorten(repr(name))} is not usable in a file name "
                "(use lowercase letters, digits, '.', '_' and '-', no '__')"
            )
    return _timestamp_problem(data["created_at"])


def _timestamp_problem(created_at: str) -> str | None:
    # datetime.fromisoformat reads a trailing "Z" only from Python 3.11; spell it out for 3.10.
    text = created_at[:-1] + "+00:00" if created_at.endswith(("Z", "z")) else created_at
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return f"at $.created_at: {_shorten(repr(created_at))} is not an ISO-8601 timestamp"
    if moment.utcoffset() != timedelta(0):
        return f"at $.created_at: {_shorten(repr(created_at))} is not in UTC (write it as YYYY-MM-DDThh:mm:ssZ)"
    return None


def _first_non_finite(value: Any, path: str) -> tuple[str, float] | None:
    if isinstance(value, float) and not math.isfinite(value):
        return path, value
    if isinstance(value, dict):
        for key, item in value.items():
            found = _first_non_finite(item, f"{path}.{key}")
            if found is not None:
                return found
    if isinstance(value, list):
        for index, item in enumerate(value):
            found = _first_non_finite(item, f"{path}[{index}]")
            if found is not None:
                return found
    return None


def _json_path(parts: Any) -> str:
    path = "$"
    for part in parts:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def _shorten(message: str) -> str:
    # jsonschema quotes the whole offending value first and says what is wrong last ("... is not of
    # type 'array'"); a wrong-typed `trials` would fill the screen, so cut from the middle.
    message = " ".join(message.split())
    if len(message) > _MAX_MESSAGE_CHARS:
        head = _MAX_MESSAGE_CHARS // 2
        message = message[:head] + " ... " + message[-(_MAX_MESSAGE_CHARS - head - 5) :]
    return message
