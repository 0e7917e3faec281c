"""held_native_stderr: what native code writes to fd 2 is held back, and shown again on an error."""

import os

import pytest

from edgebatch.native_stderr import held_native_stderr


def test_what_fd_2_gets_in_the_block_is_held_and_returned(capfd):
    with held_native_stderr() as held:
        os.write(2, b"from C++\n")
    os.write(2, b"after\n")
    assert held() == "from C++\n"
    assert capfd.readouterr().err == "after\n"


def test_a_block_that_raises_shows_what_was_held(capfd):
    with pytest.raises(ImportError, match="no runtime"), held_native_stderr():
        os.write(2, b"why the import failed\n")
        raise ImportError("no runtime")
    assert capfd.readouterr().err == "why the import failed\n"


def test_fd_2_is_restored_and_nothing_leaks():
    before_fds, before_target = sorted(os.listdir("/proc/self/fd")), os.fstat(2)
    with held_native_stderr():
        assert (os.fstat(2).st_dev, os.fstat(2).st_ino) != (before_target.st_dev, before_target.st_ino)
    assert sorted(os.listdir("/proc/self/fd")) == before_fds
    assert (os.fstat(2).st_dev, os.fstat(2).st_ino) == (before_target.st_dev, before_target.st_ino)
