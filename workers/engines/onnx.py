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

A passed check is recorded beside the export (``<hash>.onnx.check.json``,
``check_path``, under its checksum): the ONNX Runtime version it ran with,
the graph's and the weights' sha256, and the model's facts from its torch
weights. A later start finds there everything the check and the torch model
gave it (``open_checked``, workers/quick_start.py): with the same files
(the fingerprint), the same graph (its sha256) and the same library
versions, the check would pass again, so that start serves on the export
before the weights are read. A new export removes the record.

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

__all__ = ["TOLERANCE", "EngineMismatch", "OnnxEngine", "check_path", "export_path", "record_path",
           "temp_name"]

log = logging.getLogger("layerbank.engines")

TOLERANCE = 1e-4  # relative to the layer's largest value: the promise of docs/decisions.md
OPSET = 17  # LayerNormalization as one op; ONNX Runtime fuses it


class _Outdated(ValueError):
    """A check record that is sound but not for this start (other versions), or an export
    whose own damage the usual path will name: not a WARNING of its own."""


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


def check_path(path: Path) -> Path:
    """The record of the numeric check the export at ``path`` passed, and of the model it
    stands for (what ``OnnxEngine.open_checked`` starts from without the torch model)."""
    return path.with_name(path.name + ".check.json")


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
    return {"model_fingerprint": fingerprint, "weights_sha256": weights_sha256(model), **_versions()}


def _versions() -> dict[str, str]:
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__, "opset": str(OPSET)}


def _digest(payload: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _problem(path: Path, source: dict[str, str]) -> str | None:
    """Why the export at ``path`` cannot be trusted for ``source``; None when it can."""
    try:
        payload = _read_signed(record_path(path), "record")
    except FileNotFoundError:
        return f"has no record {record_path(path).name} of what it was exported from"
    except ValueError as e:
        return str(e)
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


def _read_signed(path: Path, noun: str) -> dict[str, Any]:
    """The payload of a ``{"payload": ..., "sha256": ...}`` file; ValueError naming what is
    wrong (``noun``: what the file is called in that line). A missing file raises FileNotFoundError."""
    try:
        doc = json.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise
    except (OSError, ValueError) as e:  # unreadable, not UTF-8, not JSON
        raise ValueError(f"has an unreadable {noun} {path.name} ({e})") from None
    payload = doc.get("payload") if isinstance(doc, dict) else None
    if not isinstance(payload, dict) or doc.get("sha256") != _digest(payload):
        raise ValueError(f"has a {noun} {path.name} that fails its checksum")
    return payload


def _write_signed(path: Path, payload: dict[str, Any]) -> None:
    """``payload`` under its checksum at ``path``: temp file, fsync, os.replace."""
    body = json.dumps({"payload": payload, "sha256": _digest(payload)}, indent=1)
    tmp = _write_fsynced(path, lambda t: t.write_text(body, encoding="utf-8"))
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


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
        check_path(path).unlink(missing_ok=True)  # a new graph has passed no check yet
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
             threads: int | None = None, facts: dict[str, Any] | None = None) -> OnnxEngine:
        """Export (or reuse the cached export), open a session, check it against torch.

        ``cache_dir`` None: export into a temporary directory, removed once the
        session has read it (nothing kept). ``threads``: ONNX Runtime's
        intra-op threads (default: torch's). Raises EngineMismatch when the
        numbers differ beyond TOLERANCE. ``facts``: what the encoder knows of
        the model from its torch weights (sizes, layout); with them, a passed
        check is recorded beside the export (``check_path``) for
        ``open_checked``.
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
        worst = engine.check_against(model)
        if facts is not None:
            _record_check(path, source, worst, facts)
        return engine

    @classmethod
    def open_checked(cls, fingerprint: str, cache_dir: str | os.PathLike[str],
                     threads: int | None = None) -> tuple[OnnxEngine, dict[str, Any]] | None:
        """The engine on an export that passed its check against torch before, without the
        torch model; with the model's facts its check recorded. None when it cannot be
        trusted that way (why: one line at INFO, a damaged record at WARNING).

        What makes the earlier check hold now: the fingerprint is a sha256 of the
        model's files (a local directory: ``local:``; a hub name proves nothing of
        the bytes, so it never takes this path), the export record names the same
        fingerprint and weights, the graph still hashes to its record, and torch,
        transformers, the opset and ONNX Runtime are the versions the check ran with.
        """
        import onnxruntime as ort

        path = export_path(cache_dir, fingerprint)
        if not fingerprint.startswith("local:"):
            log.info("ONNX export of %s not started from its check: a hub name's fingerprint is not "
                     "a hash of its files", fingerprint)
            return None
        if not check_path(path).exists():
            return None  # never checked here (a first start): the caller exports and checks
        want = {"model_fingerprint": fingerprint, **_versions(), "onnxruntime": ort.__version__}
        try:
            check = _read_signed(check_path(path), "check record")
            for k, v in want.items():
                if check.get(k) != v:
                    raise _Outdated(f"was checked with {k} {check.get(k)!r}, not {v!r}")
            facts = check.get("facts")
            if not isinstance(facts, dict):
                raise ValueError(f"has a check record {check_path(path).name} without the model's facts")
            try:
                exported = _read_signed(record_path(path), "record")
            except (ValueError, FileNotFoundError) as e:  # the usual path names the export's own damage
                raise _Outdated(str(e)) from None
            for k in ("weights_sha256", "file_sha256"):
                if check.get(k) != exported.get(k):
                    raise ValueError(f"has a check record {check_path(path).name} of another graph ({k} "
                                     f"{str(check.get(k))[:16]}..., its record says {str(exported.get(k))[:16]}...)")
        except (ValueError, FileNotFoundError) as e:  # removed meanwhile: as if never written
            level = logging.INFO if isinstance(e, (_Outdated, FileNotFoundError)) else logging.WARNING
            log.log(level, "ONNX export %s %s; checking it against torch again", path, e)
            return None
        problem = _problem(path, {"model_fingerprint": fingerprint, **_versions()})
        session = None
        if problem is None:
            try:
                session = _session(path, threads)
            except Exception as e:  # noqa: BLE001 - ONNX Runtime raises its own types for bad files
                problem = f"cannot be opened ({e})"
        if session is None:  # the usual path finds it too, and names it in its WARNING
            log.info("ONNX export %s %s; not started from its check", path, problem)
            return None
        return cls(session, path), facts

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


def _record_check(path: Path, source: dict[str, str], worst: float, facts: dict[str, Any]) -> None:
    """Write ``check_path(path)``: the export passed its check for ``source`` with ``worst``."""
    import onnxruntime as ort

    try:
        exported = _read_signed(record_path(path), "record")  # what the checked graph hashes to
    except (ValueError, FileNotFoundError) as e:
        log.warning("the ONNX check of %s is not recorded: its export record %s", path, e)
        return
    payload = {**source, "onnxruntime": ort.__version__, "file_sha256": exported.get("file_sha256"),
               "worst_relative_difference": worst, "tolerance": TOLERANCE, "facts": facts}
    try:
        _write_signed(check_path(path), payload)
    except OSError as e:  # a read-only data directory: the check still holds for this process
        log.info("the ONNX check of %s is not recorded (%s)", path, e)


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
