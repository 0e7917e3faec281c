"""Installed memory from the kernel's memory blocks, read from a fake /sys."""

from edgebatch.sensors.installed import installed_memory_bytes

BLOCK = 0x8000000  # 128 MiB, as on this machine kind


def make_sys(tmp_path, online, block_hex="8000000", offline=0, without_online_file=0):
    memory = tmp_path / "devices" / "system" / "memory"
    memory.mkdir(parents=True)
    (memory / "block_size_bytes").write_text(block_hex + "\n")
    (memory / "auto_online_blocks").write_text("online\n")  # not a block
    states = ["1"] * online + ["0"] * offline + [None] * without_online_file
    for index, state in enumerate(states):
        block = memory / f"memory{index}"
        block.mkdir()
        if state is not None:
            (block / "online").write_text(state + "\n")
    return tmp_path


def test_online_blocks_add_up_to_the_installed_size(tmp_path):
    assert installed_memory_bytes(make_sys(tmp_path, online=192)) == 24 * 1024**3


def test_offline_blocks_do_not_count_and_blocks_without_a_state_are_online(tmp_path):
    root = make_sys(tmp_path, online=8, offline=4, without_online_file=2)
    assert installed_memory_bytes(root) == 10 * BLOCK


def test_no_blocks_or_a_garbled_size_reads_as_unknown(tmp_path):
    assert installed_memory_bytes(tmp_path / "absent") is None
    assert installed_memory_bytes(make_sys(tmp_path / "a", online=0)) is None
    assert installed_memory_bytes(make_sys(tmp_path / "b", online=4, block_hex="zz")) is None
