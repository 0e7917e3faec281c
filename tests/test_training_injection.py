"""Fault injection: parsing EDGEBATCH_INJECT_OOM and the inject_oom context manager (no TensorFlow)."""

import pytest

from edgebatch.errors import UsageError
from edgebatch.training import injection
from edgebatch.training.injection import ENV_INJECT_OOM, inject_oom, next_injected_oom, parse_oom_indices


def test_parse_lists_and_blank():
    assert parse_oom_indices("2,5,6") == {2, 5, 6}
    assert parse_oom_indices(" 3 , 1 ") == {1, 3}
    assert parse_oom_indices("") == frozenset()
    assert parse_oom_indices("   ") == frozenset()


@pytest.mark.parametrize("text", ["0", "-1", "2,,5", "a", "2;5", "1.5", "²", "5,"])
def test_parse_rejects_and_quotes_the_value(text):
    with pytest.raises(UsageError) as info:
        parse_oom_indices(text)
    assert repr(text) in str(info.value)


def test_env_indices_count_the_whole_process(monkeypatch):
    base = injection._executions
    monkeypatch.setenv(ENV_INJECT_OOM, f"{base + 2},{base + 4}")
    results = [next_injected_oom() for _ in range(5)]
    assert [r is not None for r in results] == [False, True, False, True, False]
    assert ENV_INJECT_OOM in results[1]


def test_bad_env_value_raises_usage_error_quoting_it(monkeypatch):
    monkeypatch.setenv(ENV_INJECT_OOM, "two")
    with pytest.raises(UsageError, match="'two'"):
        injection.injected_oom_plan()
    with pytest.raises(UsageError, match="'two'"):
        next_injected_oom()


def test_context_manager_counts_from_entry_and_nests(monkeypatch):
    monkeypatch.delenv(ENV_INJECT_OOM, raising=False)
    next_injected_oom()  # whatever ran before must not shift the block's numbering
    with inject_oom([1, 3]):
        first = [next_injected_oom() is not None for _ in range(2)]
        with inject_oom([1]):
            inner = next_injected_oom()
        after = [next_injected_oom() is not None for _ in range(2)]
    assert first == [True, False]
    assert inner is not None  # execution 3 of the outer block, 1 of the inner
    assert after == [False, False]
    assert next_injected_oom() is None  # the block is gone


@pytest.mark.parametrize("bad", ["2,5", [0], [1.5], [True], 3])
def test_context_manager_rejects_bad_indices(bad):
    with pytest.raises(UsageError):
        with inject_oom(bad):
            pass
