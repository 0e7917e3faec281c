"""Device profiles: one JSON file per (device fingerprint, model key), written atomically.

A profiles location is a local directory or an fsspec URL (see location.py). Local writers take a
lock and replace the file in one rename; URL writers replace the object in one step their backend
makes atomic (see save_profile). Either way a reader never needs a lock: it sees the old file or
the new one, never half of one. Every failure is a ProfileError that names the file or URL and
what to do about it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from edgebatch.errors import EdgebatchError, ProfileError, UsageError
from edgebatch.files import fsync_directory, write_atomically
from edgebatch.profiles.location import ProfileURL, as_location, open_url, remote_errors
from edgebatch.profiles.model import DeviceProfile
from edgebatch.profiles.schema import REPROBE_FIX, SAFE_NAME_RE, profile_problem
from edgebatch.profiles.temp_files import (
    is_stranded_temp_file,
    remove_stranded_local_temp_files,
    temp_name,
    writer_label,
)

PROFILES_ENV_VAR = "EDGEBATCH_PROFILES"
DEFAULT_PROFILES_DIRNAME = "device_profiles"
# A profile write takes milliseconds; 30 s of waiting means the other writer is stuck, not busy.
LOCK_TIMEOUT_SECONDS = 30.0
# fsspec backends where writing a whole object in one call (a PUT; for memory:// one dict
# assignment) is atomic and where mv is a copy + delete rather than a rename: a profile is written
# there in one pipe_file. Every other backend gets a temporary file next to the target and fs.mv.
SINGLE_PUT_PROTOCOLS = frozenset({"memory", "s3", "s3a", "gs", "gcs", "abfs", "abfss", "az", "oci", "oss"})

ProfileLocation = Path | ProfileURL

_CREATE_HINT = (
    "run `edgebatch probe` for this model on this device, "
    f"or point ${PROFILES_ENV_VAR} at the directory that holds the profile"
)


def resolve_profiles_dir(explicit: str | Path | None = None) -> ProfileLocation:
    """Where profiles live: `explicit` if given, else $EDGEBATCH_PROFILES if set, else ./device_profiles.

    A value starting with `protocol://` is returned as a ProfileURL (a str, never put through
    Path); anything else as a Path with `~` expanded.
    """
    if explicit is not None and str(explicit) != "":
        return as_location(explicit)
    from_env = os.environ.get(PROFILES_ENV_VAR, "").strip()
    if from_env:
        return as_location(from_env)
    return Path.cwd() / DEFAULT_PROFILES_DIRNAME


def profile_path(profiles_dir: str | Path | None, device_fingerprint: str, model_key: str) -> ProfileLocation:
    """The file (Path or ProfileURL) that holds the profile of (device_fingerprint, model_key) in `profiles_dir`."""
    for label, name in (("device fingerprint", device_fingerprint), ("model key", model_key)):
        if not isinstance(name, str) or not SAFE_NAME_RE.match(name) or "__" in name:
            raise UsageError(
                f"{label} {name!r} is not a profile name: use lowercase letters, digits, '.', '_' and '-', "
                "no '__'"
            )
    return resolve_profiles_dir(profiles_dir) / f"{device_fingerprint}__{model_key}.json"


def save_profile(
    profile: DeviceProfile,
    profiles_dir: str | Path | None = None,
    *,
    lock_timeout_seconds: float = LOCK_TIMEOUT_SECONDS,
) -> ProfileLocation:
    """Validate `profile` and write it to `<profiles_dir>/<path_name>` atomically; return the path or URL.

    What is atomic where (a reader never sees half a file in any of these):
    - local directory: written to a temporary file next to the target, fsynced and renamed over it
      (os.replace) under a lock on `<file>.lock`; the directory is created if needed.
    - URL on a backend whose mv is a rename (file://, sftp, hdfs, ...): written to a temporary
      file next to the target, then fs.mv; the rename is atomic where the backend's is (POSIX
      filesystems, NFS within one export). No lock: the temporary names are unique.
    - memory:// and object stores (SINGLE_PUT_PROTOCOLS: s3, gs, abfs, ...): one pipe_file, i.e.
      one dict assignment (memory) or one PUT (object stores), which those stores make atomic.
    Concurrent writers of different profiles never touch each other's files. Concurrent writers
    of the same profile end with one whole file: the last rename or PUT wins.
    A failed or interrupted write (an exception, Ctrl-C) leaves the old file and removes its
    temporary file. A write killed outright (SIGKILL, power loss) cannot clean up: it leaves the
    old file and at most a `.<name>.<host>.<pid>.<random>.tmp`, which listings ignore and the next
    save into that directory from the same host removes once that pid is gone.

    Args:
        profile: the DeviceProfile to write.
        profiles_dir: a local folder or an fsspec URL (None: resolve_profiles_dir()).
        lock_timeout_seconds: how long to wait for another writer's lock on a local file.

    Returns:
        Where it was written (a ProfileLocation: a path or a URL).

    Raises:
        ProfileError: the profile fails validation, the lock is not had in time, or the write fails.
    """
    data = profile.to_dict()
    directory = resolve_profiles_dir(profiles_dir)
    path = directory / profile.path_name
    problem = profile_problem(data)
    if problem is not None:
        raise ProfileError(
            f"refusing to write device profile {path}: the profile is invalid {problem} "
            "(a bug in whatever built it; the existing file, if any, is left as it was)"
        )
    try:
        # The schema leaves the extra keys of device/model/... untyped; a set or an object there
        # must fail here, in words, not as a TypeError half-way through the write.
        json.dumps(data, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise ProfileError(
            f"refusing to write device profile {path}: it does not convert to JSON ({error})"
        ) from error
    if isinstance(path, ProfileURL):
        _save_to_url(path, (json.dumps(data, indent=2, allow_nan=False) + "\n").encode("utf-8"))
        return path
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ProfileError(f"cannot create profile directory {directory}: {error.strerror or error}") from error
    import filelock  # lazily, like jsonschema: only writers need it

    lock_path = Path(f"{path}.lock")
    try:
        with filelock.FileLock(str(lock_path), timeout=lock_timeout_seconds):
            remove_stranded_local_temp_files(directory)
            _write_atomically(path, data)
    except filelock.Timeout as error:
        raise ProfileError(
            f"could not lock {lock_path} within {lock_timeout_seconds:g} s: another process is writing "
            f"this profile; wait for it to finish and try again"
        ) from error
    except ProfileError:
        raise
    except (OSError, EdgebatchError) as error:  # files.write_atomically's carries the OSError as its cause
        reason = error.__cause__ if isinstance(error.__cause__, OSError) else error
        raise ProfileError(f"cannot write device profile {path}: {getattr(reason, 'strerror', None) or reason}") from error
    return path


def load_profile(
    path_or_dir: str | Path | None = None,
    *,
    device_fingerprint: str | None = None,
    model_key: str | None = None,
) -> DeviceProfile:
    """Load a profile: from a file path or URL, or by (device_fingerprint, model_key) from a directory.

    Args:
        path_or_dir: a profile file or URL; with both keywords, the directory or directory URL
            (None: resolve_profiles_dir()).
        device_fingerprint: the device part of the file name (DeviceFacts.fingerprint).
        model_key: the model part of the file name (profiles.model_key).

    Returns:
        The DeviceProfile, validated against the schema (older schema versions still load).

    Raises:
        ProfileError: a missing, unreadable, non-JSON or invalid file, or an unreachable URL.
    """
    if device_fingerprint is None and model_key is None:
        if path_or_dir is None:
            raise UsageError("load_profile needs a profile file, or device_fingerprint and model_key to look one up")
        path = as_location(path_or_dir)
        if isinstance(path, ProfileURL):
            return _load_url_file(path)
        if path.is_dir():
            raise UsageError(
                f"{path} is a directory: give a profile file, or device_fingerprint and model_key to look one up in it"
            )
        if not path.exists():
            raise ProfileError(f"device profile {path} does not exist: {_CREATE_HINT}")
        return _read_profile(path)
    if device_fingerprint is None or model_key is None:
        raise UsageError(
            f"looking up a profile needs both device_fingerprint and model_key, "
            f"got device_fingerprint={device_fingerprint!r}, model_key={model_key!r}"
        )
    profile = find_profile(path_or_dir, device_fingerprint, model_key)
    if profile is None:
        raise ProfileError(
            f"no device profile for device {device_fingerprint} and model {model_key} "
            f"(looked for {profile_path(path_or_dir, device_fingerprint, model_key)}): {_CREATE_HINT}"
        )
    return profile


def find_profile(profiles_dir: str | Path | None, device_fingerprint: str, model_key: str) -> DeviceProfile | None:
    """The profile of (device_fingerprint, model_key), or None if there is none; a corrupt one raises."""
    path = profile_path(profiles_dir, device_fingerprint, model_key)
    if isinstance(path, ProfileURL):
        profile = _read_url_profile(path)  # one request: no exists() before the read
        if profile is None:
            return None
    elif not path.exists():
        return None
    else:
        profile = _read_profile(path)
    # A file copied or renamed by hand would otherwise hand one device's batch size to another.
    if profile.device_fingerprint != device_fingerprint or profile.model_key != model_key:
        raise ProfileError(_misnamed_message(path, profile))
    return profile


def list_profiles(
    profiles_dir: str | Path | None = None, *, recursive: bool = False
) -> list[tuple[ProfileLocation, DeviceProfile | ProfileError]]:
    """Every `*.json` in the directory (or URL), sorted, with its profile or the ProfileError it gives.

    With recursive=True, subdirectories too (a fleet writes `<dir>/nodes/<node>/<name>.json`).
    A file whose name does not match what it holds is reported too: a lookup would never find it.
    Lock files and temporary files are not profiles and are skipped. A missing directory has no
    profiles; an unreachable URL is a ProfileError.
    """
    location = resolve_profiles_dir(profiles_dir)
    if isinstance(location, ProfileURL):
        candidates, read = _url_profile_files(location, recursive), _read_listed_url_profile
    else:
        candidates, read = _local_profile_files(location, recursive), _read_profile
    results: list[tuple[ProfileLocation, DeviceProfile | ProfileError]] = []
    for path in candidates:
        try:
            profile = read(path)
            if profile.path_name != path.name:
                raise ProfileError(_misnamed_message(path, profile))
            results.append((path, profile))
        except ProfileError as error:
            results.append((path, error))
    return results


def _local_profile_files(directory: Path, recursive: bool) -> list[Path]:
    if not directory.is_dir():
        return []
    found = directory.rglob("*.json") if recursive else directory.glob("*.json")
    return sorted(path for path in found if path.is_file())


def _url_profile_files(url: ProfileURL, recursive: bool) -> list[ProfileURL]:
    """The `*.json` files under `url` (one level, or all with recursive), as URLs that start with `url`."""
    fs, base = open_url(url)
    with remote_errors(url, "list profiles in"):
        try:
            if recursive:
                paths = fs.find(base)
            else:
                paths = [entry["name"] for entry in fs.ls(base, detail=True) if entry.get("type") == "file"]
        except FileNotFoundError:
            return []
    base = base.rstrip("/")
    relative = sorted(path[len(base):].lstrip("/") for path in paths if path.startswith(base))
    return [url / name for name in relative if name.endswith(".json")]


def _load_url_file(url: ProfileURL) -> DeviceProfile:
    profile = _read_url_profile(url)
    if profile is not None:
        return profile
    if url.is_dir():
        raise UsageError(
            f"{url} is a directory: give a profile file, or device_fingerprint and model_key to look one up in it"
        )
    raise ProfileError(f"device profile {url} does not exist: {_CREATE_HINT}")


def _read_listed_url_profile(url: ProfileURL) -> DeviceProfile:
    profile = _read_url_profile(url)
    if profile is None:
        raise ProfileError(f"device profile {url} was removed while the profiles were being listed")
    return profile


def _read_url_profile(url: ProfileURL) -> DeviceProfile | None:
    """The profile at `url`, or None if there is no file there."""
    fs, path = open_url(url)
    with remote_errors(url, "read device profile"):
        try:
            raw = fs.cat_file(path)
        except (FileNotFoundError, IsADirectoryError):
            return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ProfileError(f"device profile {url} is not UTF-8 text (byte {error.start}); {REPROBE_FIX}") from error
    return _parse_profile(text, url)


def _read_profile(path: Path) -> DeviceProfile:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ProfileError(f"device profile {path} is not UTF-8 text (byte {error.start}); {REPROBE_FIX}") from error
    except OSError as error:
        raise ProfileError(f"cannot read device profile {path}: {error.strerror or error}") from error
    return _parse_profile(text, path)


def _parse_profile(text: str, where: ProfileLocation) -> DeviceProfile:
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as error:
        raise ProfileError(
            f"device profile {where} is not valid JSON (line {error.lineno}, column {error.colno}: {error.msg}); "
            f"{REPROBE_FIX}"
        ) from error
    except ValueError as error:  # NaN / Infinity, which Python's json accepts and JSON does not
        raise ProfileError(f"device profile {where} is not valid JSON ({error}); {REPROBE_FIX}") from error
    return DeviceProfile.from_dict(data, source=str(where))


def _misnamed_message(path: ProfileLocation, profile: DeviceProfile) -> str:
    return (
        f"device profile {path} holds the profile of device {profile.device_fingerprint} and model "
        f"{profile.model_key}, which belongs in {profile.path_name}: rename it to that or delete it"
    )


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _write_atomically(path: Path, data: dict) -> None:
    """Write `data` as JSON to `path` atomically (files.write_atomically), its temporary file named
    like temp_files.temp_name's (mkstemp adds the random part), so a stranded one can be swept."""
    # allow_nan=False: validation already refused NaN, this is the belt to those braces.
    text = json.dumps(data, indent=2, allow_nan=False) + "\n"
    write_atomically(path, text, temp_prefix=f".{path.name}.{writer_label()}.{os.getpid()}.")


def _save_to_url(url: ProfileURL, data: bytes) -> None:
    """Write `data` to `url` in the one step its backend makes atomic (see save_profile)."""
    fs, path = open_url(url)
    if _single_put_is_atomic(fs):
        with remote_errors(url, "write device profile"):
            fs.pipe_file(path, data)
        return
    directory = fs._parent(path)
    with remote_errors(url.parent, "create profile directory"):
        fs.makedirs(directory, exist_ok=True)
    _remove_stranded_remote_temp_files(fs, directory)
    _write_then_move(fs, url, path, f"{directory.rstrip('/')}/{temp_name(url.name)}", data)


def _single_put_is_atomic(fs) -> bool:
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
    return any(protocol in SINGLE_PUT_PROTOCOLS for protocol in protocols)


def _write_then_move(fs, url: ProfileURL, path: str, temp_path: str, data: bytes) -> None:
    """Write `data` to `temp_path`, then fs.mv it onto `path`; on any exit without the move, remove the temp."""
    moved = False
    try:
        with remote_errors(url, "write device profile"):
            with fs.open(temp_path, "wb") as handle:
                handle.write(data)
                _flush_to_storage(handle)
            fs.mv(temp_path, path)
        moved = True
        if _is_local(fs):
            fsync_directory(Path(path).parent)
    finally:
        # BaseException included (KeyboardInterrupt mid-write): never leave a temporary file.
        if not moved:
            _remove_quietly(fs, temp_path)


def _flush_to_storage(handle) -> None:
    """Flush and fsync when the backend's file has a descriptor (local files); others persist on close."""
    handle.flush()
    try:
        os.fsync(handle.fileno())
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both OSError and ValueError
        pass


def _is_local(fs) -> bool:
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
    return "file" in protocols or "local" in protocols


def _remove_quietly(fs, path: str) -> None:
    try:
        fs.rm_file(path)
    except Exception:  # noqa: BLE001, S110 - already gone, or the store is unreachable: the original error matters more
        pass


def _remove_stranded_remote_temp_files(fs, directory: str) -> None:
    try:
        paths = fs.ls(directory, detail=False)
    except Exception:  # noqa: BLE001 - best effort: the write itself will report an unreachable store
        return
    for path in paths:
        if is_stranded_temp_file(path.rstrip("/").rsplit("/", 1)[-1]):
            _remove_quietly(fs, path)
