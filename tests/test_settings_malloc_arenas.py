"""edgebatch.settings.malloc_arenas (and the settings package): the arena limit a profile was measured under, checked where training uses it.

Pure: the setting is read from an environment mapping; what glibc does with it is measured in
docs/probe-evidence.md, not here.
"""

import warnings
from types import SimpleNamespace

import pytest

from edgebatch.settings import malloc_arenas
from edgebatch.governor import Governor
from edgebatch.profiles import LengthCeiling
from edgebatch.training.length_ceilings import LengthCeilings

MiB = 1024**2


@pytest.mark.parametrize("value, in_effect", [("1", 1), (" 4 ", 4), ("0", None), ("-1", None), ("x", None), ("", None)])
def test_the_limit_is_read_as_glibc_reads_it(value, in_effect):
    assert malloc_arenas.malloc_arena_max_in_effect({"MALLOC_ARENA_MAX": value}) == in_effect
    assert malloc_arenas.malloc_arena_max_in_effect({}) is None


def test_a_mismatch_names_both_settings_and_how_to_start_training():
    assert malloc_arenas.mismatch(1, 1) is None and malloc_arenas.mismatch(None, None) is None
    line = malloc_arenas.mismatch(1, None)
    assert "1 (MALLOC_ARENA_MAX=1)" in line and "glibc's default" in line
    assert "start training with MALLOC_ARENA_MAX=1" in line and "\n" not in line
    assert "start training without MALLOC_ARENA_MAX" in malloc_arenas.mismatch(None, 2)


def test_a_profile_is_checked_against_this_process_and_an_unrecorded_limit_counts_as_unset():
    one_arena = SimpleNamespace(search={"malloc_arena_max": 1})
    older = SimpleNamespace(search={"strategy": "slow_start"})
    with pytest.warns(UserWarning, match="malloc arena limit 1"):
        assert malloc_arenas.warn_on_mismatch(one_arena, {}) is not None
    with pytest.warns(UserWarning, match="start training without MALLOC_ARENA_MAX"):
        malloc_arenas.warn_on_mismatch(older, {"MALLOC_ARENA_MAX": "1"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert malloc_arenas.warn_on_mismatch(one_arena, {"MALLOC_ARENA_MAX": "1"}) is None
        assert malloc_arenas.warn_on_mismatch(older, {}) is None
        assert malloc_arenas.warn_on_mismatch(SimpleNamespace(max_batch=8), {"MALLOC_ARENA_MAX": "1"}) is None


def test_training_from_a_profile_warns_when_this_process_runs_another_limit(monkeypatch):
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    search = {"malloc_arena_max": 1}
    profile = SimpleNamespace(safe_batch=48, max_batch=64, memory_model=None, budget_bytes=4096 * MiB,
                              device={"kind": "CPU"}, measure="process_peak", search=search,
                              per_length={64: LengthCeiling(max_batch=130, safe_batch=117, peak_bytes=1)})
    with pytest.warns(UserWarning, match="MALLOC_ARENA_MAX=1") as caught:
        assert Governor.from_profile(profile, effective_batch=48).config.ceiling_batch == 48
    # edgebatch/settings/__init__.py warns for the caller of from_profile, not for edgebatch's own code.
    assert {w.filename for w in caught if "malloc arena" in str(w.message)} == {__file__}
    with pytest.warns(UserWarning, match="MALLOC_ARENA_MAX=1"):
        assert LengthCeilings.from_profile(profile).table == ((64, 117),)
    monkeypatch.setenv("MALLOC_ARENA_MAX", "1")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        LengthCeilings.from_profile(profile)
    assert not [w for w in caught if "malloc arena" in str(w.message)]
