"""Starting JAX's backend on the device a process was placed on, or saying in one line how to fix it."""

from __future__ import annotations

from dlc.core.allocator import allocator, keep_freed_memory
from dlc.core.threads import cpus_seen


class BackendError(Exception):
    """JAX could not start on the device this process was placed on; the message is one line with the fix."""


def device_label(platform: str, device_kind: str) -> str:
    """How a device is shown: 'gpu: NVIDIA H100 80GB HBM3', 'cpu'."""
    return platform if device_kind.lower() == platform else f"{platform}: {device_kind}"


def backend_fix(error: str, share_field: str = "learners.num_gpus") -> str:
    """What to do about a GPU backend that failed to start, from its error message."""
    if "OUT_OF_MEMORY" in error or "out of memory" in error.lower():
        return (
            f"the GPU's memory is taken: raise {share_field} so fewer processes share a GPU, or stop what else "
            "holds the GPU's memory"
        )
    return (
        "install JAX's CUDA plugin for your jax on every node (pip install -e '.[cuda]', or '.[cuda13]' for "
        f"CUDA 13 drivers), or set {share_field}=0 to run on CPU"
    )


def start_backend(
    platform: str, share_field: str = "learners.num_gpus", cpu_threads: int | None = None, keep_memory: bool = True
) -> dict[str, str]:
    """Start JAX's backend in this process and check it is on `platform` (gpu or cpu).

    Returns the platform, the device kind, their label and what the allocator does with freed
    memory (`allocator`). Raises BackendError with the backend's own first line and the fix
    (naming `share_field`, the recipe field that asked for the GPU) when JAX fails to start, or
    starts elsewhere: JAX falls back to CPU when no GPU plugin is installed. On CPU,
    `cpu_threads` is how many threads XLA computes with (None: XLA's own, one per CPU). With
    `keep_memory` the process's allocator keeps what it frees from here on (`keep_freed_memory`).
    """
    import jax

    if keep_memory:
        keep_freed_memory()
    try:
        with cpus_seen(cpu_threads if platform == "cpu" else None):
            device = jax.devices()[0]
    except Exception as exc:  # RuntimeError from a plugin; anything else is as fatal here
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise BackendError(
            f"JAX could not start on its {platform}: {first}; {backend_fix(first, share_field)}"
        ) from None
    if device.platform != platform:
        wanted = "reserved a GPU" if platform == "gpu" else "reserved no GPU"
        raise BackendError(
            f"it {wanted} but JAX started on {device.platform} ({device.device_kind}); "
            + (backend_fix("", share_field) if platform == "gpu" else "unset JAX_PLATFORMS in the workers' environment")
        )
    return {
        "platform": device.platform,
        "device_kind": device.device_kind,
        "device": device_label(device.platform, device.device_kind),
        "allocator": allocator(),
    }
