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
temporary name (carrying the writer's pid: a killed writer's leftover is
removed by ``layerbank.cache.leftovers``), fsynced and ``os.replace``d, so a
crash never leaves a half file under the final name.

Beside it, ``<hash>.onnx.json`` records what it was exported from and what
it is: the model fingerprint, a sha256 over the torch weights (names,
dtypes, shapes, bytes), the library versions and opset, and the sha256 and
size of the .onnx file, itself under a checksum. Every open verifies the
chain: the record is whole, it names this model and these exact weights,
and the file hashes to what it records. So one flipped bit anywhere in the
graph (issue 25: in the word-embedding row of "film", which a check on
token ids 1-8 never reached) or another model's valid export under this
name is found before any row is computed, named in one WARNING line, and
exported again. Then one padded batch, and a batch of ids spread over the
whole vocabulary, run through both engines, and the hidden states must
agree within ``TOLERANCE`` (relative to the largest value) on the real
tokens, or the engine refuses (``EngineMismatch``) and the encoder stays on
torch: no row of an engine that failed its check is ever stored. fp32 only:
bf16 and fp16 run on torch.

Example::

    engine = OnnxEngine.open(model, fingerprint, cache_dir="layerbank-data")
    states = engine.hidden_states(ids, mask)   # tuple of [n, t, d] float32 tensors
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from ..measured import temp_name

__all__ = ["TOLERANCE", "EngineMismatch", "OnnxEngine", "export_path", "record_path", "temp_name"]

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


def record_path(path: Path) -> Path:
    """The record of what the export at ``path`` was made from and what its bytes hash to."""
    return path.with_name(path.name + ".json")


def weights_sha256(model: Any) -> str:
    """sha256 over the model's weights: every tensor's name, dtype, shape and bytes, in name order."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        a = t.detach().cpu().contiguous()
        h.update(f"{name}|{a.dtype}|{tuple(a.shape)}\0".encode())
        h.update(a.view(torch.uint8).numpy() if a.numel() else b"")
    return h.hexdigest()


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _source(model: Any, fingerprint: str) -> dict[str, str]:
    """What an export is made from: the model, its exact weights, the exporter."""
    import transformers

    return {"model_fingerprint": fingerprint, "weights_sha256": weights_sha256(model),
            "torch": torch.__version__, "transformers": transformers.__version__, "opset": str(OPSET)}


def _digest(payload: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _problem(path: Path, source: dict[str, str]) -> str | None:
    """Why the export at ``path`` cannot be trusted for ``source``; None when it can."""
    try:
        doc = json.loads(record_path(path).read_bytes().decode("utf-8"))
    except FileNotFoundError:
        return f"has no record {record_path(path).name} of what it was exported from"
    except (OSError, ValueError) as e:  # unreadable, not UTF-8, not JSON
        return f"has an unreadable record {record_path(path).name} ({e})"
    payload = doc.get("payload") if isinstance(doc, dict) else None
    if not isinstance(payload, dict) or doc.get("sha256") != _digest(payload):
        return f"has a record {record_path(path).name} that fails its checksum"
    for k, want in source.items():
        if payload.get(k) != want:
            return f"was exported from {k} {payload.get(k)!r}, not this model's {want!r}"
    try:
        size = path.stat().st_size
    except OSError as e:
        return f"cannot be read ({e})"
    if size != payload.get("file_bytes"):
        return f"is {size} bytes, not the {payload.get('file_bytes')} it was written with"
    if (got := _file_sha256(path)) != payload.get("file_sha256"):
        return f"fails its sha256 checksum ({got[:16]}..., written as {str(payload.get('file_sha256'))[:16]}...)"
    return None


def _write_fsynced(path: Path, write: Any) -> Path:
    """``write(tmp_path)`` under a temporary name in ``path``'s directory, fsynced; the temp's path."""
    tmp = path.parent / temp_name(path)
    write(tmp)
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return tmp


def _vocab_sample(model: Any, n: int = 256, width: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """Up to ``n`` token ids evenly spread over the vocabulary (first and last included), in rows
    of ``width``: a numeric check that reaches beyond the first few embedding rows."""
    vocab = int(getattr(model.config, "vocab_size", 1000))
    ids = torch.linspace(0, vocab - 1, steps=min(n, vocab)).round().to(torch.int64)
    ids = torch.cat([ids, ids[: (-len(ids)) % width]]).reshape(-1, width)
    return ids, torch.ones_like(ids)


def export(model: Any, path: Path, source: dict[str, str] | None = None) -> None:
    """Write the model's graph to ``path`` and its record beside it (atomically: temp files,
    fsync, os.replace). ``source``: what the record says it was made from (``_source``)."""
    n_states = int(model.config.num_hidden_layers) + 1
    names = [f"hidden_state_{i}" for i in range(n_states)]
    axes = {name: {0: "batch", 1: "tokens"} for name in ["input_ids", "attention_mask", *names]}
    path.parent.mkdir(parents=True, exist_ok=True)
    temps: list[Path] = []

    def graph(tmp: Path) -> None:
        temps.append(tmp)
        with _eager_attention(model), warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # tracer notes on Python-side checks, all about shapes
            torch.onnx.export(_AllHiddenStates(model), _example(model), os.fspath(tmp),
                              input_names=["input_ids", "attention_mask"], output_names=names,
                              dynamic_axes=axes, opset_version=OPSET, dynamo=False)

    try:
        tmp = _write_fsynced(path, graph)
        payload = {**(source or {}), "file_sha256": _file_sha256(tmp), "file_bytes": tmp.stat().st_size}
        body = json.dumps({"payload": payload, "sha256": _digest(payload)}, indent=1)

        def record(rtmp: Path) -> None:
            temps.append(rtmp)
            rtmp.write_text(body, encoding="utf-8")

        rtmp = _write_fsynced(record_path(path), record)
        os.replace(tmp, path)
        os.replace(rtmp, record_path(path))  # a crash between the two: the old record fails the new file
    except BaseException:
        for t in temps:
            t.unlink(missing_ok=True)
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
        source = _source(model, fingerprint)
        session = None
        if path.exists():
            problem = _problem(path, source)
            if problem is None:
                try:
                    session = _session(path, threads)
                except Exception as e:  # noqa: BLE001 - ONNX Runtime raises its own types for bad files
                    problem = f"cannot be opened ({e})"
            if problem is not None:
                log.warning("cached ONNX export %s %s; exporting again", path, problem)
        if session is None:
            log.info("exporting %s to ONNX (once; cached at %s)", fingerprint, path)
            export(model, path, source)
            session = _session(path, threads)
        engine = cls(session, path)
        engine.check_against(model)
        return engine

    def hidden_states(self, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Every hidden state h_0..h_L of the batch, [n, t, d] float32 on the CPU."""
        outs = self.session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
        return tuple(torch.from_numpy(o) for o in outs)

    def check_against(self, model: Any) -> float:
        """Largest relative difference to torch on one padded batch and on ids spread over the
        whole vocabulary; EngineMismatch past TOLERANCE, or when the graph cannot run them."""
        worst = 0.0
        for ids, mask in (_example(model), _vocab_sample(model)):
            with torch.inference_mode():
                want = model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
            try:
                got = self.hidden_states(ids, mask)
            except Exception as e:  # ONNX Runtime's own errors: a graph of other shapes
                raise EngineMismatch(f"ONNX export {self.path} cannot run this model's inputs ({e})") from e
            if len(got) != len(want) or any(g.shape != w.shape for g, w in zip(got, want)):
                raise EngineMismatch(f"ONNX export {self.path} gives other shapes than torch")
            real = mask.bool()
            for w, g in zip(want, got):
                w_real, g_real = w[real].float(), g[real]
                scale = float(w_real.abs().max()) or 1.0
                worst = max(worst, float((w_real - g_real).abs().max()) / scale)
        if not worst <= TOLERANCE:
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
