"""edgebatch.adapt exports what a user calls; the names it exported before stay importable from their
modules, and from the package with a DeprecationWarning (once per name)."""

import importlib
import subprocess
import sys
import warnings

import pytest

import edgebatch.adapt as adapt

USER_NAMES = {"AdaptConfig", "AdaptConfigError", "AdaptController", "AdaptDecision", "AdaptReading",
              "UpdateMeasurement"}


def test_the_package_exports_what_a_user_calls():
    assert set(adapt.__all__) == USER_NAMES
    for name in USER_NAMES:
        assert getattr(adapt, name) is not None


@pytest.mark.parametrize("name", sorted(adapt._MOVED))
def test_an_old_name_is_the_same_object_and_warns_once(name, monkeypatch):
    monkeypatch.setattr(adapt, "_warned", set())
    module = importlib.import_module(f"edgebatch.adapt.{adapt._MOVED[name]}")
    with pytest.warns(DeprecationWarning, match=rf"edgebatch.adapt.{name} is deprecated: import it from "
                                                rf"edgebatch.adapt.{adapt._MOVED[name]}"):
        value = getattr(adapt, name)
    assert value is getattr(module, name)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert getattr(adapt, name) is value


def test_from_import_of_an_old_name_still_works(monkeypatch):
    monkeypatch.setattr(adapt, "_warned", set())
    with pytest.warns(DeprecationWarning, match="edgebatch.adapt.decide is deprecated") as caught:
        from edgebatch.adapt import decide
    from edgebatch.adapt.policy import decide as from_module

    assert decide is from_module
    assert caught[0].filename == __file__  # points at the importing line
    with pytest.raises(ImportError):
        from edgebatch.adapt import no_such_name  # noqa: F401


def test_importing_the_package_imports_no_tensorflow():
    code = "import sys, edgebatch.adapt as a; a.decide; print('tensorflow' in sys.modules)"
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "False", done.stderr
