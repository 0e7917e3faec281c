"""Profiles on disk: round trip, atomic writes, locking, lookup and the errors for bad files."""

import json
import multiprocessing
import os
import stat

import filelock
import pytest

import edgebatch.files as files
import edgebatch.profiles.store as store
import edgebatch.profiles.temp_files as temp_files
from edgebatch.errors import ProfileError, UsageError
from edgebatch.profiles import (
    PROFILES_ENV_VAR,
    SCHEMA_VERSION,
    find_profile,
    list_profiles,
    load_profile,
    profile_path,
    resolve_profiles_dir,
    save_profile,
)
from profile_factory import make_profile, write_repeatedly


def _leftovers(directory):
    """Files that are neither profiles nor their lock files: what an interrupted write could leave."""
    return sorted(name for name in os.listdir(directory) if not name.endswith((".json", ".json.lock")))


def test_save_then_load_round_trip(tmp_path):
    profile = make_profile()
    directory = tmp_path / "nested" / "profiles"
    path = save_profile(profile, directory)
    assert path == directory / profile.path_name
    assert load_profile(path) == profile
    assert load_profile(directory, device_fingerprint=profile.device_fingerprint, model_key=profile.model_key) == profile
    assert find_profile(directory, profile.device_fingerprint, profile.model_key) == profile
    assert json.loads(path.read_text())["schema_version"] == SCHEMA_VERSION
    assert _leftovers(directory) == []


def test_saved_file_is_readable_by_others(tmp_path):
    path = save_profile(make_profile(), tmp_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_overwrite_replaces_the_profile(tmp_path):
    save_profile(make_profile(probe_seconds=1.0), tmp_path)
    path = save_profile(make_profile(probe_seconds=2.0), tmp_path)
    assert load_profile(path).probe_seconds == 2.0


def _failing_dumps(data, **kwargs):
    raise ValueError("serialisation failed")


def _interrupted_fsync(fd):
    # The temporary file holds the whole text, not yet flushed to disk nor renamed over the profile.
    raise KeyboardInterrupt


@pytest.mark.parametrize(("patched", "failing", "raised"), [
    (store.json, ("dumps", _failing_dumps), ValueError),
    (files.os, ("fsync", _interrupted_fsync), KeyboardInterrupt),
])
def test_failed_write_keeps_the_old_file_and_leaves_no_temp_file(tmp_path, monkeypatch, patched, failing, raised):
    path = save_profile(make_profile(probe_seconds=1.0), tmp_path)
    before = path.read_bytes()
    monkeypatch.setattr(patched, *failing)
    with pytest.raises(raised):
        save_profile(make_profile(probe_seconds=2.0), tmp_path)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert _leftovers(tmp_path) == []
    assert load_profile(path).probe_seconds == 1.0


def test_failed_first_write_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(files.os, "fsync", _interrupted_fsync)
    with pytest.raises(KeyboardInterrupt):
        save_profile(make_profile(), tmp_path)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.glob("*.json")) == []
    assert _leftovers(tmp_path) == []


def test_invalid_profile_is_refused_before_touching_the_file(tmp_path):
    path = save_profile(make_profile(), tmp_path)
    before = path.read_bytes()
    with pytest.raises(ProfileError, match=r"refusing to write .*\$\.safe_batch"):
        save_profile(make_profile(safe_batch=128), tmp_path)
    assert path.read_bytes() == before


def test_profile_that_does_not_convert_to_json_is_refused(tmp_path):
    with pytest.raises(ProfileError, match=r"refusing to write .*does not convert to JSON.*set"):
        save_profile(make_profile(device={"numa_nodes": {1, 2}}), tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_held_lock_times_out_naming_the_lock_file(tmp_path):
    profile = make_profile()
    lock_path = tmp_path / f"{profile.path_name}.lock"
    with filelock.FileLock(str(lock_path)):
        with pytest.raises(ProfileError, match=r"could not lock .*\.json\.lock within 0\.2 s"):
            save_profile(profile, tmp_path, lock_timeout_seconds=0.2)
    assert not (tmp_path / profile.path_name).exists()


def test_two_processes_writing_the_same_profile_end_with_a_valid_file(tmp_path):
    context = multiprocessing.get_context("spawn")  # never fork a process that may hold TensorFlow threads
    writers = [
        context.Process(target=write_repeatedly, args=(str(tmp_path), probe_seconds, 40))
        for probe_seconds in (1.0, 2.0)
    ]
    for writer in writers:
        writer.start()
    path = tmp_path / make_profile().path_name
    reads = 0
    # Read while they write: a reader takes no lock, so every file it sees must be whole.
    while any(writer.is_alive() for writer in writers):
        if path.exists():
            assert load_profile(path).probe_seconds in (1.0, 2.0)
            reads += 1
    for writer in writers:
        writer.join(timeout=60)
        assert writer.exitcode == 0
    assert load_profile(path).probe_seconds in (1.0, 2.0)
    assert _leftovers(tmp_path) == []
    assert reads > 0


def test_missing_profile_says_what_was_looked_for_and_how_to_create_it(tmp_path):
    with pytest.raises(ProfileError) as caught:
        load_profile(tmp_path, device_fingerprint="cpu-x-1c-1gib-00000000", model_key="m-float32-sgd-tf2.21-11111111")
    message = str(caught.value)
    for fragment in ("cpu-x-1c-1gib-00000000", "m-float32-sgd-tf2.21-11111111", str(tmp_path), "edgebatch probe"):
        assert fragment in message
    assert find_profile(tmp_path, "cpu-x-1c-1gib-00000000", "m-float32-sgd-tf2.21-11111111") is None


def test_missing_file_path_is_a_profile_error(tmp_path):
    with pytest.raises(ProfileError, match="does not exist"):
        load_profile(tmp_path / "nope.json")


def _write_bad(tmp_path, text):
    profile = make_profile()
    path = tmp_path / profile.path_name
    path.write_text(text)
    return profile, path


def test_corrupt_json_names_the_file_line_and_fix(tmp_path):
    good = json.dumps(make_profile().to_dict(), indent=2)
    profile, path = _write_bad(tmp_path, good[: len(good) // 2])
    with pytest.raises(ProfileError) as caught:
        load_profile(path)
    message = str(caught.value)
    assert str(path) in message
    assert "not valid JSON (line " in message
    assert "re-run `edgebatch probe --force`" in message
    # Looked up rather than opened, a corrupt profile is an error, not a miss.
    with pytest.raises(ProfileError, match="not valid JSON"):
        find_profile(tmp_path, profile.device_fingerprint, profile.model_key)


def test_wrong_type_names_the_file(tmp_path):
    data = make_profile().to_dict()
    data["budget_bytes"] = "2GiB"
    _, path = _write_bad(tmp_path, json.dumps(data))
    with pytest.raises(ProfileError, match=rf"{path}.*\$\.budget_bytes"):
        load_profile(path)


def test_unknown_schema_version_names_the_file(tmp_path):
    data = make_profile().to_dict()
    data["schema_version"] = 99
    _, path = _write_bad(tmp_path, json.dumps(data))
    with pytest.raises(ProfileError, match=rf"{path} was written by a newer edgebatch \(schema 99"):
        load_profile(path)


def test_nan_in_the_file_is_refused(tmp_path):
    _, path = _write_bad(tmp_path, json.dumps(make_profile().to_dict()).replace('"probe_seconds": 41.5', '"probe_seconds": NaN'))
    with pytest.raises(ProfileError, match=rf"{path} is not valid JSON.*NaN"):
        load_profile(path)


def test_non_utf8_file_is_a_profile_error(tmp_path):
    profile = make_profile()
    path = tmp_path / profile.path_name
    path.write_bytes(b"\xff\xfe{}")
    with pytest.raises(ProfileError, match=rf"{path} is not UTF-8"):
        load_profile(path)


def test_renamed_profile_is_not_handed_to_another_device(tmp_path):
    other = make_profile(device={"cores": 8})
    path = save_profile(other, tmp_path)
    wanted = make_profile()
    path.rename(tmp_path / wanted.path_name)
    with pytest.raises(ProfileError, match=f"belongs in {other.path_name}"):
        find_profile(tmp_path, wanted.device_fingerprint, wanted.model_key)


def test_list_profiles_reports_good_and_bad_without_raising(tmp_path):
    good = make_profile()
    save_profile(good, tmp_path)
    (tmp_path / "aaa__broken.json").write_text("{")
    (tmp_path / "zzz__misnamed.json").write_text(json.dumps(good.to_dict()))
    (tmp_path / "README.md").write_text("not a profile")
    listed = list_profiles(tmp_path)
    assert [path.name for path, _ in listed] == sorted(["aaa__broken.json", good.path_name, "zzz__misnamed.json"])
    outcomes = {path.name: outcome for path, outcome in listed}
    assert outcomes[good.path_name] == good
    assert isinstance(outcomes["aaa__broken.json"], ProfileError)
    assert "aaa__broken.json" in str(outcomes["aaa__broken.json"])
    assert isinstance(outcomes["zzz__misnamed.json"], ProfileError)
    assert "rename it" in str(outcomes["zzz__misnamed.json"])


def test_list_profiles_of_a_missing_directory_is_empty(tmp_path):
    assert list_profiles(tmp_path / "nowhere") == []


def test_resolve_profiles_dir_explicit_then_env_then_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(PROFILES_ENV_VAR, raising=False)
    assert resolve_profiles_dir() == tmp_path / "device_profiles"
    monkeypatch.setenv(PROFILES_ENV_VAR, str(tmp_path / "from_env"))
    assert resolve_profiles_dir() == tmp_path / "from_env"
    assert resolve_profiles_dir(tmp_path / "explicit") == tmp_path / "explicit"
    assert resolve_profiles_dir(str(tmp_path / "explicit")) == tmp_path / "explicit"
    monkeypatch.setenv(PROFILES_ENV_VAR, "")
    assert resolve_profiles_dir() == tmp_path / "device_profiles"


def test_save_and_load_follow_the_env_var(tmp_path, monkeypatch):
    monkeypatch.setenv(PROFILES_ENV_VAR, str(tmp_path / "env_profiles"))
    profile = make_profile()
    path = save_profile(profile)
    assert path.parent == tmp_path / "env_profiles"
    assert load_profile(device_fingerprint=profile.device_fingerprint, model_key=profile.model_key) == profile


@pytest.mark.parametrize(
    ("fingerprint", "key"), [("../etc", "m"), ("cpu", "a/b"), ("cpu__x", "m"), ("CPU", "m"), ("", "m")]
)
def test_profile_path_refuses_names_that_could_escape_or_collide(tmp_path, fingerprint, key):
    with pytest.raises(UsageError, match="is not a profile name"):
        profile_path(tmp_path, fingerprint, key)


def test_load_profile_needs_a_file_or_both_keys(tmp_path):
    with pytest.raises(UsageError, match="is a directory"):
        load_profile(tmp_path)
    with pytest.raises(UsageError, match="both device_fingerprint and model_key"):
        load_profile(tmp_path, device_fingerprint="cpu-x")


def test_list_profiles_recursive_walks_node_subdirectories(tmp_path):
    top = make_profile()
    node = make_profile(device={"cores": 8})
    save_profile(top, tmp_path)
    save_profile(node, tmp_path / "nodes" / "node-a")
    (tmp_path / "nodes" / "node-a" / f".{node.path_name}.somehost.1.abcdefgh.tmp").write_text('{"half": ')
    assert [path for path, _ in list_profiles(tmp_path)] == [tmp_path / top.path_name]
    listed = list_profiles(tmp_path, recursive=True)
    assert listed == [(tmp_path / top.path_name, top), (tmp_path / "nodes" / "node-a" / node.path_name, node)]


def test_temp_file_names_carry_host_and_pid_so_a_stranded_one_can_be_swept(tmp_path, monkeypatch):
    profile = make_profile()
    seen = []
    real_replace = os.replace

    def record_replace(source, target):
        seen.append(os.path.basename(source))
        real_replace(source, target)

    monkeypatch.setattr(store.os, "replace", record_replace)
    save_profile(profile, tmp_path)
    monkeypatch.undo()
    assert len(seen) == 1
    assert seen[0].startswith(f".{profile.path_name}.{temp_files.writer_label()}.{os.getpid()}.")
    assert seen[0].endswith(".tmp")
    assert not temp_files.is_stranded_temp_file(seen[0])  # this process is alive
