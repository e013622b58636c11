"""``--engine auto`` and ``--precision auto`` on a CPU: time the candidates, keep the faster.

Both run once per machine, model and library versions (the decision is
stored in the data directory, workers/measured.py), on batches shaped like
the model's own work: random token ids at two lengths within the model's
maximum, one row of each padded, encoded through the real path (forward
pass and pooling), in alternating rounds.

1. Engine (fp32): torch against ONNX Runtime. ONNX is kept when it ran at
   least ``ENGINE_MARGIN`` faster; its numbers are checked against torch's
   when it opens, or taken from the record of that check for the same files,
   graph and libraries (engines/onnx.py), so this is a choice of speed only.
2. Precision (``auto`` only): fp32 on the engine chosen in 1 against torch
   bf16. bf16 is kept when it ran at least ``BF16_MARGIN`` faster *and* its
   pooled rows on the same batches stay within the documented tolerance
   (max relative L2 difference ``BF16_MAX_REL_L2``, docs/precision.md);
   otherwise fp32. The flags a CPU reports do not decide: bf16 measured
   0.68x fp32 on one AVX-512 BF16 VM and 2.2-3.5x on another.

Example::

    enc = apply_choices(enc, engine="auto", precision="auto", data_dir="layerbank-data")
    enc.info["engine_choice"]    # {'chosen': 'onnx', 'measured_ratio': 2.04, ...}
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ..measured import Measured, cpu_model, measured_choice, stored_choice, time_alternating
from ..model_source import ModelLoadError

# the encoder imports this module to apply the choices at load, so it is typed
# here as Any rather than imported (no import cycle)
Encoder = Any

__all__ = ["BF16_MARGIN", "BF16_MAX_REL_L2", "ENGINE_MARGIN", "apply_choices", "choose_engine",
           "choose_precision", "pick_engine", "pick_precision", "stored_onnx_choices"]

log = logging.getLogger("layerbank.engines")

ENGINE_MARGIN = 1.05  # same numbers either way: a small margin only so noise does not flip it
BF16_MARGIN = 1.10  # bf16 changes the numbers (and so the keys): worth it only for a clear gain
BF16_MAX_REL_L2 = 0.02  # docs/precision.md, "Tolerance"


def pick_engine(figures: dict[str, float]) -> tuple[str, float]:
    ratio = figures["torch"] / figures["onnx"]
    return ("onnx" if ratio >= ENGINE_MARGIN else "torch"), ratio


def pick_precision(figures: dict[str, float]) -> tuple[str, float]:
    ratio = figures["fp32"] / figures["bf16"]
    keeps_accuracy = figures.get("bf16_max_rel_l2", 0.0) <= BF16_MAX_REL_L2
    return ("bf16" if ratio >= BF16_MARGIN and keeps_accuracy else "fp32"), ratio


def sample_batches(enc: Encoder, seed: int = 0) -> list[Any]:
    """Two tokenized batches of about 512 tokens each, at a short and a long length the model takes.

    Texts are decoded from random vocabulary ids and tokenized as any text
    is, so special tokens and lengths are the model's own.
    """
    rng = np.random.default_rng(seed)
    vocab = int(getattr(enc.model.config, "vocab_size", 1000))
    max_len = int(enc.config.max_length or 512)
    batches = []
    for length in (min(32, max_len), min(128, max_len)):
        n = max(2, 512 // length)
        sizes = [max(2, length - 2)] * (n - 1) + [max(2, (length - 2) * 3 // 4)]  # one padded row
        texts = [enc.tokenizer.decode(rng.integers(1000 if vocab > 2000 else 1, vocab, size=k).tolist())
                 for k in sizes]
        batches.append(enc.tokenize(texts))
    return batches


def _encode_all(enc: Encoder, batches: list[Any]) -> Callable[[], list[np.ndarray]]:
    return lambda: [enc.encode(b).pooled[enc.poolings[0]] for b in batches]


def _machine(enc: Encoder, **extra: str) -> dict[str, str]:
    return _machine_key(enc.fingerprint, enc.config.max_length, **extra)


def _machine_key(fingerprint: str, max_length: int | None, **extra: str) -> dict[str, str]:
    """What a stored decision is for: this CPU, these libraries and threads, this model and length."""
    return {"cpu": cpu_model(), "torch": torch.__version__, "threads": str(torch.get_num_threads()),
            "model": fingerprint, "max_length": str(max_length), **extra}


_ENGINE_REASON = "measured: onnx / torch speed"
_PRECISION_REASON = "measured: bf16 / fp32 speed"


def stored_onnx_choices(fingerprint: str, max_length: int | None, precision_modes: dict[str, str], *,
                        engine: str, precision: str,
                        data_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """What ``apply_choices`` would add to the info of an encoder that ends on ONNX at fp32,
    read from the decisions stored in ``data_dir``; None unless the settings and those
    decisions both lead there (engine onnx, or auto stored as onnx; precision fp32, or
    auto stored as fp32). Measures nothing (workers/quick_start.py)."""
    import onnxruntime as ort

    info: dict[str, Any] = {"engine": "onnx"}
    if engine == "onnx":
        info["engine_choice"] = {"chosen": "onnx", "reason": "asked for"}
    elif engine == "auto":
        found = stored_choice(data_dir, "engine", _machine_key(fingerprint, max_length,
                                                                onnxruntime=ort.__version__))
        if found is None or found.choice != "onnx":
            return None
        info["engine_choice"] = {**found.as_info(), "reason": _ENGINE_REASON}
    else:
        return None
    if precision == "auto":
        found = stored_choice(data_dir, "precision", _machine_key(fingerprint, max_length, fp32_engine="onnx"))
        if found is None or found.choice != "fp32":
            return None
        info["precision_choice"] = {**found.as_info(), "reason": _PRECISION_REASON}
        info["precision_modes"] = {**precision_modes, "auto": "fp32"}
    return info


def choose_engine(enc: Encoder, data_dir: str | os.PathLike[str] | None,
                  measure: Callable[[], dict[str, float]] | None = None) -> tuple[Encoder, Measured]:
    """``enc`` on ONNX Runtime or torch, whichever measured faster (fp32 on a CPU).

    With a stored decision for torch, ONNX Runtime is not even opened.
    """
    import onnxruntime as ort

    from .onnx import OnnxEngine

    @functools.cache
    def onnx_enc() -> Encoder:
        return dataclasses.replace(enc, engine=OnnxEngine.open(enc.torch_model(), enc.fingerprint, data_dir,
                                                               facts=enc.torch_facts()))

    def timed() -> dict[str, float]:
        batches = sample_batches(enc)
        return time_alternating({"torch": _encode_all(enc, batches), "onnx": _encode_all(onnx_enc(), batches)})

    found = measured_choice(data_dir, "engine", _machine(enc, onnxruntime=ort.__version__),
                            measure or timed, pick_engine)
    return (onnx_enc() if found.choice == "onnx" else enc), found


def choose_precision(enc: Encoder, data_dir: str | os.PathLike[str] | None,
                     measure: Callable[[], dict[str, float]] | None = None) -> Measured:
    """fp32 (on ``enc``'s engine) or bf16, by measurement; ``enc`` computes in fp32."""

    def timed() -> dict[str, float]:
        bf16, batches = enc.with_precision("bf16"), sample_batches(enc)
        fp32_rows, bf16_rows = _encode_all(enc, batches)(), _encode_all(bf16, batches)()
        worst = max(float((np.linalg.norm(b - a, axis=-1) / np.maximum(np.linalg.norm(a, axis=-1), 1e-12)).max())
                    for a, b in zip(fp32_rows, bf16_rows))
        figures = time_alternating({"fp32": _encode_all(enc, batches), "bf16": _encode_all(bf16, batches)})
        return {**figures, "bf16_max_rel_l2": worst}

    engine = getattr(enc.engine, "name", "torch")
    return measured_choice(data_dir, "precision", _machine(enc, fp32_engine=engine), measure or timed,
                           pick_precision)


def apply_choices(enc: Encoder, *, engine: str, precision: str,
                  data_dir: str | os.PathLike[str] | None) -> Encoder:
    """The encoder with the engine and precision the settings ask for, measured where they say auto.

    Off the CPU, or at a precision other than fp32, the engine is torch.
    An ONNX engine that cannot be used (onnxruntime missing, export failed,
    numbers differ) falls back to torch with a warning when ``engine`` is
    auto, and raises ``ModelLoadError`` (one line; the worker stops rather
    than restarting into the same failure) when it is ``onnx``.
    """
    info: dict[str, Any] = {"engine": "torch"}
    on_cpu_fp32 = enc.device.type == "cpu" and enc.config.precision == "fp32"
    if engine != "torch" and on_cpu_fp32:
        try:
            if engine == "onnx":
                from .onnx import OnnxEngine

                enc = dataclasses.replace(enc, engine=OnnxEngine.open(enc.torch_model(), enc.fingerprint,
                                                                      data_dir, facts=enc.torch_facts()))
                info["engine_choice"] = {"chosen": "onnx", "reason": "asked for"}
            else:
                enc, found = choose_engine(enc, data_dir)
                info["engine_choice"] = {**found.as_info(), "reason": _ENGINE_REASON}
        except Exception as e:  # noqa: BLE001 - any failure of the optional engine leaves torch
            if engine == "onnx":  # asked for: one line that stops the worker, not a restart loop
                raise ModelLoadError(f"--engine onnx cannot be used for {enc.name!r}: {e}") from e
            log.warning("engine auto: ONNX Runtime not used (%s); running torch", e)
            info["engine_choice"] = {"chosen": "torch", "reason": f"onnx unavailable: {e}"}
        info["engine"] = getattr(enc.engine, "name", "torch")
    if precision == "auto" and on_cpu_fp32:
        found = choose_precision(enc, data_dir)
        info["precision_choice"] = {**found.as_info(), "reason": _PRECISION_REASON}
        if found.choice != "fp32":
            enc = enc.with_precision(found.choice)
            info["engine"] = "torch"
        modes = dict(enc.info.get("precision_modes", {}))
        modes["auto"] = found.choice
        info["precision_modes"] = modes
    enc.info.update(info)
    log.info("%s", choices_line(enc.info))
    return enc


def choices_line(info: dict[str, Any]) -> str:
    """One line for the CLI: engine and precision, and the measured ratio behind each."""
    parts = [f"engine {info.get('engine', 'torch')}"]
    if (e := info.get("engine_choice")) and "measured_ratio" in e:
        parts[-1] += f" (onnx ran {e['measured_ratio']:.2f}x torch{', stored' if e.get('reused') else ''})"
    parts.append(f"precision {info.get('precision', 'fp32')}")
    if (p := info.get("precision_choice")) and "measured_ratio" in p:
        parts[-1] += f" (bf16 ran {p['measured_ratio']:.2f}x fp32{', stored' if p.get('reused') else ''})"
    return ", ".join(parts)
