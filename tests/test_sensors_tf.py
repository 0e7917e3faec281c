"""TensorFlow sensors: the allocator (real, on CPU) and GPU memory growth (fake tf.config; real on GPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest

from edgebatch.sensors import enable_memory_growth, list_gpus, read_allocator, reset_allocator_peak

REPO_ROOT = Path(__file__).resolve().parents[1]
MiB = 1024**2


# ---- allocator (real TensorFlow) -------------------------------------------------------------


def test_allocator_grows_with_a_big_tensor_and_peak_resets():
    import tensorflow as tf

    before = read_allocator("CPU:0")
    if before is None:
        pytest.skip("TensorFlow refuses get_memory_info('CPU:0') here (oneDNN off?)")
    tensor = tf.ones((64 * MiB // 4,), dtype=tf.float32)  # 64 MiB
    during = read_allocator("CPU:0")
    assert during.device == "CPU:0"
    assert during.current_bytes >= before.current_bytes + 60 * MiB
    assert during.peak_bytes >= during.current_bytes
    del tensor
    after_free = read_allocator("CPU:0")
    assert after_free.current_bytes <= during.current_bytes - 60 * MiB
    assert after_free.peak_bytes >= during.current_bytes  # the peak remembers the tensor
    assert reset_allocator_peak("CPU:0") is True
    after_reset = read_allocator("CPU:0")
    assert after_reset.peak_bytes <= during.current_bytes - 60 * MiB


def test_allocator_on_a_missing_device_is_none():
    assert read_allocator("CPU:99") is None
    assert reset_allocator_peak("CPU:99") is False


def test_enable_memory_growth_without_gpus_is_silent():
    import tensorflow as tf

    if tf.config.list_physical_devices("GPU"):
        pytest.skip("this machine has GPUs; the silent no-GPU path needs a CPU-only machine")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert enable_memory_growth() == []


# ---- memory growth with a fake tf.config -----------------------------------------------------


class FakeConfig:
    """tf.config's device calls, with TensorFlow's error texts."""

    def __init__(self, gpu_count=2, initialised=False, growth=None, virtual=()):
        self.gpus = [SimpleNamespace(name=f"/physical_device:GPU:{i}", device_type="GPU") for i in range(gpu_count)]
        self.initialised = initialised
        self.growth = dict(growth or {})
        self.virtual = set(virtual)
        self.experimental = SimpleNamespace(set_memory_growth=self._set, get_memory_growth=self._get)

    def list_physical_devices(self, device_type):
        assert device_type == "GPU"
        return list(self.gpus)

    def _set(self, device, enable):
        if device.name in self.virtual:
            raise ValueError("Cannot set memory growth on device when virtual devices configured")
        if self.growth.get(device.name) == enable:
            return
        if self.initialised:
            raise RuntimeError("Physical devices cannot be modified after being initialized")
        self.growth[device.name] = enable

    def _get(self, device):
        return self.growth.get(device.name, False)


def test_growth_is_set_on_every_gpu():
    config = FakeConfig(gpu_count=2)
    assert enable_memory_growth(tf_config=config) == ["GPU:0", "GPU:1"]
    assert config.growth == {"/physical_device:GPU:0": True, "/physical_device:GPU:1": True}


def test_no_gpus_returns_empty_without_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert enable_memory_growth(tf_config=FakeConfig(gpu_count=0)) == []


def test_already_initialised_warns_with_the_fix(monkeypatch):
    monkeypatch.delenv("TF_FORCE_GPU_ALLOW_GROWTH", raising=False)
    with pytest.warns(RuntimeWarning) as record:
        assert enable_memory_growth(tf_config=FakeConfig(initialised=True)) == []
    message = str(record[0].message)
    assert "enable_memory_growth()" in message
    assert "TF_FORCE_GPU_ALLOW_GROWTH=true" in message
    assert "GPU:0, GPU:1" in message
    assert record[0].filename == __file__  # points at the caller, not at edgebatch


def test_already_initialised_with_growth_on_is_fine(monkeypatch):
    monkeypatch.delenv("TF_FORCE_GPU_ALLOW_GROWTH", raising=False)
    growth = {"/physical_device:GPU:0": True}
    config = FakeConfig(gpu_count=1, initialised=True, growth=growth)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert enable_memory_growth(tf_config=config) == ["GPU:0"]


def test_already_initialised_but_growth_forced_by_environment(monkeypatch):
    monkeypatch.setenv("TF_FORCE_GPU_ALLOW_GROWTH", "true")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert enable_memory_growth(tf_config=FakeConfig(initialised=True)) == ["GPU:0", "GPU:1"]


def test_gpu_split_into_virtual_devices_is_skipped_with_a_warning():
    config = FakeConfig(gpu_count=2, virtual={"/physical_device:GPU:0"})
    with pytest.warns(RuntimeWarning, match="GPU:0.*virtual devices"):
        assert enable_memory_growth(tf_config=config) == ["GPU:1"]


def test_other_runtime_errors_propagate():
    config = FakeConfig(gpu_count=1)

    def broken(device, enable):
        raise RuntimeError("CUDA driver version is insufficient")

    config.experimental.set_memory_growth = broken
    with pytest.raises(RuntimeError, match="insufficient"):
        enable_memory_growth(tf_config=config)


# ---- real GPU --------------------------------------------------------------------------------


@pytest.mark.gpu
def test_enable_memory_growth_on_real_gpus_in_a_fresh_process():
    if not list_gpus():
        pytest.skip("no NVIDIA GPU visible through NVML")
    # A fresh process: in this one TensorFlow may already have initialised the GPUs.
    code = (
        "import json, warnings\n"
        "import tensorflow as tf\n"
        "from edgebatch.sensors import enable_memory_growth\n"
        "names = enable_memory_growth()\n"
        "gpus = tf.config.list_physical_devices('GPU')\n"
        "print(json.dumps([names, [tf.config.experimental.get_memory_growth(g) for g in gpus]]))\n"
        "tf.ones((4,))\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    again = enable_memory_growth()\n"  # initialised now, growth already on: same names, no warning
        "print(json.dumps([again, len(caught)]))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    env.pop("TF_FORCE_GPU_ALLOW_GROWTH", None)
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    first, second = result.stdout.strip().splitlines()[-2:]
    names, growth = json.loads(first)
    if not names:
        pytest.skip("NVML sees a GPU but this TensorFlow build does not (no CUDA libraries?)")
    assert names == [f"GPU:{i}" for i in range(len(growth))]
    assert all(growth)
    assert json.loads(second) == [names, 0]


def test_describe_devices_with_tensorflow_is_json_and_readable():
    import tensorflow as tf

    from edgebatch.sensors import describe_devices, format_devices_text

    info = describe_devices(include_tensorflow=True)
    json.dumps(info)
    assert info["tensorflow"]["version"] == tf.__version__
    assert info["tensorflow"]["gpu_devices"] == [
        device.name.replace("/physical_device:", "") for device in tf.config.list_physical_devices("GPU")
    ]
    assert info["cpu"]["ram_total_bytes"] >= info["cpu"]["ram_available_bytes"] > 0
    assert info["cpu"]["cores_logical"] >= 1
    assert tf.__version__ in format_devices_text(info)
