"""`edgebatch fleet probe` on a real local Ray cluster, and the pure pieces it stands on.

The cluster tests start Ray nodes on this machine with ray.cluster_utils.Cluster (no mocks of
Ray): each node gets its own EDGEBATCH_MEMORY_BUDGET in its environment, which its probe and
profile record, and one node gets a budget below what a TensorFlow worker holds, so it fails while
the others land. The model is tests/models/dense_wide.py (~2.3 MiB per sample over a ~700 MiB
worker): under 1 GiB it answered 133 here, under 1.25 GiB 255. The searches are limited to
batches both budgets fit: what these tests check is the fleet's plumbing, and the probe's answers
are checked in tests/test_probe_real.py.
"""

from __future__ import annotations

import json
import signal
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from edgebatch.errors import UsageError
from edgebatch.fleet.cluster import address_problem, node_directory
from edgebatch.fleet.nodes import (
    DeviceResult,
    at_batch_limit,
    format_results,
    node_done_line,
    node_label,
    targets_from_ray_nodes,
)
from edgebatch.fleet.remote import node_budget
from edgebatch.profiles import load_profile

HERE = Path(__file__).parent
DENSE_WIDE = f"{HERE / 'models' / 'dense_wide.py'}:build"


def ray_node(node_id, alive=True, cpus=1.0, gpus=0, host="box", address="10.0.0.5"):
    resources = {"CPU": cpus, "memory": 1e9}
    if gpus:
        resources["GPU"] = float(gpus)
    return {"NodeID": node_id, "Alive": alive, "NodeManagerAddress": address, "NodeManagerHostname": host,
            "Resources": resources}


# ---- pure pieces ----------------------------------------------------------------------------

def test_one_target_per_alive_node_with_each_gpu_or_the_cpu():
    targets = targets_from_ray_nodes([
        ray_node("bbbbbbbb1111", host="gpu-box", gpus=2),
        ray_node("aaaaaaaa2222", host="cpu-box"),
        ray_node("cccccccc3333", host="gone", alive=False),
    ])
    assert [t.label for t in targets] == ["cpu-box", "gpu-box"]
    assert targets[0].devices == ("CPU:0",)
    assert targets[1].devices == ("GPU:0", "GPU:1")
    assert targets[1].gpus == 2 and targets[0].cpus == 1.0


def test_nodes_sharing_a_hostname_are_told_apart_by_their_ray_id():
    targets = targets_from_ray_nodes([
        ray_node("bbbbbbbb1111", host="box"),
        ray_node("aaaaaaaa2222", host="box"),
        ray_node("cccccccc3333", host="other"),
        ray_node("dddddddd4444", host="other", alive=False),
    ])
    assert [t.label for t in targets] == ["box-aaaaaaaa", "box-bbbbbbbb", "other"]


def test_node_labels_are_directory_safe_and_keep_two_nodes_of_one_host_apart():
    assert node_label("10.0.0.5", "ABCDEF0123456789", "Node_1.Example.COM") == "node-1.example.com-abcdef01"
    assert node_label("10.0.0.5", "0123456789", None) == "10.0.0.5-01234567"
    assert node_label("", "../../etc", "../..") == "node-etc"
    assert node_label("h", "11111111aaaa", "h") != node_label("h", "22222222aaaa", "h")


def test_results_table_shows_each_error_in_its_row():
    table = format_results([
        DeviceResult(label="b-2", device="CPU:0", ok=False, error="budget below baseline", seconds=3.0),
        DeviceResult(label="a-1", device="CPU:0", ok=True, max_batch=133, safe_batch=85, seconds=40.0,
                     profile_location="/p/nodes/a-1/x.json"),
    ])
    rows = table.splitlines()
    assert rows[1].startswith("a-1") and "133" in rows[1] and "saved /p/nodes/a-1/x.json" in rows[1]
    assert rows[2].startswith("b-2") and "FAILED: budget below baseline" in rows[2]
    assert rows[-1] == "1 of 2 device probes saved a profile; 1 failed (see the result column)"


def test_node_budget_precedence(monkeypatch):
    monkeypatch.delenv("EDGEBATCH_MEMORY_BUDGET", raising=False)
    assert node_budget(None) == (None, "the device default")
    monkeypatch.setenv("EDGEBATCH_MEMORY_BUDGET", "6GiB")
    assert node_budget(None) == ("6GiB", "$EDGEBATCH_MEMORY_BUDGET on the node")
    assert node_budget("2GiB") == ("2GiB", "--memory-budget")


def test_node_directories_for_paths_and_urls(tmp_path):
    assert node_directory(tmp_path, "a-1") == tmp_path / "nodes" / "a-1"
    assert str(node_directory("memory://fleet/", "a-1")) == "memory://fleet/nodes/a-1"


def test_addresses_are_checked_before_ray_waits_on_them():
    assert address_problem("auto") is None and address_problem("local") is None
    with pytest.raises(UsageError, match="not HOST:PORT"):
        address_problem("headnode")
    # Port 1 on this host: nothing listens (ray.init would retry here for minutes).
    assert "nothing answers at 127.0.0.1:1" in address_problem("127.0.0.1:1", timeout_seconds=2)
    assert "nothing answers at ray://127.0.0.1:1" in address_problem("ray://127.0.0.1:1", timeout_seconds=2)


def test_cli_says_in_one_line_when_no_cluster_is_there(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "edgebatch", "fleet", "probe", "--address", "127.0.0.1:1", "--model", "mlp",
         "--profiles-dir", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("Error: nothing answers at 127.0.0.1:1")
    assert "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def silent_port():
    """A TCP port on 127.0.0.1 that accepts connections and never speaks (no Ray there)."""
    server = socket.create_server(("127.0.0.1", 0))
    held = []
    stop = threading.Event()

    def accept():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    for connection in held:
        connection.close()
    server.close()


@pytest.mark.slow
def test_a_port_that_answers_but_is_no_cluster_ends_within_the_connect_timeout(tmp_path, silent_port):
    # ray.init retries such an address for minutes, deaf to Ctrl-C; the probe gives up in one line.
    pytest.importorskip("ray")
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "edgebatch", "fleet", "probe", "--address", f"127.0.0.1:{silent_port}",
         "--connect-timeout", "5", "--model", "mlp", "--profiles-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=180)
    seconds = time.monotonic() - started
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"Error: Ray did not connect to the cluster at '127.0.0.1:{silent_port}' within 5 s"), last
    assert "but Ray tried " in last and "Traceback" not in done.stderr
    assert seconds < 60, f"took {seconds:.0f} s"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_ctrl_c_while_ray_connects_stops_the_probe_at_once(tmp_path, silent_port, terminal_signals):
    pytest.importorskip("ray")
    child = subprocess.Popen(
        [sys.executable, "-m", "edgebatch", "fleet", "probe", "--address", f"127.0.0.1:{silent_port}",
         "--connect-timeout", "300", "--model", "mlp", "--profiles-dir", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=terminal_signals)
    try:
        time.sleep(8)  # Ray imported, ray.init under way
        sent = time.monotonic()
        child.send_signal(signal.SIGINT)
        _out, err = child.communicate(timeout=60)
        seconds = time.monotonic() - sent
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 130, err[-2000:]
    assert seconds < 10, f"took {seconds:.0f} s after Ctrl-C"
    assert "Traceback" not in err


# ---- a real local Ray cluster ---------------------------------------------------------------

@pytest.fixture
def cluster():
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    made = Cluster(initialize_head=False)
    yield made
    ray.shutdown()
    made.shutdown()


def add_node(cluster, budget):
    """A one-CPU node (the first one added is the head) whose probes default to `budget`."""
    return cluster.add_node(num_cpus=1, env_vars={"EDGEBATCH_MEMORY_BUDGET": budget})


def label_of(node):
    return node_label(node.node_ip_address, node.node_id, socket.gethostname())


@pytest.mark.slow
@pytest.mark.distributed
def test_fleet_probe_writes_one_profile_per_node_and_reports_the_failing_one(cluster, tmp_path):
    small = add_node(cluster, "1GiB")
    large = add_node(cluster, "1.25GiB")
    broken = add_node(cluster, "100MiB")
    cluster.wait_for_nodes()
    collection = tmp_path / "profiles"
    done = subprocess.run(
        # This checks the fleet's plumbing, not the answers: each node's own budget reaches its probe
        # (recorded in its profile; the 100 MiB node fails on it), profiles land per node, and the
        # report merges them. So one reading of each answer (a repeat is a new process with a
        # TensorFlow import on each node), and a search limit of 64, which both budgets fit
        # (dense_wide answered 133 under 1 GiB): the searches stop there instead of at their edges,
        # whose endgame cost this test 60-80 s on a 2-core host.
        [sys.executable, "-m", "edgebatch", "fleet", "probe", "--address", cluster.address, "--model", DENSE_WIDE,
         "--profiles-dir", str(collection), "--json", "--answer-readings", "1", "--max-batch-limit", "64"],
        capture_output=True, text=True, timeout=900, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert done.returncode == 1, done.stderr[-3000:]
    rows = {row["label"]: row for row in json.loads(done.stdout)}
    assert set(rows) == {label_of(small), label_of(large), label_of(broken)}
    assert rows[label_of(broken)]["ok"] is False
    assert "below what a worker holds" in rows[label_of(broken)]["error"]
    # Progress streamed from every node, tagged with it.
    for node in (small, large, broken):
        assert f"[{label_of(node)} CPU:0] probing" in done.stderr
        assert f"[{label_of(node)}] finished after" in done.stderr  # a line as each node ends
    assert "CPU:0 max_batch 64 (the --max-batch-limit), safe_batch" in done.stderr
    assert done.stderr.strip().splitlines()[-1] == "Error: 1 of 3 device probes failed (see the table above)"

    profiles = {}
    for node, budget_bytes in ((small, 1024**3), (large, int(1.25 * 1024**3))):
        row = rows[label_of(node)]
        assert row["ok"] is True, row
        path = Path(row["profile_location"])
        assert path.parent == collection / "nodes" / label_of(node)
        profile = load_profile(path)
        assert profile.budget_bytes == budget_bytes
        assert profile.device["host"] == label_of(node)
        assert profile.max_batch == row["max_batch"]
        profiles[node.node_id] = profile
    assert not (collection / "nodes" / label_of(broken)).exists()
    assert [profile.max_batch for profile in profiles.values()] == [64, 64]  # the limit, which both fit

    report = subprocess.run([sys.executable, "-m", "edgebatch", "fleet", "report", str(collection), "--json"],
                            capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stderr
    merged = json.loads(report.stdout)
    # Two Ray nodes on one machine are two devices to the report, not copies of one; with one answer
    # they are no outliers either (tests/test_fleet_report.py covers outliers).
    assert merged["duplicates"] == [] and merged["outliers"] == []
    assert sorted(row["max_batch"] for row in merged["rows"]) == sorted(p.max_batch for p in profiles.values())


@pytest.mark.slow
@pytest.mark.distributed
def test_a_node_that_disappears_mid_probe_is_reported_and_the_other_lands(cluster, tmp_path):
    from edgebatch.fleet import fleet_probe

    add_node(cluster, "1GiB")
    doomed = add_node(cluster, "1GiB")
    cluster.wait_for_nodes()
    doomed_label = label_of(doomed)
    lines = []

    def progress(line):
        lines.append(line)
        # Once the doomed node's probe is under way (its model is built), take the node away.
        if line.startswith(f"[{doomed_label} CPU:0] model ") and doomed in cluster.worker_nodes:
            cluster.remove_node(doomed, allow_graceful=False)

    # The survivor's answer is not what this checks, only that its profile lands: a search limit
    # of 32 (dense_wide fits 133 under 1 GiB) ends its probe after the scout's first trials.
    results = fleet_probe(DENSE_WIDE, address=cluster.address, profiles_dir=tmp_path, progress=progress,
                          options={"answer_readings": 1, "max_batch_limit": 32})
    by_label = {result.label: result for result in results}
    assert doomed not in cluster.worker_nodes, "the node was never removed: " + "\n".join(lines[-20:])
    assert by_label[doomed_label].ok is False
    assert by_label[doomed_label].error
    survivors = [result for label, result in by_label.items() if label != doomed_label]
    assert len(survivors) == 1 and survivors[0].ok, survivors
    assert survivors[0].max_batch == 32  # the limit, which fits
    assert load_profile(survivors[0].profile_location).max_batch == survivors[0].max_batch


def test_edgebatch_probe_reads_the_budget_variable_a_node_sets(tmp_path):
    """The variable a fleet node sets is also `edgebatch probe`'s default budget (checked before any trial)."""
    from click.testing import CliRunner

    from edgebatch.cli import main

    result = CliRunner().invoke(main, ["probe", "--model", "mlp", "--profiles-dir", str(tmp_path)],
                                env={"EDGEBATCH_MEMORY_BUDGET": "100"})
    assert result.exit_code == 2
    assert "memory budget '100' is 100 bytes" in result.output
    assert list(tmp_path.iterdir()) == []


def test_a_model_file_travels_with_the_task_and_a_wrong_name_fails_on_the_driver(tmp_path):
    from edgebatch.fleet.remote import ship_model

    assert ship_model("mlp") is None  # built-ins are on every node with edgebatch
    shipped = ship_model(DENSE_WIDE)
    assert shipped.file_name == "dense_wide.py" and shipped.function == "build"
    assert shipped.data == (HERE / "models" / "dense_wide.py").read_bytes()
    spec = shipped.written_to(str(tmp_path))
    assert spec == f"{tmp_path / 'dense_wide.py'}:build" and (tmp_path / "dense_wide.py").read_bytes() == shipped.data
    with pytest.raises(UsageError, match="unknown model 'mlpp'"):
        ship_model("mlpp")
    with pytest.raises(UsageError, match="does not exist"):
        ship_model(str(tmp_path / "missing.py") + ":build")


def test_cli_refuses_a_wrong_model_before_any_connection(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "edgebatch", "fleet", "probe", "--address", "127.0.0.1:1", "--model", "mlpp",
         "--profiles-dir", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "unknown model 'mlpp'" in done.stderr and "nothing answers" not in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_finished_node_gets_one_line_and_an_answer_at_the_limit_is_marked():
    at_limit = DeviceResult(label="a-1", device="CPU:0", ok=True, max_batch=4096, safe_batch=3686, seconds=61.4,
                            profile={"search": {"max_batch_limit": 4096, "multiple": 1}})
    below = DeviceResult(label="a-1", device="GPU:0", ok=True, max_batch=300, safe_batch=270, seconds=80.2,
                         profile={"search": {"max_batch_limit": 4096, "multiple": 8}})
    failed = DeviceResult(label="b-2", device="CPU:0", ok=False, error="budget below baseline", seconds=3.0)
    assert node_done_line("a-1", [at_limit, below]) == (
        "[a-1] finished after 80 s: CPU:0 max_batch 4096 (the --max-batch-limit), safe_batch 3686; "
        "GPU:0 max_batch 300, safe_batch 270")
    assert node_done_line("b-2", [failed]) == "[b-2] finished after 3 s: CPU:0 failed: budget below baseline"
    table = format_results([at_limit, below, failed]).splitlines()
    assert " 4096* " in table[1] and " 300 " in table[2] and "*" not in table[2]
    assert table[-1].startswith("* the --max-batch-limit, not the device's ceiling")
    # A limit that is not a multiple: the largest allowed batch is the limit rounded down.
    rounded = DeviceResult(label="c", device="CPU:0", ok=True, max_batch=96, safe_batch=88, seconds=1.0,
                           profile={"search": {"max_batch_limit": 100, "multiple": 8}})
    assert at_batch_limit(rounded) and not at_batch_limit(below) and not at_batch_limit(failed)
