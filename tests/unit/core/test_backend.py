"""The device a process starts on, and the one-line fix when JAX cannot start there."""

import jax
import pytest

from dlc.core.allocator import allocator
from dlc.core.backend import BackendError, device_label, start_backend


def test_a_cpu_process_reports_its_device():
    device = start_backend("cpu", keep_memory=False)  # this test process's allocator stays as it is
    assert device == {"platform": "cpu", "device_kind": "cpu", "device": "cpu", "allocator": allocator()}


def test_a_process_that_reserved_a_gpu_but_got_cpu_says_how_to_fix_it():
    # This machine's JAX has no GPU backend: what a learner with num_gpus > 0 meets without the CUDA plugin.
    with pytest.raises(BackendError) as err:
        start_backend("gpu", "eval.num_gpus")
    assert str(err.value) == (
        "it reserved a GPU but JAX started on cpu (cpu); install JAX's CUDA plugin for your jax on every node "
        "(pip install -e '.[cuda]', or '.[cuda13]' for CUDA 13 drivers), or set eval.num_gpus=0 to run on CPU"
    )


def test_a_backend_that_fails_to_start_is_one_line_with_its_first_line_and_the_fix(monkeypatch):
    def out_of_memory() -> None:
        raise RuntimeError(
            "Unable to initialize backend 'cuda': INTERNAL: no supported devices found for platform CUDA: "
            "CUDA_ERROR_OUT_OF_MEMORY: out of memory\nsecond line of the plugin's log"
        )

    monkeypatch.setattr(jax, "devices", out_of_memory)
    with pytest.raises(BackendError) as err:
        start_backend("gpu")
    message = str(err.value)
    assert "\n" not in message and "second line" not in message
    assert message.startswith("JAX could not start on its gpu: Unable to initialize backend 'cuda': ")
    assert message.endswith(
        "CUDA_ERROR_OUT_OF_MEMORY: out of memory; the GPU's memory is taken: raise learners.num_gpus so fewer "
        "processes share a GPU, or stop what else holds the GPU's memory"
    )
    assert device_label("gpu", "NVIDIA H100 80GB HBM3") == "gpu: NVIDIA H100 80GB HBM3"
    assert device_label("cpu", "cpu") == "cpu"
