"""Start on the ONNX export an earlier start checked, before the torch model is read.

On a CPU where the stored decisions are "onnx" and "fp32" (``--engine
auto``/``onnx``, ``--precision auto``/``default``/``fp32``), every row is
computed by ONNX Runtime; the torch model serves only to check the export
and to say what the model is (its sizes, its layout for the regimes). Both
were known at the start that checked it and are kept in the check record
(workers/engines/onnx.py ``check_path``, under its checksum). So this start
reads the tokenizer, verifies that record, the export's record and the
graph's sha256 against the model's fingerprint (a sha256 of its files), and
serves: transformers' modeling code (~3 s of imports on the 2-core
development machine, most of a 6 s ``/ready``) is not imported until
something needs the torch weights (``Encoder.torch_model()``: bf16 rows, a
regime), which then reads them once (workers/deferred_model.py).

Any doubt leaves the usual path (read the model, check the export against
torch, which writes the check record again): no check record yet, a record
that fails its checksum or names other library versions, a graph that does
not hash to its record, a decision that is not stored, a hub name (its
fingerprint is not a hash of its files).

Example::

    enc = Encoder.load(path, data_dir="layerbank-data")   # second start: this path
    enc.model.loaded     # False until bf16 rows or a regime ask for the weights
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from layerbank.cache.fingerprint import model_fingerprint
from layerbank.cache.keys import ExtractionConfig

from .deferred_model import DeferredModel
from .model_reading import encoder_info, extraction_config, model_files, read_model, read_tokenizer
from .model_source import ModelLoadError, ModelSource
from .precision import resolve_precision

__all__ = ["QuickStart", "may_start_quickly", "quick_start"]

log = logging.getLogger("layerbank.encoder")


@dataclass(frozen=True)
class QuickStart:
    """What ``Encoder.load`` makes the encoder of: its weights deferred, its engine open."""

    model: DeferredModel
    tokenizer: Any
    config: ExtractionConfig
    info: dict[str, Any]
    engine: Any  # OnnxEngine


def quick_start(source: ModelSource, fingerprint: str, *, precision: str, max_length: int | None,
                storage_dtype: str, truncation_side: str, poolings: str | Sequence[str], engine: str,
                data_dir: str | os.PathLike[str], described: bool) -> QuickStart | None:
    """The encoder's parts on its checked ONNX export, the torch model deferred; None when
    this start cannot be served that way (the caller loads the model as usual)."""
    from .engines.choice import choices_line, stored_onnx_choices
    from .engines.onnx import OnnxEngine

    dev = torch.device("cpu")
    try:
        if resolve_precision(precision, dev) != "fp32":
            return None  # other precisions run on torch
    except ValueError:
        return None  # the usual path says what is wrong with it
    if not (opened := OnnxEngine.open_checked(fingerprint, data_dir)):
        return None
    onnx, facts = opened
    cfg = extraction_config(max_length, int(facts["model_max_length"]), truncation_side, storage_dtype, "fp32")
    info = encoder_info(source, facts, cfg, dev, storage_dtype, poolings, described=described)
    choices = stored_onnx_choices(fingerprint, cfg.max_length, info["precision_modes"], engine=engine,
                                  precision=precision, data_dir=data_dir)
    if choices is None:
        return None
    name, files = str(source.name), model_files(source)
    tok = read_tokenizer(files, name, trust_remote_code=False)
    tok.truncation_side = truncation_side
    if model_fingerprint(name) != fingerprint:  # rewritten while this start read it
        raise ModelLoadError(f"cannot load model {name!r}: its files changed while it loaded; load it again")

    def load_weights() -> Any:
        if model_fingerprint(name) != fingerprint:  # the rows served so far are of the old files
            raise ModelLoadError(f"cannot read the torch weights of {name!r}: its files changed since this "
                                 "worker started on their ONNX export; restart it to serve the new files")
        log.info("reading the torch weights of %s (first use)", name)
        return read_model(files, name, fingerprint, dev, trust_remote_code=False)

    quick = QuickStart(DeferredModel(load_weights, nbytes=onnx.path.stat().st_size), tok, cfg,
                       {**info, **choices, "started_from": "onnx check"}, onnx)
    log.info("%s: started on its checked ONNX export %s; the torch weights are read on first use",
             name, onnx.path.name)
    log.info("%s", choices_line(quick.info))
    return quick


def may_start_quickly(name_or_path: str | None, *, engine: str, device: str,
                      data_dir: str | os.PathLike[str]) -> bool:
    """Whether a start of this model will likely take the quick path: a read-only look (the
    check record exists), so ``serve``'s gated worker need not read the weights before its
    gate. Verified only by ``quick_start``, after the gate."""
    from .engines.onnx import check_path, export_path
    from .model_source import locate_model

    if engine == "torch" or device not in ("auto", "cpu") or (device == "auto" and torch.cuda.is_available()):
        return False
    try:
        fingerprint = model_fingerprint(locate_model(name_or_path).name)
    except (ModelLoadError, OSError):
        return False  # the usual path says why, after the gate
    return fingerprint.startswith("local:") and check_path(export_path(data_dir, fingerprint)).is_file()
