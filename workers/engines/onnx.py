"""The ONNX Runtime engine: the same weights, exported once, run by a faster CPU library.

Issue 18 measured on the 2-core development VM: 81% of extraction time is
torch's fp32 matrix product (MKL, 112 GFLOP/s per core there) against 341
GFLOP/s on 2 threads for ONNX Runtime, and layerbank's batches through ONNX
Runtime ran 2.04x faster with pooled outputs within 6e-6 of torch.

The model is exported at first use with ``torch.onnx.export`` (the
TorchScript exporter: dynamic batch and sequence axes, every hidden state an
output) and cached as ``<data_dir>/engines/onnx/<hash>.onnx``, the hash over
the model fingerprint and the torch, transformers and exporter versions: a
changed weight file or library exports again. The export is written to a
temporary name and ``os.replace``d, so a crash never leaves a half file under
the final name; a final file that ONNX Runtime cannot open is exported again.

Every time a session opens, one padded batch runs through both engines and
the hidden states must agree within ``TOLERANCE`` (relative to the largest
value) on the real tokens, or the engine refuses (``EngineMismatch``) and the
encoder stays on torch. fp32 only: bf16 and fp16 run on torch.

Example::

    engine = OnnxEngine.open(model, fingerprint, cache_dir="layerbank-data")
    states = engine.hidden_states(ids, mask)   # tuple of [n, t, d] float32 tensors
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["EngineMismatch", "OnnxEngine", "TOLERANCE", "export_path"]

log = logging.getLogger("layerbank.engines")

TOLERANCE = 1e-4  # relative to the layer's largest value: the promise of docs/decisions.md
OPSET = 17  # LayerNormalization as one op; ONNX Runtime fuses it


class EngineMismatch(RuntimeError):
    """The exported graph gives other numbers than torch: not used."""


class _AllHiddenStates(torch.nn.Module):
    """(input_ids, attention_mask) -> every hidden state, as the exporter wants a tuple."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model
        # the exporter restores the wrapper's training flag on the whole tree when it
        # is done: a wrapper left in training mode would switch dropout on in the model
        self.eval()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
        return tuple(out.hidden_states)


def export_path(cache_dir: str | os.PathLike[str], fingerprint: str) -> Path:
    """Where the export of this model (and these library versions) is kept."""
    import transformers

    parts = "|".join([fingerprint, torch.__version__, transformers.__version__, f"opset{OPSET}"])
    digest = hashlib.sha256(parts.encode()).hexdigest()[:20]
    return Path(cache_dir) / "engines" / "onnx" / f"{digest}.onnx"


@contextlib.contextmanager
def _eager_attention(model: Any) -> Iterator[None]:
    """Trace plain (eager) attention: SDPA's Python-side checks on the mask trace as constants."""
    cfg = getattr(model, "config", None)
    old = getattr(cfg, "_attn_implementation", None)
    if cfg is None or old is None:
        yield
        return
    try:
        cfg._attn_implementation = "eager"
        yield
    finally:
        cfg._attn_implementation = old


def _example(model: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Two rows, the second padded, so the exporter traces the mask's path."""
    vocab = int(getattr(model.config, "vocab_size", 1000))
    ids = torch.arange(8, dtype=torch.int64).repeat(2, 1) % max(vocab - 1, 1) + 1
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    return ids, mask


def export(model: Any, path: Path) -> None:
    """Write the model's graph to ``path`` (atomically: temp file, then os.replace)."""
    n_states = int(model.config.num_hidden_layers) + 1
    names = [f"hidden_state_{i}" for i in range(n_states)]
    axes = {name: {0: "batch", 1: "tokens"} for name in ["input_ids", "attention_mask", *names]}
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    os.close(fd)
    try:
        with _eager_attention(model), warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # tracer notes on Python-side checks, all about shapes
            torch.onnx.export(_AllHiddenStates(model), _example(model), tmp,
                              input_names=["input_ids", "attention_mask"], output_names=names,
                              dynamic_axes=axes, opset_version=OPSET, dynamo=False)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class OnnxEngine:
    """An ONNX Runtime session over one model's export; ``hidden_states`` as the torch model gives them."""

    name = "onnx"

    def __init__(self, session: Any, path: Path) -> None:
        self.session = session
        self.path = path

    @classmethod
    def open(cls, model: Any, fingerprint: str, cache_dir: str | os.PathLike[str] | None,
             threads: int | None = None) -> OnnxEngine:
        """Export (or reuse the cached export), open a session, check it against torch.

        ``cache_dir`` None: export into a temporary directory, removed once the
        session has read it (nothing kept). ``threads``: ONNX Runtime's
        intra-op threads (default: torch's). Raises EngineMismatch when the
        numbers differ beyond TOLERANCE.
        """
        if cache_dir is None:
            with tempfile.TemporaryDirectory(prefix="layerbank-onnx-") as tmp:
                return cls.open(model, fingerprint, tmp, threads)
        path = export_path(cache_dir, fingerprint)
        session = None
        if path.exists():
            try:
                session = _session(path, threads)
            except Exception as e:  # noqa: BLE001 - ONNX Runtime raises its own types for bad files
                log.warning("cached ONNX export %s cannot be opened (%s); exporting again", path, e)
        if session is None:
            log.info("exporting %s to ONNX (once; cached at %s)", fingerprint, path)
            export(model, path)
            session = _session(path, threads)
        engine = cls(session, path)
        engine.check_against(model)
        return engine

    def hidden_states(self, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Every hidden state h_0..h_L of the batch, [n, t, d] float32 on the CPU."""
        outs = self.session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
        return tuple(torch.from_numpy(o) for o in outs)

    def check_against(self, model: Any) -> float:
        """Largest relative difference to torch on one padded batch; EngineMismatch past TOLERANCE."""
        ids, mask = _example(model)
        with torch.inference_mode():
            want = model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
        got = self.hidden_states(ids, mask)
        real = mask.bool()
        worst = 0.0
        for w, g in zip(want, got):
            w_real, g_real = w[real].float(), g[real]
            scale = float(w_real.abs().max()) or 1.0
            worst = max(worst, float((w_real - g_real).abs().max()) / scale)
        if len(got) != len(want) or not worst <= TOLERANCE:
            raise EngineMismatch(f"ONNX export {self.path} differs from torch by {worst:.2e} "
                                 f"relative (allowed {TOLERANCE:.0e})")
        return worst


def _session(path: Path, threads: int | None) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = int(threads or torch.get_num_threads())
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.log_severity_level = 3  # warnings about unused initializers are not the user's concern
    # idle threads sleep rather than spin, as OMP_WAIT_POLICY=PASSIVE makes torch's do
    # (workers/__init__.py): on shared cores a spinning thread takes its partner's CPU
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(os.fspath(path), opts, providers=["CPUExecutionProvider"])


def onnx_versions() -> dict[str, str]:
    """The library versions an engine timing depends on."""
    import onnxruntime as ort

    return {"torch": torch.__version__, "onnxruntime": ort.__version__, "numpy": np.__version__}
