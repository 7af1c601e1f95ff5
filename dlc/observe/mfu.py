"""Model FLOPs utilisation: the FLOPs a learner's tokens cost the model, over its devices' peak.

FLOPs per token (PaLM, arXiv 2204.02311, appendix B): 6 N for the matmuls of the forward and
backward passes, N every parameter (a tied embedding counted once), plus 12 L D T for attention's
scores and weighted sums over a window of T tokens (L blocks of width D), counted whole though the
mask is causal, as PaLM and nanoGPT count it. What a step does beyond the model (the optimizer, a
recomputed block under `model.remat`) is not model FLOPs.

The peak is the device's dense tensor-core figure for the compute dtype from its vendor's data sheet:
bfloat16 for `compute_dtype: bfloat16`; for float32, TF32 on NVIDIA GPUs (JAX's default precision
computes float32 matmuls with TF32 there) and none on TPUs. A CPU, or a device not in the table,
has no MFU: unknown, rather than a guess.
"""

from __future__ import annotations

import re

from dlc.config.workload import ModelConfig

TERA = 1e12

# (pattern of jax's device_kind, {dtype: dense peak TFLOP/s}); the first that matches wins.
PEAK_TFLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    (r"H100.*PCIe", {"bfloat16": 756.0, "float32": 378.0}),
    (r"H100|H200|GH200", {"bfloat16": 989.5, "float32": 494.7}),  # SXM; the H200 has the H100's compute
    (r"A100", {"bfloat16": 312.0, "float32": 156.0}),
    (r"\bL4\b", {"bfloat16": 121.0, "float32": 60.0}),
    (r"TPU v5 ?lite|TPU v5e", {"bfloat16": 197.0}),
    (r"TPU v5p|TPU v5$", {"bfloat16": 459.0}),
    (r"TPU v6 ?lite|TPU v6e", {"bfloat16": 918.0}),
)


def peak_flops(device_kind: str | None, dtype: str) -> float | None:
    """A device's dense peak in FLOP/s for `dtype`, or None (a CPU, an unknown device, no figure)."""
    if not device_kind:
        return None
    for pattern, peaks in PEAK_TFLOPS:
        if re.search(pattern, device_kind):
            tflops = peaks.get(dtype)
            return None if tflops is None else tflops * TERA
    return None


def flops_per_token(model: ModelConfig, seq_len: int) -> float:
    """Model FLOPs of training on one token: 6 N + 12 L D T."""
    from dlc.core.abstract import param_count

    return 6.0 * param_count(model) + 12.0 * model.num_layers * model.width * seq_len


def mfu(tokens_per_s: float, flops_token: float, peak: float | None, devices: int = 1) -> float | None:
    """The fraction of `devices` devices' peak that `tokens_per_s` uses, or None where the peak is unknown."""
    if peak is None or devices < 1:
        return None
    return tokens_per_s * flops_token / (peak * devices)
