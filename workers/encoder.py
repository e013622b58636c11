"""The encoder: a frozen Hugging Face model that returns every hidden state,
pooled on the device.

``Encoder.encode(batch)`` takes one tokenized, length-homogeneous batch and
returns, for every hidden state h_0..h_L, the pooled vectors it is set to
store (``poolings``, default mean, cls and max; workers/pooling.py) as float32
numpy arrays, and the token-level states when asked. Pooling runs on the
device in float32 accumulation whatever the compute precision, one hidden
state at a time (``pool_hidden_states``), so only [n, H, d] crosses to the host, not
[n, H, t, d]. On CUDA the model uses SDPA attention, runs under bf16/fp16
autocast when the precision says so, and ids go in and pooled rows come out
through pinned host memory (one synchronisation per batch).

Example::

    enc = Encoder.load()                     # the embedded default model
    batch = enc.tokenize(["a text", "another"])
    out = enc.encode(batch)
    out.pooled["mean"].shape                 # (2, 7, 384)
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from layerbank.cache.fingerprint import model_fingerprint
from layerbank.cache.keys import ExtractionConfig
from layerbank.cache.poolings import DEFAULT_POOLINGS, parse_poolings
from layerbank.cache.shard import TokenRows

from .deferred_model import DeferredModel
from .long_texts import head_for_tokens
from .model_reading import (
    TORCH_FACTS,
    encoder_info,
    extraction_config,
    model_files,
    model_max_length,
    read_model,
    read_tokenizer,
)

# defined without torch, so the command line can fail on a missing model before importing torch
from .model_source import ModelLoadError, locate_model
from .pooling import pool_hidden_states
from .precision import (
    autocast_dtype,
    cast_linear_weights_once,
    resolve_precision,
    speed_warning,
)

__all__ = ["Encoded", "Encoder", "ModelLoadError", "Tokenized", "pool_hidden_states",
           "set_threads"]

log = logging.getLogger("layerbank.encoder")




@dataclass
class Tokenized:
    """A tokenized batch (unpadded), in the order the texts were given."""

    input_ids: list[list[int]]
    truncated: list[bool]
    offsets: list[list[tuple[int, int]]] | None = None
    word_ids: list[list[int]] | None = None

    @property
    def lengths(self) -> list[int]:
        return [len(x) for x in self.input_ids]


@dataclass
class Encoded:
    pooled: dict[str, np.ndarray]  # pooling name (Encoder.poolings) -> [n, H, d] float32
    n_tokens: np.ndarray
    truncated: np.ndarray
    tokens: list[TokenRows] | None = None


@dataclass
class Encoder:
    model: Any
    tokenizer: Any
    name: str
    fingerprint: str
    config: ExtractionConfig
    device: torch.device
    info: dict[str, Any] = field(default_factory=dict)
    calls: int = 0  # forward passes run; tests use it to prove cache hits skip the model
    # what each encoded row stores (a setting, not part of the key: layerbank.cache.poolings)
    poolings: tuple[str, ...] = parse_poolings(DEFAULT_POOLINGS)
    # what runs the forward pass: None = the torch model itself; else an object whose
    # hidden_states(ids, mask) returns every hidden state (workers/engines/)
    engine: Any = None

    # -- loading ----------------------------------------------------------
    @classmethod
    def load(cls, name_or_path: str | None = None, *, device: str = "auto", precision: str = "default",
             max_length: int | None = None, storage_dtype: str = "float16",
             truncation_side: str = "right", trust_remote_code: bool = False,
             poolings: str | Sequence[str] = DEFAULT_POOLINGS, engine: str = "torch",
             data_dir: str | os.PathLike[str] | None = None, choose: bool = True) -> Encoder:
        """The model's tokenizer and weights, on its device, with the engine and precision asked for.

        ``engine`` and ``precision`` "auto" are measured here, once per machine, and the
        decision is stored in ``data_dir`` (engines/choice.py). ``choose=False`` stops
        before that, on torch at the precision resolved without measuring, and leaves
        it to ``choose()``: ``layerbank serve``'s gated worker reads its model while the
        server still checks the data directory, and chooses once it may touch it.
        """
        # a missing path or an unreachable hub fails here in one line, not after the hub's retries
        source = locate_model(name_or_path)
        name = source.name
        fingerprint = model_fingerprint(str(name))  # of the files as they are now, confirmed below
        dev = torch.device("cuda" if device == "auto" and torch.cuda.is_available()
                           else ("cpu" if device == "auto" else device))
        if choose and data_dir is not None and engine != "torch" and dev.type == "cpu" and not trust_remote_code:
            from .quick_start import quick_start  # the export checked at an earlier start

            quick = quick_start(source, fingerprint, precision=precision, max_length=max_length,
                                storage_dtype=storage_dtype, truncation_side=truncation_side,
                                poolings=poolings, engine=engine, data_dir=data_dir,
                                described=name_or_path is not None)
            if quick is not None:
                return cls(quick.model, quick.tokenizer, str(name), fingerprint, quick.config, dev, quick.info,
                           poolings=parse_poolings(poolings), engine=quick.engine)
        files = model_files(source)
        tok = read_tokenizer(files, name, trust_remote_code)
        model = read_model(files, name, fingerprint, dev, trust_remote_code)
        model_max = model_max_length(model, tok)
        cfg = extraction_config(max_length, model_max, truncation_side, storage_dtype,
                                resolve_precision(precision, dev))
        if (slow := speed_warning(cfg.precision, dev)) is not None:
            log.warning(slow)
        tok.truncation_side = truncation_side
        # where the regimes find its layers and projections: the HTTP layer (no torch) refuses
        # a regime that cannot run on it before queuing (workers/regimes/families.py)
        from .regimes.families import layout_summary

        facts = {"num_layers": int(model.config.num_hidden_layers),
                 "n_hidden_states": int(model.config.num_hidden_layers) + 1,
                 "hidden_size": int(model.config.hidden_size),
                 "n_params": int(sum(p.numel() for p in model.parameters())),
                 "n_bias_params": int(sum(p.numel() for n, p in model.named_parameters() if n.endswith(".bias"))),
                 # with precision_modes, lets a reader make the keys of any setting without torch
                 "model_max_length": model_max, "architecture": type(model).__name__,
                 "regimes_layout": layout_summary(model)}
        info = encoder_info(source, facts, cfg, dev, storage_dtype, poolings, described=name_or_path is not None)
        enc = cls(model, tok, str(name), fingerprint, cfg, dev, info, poolings=parse_poolings(poolings))
        return enc.choose(engine=engine, precision=precision, data_dir=data_dir) if choose else enc

    def torch_model(self) -> Any:
        """The torch model itself, read from its files now if this encoder started without it
        (on a checked ONNX export: workers/quick_start.py)."""
        return self.model.get() if isinstance(self.model, DeferredModel) else self.model

    def torch_facts(self) -> dict[str, Any]:
        """What this encoder knows of its model from the torch weights (kept with an ONNX check)."""
        return {k: self.info[k] for k in TORCH_FACTS if k in self.info}

    def choose(self, *, engine: str, precision: str, data_dir: str | os.PathLike[str] | None) -> Encoder:
        """This encoder on the engine and at the precision asked for, measuring where they say
        auto (the decision is read from, or stored in, ``data_dir``)."""
        from .engines.choice import apply_choices

        return apply_choices(self, engine=engine, precision=precision, data_dir=data_dir)

    def with_precision(self, precision: str) -> Encoder:
        """This encoder computing at another precision: same weights, same
        tokenizer (only autocast changes), its own config and so its own keys.

        ``self`` when the mode resolves to the current one. Raises
        ValueError for an unknown mode or fp16 off CUDA.
        """
        # "auto" resolves as measured at load (info's precision_modes), not by CPU flags
        resolved = (self.info.get("precision_modes") or {}).get(precision) if precision == "auto" else None
        resolved = resolved or resolve_precision(precision, self.device)
        if resolved == self.config.precision:
            return self
        # another engine computes fp32 only (workers/engines/): other precisions run on torch
        return dataclasses.replace(self, config=dataclasses.replace(self.config, precision=resolved),
                                   info={**self.info, "precision": resolved, "engine": "torch"}, calls=0,
                                   engine=None)

    # -- tokenizing -------------------------------------------------------
    def tokenize(self, texts: Sequence[str], want_offsets: bool = False) -> Tokenized:
        """Tokenize without padding; texts past max_length are cut and flagged.

        Only texts that turn out too long are tokenized a second time, with
        truncation, so the common case costs one pass.
        """
        max_len = int(self.config.max_length or 512)
        full = list(texts)
        heads: list[str | None] = [None] * len(full)
        if self.config.truncation_side == "right":  # workers/long_texts.py: the same tokens, sooner
            heads = [head_for_tokens(t, max_len) for t in full]
            texts = [t if h is None else h for t, h in zip(full, heads)]
        texts = list(texts)
        enc = self.tokenizer(texts, add_special_tokens=self.config.add_special_tokens,
                             truncation=False, return_offsets_mapping=want_offsets,
                             return_attention_mask=False, verbose=False)
        ids: list[list[int]] = enc["input_ids"]
        offsets = enc["offset_mapping"] if want_offsets else None
        word_ids = [enc.word_ids(i) for i in range(len(ids))] if want_offsets else None
        # a prefix that held too few tokens (very long words): the whole text after all; known
        # from this pass rather than from one of its own (a third of tokenizing long texts)
        short = [i for i, h in enumerate(heads) if h is not None and len(ids[i]) <= max_len]
        if short:
            again = self.tokenizer([full[i] for i in short], add_special_tokens=self.config.add_special_tokens,
                                   truncation=False, return_offsets_mapping=want_offsets,
                                   return_attention_mask=False, verbose=False)
            for j, i in enumerate(short):
                texts[i] = full[i]
                ids[i] = again["input_ids"][j]
                if offsets is not None and word_ids is not None:
                    offsets[i] = again["offset_mapping"][j]
                    word_ids[i] = again.word_ids(j)
        truncated = [len(x) > max_len for x in ids]
        long_idx = [i for i, t in enumerate(truncated) if t]
        if long_idx:
            cut = self.tokenizer([texts[i] for i in long_idx], truncation=True, max_length=max_len,
                                 add_special_tokens=self.config.add_special_tokens,
                                 return_offsets_mapping=want_offsets, return_attention_mask=False)
            for j, i in enumerate(long_idx):
                ids[i] = cut["input_ids"][j]
                if offsets is not None and word_ids is not None:
                    offsets[i] = cut["offset_mapping"][j]
                    word_ids[i] = cut.word_ids(j)
        wids = None
        if word_ids is not None:
            wids = [[-1 if w is None else int(w) for w in ws] for ws in word_ids]
        return Tokenized(ids, truncated, offsets, wids)

    # -- encoding ---------------------------------------------------------
    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        dtype = autocast_dtype(self.config.precision)
        if dtype is None:
            return contextlib.nullcontext()
        if self.engine is None:  # Linear weights cast once, not in every pass (precision.py)
            cast_linear_weights_once(self.torch_model())
        return torch.autocast(self.device.type, dtype=dtype)

    @torch.inference_mode()
    def encode(self, batch: Tokenized, want_tokens: bool = False) -> Encoded:
        """Run the model on one batch and pool every hidden state."""
        n = len(batch.input_ids)
        lengths = np.fromiter((len(x) for x in batch.input_ids), dtype=np.int64, count=n)
        t = int(lengths.max())
        real = np.arange(t)[None, :] < lengths[:, None]  # [n, t]: True on real tokens
        ids = np.full((n, t), self.tokenizer.pad_token_id or 0, dtype=np.int64)
        ids[real] = np.fromiter(itertools.chain.from_iterable(batch.input_ids), dtype=np.int64,
                                count=int(lengths.sum()))  # row-major: row by row, as given
        ids_dev = self._to_device(torch.from_numpy(ids))
        mask_dev = self._to_device(torch.from_numpy(real.astype(np.int64)))
        with self._autocast():
            hidden = self._hidden_states(ids_dev, mask_dev)
        self.calls += 1
        pooled = self._to_host(pool_hidden_states(hidden, mask_dev,
                                                  padded=bool(lengths.min() < t), names=self.poolings))
        tokens = None
        if want_tokens:
            if batch.offsets is None or batch.word_ids is None:
                raise ValueError("token-level states need a batch tokenized with want_offsets=True")
            host = self._to_host(torch.stack(hidden, dim=2).float())  # [n, t, H, d]
            tokens = [TokenRows(host[i, : len(batch.input_ids[i])],
                                np.asarray(batch.input_ids[i], dtype=np.int32),
                                np.asarray(batch.offsets[i], dtype=np.int32).reshape(-1, 2),
                                np.asarray(batch.word_ids[i], dtype=np.int32))
                      for i in range(n)]
        return Encoded({name: pooled[j] for j, name in enumerate(self.poolings)},
                       lengths.astype(np.int32), np.asarray(batch.truncated, dtype=bool), tokens)

    def _hidden_states(self, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.engine is not None:
            return self.engine.hidden_states(ids, mask)  # type: ignore[no-any-return]  # engines are typed Any
        # transformers' model outputs are untyped (ModelOutput fields are Any)
        out = self.torch_model()(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        return out.hidden_states  # type: ignore[no-any-return]  # ModelOutput fields are Any

    def _to_device(self, x: torch.Tensor) -> torch.Tensor:
        if self.device.type != "cuda":
            return x
        # pinned host memory lets the copy run asynchronously with the host's next work
        return x.pin_memory().to(self.device, non_blocking=True)

    def _to_host(self, x: torch.Tensor) -> np.ndarray:
        if self.device.type != "cuda":
            return x.numpy()
        host = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
        host.copy_(x, non_blocking=True)
        torch.cuda.current_stream(self.device).synchronize()
        return host.numpy()


def set_threads(n: int | None) -> None:
    """Pin torch's intra-op threads (by default, the cores this process may run on)."""
    torch.set_num_threads(n or _usable_cores())


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))  # honours taskset / cgroup cpusets
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
