"""The examples in the main entry points' docstrings run as written (doctest)."""

import doctest
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_examples(function, name):
    """Run `function`'s docstring examples; (failed, attempted)."""
    finder, runner = doctest.DocTestFinder(), doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in finder.find(function, name, globs={}):
        runner.run(test)
    return runner.summarize(verbose=False)


def test_governor_from_profile_example(monkeypatch):
    from edgebatch import Governor

    monkeypatch.chdir(ROOT)  # it reads a committed profile
    failed, attempted = run_examples(Governor.from_profile, "Governor.from_profile")
    assert attempted > 0 and failed == 0


@pytest.mark.slow
def test_fit_example(monkeypatch, tmp_path):
    from edgebatch import fit

    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    failed, attempted = run_examples(fit, "fit")
    assert attempted > 0 and failed == 0


def test_supervise_example():
    from edgebatch import supervise

    failed, attempted = run_examples(supervise, "supervise")
    assert attempted > 0 and failed == 0


@pytest.mark.slow
def test_probe_example():
    from edgebatch import probe

    failed, attempted = run_examples(probe, "probe")
    assert attempted > 0 and failed == 0
