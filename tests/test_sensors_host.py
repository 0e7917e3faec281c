"""Host sensors: cgroup v1/v2 and PSI from fake file trees, /proc/self/status, HostMemory, devices."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgebatch.sensors import (
    CgroupMemory,
    HostMemory,
    Psi,
    cpu_model_name,
    format_devices_text,
    parse_psi,
    process_peak_rss_bytes,
    process_rss_bytes,
    process_swap_bytes,
    process_virtual_bytes,
    read_cgroup_memory,
    read_host_memory,
    read_psi,
    reset_process_peak_rss,
)
from edgebatch.sensors.devices import parse_cpu_model

REPO_ROOT = Path(__file__).resolve().parents[1]
MiB = 1024**2
GiB = 1024**3
V1_UNLIMITED = "9223372036854771712"  # what cgroup v1 shows for "no limit" on x86-64


def make_tree(tmp_path: Path, proc_cgroup: str, files: dict[str, str]) -> tuple[Path, Path]:
    """A fake /proc (with self/cgroup) and /sys/fs/cgroup holding `files` (paths relative to it)."""
    proc_root = tmp_path / "proc"
    cgroup_root = tmp_path / "cgroup"
    (proc_root / "self").mkdir(parents=True)
    (proc_root / "self" / "cgroup").write_text(proc_cgroup)
    cgroup_root.mkdir()
    for relative, text in files.items():
        path = cgroup_root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return proc_root, cgroup_root


# ---- cgroup v2 -------------------------------------------------------------------------------


def test_v2_limit_and_usage(tmp_path):
    proc, root = make_tree(
        tmp_path,
        "0::/app.slice/train\n",
        {
            "cgroup.controllers": "cpu io memory pids\n",
            "app.slice/train/memory.max": f"{2 * GiB}\n",
            "app.slice/train/memory.current": f"{512 * MiB}\n",
        },
    )
    reading = read_cgroup_memory(proc, root)
    assert reading == CgroupMemory(version=2, limit_bytes=2 * GiB, usage_bytes=512 * MiB)


def test_v2_max_means_unlimited_and_usage_is_own(tmp_path):
    proc, root = make_tree(
        tmp_path,
        "0::/app.slice/train\n",
        {
            "app.slice/memory.max": "max\n",
            "app.slice/memory.current": f"{900 * MiB}\n",
            "app.slice/train/memory.max": "max\n",
            "app.slice/train/memory.current": f"{300 * MiB}\n",
        },
    )
    reading = read_cgroup_memory(proc, root)
    assert reading.version == 2
    assert reading.limit_bytes is None
    assert reading.usage_bytes == 300 * MiB


def test_v2_parent_with_smaller_limit_binds(tmp_path):
    proc, root = make_tree(
        tmp_path,
        "0::/app.slice/train\n",
        {
            "app.slice/memory.max": f"{1 * GiB}\n",
            "app.slice/memory.current": f"{700 * MiB}\n",
            "app.slice/train/memory.max": f"{4 * GiB}\n",
            "app.slice/train/memory.current": f"{600 * MiB}\n",
        },
    )
    reading = read_cgroup_memory(proc, root)
    # The parent's limit, with the parent's usage (it counts the siblings too).
    assert reading.limit_bytes == 1 * GiB
    assert reading.usage_bytes == 700 * MiB


def test_v2_child_with_smaller_limit_binds(tmp_path):
    proc, root = make_tree(
        tmp_path,
        "0::/app.slice/train\n",
        {
            "app.slice/memory.max": f"{4 * GiB}\n",
            "app.slice/memory.current": f"{700 * MiB}\n",
            "app.slice/train/memory.max": f"{1 * GiB}\n",
            "app.slice/train/memory.current": f"{600 * MiB}\n",
        },
    )
    reading = read_cgroup_memory(proc, root)
    assert (reading.limit_bytes, reading.usage_bytes) == (1 * GiB, 600 * MiB)


def test_v2_unmounted_own_path_falls_back_to_root(tmp_path):
    # Inside a container /proc/self/cgroup names the host's path; the container's cgroup is the root.
    proc, root = make_tree(
        tmp_path,
        "0::/system.slice/docker-abc.scope\n",
        {"memory.max": f"{3 * GiB}\n", "memory.current": f"{1 * GiB}\n"},
    )
    reading = read_cgroup_memory(proc, root)
    assert (reading.version, reading.limit_bytes, reading.usage_bytes) == (2, 3 * GiB, 1 * GiB)


def test_v2_inactive_file_gives_working_set(tmp_path):
    proc, root = make_tree(
        tmp_path,
        "0::/\n",
        {
            "memory.max": f"{2 * GiB}\n",
            "memory.current": f"{1 * GiB}\n",
            "memory.stat": f"anon {600 * MiB}\nfile {400 * MiB}\ninactive_file {300 * MiB}\nactive_file 1\n",
        },
    )
    reading = read_cgroup_memory(proc, root)
    assert reading.inactive_file_bytes == 300 * MiB
    assert reading.working_set_bytes == 1 * GiB - 300 * MiB


def test_v2_mount_without_memory_files_reports_no_limit(tmp_path):
    proc, root = make_tree(tmp_path, "0::/\n", {"cgroup.controllers": "cpu io\n"})
    assert read_cgroup_memory(proc, root) == CgroupMemory(version=2, limit_bytes=None, usage_bytes=None)


def test_v2_missing_usage_file_keeps_limit(tmp_path):
    proc, root = make_tree(tmp_path, "0::/a\n", {"a/memory.max": "1048576\n"})
    reading = read_cgroup_memory(proc, root)
    assert (reading.limit_bytes, reading.usage_bytes) == (1048576, None)


def test_v2_garbage_limit_is_skipped_with_a_warning_naming_the_file(tmp_path):
    proc, root = make_tree(
        tmp_path, "0::/a\n", {"a/memory.max": "lots\n", "a/memory.current": "1000\n"}
    )
    with pytest.warns(RuntimeWarning, match=r"memory\.max.*'lots'"):
        reading = read_cgroup_memory(proc, root)
    assert (reading.limit_bytes, reading.usage_bytes) == (None, 1000)


def test_dotdot_in_cgroup_path_stays_inside_the_hierarchy(tmp_path):
    proc, root = make_tree(tmp_path, "0::/../..\n", {"memory.max": "4096\n", "memory.current": "0\n"})
    assert read_cgroup_memory(proc, root).limit_bytes == 4096


# ---- cgroup v1 -------------------------------------------------------------------------------


def test_v1_limit_and_usage_on_a_hybrid_host(tmp_path):
    proc, root = make_tree(
        tmp_path,
        "9:name=systemd:/\n4:memory:/process_api/abc\n1:cpu,cpuacct:/\n0::/\n",
        {
            "unified/cgroup.controllers": "\n",
            "memory/memory.limit_in_bytes": V1_UNLIMITED + "\n",
            "memory/memory.usage_in_bytes": f"{5 * GiB}\n",
            "memory/process_api/abc/memory.limit_in_bytes": f"{1536 * MiB}\n",
            "memory/process_api/abc/memory.usage_in_bytes": f"{400 * MiB}\n",
            "memory/process_api/abc/memory.stat": f"inactive_file 5\ntotal_inactive_file {100 * MiB}\n",
        },
    )
    reading = read_cgroup_memory(proc, root)
    assert reading.version == 1
    assert (reading.limit_bytes, reading.usage_bytes) == (1536 * MiB, 400 * MiB)
    # The hierarchical counter, which matches usage_in_bytes (it counts the subtree).
    assert reading.inactive_file_bytes == 100 * MiB


def test_v1_unlimited_sentinel_reads_as_none(tmp_path):
    proc, root = make_tree(
        tmp_path,
        "4:memory:/job\n",
        {
            "memory/memory.limit_in_bytes": V1_UNLIMITED + "\n",
            "memory/job/memory.limit_in_bytes": V1_UNLIMITED + "\n",
            "memory/job/memory.usage_in_bytes": "123456\n",
        },
    )
    reading = read_cgroup_memory(proc, root)
    assert (reading.version, reading.limit_bytes, reading.usage_bytes) == (1, None, 123456)


def test_v1_nested_parent_with_smaller_limit_binds(tmp_path):
    proc, root = make_tree(
        tmp_path,
        "4:memory:/outer/inner\n",
        {
            "memory/memory.limit_in_bytes": V1_UNLIMITED,
            "memory/outer/memory.limit_in_bytes": f"{768 * MiB}",
            "memory/outer/memory.usage_in_bytes": f"{500 * MiB}",
            "memory/outer/inner/memory.limit_in_bytes": f"{2 * GiB}",
            "memory/outer/inner/memory.usage_in_bytes": f"{450 * MiB}",
        },
    )
    reading = read_cgroup_memory(proc, root)
    assert (reading.limit_bytes, reading.usage_bytes) == (768 * MiB, 500 * MiB)


def test_v1_unmounted_own_path_falls_back_to_root(tmp_path):
    proc, root = make_tree(
        tmp_path,
        "4:memory:/docker/0123abcd\n",
        {"memory/memory.limit_in_bytes": f"{GiB}", "memory/memory.usage_in_bytes": f"{10 * MiB}"},
    )
    reading = read_cgroup_memory(proc, root)
    assert (reading.version, reading.limit_bytes, reading.usage_bytes) == (1, GiB, 10 * MiB)


def test_v1_line_without_mounted_controller_uses_v2(tmp_path):
    proc, root = make_tree(
        tmp_path, "4:memory:/x\n0::/x\n", {"x/memory.max": "2048\n", "x/memory.current": "1024\n"}
    )
    assert read_cgroup_memory(proc, root) == CgroupMemory(version=2, limit_bytes=2048, usage_bytes=1024)


# ---- no cgroup fs ----------------------------------------------------------------------------


def test_no_proc_cgroup_file_means_none(tmp_path):
    (tmp_path / "proc").mkdir()
    assert read_cgroup_memory(tmp_path / "proc", tmp_path / "cgroup") is None


def test_no_cgroup_filesystem_means_none(tmp_path):
    proc, root = make_tree(tmp_path, "4:memory:/x\n0::/x\n", {})
    assert read_cgroup_memory(proc, root / "absent") is None
    # An empty directory where the fs should be: no limit files anywhere, no cgroup.controllers.
    assert read_cgroup_memory(proc, root) is None


def test_garbage_proc_cgroup_warns_and_gives_none(tmp_path):
    proc, root = make_tree(tmp_path, "this is not a cgroup file\n", {"memory.max": "1\n"})
    with pytest.warns(RuntimeWarning, match="this is not a cgroup file"):
        assert read_cgroup_memory(proc, root) is None


def test_cgroup_memory_rejects_bad_values():
    with pytest.raises(ValueError, match="3"):
        CgroupMemory(version=3, limit_bytes=None, usage_bytes=None)
    with pytest.raises(ValueError, match="-5"):
        CgroupMemory(version=2, limit_bytes=-5, usage_bytes=None)


# ---- PSI -------------------------------------------------------------------------------------

PSI_TEXT = (
    "some avg10=1.50 avg60=0.75 avg300=0.10 total=123456\n"
    "full avg10=0.40 avg60=0.20 avg300=0.05 total=4567\n"
)


def test_parse_psi_some_and_full():
    assert parse_psi(PSI_TEXT) == Psi(some_avg10=1.5, some_avg60=0.75, full_avg10=0.4, full_avg60=0.2)


def test_parse_psi_without_full_line():
    psi = parse_psi("some avg10=2.00 avg60=1.00 avg300=0.50 total=99\n")
    assert (psi.some_avg10, psi.some_avg60, psi.full_avg10, psi.full_avg60) == (2.0, 1.0, None, None)


@pytest.mark.parametrize(
    "text",
    ["", "hello world\n", "some avg10=abc avg60=1 total=0\n", "some total=5\n", "full avg10=1 avg60=1\n"],
)
def test_parse_psi_garbage_raises_quoting_the_text(text):
    with pytest.raises(ValueError) as info:
        parse_psi(text)
    assert repr(text)[:40] in str(info.value)


def test_read_psi_from_fake_proc(tmp_path):
    (tmp_path / "pressure").mkdir()
    (tmp_path / "pressure" / "memory").write_text(PSI_TEXT)
    assert read_psi(tmp_path).some_avg10 == 1.5
    assert read_psi(tmp_path / "nowhere") is None
    (tmp_path / "pressure" / "memory").write_text("garbage\n")
    with pytest.warns(RuntimeWarning, match="garbage"):
        assert read_psi(tmp_path) is None


# ---- HostMemory ------------------------------------------------------------------------------


def host(total=16 * GiB, available=10 * GiB, rss=1 * GiB, cgroup=None):
    return HostMemory(total_bytes=total, available_bytes=available, process_rss_bytes=rss, cgroup=cgroup, psi=None)


def test_host_memory_without_cgroup_is_ram():
    memory = host()
    assert memory.limit_bytes == 16 * GiB
    assert memory.available_to_process_bytes == 10 * GiB
    assert memory.used_fraction == pytest.approx(6 / 16)


def test_host_memory_cgroup_limit_binds():
    memory = host(cgroup=CgroupMemory(version=2, limit_bytes=4 * GiB, usage_bytes=3 * GiB))
    assert memory.limit_bytes == 4 * GiB
    assert memory.available_to_process_bytes == 1 * GiB
    assert memory.used_fraction == pytest.approx(3 / 4)


def test_host_memory_cgroup_limit_above_ram_does_not_bind():
    memory = host(available=2 * GiB, cgroup=CgroupMemory(version=1, limit_bytes=64 * GiB, usage_bytes=1 * GiB))
    assert memory.limit_bytes == 16 * GiB
    assert memory.available_to_process_bytes == 2 * GiB
    assert memory.used_fraction == pytest.approx(14 / 16)


def test_host_memory_unlimited_cgroup_is_ram():
    memory = host(cgroup=CgroupMemory(version=1, limit_bytes=None, usage_bytes=12 * GiB))
    assert (memory.limit_bytes, memory.available_to_process_bytes) == (16 * GiB, 10 * GiB)
    assert memory.used_fraction == pytest.approx(6 / 16)


def test_host_memory_over_limit_clamps_available_at_zero():
    memory = host(cgroup=CgroupMemory(version=2, limit_bytes=1 * GiB, usage_bytes=int(1.5 * GiB)))
    assert memory.available_to_process_bytes == 0
    assert memory.used_fraction == pytest.approx(1.5)


def test_host_memory_uses_working_set_when_page_cache_is_known():
    cgroup = CgroupMemory(version=1, limit_bytes=4 * GiB, usage_bytes=3 * GiB, inactive_file_bytes=1 * GiB)
    memory = host(cgroup=cgroup)
    assert memory.available_to_process_bytes == 2 * GiB
    assert memory.used_fraction == pytest.approx(2 / 4)


def test_host_memory_unknown_cgroup_usage_falls_back_to_rss():
    memory = host(rss=3 * GiB, cgroup=CgroupMemory(version=2, limit_bytes=4 * GiB, usage_bytes=None))
    assert memory.available_to_process_bytes == 1 * GiB
    assert memory.used_fraction == pytest.approx(3 / 4)


def test_host_memory_rejects_negative_values():
    with pytest.raises(ValueError, match="-1"):
        host(available=-1)


def test_read_host_memory_on_this_machine():
    memory = read_host_memory()
    assert memory.total_bytes > 0
    assert 0 < memory.available_bytes <= memory.total_bytes
    assert memory.process_rss_bytes > 0
    assert 0 < memory.limit_bytes <= memory.total_bytes
    assert 0 <= memory.available_to_process_bytes <= memory.available_bytes
    assert 0.0 <= memory.used_fraction
    if memory.cgroup is not None and memory.cgroup.usage_bytes is not None:
        assert memory.cgroup.usage_bytes > 0


# ---- /proc/self/status -----------------------------------------------------------------------

STATUS_TEXT = """Name:\tpython
VmPeak:\t 3000000 kB
VmSize:\t 2500000 kB
VmLck:\t       0 kB
VmHWM:\t 1500000 kB
VmRSS:\t 1200000 kB
Threads:\t12
"""


def test_status_fields_from_fake_proc(tmp_path):
    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "status").write_text(STATUS_TEXT)
    assert process_peak_rss_bytes(tmp_path) == 1500000 * 1024
    assert process_rss_bytes(tmp_path) == 1200000 * 1024
    assert process_virtual_bytes(tmp_path) == 2500000 * 1024


def test_status_without_the_field_raises_naming_it(tmp_path):
    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "status").write_text("Name:\tkthread\nThreads:\t1\n")
    with pytest.raises(ValueError, match="VmHWM"):
        process_peak_rss_bytes(tmp_path)
    with pytest.raises(OSError):
        process_rss_bytes(tmp_path / "nowhere")


def test_swap_of_a_process_from_fake_proc(tmp_path):
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "status").write_text(STATUS_TEXT + "VmSwap:\t   20480 kB\n")
    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "status").write_text(STATUS_TEXT)
    assert process_swap_bytes(tmp_path, pid=4242) == 20480 * 1024
    # A kernel without the VmSwap line, or a process that is gone: unknown, not an error.
    assert process_swap_bytes(tmp_path) is None
    assert process_swap_bytes(tmp_path, pid=4343) is None


def test_real_swap_reads_where_the_kernel_reports_it():
    status = Path("/proc/self/status")
    if not status.exists() or "VmSwap:" not in status.read_text():
        pytest.skip("no /proc/self/status with a VmSwap line here")
    swap_bytes = process_swap_bytes(pid=os.getpid())
    assert swap_bytes is not None and swap_bytes >= 0


def test_reset_peak_writes_5_to_clear_refs(tmp_path):
    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "clear_refs").write_text("")
    assert reset_process_peak_rss(tmp_path) is True
    assert (tmp_path / "self" / "clear_refs").read_text() == "5"
    # No such file: report failure, do not create it.
    assert reset_process_peak_rss(tmp_path / "nowhere") is False


def test_real_peak_rss_rises_and_resets():
    baseline_bytes = process_rss_bytes()
    block = b"\x01" * (200 * MiB)
    peak_with_block = process_peak_rss_bytes()
    assert peak_with_block >= baseline_bytes + 150 * MiB
    del block
    if not reset_process_peak_rss():
        pytest.skip("writing /proc/self/clear_refs is not permitted here")
    assert process_peak_rss_bytes() <= peak_with_block - 150 * MiB
    assert process_virtual_bytes() >= process_rss_bytes()


# ---- devices ---------------------------------------------------------------------------------


def test_cpu_model_from_fake_cpuinfo(tmp_path):
    (tmp_path / "cpuinfo").write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\n")
    assert cpu_model_name(tmp_path) == "AMD EPYC 7B13"
    assert parse_cpu_model("processor\t: 0\nBogoMIPS\t: 48.00\n\nHardware\t: BCM2835\n") == "BCM2835"
    assert parse_cpu_model("processor : 0\n") is None
    assert cpu_model_name(tmp_path / "nowhere")  # platform fallback, never empty


def test_format_devices_text_lists_gpus_and_limits():
    info = {
        "cpu": {
            "model": "AMD EPYC",
            "cores_logical": 8,
            "cores_physical": 4,
            "ram_total_bytes": 32 * GiB,
            "ram_available_bytes": 20 * GiB,
            "cgroup": {"version": 2, "limit_bytes": 8 * GiB, "usage_bytes": 2 * GiB},
            "psi": {"some_avg10": 1.25, "some_avg60": 0.5, "full_avg10": None, "full_avg60": None},
        },
        "gpus": [
            {"index": 0, "name": "NVIDIA L4", "uuid": "GPU-1234", "total_bytes": 24 * GiB,
             "free_bytes": 23 * GiB, "driver_version": "550.54", "compute_capability": "8.9", "tf_device": "GPU:0"}
        ],
        "tensorflow": {
            "version": "2.21.0", "keras_version": "3.15.1", "gpu_devices": ["GPU:0"], "built_with_cuda": True
        },
        "nvml": {"available": True, "driver_version": "550.54"},
    }
    text = format_devices_text(info)
    for expected in ("AMD EPYC", "32.00 GiB", "limit 8.00 GiB", "some 1.25%", "NVIDIA L4", "GPU:0", "8.9",
                     "24.00 GiB", "driver 550.54", "2.21.0"):
        assert expected in text, expected
    assert "full" not in text
    assert "unavailable" in format_devices_text({})


def test_importing_sensors_pulls_in_neither_tensorflow_nor_pynvml():
    code = (
        "import sys, json\n"
        "import edgebatch.sensors as s\n"
        "at_import = ['tensorflow' in sys.modules, 'pynvml' in sys.modules]\n"
        "info = s.describe_devices(include_tensorflow=False)\n"
        "json.dumps(info)\n"
        "print(at_import, 'tensorflow' in sys.modules, info['tensorflow'])\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[False, False] False None"
