"""A node's profile as one line of text (``hetero-ray profile`` and a run's profiling print it)."""

from __future__ import annotations

from typing import Optional

from hetero_ray.profiling.capability import CPU, FAILED, LINUX, NodeCapability


def describe_node(capability: NodeCapability, elapsed_s: Optional[float] = None, model: Optional[str] = None) -> str:
    """One line: ``node 1a2b3c4d (10.0.0.5): cpu 0.21 TFLOPS fp32, 8.4 GB/s, simple_cnn α=… (4.2 s)``;
    a platform other than plain Linux follows the address (``(10.0.0.7, wsl2)``)."""
    where = ", ".join(filter(None, [capability.ip or "?", None if capability.platform in (None, LINUX)
                                    else capability.platform]))
    head = f"node {capability.node_id[:8]} ({where})"
    took = f" ({elapsed_s:.1f} s)" if elapsed_s is not None else ""
    parts = []
    for device in capability.devices:
        label = "cpu" if device.kind == CPU else f"gpu{device.index} {device.name}"
        figures = [f"{device.matmul_tflops_fp32:.3g} TFLOPS fp32" if device.matmul_tflops_fp32 is not None else None,
                   f"{device.matmul_tflops_bf16:.3g} bf16" if device.matmul_tflops_bf16 is not None else None,
                   f"{device.memory_bandwidth_gbps:.3g} GB/s" if device.memory_bandwidth_gbps is not None else None,
                   f"h2d {device.h2d_gbps:.3g} GB/s" if device.h2d_gbps is not None else None]
        if device.has_probe:
            floor = f"floor {device.floor_s * 1e3:.3g} ms " if device.floor_s else ""
            figures.append(f"{model + ' ' if model else ''}{floor}α={device.alpha_s * 1e3:.2g} ms β={device.beta_s_per_sample * 1e3:.3g} ms/sample"
                           + (f" max batch {device.max_batch_size}" if device.max_batch_size is not None else ""))
        parts.append(f"{label} " + ", ".join(f for f in figures if f))
    body = "; ".join(parts)
    if capability.status == FAILED:
        return f"{head}: FAILED: {capability.error}" + (f" [{body}]" if body else "") + took
    return f"{head}: {body}{took}"
