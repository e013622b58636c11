"""Precision modes: which dtype the encoder computes in.

- ``fp32``: plain float32, the numbers a plain run gives. Default on CPU.
- ``bf16``: bfloat16 autocast. Fast on GPUs and on CPUs with AMX or
  AVX-512 BF16; about 3 significant digits, so stored vectors differ from
  fp32 by ~1e-2 relative (see docs/precision.md).
- ``fp16``: float16 autocast, CUDA only.
- ``auto``: bf16 on CUDA and on CPUs that report AMX or AVX-512 BF16, fp32
  otherwise. ``default`` means fp32 on CPU and auto on CUDA.

The resolved mode is part of the extraction config and so of every cache
key: bf16 features never answer a request for fp32 ones.
"""

from __future__ import annotations

from pathlib import Path

import torch

__all__ = ["resolve_precision", "autocast_dtype", "cpu_has_fast_bf16", "PRECISION_CHOICES"]

PRECISION_CHOICES = ("default", "auto", "fp32", "bf16", "fp16")
_FAST_BF16_FLAGS = {"amx_bf16", "avx512_bf16"}


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_has_fast_bf16(flags: set[str] | None = None) -> bool:
    """True when the CPU reports AMX-BF16 or AVX-512 BF16 instructions."""
    return bool(_FAST_BF16_FLAGS & (_cpu_flags() if flags is None else flags))


def resolve_precision(precision: str, device: torch.device | str,
                      cpu_flags: set[str] | None = None) -> str:
    """Turn a requested mode into one of fp32, bf16, fp16 for this device."""
    dev = torch.device(device)
    if precision not in PRECISION_CHOICES:
        raise ValueError(f"precision must be one of {', '.join(PRECISION_CHOICES)}, got {precision!r}")
    if precision == "default":
        precision = "auto" if dev.type == "cuda" else "fp32"
    if precision == "auto":
        if dev.type == "cuda":
            return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        return "bf16" if cpu_has_fast_bf16(cpu_flags) else "fp32"
    if precision == "fp16" and dev.type != "cuda":
        raise ValueError("precision fp16 needs a CUDA device; on CPU use bf16 or fp32")
    return precision


def autocast_dtype(precision: str) -> torch.dtype | None:
    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
