"""`edgebatch fleet report`: merged rows, stale/duplicate/outlier flags, escaped HTML, CLI exit codes.

Fast and TensorFlow-free. The fleet is the committed device_profiles/ plus profiles generated here
in tmp dirs (test data only; nothing is written to device_profiles/).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from datetime import datetime, timedelta, timezone
from html.parser import HTMLParser
from pathlib import Path

import pytest
from click.testing import CliRunner
from profile_factory import GIB, make_profile, make_trial

from edgebatch.cli import main
from edgebatch import files
from edgebatch.cli import fleet_report as cli_report
from edgebatch.fleet.report import (
    DUPLICATE,
    OUTLIER,
    STALE,
    RunningVersions,
    analyse,
    collect,
    parse_created_at,
    report_to_dict,
    throughput_at_batch,
)
from edgebatch.fleet.report_html import render_html
from edgebatch.profiles import SCHEMA_VERSION, save_profile
from edgebatch.profiles.schema import ANSWERS_UNCHANGED_SINCE

COMMITTED = Path(__file__).resolve().parent.parent / "device_profiles"
RUNNING = RunningVersions(schema_version=SCHEMA_VERSION, edgebatch="0.1.0", tensorflow="2.21.0")  # make_profile's
# The committed profiles written before schema 3's safe_batch rule: stale for that reason alone.
OLDER_COMMITTED = sum(json.loads(path.read_text())["schema_version"] < ANSWERS_UNCHANGED_SINCE
                      for path in COMMITTED.glob("*.json"))
NOW = datetime(2026, 12, 3, 12, 0, tzinfo=timezone.utc)

HOSTILE_DESCRIPTION = '<script>alert(1)</script>" onmouseover="x $\\frac{'
HOSTILE_MODEL = "</svg><img src=x onerror=alert(1)> $\\frac{$"  # unescaped, mathtext raises on $..$
HOSTILE_HOST = "<b onclick=alert(1)>\x1b[31mred</b>"
HOSTILE_NODE_ID = "'><iframe src=//evil>"

# What TEMPLATE in report_html.py may produce, and nothing else, whatever the profiles say.
EXPECTED_TAGS = {
    "html", "head", "meta", "title", "style", "body", "h1", "h2", "h3", "p", "table", "thead", "tbody",
    "tr", "th", "td", "br", "code", "span", "ul", "li", "img",
}
EXPECTED_ATTRIBUTES = {("html", "lang"), ("meta", "charset"), ("td", "class"), ("tr", "class"), ("span", "class"), ("p", "class"),
                       ("img", "src"), ("img", "alt")}
ALLOWED_CLASS_WORDS = {"num", "note", "flags", "stale", "duplicate", "outlier"}


class _Collector(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags: set[str] = set()
        self.attributes: list[tuple[str, str, str | None]] = []
        self.text: list[str] = []
        self.comments: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        self.attributes.extend((tag, name, value) for name, value in attrs)

    handle_startendtag = handle_starttag

    def handle_data(self, data):
        self.text.append(data)

    def handle_comment(self, data):
        self.comments.append(data)


def _parse(page: str) -> _Collector:
    collector = _Collector()
    collector.feed(page)
    collector.close()
    return collector


def _save(profile, directory: Path) -> Path:
    return save_profile(profile, directory)


@pytest.fixture
def fleet(tmp_path):
    """A fleet probe's layout (nodes/<label>/...) with one of each thing the report must flag."""
    nodes = tmp_path / "fleet" / "nodes"
    base = make_profile(device={"host": "node-a", "ray_node_id": "ray-a"}, created_at="2026-12-01T12:00:00Z")
    _save(base, nodes / "node-a")
    # Same hardware and model on another host, 25% higher ceiling under a larger budget: an outlier.
    _save(make_profile(device={"host": "node-b"}, max_batch=80, safe_batch=72, budget_bytes=3 * GIB),
          nodes / "node-b")
    # Probed by an older edgebatch under another TensorFlow: stale (a different model key, too).
    _save(make_profile(versions={"edgebatch": "0.0.9", "tensorflow": "2.15.1"}), nodes / "node-c")
    # Someone else's names, and throughput timed on warm-up steps.
    trials = list(make_profile().trials)
    trials[2] = dataclasses.replace(trials[2], steady=False)
    _save(make_profile(device={"description": HOSTILE_DESCRIPTION, "host": HOSTILE_HOST,
                               "ray_node_id": HOSTILE_NODE_ID},
                       model={"name": HOSTILE_MODEL}, trials=tuple(trials), safe_batch=48),
          nodes / "node-d")
    (nodes / "node-e").mkdir()
    (nodes / "node-e" / "broken.json").write_text("{not json", encoding="utf-8")
    # A copy of node-a's profile in another directory: the same (device, model, host) twice.
    copies = tmp_path / "copies" / "node-a"
    copies.mkdir(parents=True)
    shutil.copy(nodes / "node-a" / base.path_name, copies / base.path_name)
    return tmp_path


def _report(fleet_root: Path):
    entries, invalid = collect([str(COMMITTED), str(fleet_root / "fleet"), str(fleet_root / "copies")])
    return analyse(entries, invalid, now=NOW, running=RUNNING)


def _rows(report, **match):
    return [row for row in report.rows if all(getattr(row, key) == value for key, value in match.items())]


def test_throughput_at_batch_measured_interpolated_unmeasured_and_unsteady():
    trials = (
        make_trial(8, 900, step_seconds=0.1),  # 80 samples/s
        make_trial(16, 1000, step_seconds=0.1),  # 160
        dataclasses.replace(make_trial(32, 1200, step_seconds=0.1), steady=False),  # 320, warm-up timed
        make_trial(64, None, ok=False, error="oom"),
    )
    measured = throughput_at_batch(trials, 16)
    assert (measured.basis, measured.samples_per_second, measured.steady) == ("measured", pytest.approx(160), True)
    between = throughput_at_batch(trials, 12)
    assert (between.basis, between.samples_per_second) == ("interpolated", pytest.approx(120))
    resting_on_warmup = throughput_at_batch(trials, 24)
    assert resting_on_warmup.samples_per_second == pytest.approx(240)
    assert resting_on_warmup.steady is False
    assert throughput_at_batch(trials, 48).basis == "unmeasured"  # the failed trial has no rate
    assert throughput_at_batch(trials, 4).samples_per_second is None
    # The plan's curve: a warm-up-timed figure between steady ones gives way to them, repeats give their median.
    between_steady = trials + (make_trial(64, 1400, step_seconds=0.1), make_trial(16, 1000, step_seconds=0.2))
    assert throughput_at_batch(between_steady, 16).samples_per_second == pytest.approx((160 + 80) / 2)
    assert throughput_at_batch(between_steady, 32).samples_per_second == pytest.approx(120 + (640 - 120) / 3)
    assert throughput_at_batch(between_steady, 32).steady is True


def test_committed_profiles_report_without_flags_but_an_older_schema():
    entries, invalid = collect([str(COMMITTED)])
    # A day after the newest committed profile was written (NOW may come before it).
    newest = max(parse_created_at(json.loads(path.read_text())["created_at"]) for path in COMMITTED.glob("*.json"))
    report = analyse(entries, invalid, now=newest + timedelta(days=1), running=RUNNING, max_age_seconds=30 * 86400)
    assert invalid == []
    assert len(report.rows) == len(list(COMMITTED.glob("*.json"))) >= 2
    for row in report.rows:  # written before schema 3's safe_batch rule: stale for that reason only
        older = row.schema_version < ANSWERS_UNCHANGED_SINCE
        assert [flag.message.startswith(f"stale: schema {row.schema_version},") for flag in row.flags] == \
            ([True] if older else []), row.flags
    assert {row.host for row in report.rows} == {"device_profiles"}  # no device.host: the directory name
    for row in report.rows:
        assert row.safe_batch <= row.max_batch
        assert row.throughput_at_safe.samples_per_second > 0
        assert row.age_seconds > 0
        assert report.matrix_cells[(row.device_id, row.model_key)] == (row.safe_batch,)


def test_stale_duplicate_and_outlier_profiles_are_flagged(fleet):
    report = _report(fleet)

    stale = [row for row in report.rows if STALE in row.flag_kinds() and row.host != "device_profiles"]
    assert [row.host for row in stale] == ["node-c"]
    assert "TensorFlow 2.15, running 2.21" in stale[0].flags[0].message
    assert "edgebatch 0.0.9, running 0.1.0" in stale[0].flags[0].message

    duplicated = [row for row in report.rows if DUPLICATE in row.flag_kinds()]
    assert sorted(Path(row.source).parts[-3] for row in duplicated) == ["copies", "nodes"]
    (group,) = report.duplicates
    assert group.host == "node-a" and group.identical

    (outlier,) = report.outliers
    assert outlier.spread_fraction == pytest.approx(0.25)
    assert [(m.host, m.max_batch, m.budget_bytes) for m in outlier.members] == [
        ("node-a", 64, 2 * GIB), ("node-a", 64, 2 * GIB), ("node-b", 80, 3 * GIB)]
    assert outlier.budgets_differ
    message = _rows(report, host="node-b")[0].flags[0].message
    assert "differs by 25% across hosts (node-a: 64 at budget 2.00 GiB; node-b: 80 at budget 3.00 GiB)" in message
    assert "budgets differ" in message

    # The committed profiles carry an older schema's flag at most, the hostile one none.
    assert all(row.flag_kinds() in ((), (STALE,)) for row in _rows(report, host="device_profiles"))
    assert _rows(report, host=HOSTILE_HOST)[0].flags == ()
    assert report.count(STALE) == 1 + OLDER_COMMITTED and report.count(DUPLICATE) == 2 and report.count(OUTLIER) == 3


def test_ceilings_within_ten_percent_are_not_outliers(tmp_path):
    entries = [(f"{host}/p.json", make_profile(device={"host": host}, max_batch=ceiling, safe_batch=ceiling))
               for host, ceiling in (("a", 100), ("b", 110))]
    assert analyse(entries, now=NOW, running=RUNNING).outliers == ()
    entries.append(("c/p.json", make_profile(device={"host": "c"}, max_batch=111, safe_batch=100)))
    (group,) = analyse(entries, now=NOW, running=RUNNING).outliers
    assert group.spread_fraction == pytest.approx(0.11)
    assert not group.budgets_differ
    assert "same budget" in _rows(analyse(entries, now=NOW, running=RUNNING), host="c")[0].flags[0].message


def test_the_same_directory_twice_is_a_duplicate():
    entries, invalid = collect([str(COMMITTED), str(COMMITTED)])
    report = analyse(entries, invalid, now=NOW, running=RUNNING)
    assert all(row.flag_kinds() in ((DUPLICATE,), (DUPLICATE, STALE)) for row in report.rows)
    assert all("this same file" in row.flags[-1].message for row in report.rows)
    assert report.outliers == ()  # one host: nothing to compare


def test_invalid_files_are_listed_and_the_rest_reported(fleet):
    report = _report(fleet)
    (broken,) = report.invalid
    assert broken.source.endswith("broken.json")
    assert "not valid JSON" in broken.error and "\n" not in broken.error
    assert len(report.rows) == len(list(COMMITTED.glob("*.json"))) + 5
    missing, _ = collect([str(fleet / "no-such-dir")])
    assert missing == []


def test_hostile_names_become_text_only(fleet):
    page = render_html(_report(fleet), plots=True)
    parsed = _parse(page)
    assert parsed.tags == EXPECTED_TAGS
    assert {(tag, name) for tag, name, _value in parsed.attributes} == EXPECTED_ATTRIBUTES
    for tag, name, value in parsed.attributes:
        if name == "class":
            assert set(value.split()) <= ALLOWED_CLASS_WORDS, value
        if name == "src":
            assert value.startswith("data:image/png;base64,")
    assert parsed.comments == []
    text = "".join(parsed.text)
    for hostile in (HOSTILE_DESCRIPTION, HOSTILE_MODEL, HOSTILE_HOST, HOSTILE_NODE_ID):
        assert hostile in text, "shown as text, not dropped"
    assert "<script" not in page and "<iframe" not in page
    # Offline: no links, no external scripts, styles or fonts.
    assert "http://" not in page and "https://" not in page
    assert "@import" not in page and "url(" not in page
    # One plot per device (host, fingerprint): each committed device, node-a, b, c, d.
    committed_devices = {path.name.split("__")[0] for path in COMMITTED.glob("*.json")}
    assert sum(1 for tag, name, _ in parsed.attributes if (tag, name) == ("img", "src")) == len(committed_devices) + 4


def test_html_says_how_to_get_plots_without_matplotlib(fleet, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    text = "".join(_parse(render_html(_report(fleet))).text)
    assert "pip install 'edgebatch[plots]'" in text


def test_report_json_is_plain_data(fleet):
    data = report_to_dict(_report(fleet))
    assert json.loads(json.dumps(data)) == data
    assert {row["host"] for row in data["rows"]} >= {"node-a", "node-b", "node-c", HOSTILE_HOST, "device_profiles"}
    node_d = next(row for row in data["rows"] if row["host"] == HOSTILE_HOST)
    assert node_d["samples_per_second_basis"] == "interpolated"  # 48 lies between trials
    # The trial at 32 timed its warm-up: steady figures stand on both sides, so (as in the plan) it
    # gives way to them and the rate at 48 is a steady one; the row still names the batch.
    assert node_d["samples_per_second_steady"] is True
    assert node_d["unsteady_batches"] == [32]
    assert data["invalid"][0]["error"]


# --- the command --------------------------------------------------------------------------------


@pytest.fixture
def runner(monkeypatch):
    monkeypatch.setattr(cli_report, "running_versions", lambda: RUNNING)
    return CliRunner()


def test_cli_text_table_flags_and_unreadable_files(runner, fleet):
    # make_profile dates its profiles 2025-06-01: an age limit past that leaves the other flags to count.
    result = runner.invoke(main, ["fleet", "report", "--max-age", "1000d", str(COMMITTED), str(fleet / "fleet"),
                                  str(fleet / "copies")])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "\x1b" not in out, "a profile cannot drive the terminal"
    assert "\\x1b[31mred" in out
    assert "outlier: max_batch of the same hardware and model differs by 25%" in out
    assert "stale: TensorFlow 2.15, running 2.21" in out
    assert "broken.json: " in out and "not valid JSON" in out
    assert f"{1 + OLDER_COMMITTED} stale (S), 2 duplicate (D), 3 outlier (O); 1 unreadable" in out


def test_cli_json(runner, fleet):
    result = runner.invoke(main, ["fleet", "report", "--json", str(fleet / "fleet")])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert len(data["rows"]) == 4 and len(data["outliers"]) == 1 and data["duplicates"] == []
    assert [item["source"].endswith("broken.json") for item in data["invalid"]] == [True]


def test_cli_html_is_written_whole_and_says_where(runner, fleet, monkeypatch):
    monkeypatch.setattr(cli_report, "PROGRESS_MIN_FILES", 2)
    target = fleet / "out" / "fleet.html"
    target.parent.mkdir()
    result = runner.invoke(main, ["fleet", "report", "--no-plots", "--html", str(target), str(fleet / "fleet")])
    assert result.exit_code == 0, result.output
    assert f"wrote {target}" in result.stdout
    assert "read 4 profiles and 1 invalid files from" in result.stderr
    page = target.read_text(encoding="utf-8")
    assert _parse(page).tags <= EXPECTED_TAGS and "Plots were not drawn" in page
    assert sorted(p.name for p in target.parent.iterdir()) == ["fleet.html"]

    def fail(*_args, **_kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files.os, "fsync", fail)
    again = runner.invoke(main, ["fleet", "report", "--no-plots", "--html", str(target), str(fleet / "fleet")])
    assert again.exit_code == 1
    assert "cannot write" in again.output and "No space left on device" in again.output
    assert "Traceback" not in again.output
    assert target.read_text(encoding="utf-8") == page, "the old page is left as it was"
    assert sorted(p.name for p in target.parent.iterdir()) == ["fleet.html"], "no temporary file left"


def test_cli_exit_codes(runner, fleet):
    no_paths = runner.invoke(main, ["fleet", "report"])
    assert no_paths.exit_code == 2 and "Missing argument" in no_paths.output
    nothing = runner.invoke(main, ["fleet", "report", str(fleet / "no-such-dir")])
    assert nothing.exit_code == 1
    assert "does not exist" in nothing.stdout
    assert nothing.stderr.strip().splitlines()[-1].startswith("Error: no readable profile in")
    missing_dir = runner.invoke(main, ["fleet", "report", "--html", str(fleet / "nope" / "x.html"), str(COMMITTED)])
    assert missing_dir.exit_code == 1 and "cannot write" in missing_dir.output
    assert "Traceback" not in missing_dir.output


def test_other_schema_versions_are_stale_or_unreadable(tmp_path):
    path = _save(make_profile(), tmp_path / "node-a")
    entries, invalid = collect([str(path)])  # a single file
    assert [source for source, _profile in entries] == [str(path)] and invalid == []
    # Schema 3 changed safe_batch's rule: a schema-1 or -2 profile is stale, and says why.
    current = dataclasses.replace(entries[0][1], schema_version=SCHEMA_VERSION)
    running = RunningVersions(SCHEMA_VERSION, "0.1.0", "2.21.0")
    assert analyse([(str(path), current)], now=NOW, running=running).rows[0].flag_kinds() == ()
    for version in (1, 2):
        older = dataclasses.replace(entries[0][1], schema_version=version)
        (row,) = analyse([(str(path), older)], now=NOW, running=running).rows
        assert row.flag_kinds() == (STALE,) and "older, more cautious rule" in row.flags[0].message
    # A later schema that changed what answers mean makes the older ones stale.
    later = SCHEMA_VERSION + 1
    newer = RunningVersions(schema_version=later, edgebatch="0.1.0", tensorflow="2.21.0", answers_unchanged_since=later)
    (row,) = analyse(entries, now=NOW, running=newer).rows
    assert row.flag_kinds() == (STALE,) and f"schema {SCHEMA_VERSION}, this edgebatch writes {later}" in row.flags[0].message
    # A file of a newer schema is not read as a profile at all: listed, with why.
    data = json.loads(path.read_text(encoding="utf-8"))
    data["schema_version"] = later
    (tmp_path / "node-b").mkdir()
    (tmp_path / "node-b" / path.name).write_text(json.dumps(data), encoding="utf-8")
    entries, invalid = collect([str(tmp_path)])
    assert len(entries) == 1
    (newer_file,) = invalid
    assert "newer edgebatch" in newer_file.error


def test_running_tensorflow_is_read_without_importing_it():
    import subprocess
    import sys

    code = ("import sys; from edgebatch.fleet.report import running_versions; v = running_versions(); "
            "print(v.tensorflow is not None, 'tensorflow' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["True", "False"]


def test_profiles_at_urls(tmp_path):
    import uuid

    import fsspec

    root = f"memory://fleet-report-{uuid.uuid4().hex}"
    try:
        saved = save_profile(make_profile(), f"{root}/nodes/node-a")
        save_profile(make_profile(max_batch=90, safe_batch=80), f"{root}/nodes/node-b")
        entries, invalid = collect([root, str(saved), f"{root}-missing"])
        report = analyse(entries, invalid, now=NOW, running=RUNNING)
        # The host is the directory a fleet probe wrote the node's files into.
        assert sorted(row.host for row in report.rows) == ["node-a", "node-a", "node-b"]
        assert all(row.source.startswith(root) for row in report.rows)
        assert report.count(DUPLICATE) == 2 and report.count(OUTLIER) == 3
        (missing,) = invalid
        assert missing.source == f"{root}-missing" and "no profile files" in missing.error
    finally:
        fsspec.filesystem("memory").rm(root.removeprefix("memory://"), recursive=True)


def test_an_old_profile_is_stale_by_its_age(tmp_path, runner):
    _save(make_profile(device={"host": "old-node"}, created_at="2019-03-01T00:00:00Z"), tmp_path / "old")
    _save(make_profile(device={"host": "new-node"}, created_at="2026-12-01T00:00:00Z"), tmp_path / "new")
    entries, invalid = collect([str(tmp_path)])
    running = RunningVersions(SCHEMA_VERSION, "0.1.0", "2.21.0")
    report = analyse(entries, invalid, now=NOW, running=running, max_age_seconds=180 * 86400)
    flagged = {row.host: [flag.message for flag in row.flags] for row in report.rows}
    assert flagged["new-node"] == []
    assert len(flagged["old-node"]) == 1 and "over the 180 d --max-age" in flagged["old-node"][0]
    assert analyse(entries, invalid, now=NOW, running=running).rows[0].flags == ()  # age not judged
    # The command judges age by default (180 days), and not with --max-age none.
    assert "over the 180 d --max-age" in runner.invoke(main, ["fleet", "report", str(tmp_path)]).stdout
    assert "--max-age" not in runner.invoke(main, ["fleet", "report", "--max-age", "none", str(tmp_path)]).stdout


@pytest.mark.parametrize("age", ["soon", "0d", "12", "-3d", "1.5w"])
def test_a_bad_max_age_is_one_usage_line(tmp_path, runner, age):
    result = runner.invoke(main, ["fleet", "report", "--max-age", age, str(tmp_path)])
    assert result.exit_code == 2 and "--max-age" in result.output and "Traceback" not in result.output


def test_matrix_columns_are_model_keys_whatever_one_profile_calls_the_model(tmp_path):
    first = make_profile(device={"host": "node-a"})
    renamed = make_profile(device={"host": "node-b"}, model={"name": "my_model", "key": first.model_key})
    _save(first, tmp_path / "a")
    _save(renamed, tmp_path / "b")
    entries, invalid = collect([str(tmp_path)])
    report = analyse(entries, invalid, now=NOW, running=RUNNING)
    assert report.matrix_models == ((first.model_key, "mobilenet_v2 / my_model"),)
    page = render_html(report, plots=False)
    assert f"<th><code>{first.model_key}</code><br>mobilenet_v2 / my_model</th>" in page


def test_a_large_outlier_group_is_listed_once_not_in_every_row(tmp_path):
    entries = [(f"{host}/p.json", make_profile(device={"host": f"host-{host:02d}"}, max_batch=50 + 5 * host,
                                                safe_batch=40))
               for host in range(20)]
    report = analyse(entries, now=NOW, running=RUNNING)
    (group,) = report.outliers
    page = render_html(report, plots=False)
    text = "".join(_parse(page).text)
    assert text.count("host-00: 50 at budget") == 1  # in the Outliers list only
    assert text.count("outlier: see Outliers below") == 20
