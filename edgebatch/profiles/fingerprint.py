"""Stable names for a device and a model, so that a profile is found again (and only) where it applies.

A device fingerprint is the hardware facts that decide how much memory training may use; a model key
is everything about the model and its training setup that changes the memory a step needs. Both are
a readable slug (for people listing a directory) plus a short hash of the full facts (for
correctness: the slug is truncated and loses detail, the hash does not).
"""

from __future__ import annotations

import hashlib
import json
import re

_MIB = 1024**2
_GIB = 1024**3
_DEVICE_KINDS = ("CPU", "GPU")

# Marketing noise in CPU/GPU names that makes slugs long without telling devices apart; the
# hash still covers the full description.
_DESCRIPTION_NOISE_RE = re.compile(
    r"\((?:r|tm)\)|\b(?:processor|cpu|\d+-core|with radeon graphics)\b|@\s*[\d.]+\s*[gm]hz", re.IGNORECASE
)
_MAX_DESCRIPTION_SLUG_CHARS = 28
_MAX_NAME_SLUG_CHARS = 40


def device_fingerprint(
    kind: str,
    description: str,
    cores: int | None,
    memory_total_bytes: int | None,
    driver_version: str | None = None,
    memory_limit_bytes: int | None = None,
) -> str:
    """A file-name-safe key for a device, e.g. 'cpu-<cpu-model>-2c-24gib-<8 hex digits>'.

    Memory counts in whole GiB, rounded UP (`memory_size_gib`): what a kernel or driver reports is
    the installed size minus its reservations, which move by tens of MiB between boots and kernel
    versions, so the reported figure sits just under the installed size and the next whole GiB is
    the installed size itself, far from any rounding edge. (Rounding to the nearest GiB put a
    23.54 GiB host 40 MiB from flipping to 23gib.) `memory_limit_bytes` is a limit below the
    device's total that applies to the training process (a container's cgroup limit): a profile
    probed without it must not be found inside a 4 GiB container, so it is part of the key, to the
    MiB (a limit is a setting, exact). Without a limit the key is the same as before limits were
    counted, so older profiles are still found. The driver contributes only its MAJOR version, so
    a minor driver update (550.54 -> 550.90) keeps existing profiles.
    """
    kind_upper = str(kind).upper()
    if kind_upper not in _DEVICE_KINDS:
        raise ValueError(f"device kind must be 'CPU' or 'GPU', got {kind!r}")
    if cores is not None and (isinstance(cores, bool) or cores < 1):
        raise ValueError(f"cores must be a positive integer or None, got {cores!r}")
    if memory_total_bytes is not None and (isinstance(memory_total_bytes, bool) or memory_total_bytes < 0):
        raise ValueError(f"memory_total_bytes must be a non-negative integer or None, got {memory_total_bytes!r}")
    if memory_limit_bytes is not None and (isinstance(memory_limit_bytes, bool) or memory_limit_bytes <= 0):
        raise ValueError(f"memory_limit_bytes must be a positive integer or None, got {memory_limit_bytes!r}")
    memory_gib = None if memory_total_bytes is None else memory_size_gib(memory_total_bytes)
    facts = {
        "kind": kind_upper,
        "description": " ".join(str(description).split()).casefold(),
        "cores": cores,
        "memory_gib": memory_gib,
        "driver_major": driver_major_version(driver_version),
    }
    if memory_limit_bytes is not None:
        facts["memory_limit_mib"] = -(-int(memory_limit_bytes) // _MIB)
    parts = [kind_upper.lower()]
    description_slug = _slug(_DESCRIPTION_NOISE_RE.sub(" ", str(description)), _MAX_DESCRIPTION_SLUG_CHARS)
    if description_slug:
        parts.append(description_slug)
    if cores is not None:
        parts.append(f"{cores}c")
    if memory_gib is not None:
        parts.append(f"{memory_gib}gib")
    if memory_limit_bytes is not None:
        parts.append(f"lim{_limit_slug(memory_limit_bytes)}")
    parts.append(_short_hash(facts, 8))
    return "-".join(parts)


def memory_size_gib(memory_bytes: int) -> int:
    """Reported memory in whole GiB, rounded up: 24 GiB - 37 MiB -> 24; 23.54 GiB -> 24; 0.9 GiB -> 1."""
    return max(1, -(-int(memory_bytes) // _GIB))


def _limit_slug(limit_bytes: int) -> str:
    """'4gib' for a whole number of GiB, else whole MiB ('1536mib'): short, and exact enough to read."""
    limit_mib = -(-int(limit_bytes) // _MIB)
    return f"{limit_mib // 1024}gib" if limit_mib % 1024 == 0 else f"{limit_mib}mib"


def model_key(
    name: str,
    config_hash: str,
    inputs: list[dict],
    precision: str,
    optimizer: str,
    tf_version: str,
    optimize: str = "none",
    seq_lens: tuple[int, ...] | list[int] | None = None,
) -> str:
    """A file-name-safe key for a model and its training setup, e.g. 'mobilenet_v2-float32-adam-tf2.21-<8 hex digits>'.

    The hash covers every argument (TensorFlow as major.minor: a patch release does not change
    kernels' memory use enough to re-probe, a minor release can). A TFMOT `optimize` ("qat",
    "prune") joins the slug after the optimizer ('mobilenet_v2-float32-adam-qat-tf2.21-...') and
    the hash; "none" leaves both as they were before optimisations were counted, so older
    profiles are still found. A probe per sequence length adds its lengths to the hash and
    `len<shortest>-<longest>` to the slug ('transformer_tiny-float32-adam-len64-512-tf2.21-...'), so
    its profile is never taken for another set of lengths or for a plain probe's.
    """
    if not isinstance(inputs, (list, tuple)):
        raise ValueError(f"inputs must be a list of {{'shape': [...], 'dtype': ...}} dicts, got {inputs!r}")
    tf_minor = tf_major_minor(tf_version)
    facts = {
        "name": str(name),
        "config_hash": str(config_hash),
        "inputs": list(inputs),
        "precision": str(precision),
        "optimizer": str(optimizer),
        "tf": tf_minor,
    }
    parts = [
        _slug(name, _MAX_NAME_SLUG_CHARS, keep="_.") or "model",
        _slug(precision, _MAX_NAME_SLUG_CHARS, keep="_.") or "precision",
        _slug(optimizer, _MAX_NAME_SLUG_CHARS, keep="_.") or "optimizer",
    ]
    if optimize is not None and str(optimize) != "none":
        facts["optimize"] = str(optimize)
        parts.append(_slug(optimize, _MAX_NAME_SLUG_CHARS, keep="_.") or "optimize")
    if seq_lens:
        lengths = sorted({int(length) for length in seq_lens})
        facts["seq_lens"] = lengths
        parts.append(f"len{lengths[0]}-{lengths[-1]}")
    parts += [f"tf{_slug(tf_minor, 16, keep='.')}", _short_hash(facts, 8)]
    return "-".join(parts)


def config_hash(config: object) -> str:
    """A stable 16-hex-digit hash of a (model) config: sha256 of json.dumps(config, sort_keys=True, default=str).

    Objects JSON cannot encode are hashed by str(): fine for dtypes and enums, unstable for objects
    whose str() holds a memory address, so pass `model.get_config()`-like plain data.
    """
    text = json.dumps(config, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def driver_major_version(driver_version: str | None) -> str | None:
    """'550.54.15' -> '550'; None or '' -> None. Anything without a leading number is kept whole."""
    if driver_version is None or not str(driver_version).strip():
        return None
    text = str(driver_version).strip()
    match = re.match(r"\d+", text)
    return match.group(0) if match else text


def tf_major_minor(tf_version: str) -> str:
    """'2.21.0' / '2.21.0-rc1' -> '2.21'. A version not shaped like that is kept whole."""
    text = str(tf_version).strip()
    match = re.match(r"(\d+)\.(\d+)", text)
    return f"{match.group(1)}.{match.group(2)}" if match else text


def _short_hash(facts: dict, hex_chars: int) -> str:
    text = json.dumps(facts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:hex_chars]


def _slug(text: str, max_chars: int, keep: str = "") -> str:
    """Lowercase, runs of anything else than [a-z0-9] (and `keep`) -> '-', cut at a '-' boundary.

    Runs of '_' collapse to one so that no slug contains '__', the separator of the file name.
    """
    allowed = "a-z0-9" + re.escape(keep)
    slug = re.sub(f"[^{allowed}]+", "-", str(text).lower())
    slug = re.sub(r"_+", "_", slug)
    slug = re.sub(r"-+", "-", slug).strip("-_.")
    if len(slug) > max_chars:
        cut = slug[:max_chars]
        slug = cut.rsplit("-", 1)[0] if "-" in cut else cut
        slug = slug.strip("-_.")
    return slug
