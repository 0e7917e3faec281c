"""Profiles at fsspec URLs: memory:// and file:// round trips, listings, errors, concurrent and killed writers.

Real fsspec throughout (its local and memory filesystems); nothing of fsspec is mocked.
"""

import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import fsspec
import pytest
from click.testing import CliRunner
from profile_factory import make_profile

from edgebatch.cli import main
from edgebatch.errors import ProfileError, UsageError
from edgebatch.profiles import (
    PROFILES_ENV_VAR,
    find_profile,
    list_profiles,
    load_profile,
    profile_path,
    resolve_profiles_dir,
    save_profile,
    store,
)
from edgebatch.profiles.location import ProfileURL, is_url
from edgebatch.profiles import temp_files

TESTS_DIR = Path(__file__).resolve().parent


@pytest.fixture
def memory_url():
    """A memory:// directory of this test's own; memory:// is one store per process."""
    url = f"memory://edgebatch-test-{uuid.uuid4().hex[:8]}/profiles"
    yield url
    fs = fsspec.filesystem("memory")
    root = url.partition("://")[2].split("/")[0]
    if fs.exists(f"/{root}"):
        fs.rm(f"/{root}", recursive=True)


@pytest.fixture
def file_url(tmp_path):
    return f"file://{tmp_path}/profiles"


@pytest.fixture(params=["memory", "file"])
def url(request, memory_url, file_url):
    return memory_url if request.param == "memory" else file_url


def _all_names(url):
    """Every file under `url`, relative to it, temporary and lock files included."""
    fs, base = fsspec.core.url_to_fs(url)
    return sorted(path[len(base.rstrip("/")):].lstrip("/") for path in fs.find(base))


def _put(url, relative, data: bytes):
    """Write a file under `url` by hand (through fsspec, creating its directory), bypassing the store."""
    fs, base = fsspec.core.url_to_fs(url)
    path = f"{base}/{relative}"
    fs.makedirs(fs._parent(path), exist_ok=True)
    fs.pipe_file(path, data)


def _temp_files(url):
    return [name for name in _all_names(url) if name.endswith(".tmp")]


def _node_profile(node: int, index: int):
    """A profile of its own (distinct model, so a distinct file) for writer `node`."""
    return make_profile(model={"name": f"net{node}x{index}"}, probe_seconds=float(node))


# --- locations --------------------------------------------------------------------------------------


def test_urls_are_detected_by_their_protocol_prefix():
    for value in ("s3://b/x", "file:///tmp/p", "memory://p", "simplecache::s3://b/x", "gs://b"):
        assert is_url(value)
    for value in ("/tmp/p", "device_profiles", "C:\\profiles", "s3:/b/x", "~/p", Path("s3://b")):
        assert not is_url(value)


def test_resolve_profiles_dir_keeps_urls_whole_from_argument_and_env(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_profiles_dir("s3://bucket/fleet/") == "s3://bucket/fleet"
    assert isinstance(resolve_profiles_dir("s3://bucket/fleet"), ProfileURL)
    monkeypatch.setenv(PROFILES_ENV_VAR, "gs://bucket/fleet")
    assert resolve_profiles_dir() == "gs://bucket/fleet"
    assert resolve_profiles_dir(tmp_path / "local") == tmp_path / "local"  # an argument still wins
    monkeypatch.setenv(PROFILES_ENV_VAR, str(tmp_path / "env"))
    assert resolve_profiles_dir() == tmp_path / "env"
    assert isinstance(resolve_profiles_dir(), Path)


def test_profile_url_joins_and_splits_like_a_path():
    directory = ProfileURL("s3://bucket/fleet")
    path = directory / "nodes" / "a.json"
    assert path == "s3://bucket/fleet/nodes/a.json"
    assert path.name == "a.json"
    assert path.parent.parent == "s3://bucket/fleet"
    assert ProfileURL("memory://") / "a.json" == "memory://a.json"
    assert ProfileURL("s3://bucket").parent == "s3://bucket"
    assert profile_path("s3://b/x", "cpu-x", "m") == "s3://b/x/cpu-x__m.json"


# --- round trips ------------------------------------------------------------------------------------


def test_save_then_load_round_trip(url):
    profile = make_profile()
    saved = save_profile(profile, url)
    assert isinstance(saved, ProfileURL)
    assert saved == f"{url}/{profile.path_name}"
    assert load_profile(saved) == profile
    assert load_profile(url, device_fingerprint=profile.device_fingerprint, model_key=profile.model_key) == profile
    assert find_profile(url, profile.device_fingerprint, profile.model_key) == profile
    assert json.loads(fsspec.open(saved).open().read())["max_batch"] == profile.max_batch
    assert _all_names(url) == [profile.path_name]  # no temporary or lock files


def test_overwrite_replaces_the_profile(url):
    save_profile(make_profile(probe_seconds=1.0), url)
    saved = save_profile(make_profile(probe_seconds=2.0), url)
    assert load_profile(saved).probe_seconds == 2.0


def test_save_and_lookup_follow_an_env_var_url(memory_url, monkeypatch):
    monkeypatch.setenv(PROFILES_ENV_VAR, memory_url)
    profile = make_profile()
    assert save_profile(profile) == f"{memory_url}/{profile.path_name}"
    assert load_profile(device_fingerprint=profile.device_fingerprint, model_key=profile.model_key) == profile


def test_missing_profile_at_a_url(url):
    assert find_profile(url, "cpu-x-1c-1gib-00000000", "m-float32-sgd-tf2.21-11111111") is None
    with pytest.raises(ProfileError, match=r"no device profile .*looked for .*cpu-x-1c-1gib-00000000__"):
        load_profile(url, device_fingerprint="cpu-x-1c-1gib-00000000", model_key="m-float32-sgd-tf2.21-11111111")
    with pytest.raises(ProfileError, match=rf"{url}/nope.json does not exist"):
        load_profile(f"{url}/nope.json")
    assert list_profiles(url) == []


def test_directory_url_is_not_a_profile_file(url):
    save_profile(make_profile(), url)
    with pytest.raises(UsageError, match=rf"{url} is a directory"):
        load_profile(url)


# --- listings ---------------------------------------------------------------------------------------


def _write_fleet(url):
    """A top-level profile and one per node under nodes/<node>/, as a fleet probe writes them."""
    top = make_profile()
    save_profile(top, url)
    nodes = {node: _node_profile(index, 0) for index, node in enumerate(("node-a", "node-b"))}
    for node, profile in nodes.items():
        save_profile(profile, f"{url}/nodes/{node}")
    return top, nodes


def test_list_profiles_walks_subdirectories_only_when_recursive(url):
    top, nodes = _write_fleet(url)
    _put(url, "README.md", b"not a profile")
    _put(url, f"nodes/node-a/{nodes['node-a'].path_name}.lock", b"")
    _put(url, f"nodes/node-a/.{nodes['node-a'].path_name}.otherhost.1.abc.tmp", b'{"half": ')
    assert list_profiles(url) == [(f"{url}/{top.path_name}", top)]
    listed = list_profiles(url, recursive=True)
    assert [where for where, _ in listed] == sorted(
        [f"{url}/{top.path_name}"] + [f"{url}/nodes/{node}/{profile.path_name}" for node, profile in nodes.items()]
    )
    assert all(isinstance(where, ProfileURL) for where, _ in listed)
    assert dict(listed)[f"{url}/nodes/node-b/{nodes['node-b'].path_name}"] == nodes["node-b"]


def test_list_profiles_reports_invalid_files_with_their_error(url):
    good = make_profile()
    save_profile(good, url)
    _put(url, "aaa__broken.json", b"{")
    _put(url, "nodes/n1/zzz__misnamed.json", json.dumps(good.to_dict()).encode())
    _put(url, "nodes/n1/bbb__latin1.json", b"\xff\xfe{}")
    outcomes = dict(list_profiles(url, recursive=True))
    assert outcomes[f"{url}/{good.path_name}"] == good
    broken = outcomes[f"{url}/aaa__broken.json"]
    assert isinstance(broken, ProfileError) and f"{url}/aaa__broken.json is not valid JSON" in str(broken)
    misnamed = outcomes[f"{url}/nodes/n1/zzz__misnamed.json"]
    assert isinstance(misnamed, ProfileError) and "rename it" in str(misnamed)
    latin1 = outcomes[f"{url}/nodes/n1/bbb__latin1.json"]
    assert isinstance(latin1, ProfileError) and "is not UTF-8" in str(latin1)
    with pytest.raises(ProfileError, match="not valid JSON"):
        load_profile(f"{url}/aaa__broken.json")


# --- errors -----------------------------------------------------------------------------------------


def _uninstalled_backend():
    """A protocol fsspec knows whose backend package is not installed here (s3 unless s3fs is)."""
    import importlib.util

    from fsspec.registry import known_implementations

    for protocol in ("s3", "gs", "abfs", "oci", "webdav"):
        package = known_implementations[protocol]["class"].split(".")[0]
        if importlib.util.find_spec(package) is None:
            return protocol, package
    pytest.skip("every candidate fsspec backend is installed")


def test_unknown_protocol_is_a_usage_error_naming_the_url():
    with pytest.raises(UsageError, match=r"profiles location nosuchfs://b/x: fsspec knows no filesystem 'nosuchfs'"):
        list_profiles("nosuchfs://b/x")
    with pytest.raises(UsageError, match="nosuchfs"):
        save_profile(make_profile(), "nosuchfs://b/x")


def test_missing_backend_says_what_to_install():
    protocol, package = _uninstalled_backend()
    for call in (
        lambda: list_profiles(f"{protocol}://bucket/fleet"),
        lambda: load_profile(f"{protocol}://bucket/fleet/a.json"),
        lambda: save_profile(make_profile(), f"{protocol}://bucket/fleet"),
    ):
        with pytest.raises(UsageError, match=rf"{protocol}://bucket/fleet.*pip install {package}"):
            call()


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_unreachable_url_is_a_profile_error():
    url = f"ftp://127.0.0.1:{_closed_port()}/fleet"  # fsspec's FTP backend is stdlib only
    with pytest.raises(ProfileError, match=rf"cannot reach profiles location {url}.*refused"):
        list_profiles(url)
    with pytest.raises(ProfileError, match="cannot reach"):
        save_profile(make_profile(), url)
    with pytest.raises(ProfileError, match="cannot reach"):
        find_profile(url, "cpu-x", "m")


def test_cli_lists_a_url_and_reports_a_bad_one_in_one_line(memory_url):
    profile = make_profile()
    save_profile(profile, memory_url)
    runner = CliRunner()
    listed = runner.invoke(main, ["profile", "list", "--profiles-dir", memory_url])
    assert listed.exit_code == 0, listed.output
    assert f"{profile.path_name}: mobilenet_v2" in listed.output
    shown = runner.invoke(main, ["profile", "show", f"{memory_url}/{profile.path_name}", "--json"])
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.output)["max_batch"] == profile.max_batch
    for target in (memory_url, f"{memory_url}/{profile.path_name}"):
        validated = runner.invoke(main, ["profile", "validate", target])
        assert validated.exit_code == 0, validated.output
        assert validated.output == f"{memory_url}/{profile.path_name}: ok\n"
    bad = runner.invoke(main, ["profile", "list", "--profiles-dir", "nosuchfs://b/x"])
    assert bad.exit_code == 2
    assert "Traceback" not in bad.output
    # A usage error comes with click's usage banner; the error itself is one line that names the URL.
    assert [line for line in bad.output.splitlines() if "nosuchfs" in line] == [
        (
            "Error: profiles location nosuchfs://b/x: fsspec knows no filesystem 'nosuchfs'; check the URL "
            "(file://, memory://, s3://, gs://, abfs://, ...) or give a local directory"
        )
    ]


# --- failed and concurrent writes -------------------------------------------------------------------


def _fail_after_the_bytes_are_written(error):
    def flush_then_fail(handle):
        handle.flush()
        raise error

    return flush_then_fail


@pytest.mark.parametrize("error", [ValueError("disk said no"), KeyboardInterrupt()])
def test_failure_inside_the_write_keeps_the_old_file_and_leaves_no_temp_file(file_url, monkeypatch, error):
    saved = save_profile(make_profile(probe_seconds=1.0), file_url)
    before = fsspec.open(saved).open().read()
    # The temporary file holds the whole new profile when this fails: only the move is missing.
    monkeypatch.setattr(store, "_flush_to_storage", _fail_after_the_bytes_are_written(error))
    with pytest.raises(ProfileError if isinstance(error, Exception) else KeyboardInterrupt):
        save_profile(make_profile(probe_seconds=2.0), file_url)
    monkeypatch.undo()
    assert fsspec.open(saved).open().read() == before
    assert _all_names(file_url) == [saved.name]


def test_failed_first_write_at_a_url_leaves_nothing(file_url, monkeypatch):
    monkeypatch.setattr(store, "_flush_to_storage", _fail_after_the_bytes_are_written(ValueError("no")))
    with pytest.raises(ProfileError, match=rf"cannot write device profile {file_url}/.*: no"):
        save_profile(make_profile(), file_url)
    assert _all_names(file_url) == []


def test_unserialisable_profile_leaves_the_memory_file_as_it_was(memory_url):
    saved = save_profile(make_profile(probe_seconds=1.0), memory_url)
    with pytest.raises(ProfileError, match="does not convert to JSON"):
        save_profile(make_profile(probe_seconds=2.0, device={"numa_nodes": {1, 2}}), memory_url)
    assert load_profile(saved).probe_seconds == 1.0


WRITERS = 8
PROFILES_PER_WRITER = 10
SHARED_WRITES_PER_WRITER = 5


def write_node_profiles(url: str, node: int) -> None:
    """Writer `node`: its own profiles, interleaved with writes of one profile every writer shares."""
    shared = make_profile(probe_seconds=float(node))
    for index in range(PROFILES_PER_WRITER):
        save_profile(_node_profile(node, index), url)
        if index % 2 == 0:
            save_profile(shared, url)


def _check_fleet_after_concurrent_writes(url):
    listed = list_profiles(url)
    errors = [(where, outcome) for where, outcome in listed if isinstance(outcome, ProfileError)]
    assert errors == []
    expected = {_node_profile(node, index).path_name for node in range(WRITERS) for index in range(PROFILES_PER_WRITER)}
    shared = make_profile()
    assert {where.name for where, _ in listed} == expected | {shared.path_name}
    assert dict(listed)[f"{url}/{shared.path_name}"].probe_seconds in {float(node) for node in range(WRITERS)}
    assert _temp_files(url) == []


def _read_shared_while(url, still_writing) -> int:
    """Read the shared profile while writers run; every read must be a whole, valid profile."""
    shared = make_profile()
    reads = 0
    while still_writing():
        found = find_profile(url, shared.device_fingerprint, shared.model_key)
        if found is not None:
            assert found.probe_seconds in {float(node) for node in range(WRITERS)}
            reads += 1
        time.sleep(0.001)  # leave the (two, shared) cores to the writers
    return reads


def test_concurrent_writer_processes_to_a_file_url_lose_nothing(file_url):
    context = multiprocessing.get_context("spawn")  # never fork a process that may hold TensorFlow threads
    writers = [context.Process(target=write_node_profiles, args=(file_url, node)) for node in range(WRITERS)]
    for writer in writers:
        writer.start()
    reads = _read_shared_while(file_url, lambda: any(writer.is_alive() for writer in writers))
    for writer in writers:
        writer.join(timeout=120)
        assert writer.exitcode == 0
    _check_fleet_after_concurrent_writes(file_url)
    print(f"{reads} whole reads of the shared profile during the writes")


def test_concurrent_writer_threads_to_a_memory_url_lose_nothing(memory_url):
    writers = [threading.Thread(target=write_node_profiles, args=(memory_url, node)) for node in range(WRITERS)]
    for writer in writers:
        writer.start()
    _read_shared_while(memory_url, lambda: any(writer.is_alive() for writer in writers))
    for writer in writers:
        writer.join(timeout=60)
    _check_fleet_after_concurrent_writes(memory_url)


# --- killed writers ---------------------------------------------------------------------------------

_LARGE_WRITER = """
import sys
from profile_factory import make_profile
from edgebatch.profiles import save_profile
profile = make_profile(device={"notes": "x" * 4_000_000})
save_profile(profile, sys.argv[1])
print("saved", flush=True)
while True:
    save_profile(profile, sys.argv[1])
"""


def _start_large_writer(target: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-c", _LARGE_WRITER, target], stdout=subprocess.PIPE, text=True, env=env)


@pytest.mark.parametrize("kind", ["file_url", "local_dir"])
def test_sigkilled_writer_leaves_a_whole_file_and_its_temp_file_is_swept(tmp_path, kind):
    target = f"file://{tmp_path}/profiles" if kind == "file_url" else str(tmp_path / "profiles")
    url = target if kind == "file_url" else f"file://{target}"
    large = make_profile(device={"notes": "x" * 4_000_000})
    stranded = 0
    for delay_seconds in (0.0, 0.03, 0.07, 0.11):
        writer = _start_large_writer(target)
        try:
            assert writer.stdout.readline().strip() == "saved"
            time.sleep(delay_seconds)
        finally:
            writer.send_signal(signal.SIGKILL)
            writer.wait(timeout=30)  # reaped: its pid is gone
            writer.stdout.close()
        # Never a partial target: the file is the whole large profile, whatever the kill interrupted.
        assert load_profile(f"{url}/{large.path_name}") == large
        leftovers = _temp_files(url)
        assert all(f".{writer.pid}." in name for name in leftovers)
        stranded += len(leftovers)
        assert [where.name for where, _ in list_profiles(target)] == [large.path_name]  # listings skip temps
        save_profile(make_profile(), target)  # the next save from this host removes them
        assert _temp_files(url) == []
    print(f"{stranded} temporary files stranded by SIGKILL and swept")


def test_only_temp_files_of_dead_local_writers_are_swept(file_url):
    profile = make_profile()
    save_profile(profile, file_url)
    dead_pid = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_pid.wait()
    host = temp_files.writer_label()
    names = {
        "dead": f".{profile.path_name}.{host}.{dead_pid.pid}.0a1b2c.tmp",
        "alive": f".{profile.path_name}.{host}.{os.getpid()}.0a1b2c.tmp",
        "other_host": f".{profile.path_name}.not-{host}.{dead_pid.pid}.0a1b2c.tmp",
    }
    for name in names.values():
        _put(file_url, name, b'{"half": ')
    save_profile(make_profile(model={"name": "other"}), file_url)
    assert sorted(_temp_files(file_url)) == sorted([names["alive"], names["other_host"]])
