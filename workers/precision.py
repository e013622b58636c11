"""Precision modes: which dtype the encoder computes in.

- ``fp32``: plain float32, the numbers a plain run gives. Default on CPU.
- ``bf16``: bfloat16 autocast: matrix products and attention in bfloat16,
  the residual stream and layer norms in float32. Fast on GPUs and on CPUs
  with AMX; on a CPU with AVX-512 BF16 alone it was measured *slower* than
  fp32 (docs/precision.md). bfloat16 keeps ~3 significant digits, so stored
  vectors differ from fp32 ones by about 1% (measured figures in the doc).
- ``fp16``: float16 autocast, CUDA only.
- ``auto``: bf16 on CUDA (fp16 on GPUs without bfloat16). On a CPU, what a
  short calibration measured on the machine at hand (workers/engines/choice.py:
  fp32 against bf16 on the model's own shapes, stored in the data directory),
  never the CPU's flags: on AVX-512 BF16 without AMX extraction measured
  0.37-0.78x fp32 on one VM and 2.2-3.5x on another (docs/precision.md).
  Until measured (no model at hand), fp32.
- ``default``: fp32 on CPU, auto on CUDA.

Under autocast, ``nn.Linear`` layers use a bfloat16 (float16) copy of their
weights made once (``cast_linear_weights_once``) rather than autocast's cast
of every weight in every forward pass: autocast caches its casts only for
weights that require gradients, and the encoder's are frozen. The numbers
are identical (autocast rounds the same weights the same way).

Pooling and the copy to the host run in float32 whatever the mode
(``layerbank.workers.encoder.pool_hidden_states``); rows are then stored at the storage
dtype. The resolved mode is part of the extraction config and so of every
cache key: bf16 features never answer a request for fp32 ones.

Example::

    >>> resolve_precision("auto", "cpu")                     # not measured yet: the plain numbers
    'fp32'
    >>> resolve_precision("auto", "cpu", measured="bf16")    # what the calibration found faster
    'bf16'
    >>> precision_table("cpu")["fp16"] is None              # fp16 needs CUDA
    True
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from layerbank.cache.keys import PRECISION_CHOICES  # the one list, torch-free, that the API and CLI read

__all__ = [
    "PRECISION_CHOICES",
    "autocast_dtype",
    "cast_linear_weights_once",
    "cpu_flags",
    "cpu_has_fast_bf16",
    "precision_table",
    "resolve_precision",
    "speed_warning",
]

# AMX only: AVX-512 BF16's dot products have no more throughput than float32
# FMAs on the CPUs measured, and the casts come on top (docs/precision.md)
_FAST_BF16_FLAGS = {"amx_bf16"}


def cpu_flags() -> set[str]:
    """The flags /proc/cpuinfo reports for the first CPU (empty off Linux)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_has_fast_bf16(flags: set[str] | None = None) -> bool:
    """True when the CPU reports AMX-BF16 (the tiles that make bfloat16 fast)."""
    return bool(_FAST_BF16_FLAGS & (cpu_flags() if flags is None else flags))


def resolve_precision(precision: str, device: torch.device | str, measured: str | None = None) -> str:
    """Turn a requested mode into one of fp32, bf16, fp16 for this device.

    ``measured``: what the calibration chose for ``auto`` on this CPU (None:
    not measured, fp32); the CPU's flags decide nothing. Raises ValueError
    for an unknown mode and for fp16 off CUDA.
    """
    dev = torch.device(device)
    if precision not in PRECISION_CHOICES:
        raise ValueError(f"precision must be one of {', '.join(PRECISION_CHOICES)}, got {precision!r}")
    if precision == "default":
        precision = "auto" if dev.type == "cuda" else "fp32"
    if precision == "auto":
        if dev.type == "cuda":
            return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        return measured if measured in ("fp32", "bf16") else "fp32"
    if precision == "fp16" and dev.type != "cuda":
        raise ValueError("precision fp16 needs a CUDA device; on CPU use bf16 or fp32")
    return precision


def speed_warning(precision: str, device: torch.device | str,
                  cpu_flags: set[str] | None = None) -> str | None:
    """What to tell a user who asked for bf16 on a CPU whose speed with it is unknown, or None.

    bf16 on CPUs without AMX ran at 0.37-0.68x fp32 on one VM and 2.2-3.5x on
    another (docs/precision.md): still a valid choice for its numbers, and
    ``auto`` measures which is faster here.
    """
    if precision == "bf16" and torch.device(device).type == "cpu" and not cpu_has_fast_bf16(cpu_flags):
        return ("precision bf16 on a CPU without AMX: extraction measured 0.37-0.68x the speed of "
                "fp32 on one such CPU and 2.2-3.5x on another (docs/precision.md); "
                "--precision auto measures which is faster here")
    return None


def precision_table(device: torch.device | str) -> dict[str, str | None]:
    """What every requestable mode resolves to on this device (None: not available).

    The worker publishes this with its model info, so that the API process
    (which never imports torch) can turn a request's ``precision`` into the
    extraction config, and so the cache key, without asking the worker.
    """
    table: dict[str, str | None] = {}
    for mode in PRECISION_CHOICES:
        try:
            table[mode] = resolve_precision(mode, device)
        except ValueError:
            table[mode] = None
    return table


def autocast_dtype(precision: str) -> torch.dtype | None:
    """The autocast dtype of a resolved mode; None for fp32 (no autocast)."""
    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


def cast_linear_weights_once(model: torch.nn.Module) -> None:
    """Let every ``nn.Linear`` of ``model`` run on a 16-bit copy of its weights under autocast.

    Idempotent. With gradients enabled, or outside autocast (an fp32 encoder sharing the same weights,
    in this thread or another: autocast state is per thread) the layer runs
    as before. The copy is made on first use per dtype and remade when the
    weights change (fine-tuning bumps their version). Measured on 1,000 AG
    News texts: docs/precision.md, "bf16 speed".
    """
    for mod in model.modules():
        if isinstance(mod, torch.nn.Linear) and not getattr(mod, "_layerbank_low_forward", False):
            mod.forward = types.MethodType(_linear_forward, mod)  # type: ignore[method-assign]  # bound per instance
            mod._layerbank_low_forward = True  # type: ignore[assignment]  # a flag, not a Tensor


def _linear_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    dev = x.device.type
    # only where nothing is recorded for backward: the copy is made inside inference mode
    if (torch.is_grad_enabled() or not torch.is_autocast_enabled(dev) or self.weight.dtype != torch.float32):
        return F.linear(x, self.weight, self.bias)
    dtype = torch.get_autocast_dtype(dev)
    w, b = self.weight, self.bias
    stamp = (dtype, w.data_ptr(), w._version, None if b is None else (b.data_ptr(), b._version))
    cache: dict[Any, Any] = self.__dict__.setdefault("_layerbank_low", {})
    got = cache.get(dtype)
    if got is None or got[0] != stamp:
        with torch.no_grad():
            got = (stamp, w.detach().to(dtype), None if b is None else b.detach().to(dtype))
        cache[dtype] = got
    return F.linear(x, got[1], got[2])  # autocast casts x; the weights are already in its dtype
