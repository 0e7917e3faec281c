"""NVML sensors against a fake pynvml, plus one real read marked `nvml`."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from edgebatch.sensors import GpuInfo, GpuMemory, list_gpus, nvml_driver_version, nvml_is_available, read_gpu_memory
from edgebatch.sensors import nvml as nvml_module
from edgebatch.sensors.devices import _attach_tf_devices
from edgebatch.sensors.nvml import visible_nvml_indices

GiB = 1024**3


class NVMLError(Exception):
    pass


class NVMLError_LibraryNotFound(NVMLError):
    pass


class NVMLError_Uninitialized(NVMLError):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


class NVMLError_GpuIsLost(NVMLError):
    pass


class FakeNvml:
    """The pynvml calls edgebatch makes, over a list of fake devices."""

    NVMLError = NVMLError
    NVMLError_Uninitialized = NVMLError_Uninitialized

    def __init__(self, devices, init_error=None, driver=b"550.54.15"):
        self.devices = devices
        self.init_error = init_error
        self.driver = driver
        self.init_calls = 0
        self.initialised = False

    def nvmlInit(self):
        self.init_calls += 1
        if self.init_error is not None:
            raise self.init_error
        self.initialised = True

    def _check(self):
        if not self.initialised:
            raise NVMLError_Uninitialized("Uninitialized")

    def nvmlDeviceGetCount(self):
        self._check()
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index):
        self._check()
        device = self.devices[index]
        if device.get("lost"):
            raise NVMLError_GpuIsLost("GPU is lost")
        return device

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(total=handle["total"], used=handle["used"], free=handle["total"] - handle["used"])

    def nvmlDeviceGetName(self, handle):
        return handle["name"]

    def nvmlDeviceGetUUID(self, handle):
        if handle.get("uuid") is None:
            raise NVMLError_NotSupported("Not Supported")
        return handle["uuid"]

    def nvmlDeviceGetCudaComputeCapability(self, handle):
        if handle.get("cc") is None:
            raise NVMLError_NotSupported("Not Supported")
        return handle["cc"]

    def nvmlSystemGetDriverVersion(self):
        self._check()
        return self.driver


@pytest.fixture(autouse=True)
def fresh_nvml_cache():
    nvml_module._reset_nvml_cache()
    yield
    nvml_module._reset_nvml_cache()


def two_gpus():
    return [
        {"name": b"NVIDIA A100-SXM4-40GB", "uuid": b"GPU-aaaa-1111", "total": 40 * GiB, "used": 1 * GiB, "cc": (8, 0)},
        {"name": "NVIDIA L4", "uuid": "GPU-bbbb-2222", "total": 24 * GiB, "used": 3 * GiB, "cc": (8, 9)},
    ]


def test_available_nvml_lists_gpus_and_decodes_bytes_names():
    fake = FakeNvml(two_gpus())
    assert nvml_is_available(nvml=fake) is True
    gpus = list_gpus(nvml=fake)
    assert gpus == [
        GpuInfo(0, "NVIDIA A100-SXM4-40GB", "GPU-aaaa-1111", 40 * GiB, 39 * GiB, "550.54.15", "8.0"),
        GpuInfo(1, "NVIDIA L4", "GPU-bbbb-2222", 24 * GiB, 21 * GiB, "550.54.15", "8.9"),
    ]
    assert nvml_driver_version(nvml=fake) == "550.54.15"
    expected = GpuMemory(index=1, total_bytes=24 * GiB, used_bytes=3 * GiB, free_bytes=21 * GiB)
    assert read_gpu_memory(1, nvml=fake) == expected
    # Initialised once, however many calls.
    assert fake.init_calls == 1


def test_missing_library_reads_as_unavailable_and_is_not_retried():
    fake = FakeNvml(two_gpus(), init_error=NVMLError_LibraryNotFound("NVML Shared Library Not Found"))
    assert nvml_is_available(nvml=fake) is False
    assert list_gpus(nvml=fake) == []
    assert read_gpu_memory(0, nvml=fake) is None
    assert nvml_driver_version(nvml=fake) is None
    assert fake.init_calls == 1


def test_a_module_without_nvml_error_class_still_cannot_raise():
    class Bare:
        def nvmlInit(self):
            raise RuntimeError("driver exploded")

    assert nvml_is_available(nvml=Bare()) is False
    assert list_gpus(nvml=Bare()) == []


def test_unsupported_optional_fields_become_none():
    fake = FakeNvml([{"name": "Tesla K80", "uuid": None, "total": 12 * GiB, "used": 0, "cc": None}])
    (gpu,) = list_gpus(nvml=fake)
    assert (gpu.name, gpu.uuid, gpu.compute_capability) == ("Tesla K80", None, None)


def test_a_lost_gpu_is_skipped_with_a_warning():
    devices = two_gpus()
    devices[0]["lost"] = True
    fake = FakeNvml(devices)
    with pytest.warns(RuntimeWarning, match="GPU 0"):
        gpus = list_gpus(nvml=fake)
    assert [gpu.index for gpu in gpus] == [1]
    assert read_gpu_memory(0, nvml=fake) is None


def test_read_gpu_memory_out_of_range_and_bad_index():
    fake = FakeNvml(two_gpus())
    assert read_gpu_memory(2, nvml=fake) is None
    with pytest.raises(ValueError, match="-1"):
        read_gpu_memory(-1, nvml=fake)
    with pytest.raises(ValueError, match="True"):
        read_gpu_memory(True, nvml=fake)


def test_uninitialised_after_shutdown_initialises_again():
    fake = FakeNvml(two_gpus())
    assert len(list_gpus(nvml=fake)) == 2
    fake.initialised = False  # someone called nvmlShutdown
    assert read_gpu_memory(0, nvml=fake) is None
    assert read_gpu_memory(0, nvml=fake).total_bytes == 40 * GiB
    assert fake.init_calls == 2


@pytest.mark.parametrize(
    ("cuda_visible_devices", "expected"),
    [
        (None, [0, 1, 2]),
        ("", []),
        ("-1", []),
        ("2,0", [2, 0]),
        ("1,-1,0", [1]),  # CUDA stops at the first invalid entry
        ("0,0", [0]),
        ("GPU-cccc", [2]),
        ("bbbb-2222", [1]),
        ("GPU-", []),  # ambiguous prefix names no single GPU
        ("7", []),
    ],
)
def test_visible_nvml_indices(cuda_visible_devices, expected):
    uuids = ["GPU-aaaa-1111", "GPU-bbbb-2222", "GPU-cccc-3333"]
    gpus = [GpuInfo(i, "g", uuid, GiB, GiB, None, None) for i, uuid in enumerate(uuids)]
    assert visible_nvml_indices(gpus, cuda_visible_devices) == expected


def test_tf_devices_attach_to_nvml_gpus_through_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    gpus = list_gpus(nvml=FakeNvml(two_gpus()))
    gpu_dicts = [{"index": gpu.index, "name": gpu.name, "tf_device": None} for gpu in gpus]
    _attach_tf_devices(gpu_dicts, gpus, [{"device_name": "NVIDIA L4", "compute_capability": (8, 9)}, {}])
    assert [(d["index"], d["tf_device"]) for d in gpu_dicts] == [(0, None), (1, "GPU:0"), (None, "GPU:1")]


@pytest.mark.nvml
def test_real_nvml_reads_this_machines_gpus():
    if not nvml_is_available():
        pytest.skip("NVML unavailable here (no NVIDIA driver)")
    gpus = list_gpus()
    if not gpus:
        pytest.skip("NVML works but sees no GPU")
    for gpu in gpus:
        assert gpu.total_bytes > 0 and 0 <= gpu.free_bytes <= gpu.total_bytes
        memory = read_gpu_memory(gpu.index)
        assert memory.total_bytes == gpu.total_bytes
        assert memory.used_bytes <= memory.total_bytes


def test_real_pynvml_without_gpu_never_raises():
    # On machines without a driver this exercises NVMLError_LibraryNotFound from the real pynvml.
    available = nvml_is_available()
    assert isinstance(available, bool)
    assert isinstance(list_gpus(), list)
    if not available:
        assert list_gpus() == [] and read_gpu_memory(0) is None
