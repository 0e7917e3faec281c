"""GPU consistency of the probe: what counts as OOM, what a GPU trial measures, GPUs without NVML.

Fakes stand in for NVML here (no GPU on the build machines); the tests marked `gpu` run the real
worker where a GPU exists and are skipped visibly elsewhere.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
from test_sensors_nvml import FakeNvml, two_gpus

from edgebatch.errors import ProbeError, UsageError
from edgebatch.probing import api, budget, readings
from edgebatch.probing.budget import DeviceFacts, default_budget, device_facts, with_worker_gpu_details
from edgebatch.probing.trial import is_oom, is_oom_error
from edgebatch.probing.worker import MEASURE_FIELDS, WorkerSetup, measure_of, start_worker
from edgebatch.sensors import (
    GpuProcessMeter,
    list_gpus,
    process_gpu_footprint_bytes,
    read_process_gpu_memory,
)
from edgebatch.sensors import nvml as nvml_module

GiB = 1024**3
MiB = 1024**2

# ---- what counts as out of memory ------------------------------------------------------------

TF_INTERNAL = ("InternalError", "OpError", "Exception", "BaseException", "object")


@pytest.mark.parametrize(
    ("class_names", "message", "oom"),
    [
        (("ResourceExhaustedError", "OpError"), "OOM when allocating tensor with shape[512,64,64,32]", True),
        (("MemoryError", "Exception"), "", True),
        (TF_INTERNAL, "Blas GEMM launch failed : a.shape=(8, 8)... CUBLAS_STATUS_ALLOC_FAILED", True),
        (TF_INTERNAL, "cuDNN launch failure : CUDNN_STATUS_ALLOC_FAILED", True),
        (TF_INTERNAL, "failed to allocate memory [Op:MatMul]", True),
        (TF_INTERNAL, "CUDA runtime implicit initialization on GPU:0 failed. Status: out of memory", True),
        (TF_INTERNAL, "Failed to call ThenRnnForward ... CUDA_ERROR_OUT_OF_MEMORY", True),
        (TF_INTERNAL, "Dst tensor is not initialized. [Op:_EagerConst]", True),
        # Any other InternalError is a bug or a broken device: it must stop the probe.
        (TF_INTERNAL, "cuDNN launch failure : CUDNN_STATUS_EXECUTION_FAILED", False),
        (TF_INTERNAL, "Blas GEMM launch failed : CUBLAS_STATUS_NOT_INITIALIZED", False),
        (TF_INTERNAL, "", False),
        (("InvalidArgumentError", "OpError"), "failed to allocate: shape mismatch", False),
        (("ValueError", "Exception"), "out of memory", False),
    ],
)
def test_what_counts_as_out_of_memory(class_names, message, oom):
    assert is_oom(class_names, message) is oom


def test_real_tensorflow_errors_are_judged_by_their_class_hierarchy():
    import tensorflow as tf

    assert is_oom_error(tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor"))
    assert is_oom_error(tf.errors.InternalError(None, None, "Blas xGEMM launch failed: CUBLAS_STATUS_ALLOC_FAILED"))
    assert not is_oom_error(tf.errors.InternalError(None, None, "CUDNN_STATUS_EXECUTION_FAILED"))
    assert not is_oom_error(tf.errors.UnknownError(None, None, "out of memory"))
    assert is_oom_error(MemoryError())


# ---- what a GPU trial measures: the worker's NVML footprint ----------------------------------


class ProcessNvml(FakeNvml):
    """FakeNvml that also lists compute processes per device ({"processes": [(pid, used or None)]})."""

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        self._check()
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in handle.get("processes", [])]


@pytest.fixture(autouse=True)
def fresh_nvml_cache():
    nvml_module._reset_nvml_cache()
    yield
    nvml_module._reset_nvml_cache()


def test_process_gpu_memory_from_nvml_process_list():
    devices = two_gpus()
    devices[1]["processes"] = [(100, 3 * GiB), (4242, 900 * MiB), (4343, None)]
    fake = ProcessNvml(devices)
    assert read_process_gpu_memory(1, 4242, nvml=fake) == 900 * MiB
    # Not available (MIG, WSL), or not listed (a container's pid is not the host's): unknown.
    assert read_process_gpu_memory(1, 4343, nvml=fake) is None
    assert read_process_gpu_memory(1, 5555, nvml=fake) is None
    assert read_process_gpu_memory(0, 4242, nvml=fake) is None


@pytest.mark.parametrize(
    ("process_used", "device_used", "device_before", "footprint"),
    [
        (900 * MiB, 5 * GiB, 1 * GiB, 900 * MiB),  # NVML's figure for the process wins
        (None, 5 * GiB, 1 * GiB, 4 * GiB),  # else what the device holds over its reading before
        (None, 1 * GiB, 2 * GiB, 0),  # others freed memory meanwhile: never negative
        (None, None, 1 * GiB, None),
        (None, 5 * GiB, None, None),
    ],
)
def test_gpu_footprint_prefers_the_process_figure(process_used, device_used, device_before, footprint):
    result = process_gpu_footprint_bytes(
        process_used_bytes=process_used, device_used_bytes=device_used, device_used_before_bytes=device_before
    )
    assert result == footprint


def test_meter_follows_cuda_visible_devices_and_falls_back_to_the_device_delta():
    devices = two_gpus()
    fake = ProcessNvml(devices)
    # TensorFlow's GPU:0 is NVML's 1 here.
    meter = GpuProcessMeter.start(0, 4242, cuda_visible_devices="1", nvml=fake)
    assert meter.nvml_index == 1 and meter.device_used_before_bytes == 3 * GiB
    devices[1]["used"] = 5 * GiB  # the worker's context and allocator, not listed per process
    assert meter.footprint_bytes() == 2 * GiB
    devices[1]["processes"] = [(4242, 2 * GiB + 64 * MiB)]
    assert meter.footprint_bytes() == 2 * GiB + 64 * MiB
    assert GpuProcessMeter.start(1, 4242, cuda_visible_devices="1", nvml=fake) is None
    assert GpuProcessMeter.start(0, 4242, cuda_visible_devices=None, nvml=FakeNvml([])) is None


@pytest.mark.parametrize(
    ("device", "baseline_device_bytes", "measure"),
    [("CPU:0", None, "process_peak"), ("GPU:0", 600 * MiB, "device_used"), ("GPU:1", None, "allocator_peak")],
)
def test_the_measure_counts_what_the_budget_counts(device, baseline_device_bytes, measure):
    assert measure_of(device, baseline_device_bytes) == measure
    assert measure in MEASURE_FIELDS


def test_a_gpu_trial_is_judged_by_its_device_footprint():
    reply = {
        "batch": 64,
        "ok": True,
        "allocator_peak_bytes": 900 * MiB,  # under the budget alone...
        "device_used_bytes": 1400 * MiB,  # ...but not with the CUDA context and workspaces
        "process_peak_bytes": None,
        "step_seconds": 0.1,
        "samples_per_second": 640.0,
    }
    trial = readings.trial_from_reply(reply, "device_used", 1 * GiB)
    assert trial.ok is False and trial.error == "over_budget" and trial.peak_bytes == 1400 * MiB
    assert readings.trial_from_reply(reply, "allocator_peak", 1 * GiB).ok is True


# ---- GPUs without NVML (Jetson, ROCm) --------------------------------------------------------


@pytest.fixture
def no_nvml(monkeypatch):
    import edgebatch.sensors as sensors

    monkeypatch.setattr(sensors, "list_gpus", lambda nvml=None: [])


def test_gpu_facts_need_no_nvml(no_nvml):
    facts = device_facts("GPU:0")
    assert facts.kind == "GPU" and facts.index == 0 and facts.memory_total_bytes is None
    completed = with_worker_gpu_details(facts, {"device_name": "Orin", "compute_capability": "8.7"})
    assert completed.description == "Orin" and completed.compute_capability == "8.7"
    assert completed.fingerprint.startswith("gpu-orin-")


def test_without_nvml_only_the_default_budget_is_refused(no_nvml):
    with pytest.raises(ProbeError, match="pass --memory-budget"):
        default_budget("GPU:0")
    assert budget.resolve_budget("GPU:0", "6GiB", False) == (6 * GiB, "cli")


def test_nvml_facts_are_kept_over_the_workers():
    facts = DeviceFacts(kind="GPU", index=0, description="NVIDIA L4", cores=None, memory_total_bytes=24 * GiB)
    assert with_worker_gpu_details(facts, {"device_name": "L4", "compute_capability": "8.9"}) is facts


@pytest.mark.slow  # a real worker imports TensorFlow
def test_a_gpu_tensorflow_does_not_have_is_a_usage_error_from_the_worker():
    # The worker must refuse, not let soft placement run the steps on the CPU.
    with pytest.raises(UsageError, match="TensorFlow has no GPU:63"):
        worker = start_worker(WorkerSetup(model_spec="mlp", device="GPU:63"))
        worker.close()


# ---- on a real GPU ---------------------------------------------------------------------------

needs_gpu = pytest.mark.skipif(not list_gpus(), reason="no NVIDIA GPU visible through NVML")


def start_gpu_worker():
    try:
        return start_worker(WorkerSetup(model_spec="mlp", device="GPU:0"))
    except UsageError as error:
        if "TensorFlow has no GPU" in str(error):
            pytest.skip("NVML sees a GPU but this TensorFlow build does not (no CUDA libraries?)")
        raise


@pytest.mark.gpu
@needs_gpu
def test_a_gpu_worker_measures_its_footprint_on_the_device():
    worker = start_gpu_worker()
    try:
        facts = worker.facts
        assert facts["measure"] == "device_used"
        assert facts["gpu"]["device_name"]
        # The footprint holds the CUDA context, which the allocator does not count.
        assert facts["baseline_device_bytes"] > facts["baseline_allocator_bytes"] + 50 * MiB
        reply = worker.run_trial(64)
        assert reply["ok"] is True
        assert reply["device_used_bytes"] > reply["allocator_peak_bytes"]
    finally:
        worker.close()


@pytest.mark.gpu
@needs_gpu
def test_a_gpu_probe_with_an_explicit_budget_records_the_device_measure(tmp_path):
    start_gpu_worker().close()  # skips where TensorFlow has no GPU
    profile = api.probe(
        "mlp", device="GPU:0", memory_budget="2GiB", max_batch_limit=256, profiles_dir=tmp_path, save=False
    )
    assert profile.measure == "device_used"
    assert all(trial.peak_bytes is None or trial.peak_bytes > 0 for trial in profile.trials)
    assert profile.max_batch >= 1
    assert os.environ.get("CUDA_VISIBLE_DEVICES") != "-1"
