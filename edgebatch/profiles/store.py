"""Device profiles on disk: one JSON file per (device fingerprint, model key), written atomically.

Writers take a lock and replace the file in one rename, so a reader never needs a lock: it sees
either the old file or the new one, never half of one. Every failure is a ProfileError that names
the file and what to do about it.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from edgebatch.errors import ProfileError, UsageError
from edgebatch.profiles.model import DeviceProfile
from edgebatch.profiles.schema import REPROBE_FIX, SAFE_NAME_RE, profile_problem

PROFILES_ENV_VAR = "EDGEBATCH_PROFILES"
DEFAULT_PROFILES_DIRNAME = "device_profiles"
# A profile write takes milliseconds; 30 s of waiting means the other writer is stuck, not busy.
LOCK_TIMEOUT_SECONDS = 30.0

_CREATE_HINT = (
    "run `edgebatch probe` for this model on this device, "
    f"or point ${PROFILES_ENV_VAR} at the directory that holds the profile"
)


def resolve_profiles_dir(explicit: str | Path | None = None) -> Path:
    """Where profiles live: `explicit` if given, else $EDGEBATCH_PROFILES if set, else ./device_profiles."""
    if explicit is not None and str(explicit) != "":
        return Path(explicit).expanduser()
    from_env = os.environ.get(PROFILES_ENV_VAR, "").strip()
    if from_env:
        return Path(from_env).expanduser()
    return Path.cwd() / DEFAULT_PROFILES_DIRNAME


def profile_path(profiles_dir: str | Path | None, device_fingerprint: str, model_key: str) -> Path:
    """The file that holds the profile of (device_fingerprint, model_key) in `profiles_dir`."""
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
) -> Path:
    """Validate `profile` and write it to `<profiles_dir>/<path_name>` atomically; return the path.

    The directory is created if needed. The file is written to a temporary file next to it,
    fsynced and renamed over the old one under a lock on `<file>.lock`, so concurrent writers end
    with one whole file and an interrupted write (even by Ctrl-C) leaves the old file and no
    temporary file behind.
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
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ProfileError(f"cannot create profile directory {directory}: {error.strerror or error}") from error
    import filelock  # lazily, like jsonschema: only writers need it

    lock_path = Path(f"{path}.lock")
    try:
        with filelock.FileLock(str(lock_path), timeout=lock_timeout_seconds):
            _write_atomically(path, data)
    except filelock.Timeout as error:
        raise ProfileError(
            f"could not lock {lock_path} within {lock_timeout_seconds:g} s: another process is writing "
            f"this profile; wait for it to finish and try again"
        ) from error
    except OSError as error:
        raise ProfileError(f"cannot write device profile {path}: {error.strerror or error}") from error
    return path


def load_profile(
    path_or_dir: str | Path | None = None,
    *,
    device_fingerprint: str | None = None,
    model_key: str | None = None,
) -> DeviceProfile:
    """Load a profile: from a file path, or by (device_fingerprint, model_key) from a directory.

    With both keywords, `path_or_dir` is the directory (None: resolve_profiles_dir()). Without them,
    it must be a profile file. A missing, unreadable, non-JSON or invalid file is a ProfileError.
    """
    if device_fingerprint is None and model_key is None:
        if path_or_dir is None:
            raise UsageError("load_profile needs a profile file, or device_fingerprint and model_key to look one up")
        path = Path(path_or_dir).expanduser()
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
    path = profile_path(path_or_dir, device_fingerprint, model_key)
    if not path.exists():
        raise ProfileError(
            f"no device profile for device {device_fingerprint} and model {model_key} "
            f"(looked for {path}): {_CREATE_HINT}"
        )
    return _read_matching_profile(path, device_fingerprint, model_key)


def find_profile(profiles_dir: str | Path | None, device_fingerprint: str, model_key: str) -> DeviceProfile | None:
    """The profile of (device_fingerprint, model_key), or None if there is none; a corrupt one raises."""
    path = profile_path(profiles_dir, device_fingerprint, model_key)
    if not path.exists():
        return None
    return _read_matching_profile(path, device_fingerprint, model_key)


def list_profiles(profiles_dir: str | Path | None = None) -> list[tuple[Path, DeviceProfile | ProfileError]]:
    """Every `*.json` in the directory, sorted by name, with its profile or the ProfileError it gives.

    A file whose name does not match what it holds is reported too: a lookup would never find it.
    A missing directory has no profiles.
    """
    directory = resolve_profiles_dir(profiles_dir)
    if not directory.is_dir():
        return []
    results: list[tuple[Path, DeviceProfile | ProfileError]] = []
    for path in sorted(directory.glob("*.json")):
        if not path.is_file():
            continue
        try:
            profile = _read_profile(path)
            if profile.path_name != path.name:
                raise ProfileError(_misnamed_message(path, profile))
            results.append((path, profile))
        except ProfileError as error:
            results.append((path, error))
    return results


def _read_profile(path: Path) -> DeviceProfile:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ProfileError(f"device profile {path} is not UTF-8 text (byte {error.start}); {REPROBE_FIX}") from error
    except OSError as error:
        raise ProfileError(f"cannot read device profile {path}: {error.strerror or error}") from error
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as error:
        raise ProfileError(
            f"device profile {path} is not valid JSON (line {error.lineno}, column {error.colno}: {error.msg}); "
            f"{REPROBE_FIX}"
        ) from error
    except ValueError as error:  # NaN / Infinity, which Python's json accepts and JSON does not
        raise ProfileError(f"device profile {path} is not valid JSON ({error}); {REPROBE_FIX}") from error
    return DeviceProfile.from_dict(data, source=str(path))


def _read_matching_profile(path: Path, device_fingerprint: str, model_key: str) -> DeviceProfile:
    profile = _read_profile(path)
    # A file copied or renamed by hand would otherwise hand one device's batch size to another.
    if profile.device_fingerprint != device_fingerprint or profile.model_key != model_key:
        raise ProfileError(_misnamed_message(path, profile))
    return profile


def _misnamed_message(path: Path, profile: DeviceProfile) -> str:
    return (
        f"device profile {path} holds the profile of device {profile.device_fingerprint} and model "
        f"{profile.model_key}, which belongs in {profile.path_name}: rename it to that or delete it"
    )


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _write_atomically(path: Path, data: dict) -> None:
    """Write `data` as JSON to `path` through a temporary file + os.replace; clean up on any exit."""
    # mkstemp creates the file 0600; keep an existing file's mode, else make it readable like
    # any other file people share (profiles hold no secrets).
    try:
        mode = path.stat().st_mode & 0o777
    except FileNotFoundError:
        mode = 0o644
    fd, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    replaced = False
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            # allow_nan=False: validation already refused NaN, this is the belt to those braces.
            json.dump(data, handle, indent=2, allow_nan=False)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temp_name, mode)
        os.replace(temp_name, path)
        replaced = True
        _fsync_directory(path.parent)
    finally:
        # BaseException included (KeyboardInterrupt mid-write): never leave a temporary file.
        if not replaced:
            try:
                os.unlink(temp_name)
            except FileNotFoundError:
                pass


def _fsync_directory(directory: Path) -> None:
    """Make the rename itself durable; some platforms and filesystems cannot, which is not an error."""
    try:
        dir_fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)
