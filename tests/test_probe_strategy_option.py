"""The deprecated `strategy` option: the probe's own search still accepted with a one-line warning,
any other name a one-line usage error that says where the peers' finders went. No probe runs: every
case stops at a bad model or before any worker starts."""

import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgebatch import UsageError, probe
from edgebatch.cli import main
from edgebatch.probing import ProbeRequest, run_probe

ROOT = Path(__file__).resolve().parents[1]
MOVED = ("binsearch", "binsearch_checked", "power", "shrink_x0.9", "shrink_x0.5", "one_shot_estimate")


def test_the_api_warns_once_for_slow_start_and_goes_on_with_the_probe(tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # The probe goes on past the option: the bad model is what stops it.
        with pytest.raises(UsageError, match="unknown model 'no_such_model'"):
            probe("no_such_model", strategy="slow_start", profiles_dir=tmp_path)
    deprecations = [w for w in caught if issubclass(w.category, FutureWarning)]
    assert len(deprecations) == 1, [str(w.message) for w in caught]
    message = str(deprecations[0].message)
    assert "strategy" in message and "deprecated" in message and "\n" not in message
    assert deprecations[0].filename == __file__, "the warning names the caller's line"


@pytest.mark.parametrize("name", MOVED)
def test_the_api_refuses_a_peers_finder_naming_the_benchmark_command(name, tmp_path):
    with pytest.raises(UsageError) as raised:
        probe("mlp", strategy=name, profiles_dir=tmp_path)
    message = str(raised.value)
    assert f"python tools/bench/probe_bench.py --finder {name}" in message and "\n" not in message
    assert list(tmp_path.iterdir()) == []


def test_an_unknown_strategy_is_a_usage_error_however_the_request_is_built(tmp_path):
    with pytest.raises(UsageError, match="unknown strategy='magic'.*tools/bench/probe_bench.py"):
        probe("mlp", strategy="magic", profiles_dir=tmp_path)
    with pytest.raises(UsageError, match="strategy"):
        ProbeRequest(model="mlp", strategy="magic").validate()
    with pytest.raises(UsageError, match="--finder power"):
        run_probe(ProbeRequest(model="mlp", strategy="power"), profiles_dir=tmp_path, save=False)
    ProbeRequest(model="mlp", strategy="slow_start").validate()  # the default, by name: no error


def test_profiles_keep_recording_the_probes_own_search():
    assert ProbeRequest().search_settings()["strategy"] == "slow_start"


def test_the_cli_notes_once_on_stderr_for_slow_start_and_goes_on(tmp_path):
    result = CliRunner().invoke(main, ["probe", "--strategy", "slow_start", "--model", "no_such_model",
                                       "--profiles-dir", str(tmp_path)])
    assert result.exit_code == 2, result.output
    notes = [line for line in result.stderr.splitlines() if "deprecated" in line]
    assert notes == ["note: --strategy is deprecated and will be removed: edgebatch has one search (slow_start), "
                     "so leave the option out"]
    assert "unknown model 'no_such_model'" in result.output, "the probe went on past the option"
    assert "Traceback" not in result.output


@pytest.mark.parametrize("name", ["power", "magic"])
def test_the_cli_refuses_any_other_strategy_in_one_line_with_exit_code_2(name, tmp_path):
    result = CliRunner().invoke(main, ["probe", "--strategy", name, "--profiles-dir", str(tmp_path)])
    assert result.exit_code == 2, result.output
    (error,) = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert f"--strategy {name}" in error and "tools/bench/probe_bench.py" in error
    assert "Traceback" not in result.output
    assert list(tmp_path.iterdir()) == []


def test_the_benchmark_command_the_error_names_exists():
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "bench" / "probe_bench.py"), "--help"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for flag in ("--finder", "--model", "--memory-budget"):
        assert flag in done.stdout
    assert all(name in done.stdout for name in MOVED)
