"""Several encoders in one worker: each loaded on first use, the least
recently used unloaded to keep the loaded weights within a memory budget.

The default model (the first served) is loaded at start and never unloaded:
it is what the worker advertises and what a request naming no model gets.
Every other model is located at start without torch (its files and so its
fingerprint, ``workers/model_source.py``), and loaded by the first job that
names it; ``on_load`` registers it in the catalog so that the API can make
its keys. Before a load, unused models are unloaded until the newcomer's
weight files fit beside the rest; after it, until its measured size does.
A model a running job holds (``keep``) is never unloaded under it. One model
bigger than the whole budget still loads, alone with the default.

A model's identity follows its files (issue 25). Loaded weights are the
pool's own memory (``own_weights``: safetensors maps the file, so an
overwrite in place used to change a loaded model's numbers under its old
fingerprint, and a truncation killed the worker with SIGBUS). At every job
the worker calls ``confirm()``: each local model's fingerprint is checked by
the stamps of its files (``stat`` only; the contents are hashed again when a
stamp changed). A model whose files changed is named in one WARNING line,
unloaded, and served under its new fingerprint from then on (loaded again
on its next use, the default at once); a job that names the old
fingerprint fails with ``ModelChanged`` (send it again: its keys were made
for weights no longer served). Whatever a load returns is described under
the fingerprint it was loaded with, so a model restored after its files
were damaged loads again without a restart.

Example::

    pool = ModelPool(default_encoder, [locate_model("/models/tiny")], load=load_encoder,
                     budget_bytes=2 << 30, on_load=register)
    enc = pool.get("/models/tiny")      # loads it; pool.get(enc.fingerprint) is the same
"""

from __future__ import annotations

import gc
import logging
import os
from collections import OrderedDict
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from layerbank.cache.fingerprint import model_fingerprint

from .deferred_model import DeferredModel
from .model_source import ModelSource, locate_model

__all__ = ["ModelChanged", "ModelPool", "ServedModel", "UnknownModel", "default_budget_bytes",
           "encoder_bytes", "own_weights"]

log = logging.getLogger("layerbank.worker")

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")


class UnknownModel(ValueError):
    """A job named a model this worker does not serve."""


class ModelChanged(UnknownModel):
    """A job named a fingerprint whose files have changed since: its keys are for other weights."""

    failure_type = "unavailable"  # the request is fine: sent again, it gets the new fingerprint's keys


def own_weights(model: Any) -> None:
    """Copy every parameter and buffer into the process's own memory.

    ``from_pretrained`` leaves CPU tensors as views of the memory-mapped
    safetensors file: writing the file in place changes a loaded model's
    numbers, and truncating it kills the process (SIGBUS) at the next
    forward pass. Tied weights are one Parameter, so they stay tied.
    """
    for t in [*model.parameters(), *model.buffers()]:
        t.data = t.data.clone()


@dataclass(frozen=True)
class ServedModel:
    """One model of the served list, as found before loading it."""

    source: ModelSource
    spec: str | None  # as the settings name it (None: the embedded model)

    @property
    def fingerprint(self) -> str:
        return self.source.fingerprint

    @property
    def name(self) -> str:
        return self.source.display_name

    def names(self) -> list[str]:
        """What a job's ``model`` may say for it: display name, path, folder name, fingerprint."""
        path = self.source.name
        out = [self.name, path, os.path.basename(path.rstrip("/")), self.fingerprint]
        return [n for n in dict.fromkeys(out) if n]

    def file_bytes(self) -> int:
        """Bytes of its weight files: what loading it will take, before it is loaded."""
        d = self.source.directory
        if d is None or not d.is_dir():
            return 0
        files = [p for p in d.iterdir() if p.is_file()]
        for suffix in _WEIGHT_SUFFIXES:  # one format is loaded: safetensors before a .bin copy
            if sizes := [p.stat().st_size for p in files if p.suffix == suffix]:
                return sum(sizes)
        return 0


def encoder_bytes(encoder: Any) -> int:
    """Memory an encoder's weights take: parameters and buffers, twice with a second engine
    (ONNX Runtime holds its own copy of the weights)."""
    model = encoder.model
    if isinstance(model, DeferredModel) and not model.loaded:  # only the ONNX Runtime copy so far
        return int(model.nbytes)
    n = sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))
    return n * (2 if getattr(encoder, "engine", None) is not None else 1)


def default_budget_bytes(device: str) -> int:
    """Half of the device's memory: the GPU's on CUDA, the machine's otherwise."""
    if device.startswith("cuda"):
        import torch

        return int(torch.cuda.get_device_properties(torch.device(device)).total_memory // 2)
    return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2)


class ModelPool:
    """The served encoders: the default always loaded, the others on demand, in LRU order."""

    def __init__(self, default: Any, others: Sequence[ModelSource | ServedModel] = (), *,
                 load: Callable[[ServedModel], Any] | None = None, budget_bytes: int | None = None,
                 on_load: Callable[[Any], None] = lambda enc: None) -> None:
        self.default = default
        path = str(default.info.get("path", default.name))
        self._default_entry = ServedModel(ModelSource(path, str(default.info.get("name", default.name)),
                                                      None), None)
        self.entries: dict[str, ServedModel] = {}
        for o in others:
            entry = o if isinstance(o, ServedModel) else ServedModel(o, o.name)
            if entry.fingerprint != default.fingerprint:
                self.entries.setdefault(entry.fingerprint, entry)
        self._load = load
        self.budget = budget_bytes
        self._on_load = on_load
        self.loaded: OrderedDict[str, Any] = OrderedDict()  # fingerprint -> encoder, least recent first
        self._sizes: dict[str, int] = {default.fingerprint: encoder_bytes(default)}
        self.registered: set[str] = {default.fingerprint}  # loaded at least once in this process
        self.retired: dict[str, str] = {}  # fingerprint whose files changed -> their fingerprint now
        self._default_failed: str | None = None  # the default's files that failed to load (not tried again)
        self.loads = 0
        self.unloads = 0

    # -- which model -----------------------------------------------------------
    def fingerprint_of(self, model: str | None) -> str:
        """The fingerprint of the served model ``model`` names (None: the default)."""
        if model is None or model in (self.default.fingerprint, self.default.name,
                                      self.default.info.get("name")):
            return str(self.default.fingerprint)
        if model in self.entries:
            return model
        for fp, e in self.entries.items():
            if model in e.names():
                return fp
        if model in self.retired:
            now = model
            while now in self.retired:  # changed more than once
                now = self.retired[now]
            raise ModelChanged(f"the files of the model with fingerprint {model} have changed since this "
                               f"request was made (their fingerprint is now {now}); send it again")
        served = ", ".join([f"{self.default.info.get('name')!r} ({self.default.fingerprint})"]
                           + [f"{e.name!r} ({fp})" for fp, e in self.entries.items()])
        raise UnknownModel(f"this worker serves {served}, not {model!r}")

    # -- loading and unloading --------------------------------------------------
    def get(self, model: str | None = None, *, keep: Collection[str] = ()) -> Any:
        """The encoder of ``model`` (a name or fingerprint; None: the default), loaded if need be.

        ``keep``: fingerprints that must stay loaded (the running jobs' models).
        """
        fp = self.fingerprint_of(model)
        if fp == self.default.fingerprint:
            return self.default
        if fp in self.loaded:
            self.loaded.move_to_end(fp)
            self._make_room(0, set(keep) | {fp})  # over budget while a job held another: not any more
            return self.loaded[fp]
        entry = self.entries[fp]
        if self._load is None:
            raise UnknownModel(f"model {entry.name!r} is served but this worker cannot load models")
        self._make_room(entry.file_bytes(), keep)
        enc = self._load(entry)
        self.loads += 1
        if enc.fingerprint != fp:  # the files changed since they were located: they are what was loaded
            self._rekey(fp, enc.fingerprint, entry)
            fp = enc.fingerprint
        self._sizes[fp] = encoder_bytes(enc)
        self.loaded[fp] = enc
        self._on_load(enc)
        self.registered.add(fp)
        self._make_room(0, set(keep) | {fp})
        log.info("loaded model %s (%.1f MiB); %d of %d models loaded, %.1f MiB", entry.name,
                 self._sizes[fp] / 2**20, len(self.loaded) + 1, len(self.entries) + 1, self.used_bytes / 2**20)
        return enc

    # -- the files behind each model ----------------------------------------------
    def confirm(self) -> bool:
        """Check every local model's fingerprint against its files (``stat`` alone unless a file
        changed); a changed one is served under its new fingerprint. True when one changed.

        The default is loaded again at once (when this pool can load); until then, or
        without a loader, it goes on computing with the weights it loaded, which are its
        own memory, under the fingerprint they were loaded with.
        """
        changed = False
        for fp, entry in list(self.entries.items()):
            if entry.source.directory is None or entry.source.from_hf_cache:
                continue
            now = entry.fingerprint
            if now != fp:
                log.warning("the files of model %s changed (fingerprint %s -> %s); serving them under "
                            "the new fingerprint", entry.name, fp, now)
                self._rekey(fp, now, entry)
                changed = True
        path = str(self.default.info.get("path") or "")
        if self._load is not None and path and os.path.isdir(path):
            now = model_fingerprint(path)
            if now not in (self.default.fingerprint, self._default_failed):
                old = self.default.fingerprint
                log.warning("the files of the default model %s changed (fingerprint %s -> %s); "
                            "loading them again", self._default_entry.name, old, now)
                try:
                    enc = self._load(ServedModel(locate_model(path), path))
                except Exception as e:  # noqa: BLE001 - damaged files: keep the weights loaded before
                    self._default_failed = now
                    log.warning("the default model's changed files cannot be loaded (%s); serving the "
                                "weights loaded before, under %s, until they can", e, old)
                    return changed
                self.loads += 1
                self.retired[old] = enc.fingerprint
                self.retired.pop(enc.fingerprint, None)
                self.registered.discard(old)
                self._sizes.pop(old, None)
                self.default = enc
                self._sizes[enc.fingerprint] = encoder_bytes(enc)
                self._on_load(enc)
                self.registered.add(enc.fingerprint)
                changed = True
        return changed

    def _rekey(self, old: str, new: str, entry: ServedModel) -> None:
        """``entry``'s files now have fingerprint ``new``: forget what was loaded for ``old``."""
        self.entries.pop(old, None)
        self.entries.setdefault(new, entry)
        if self.loaded.pop(old, None) is not None:
            self.unloads += 1
            gc.collect()
        self._sizes.pop(old, None)
        self.registered.discard(old)
        self.retired[old] = new
        self.retired.pop(new, None)  # restored: the fingerprint is served again

    @property
    def used_bytes(self) -> int:
        return self._size(self.default) + sum(self._size(self.loaded[fp]) for fp in self.loaded)

    def _size(self, enc: Any) -> int:
        # an encoder started on its checked export grows when its torch weights are read
        # (workers/deferred_model.py), so it is measured at every call: a sum over its
        # tensors, asked only when a model is loaded
        if isinstance(getattr(enc, "model", None), DeferredModel):
            self._sizes[enc.fingerprint] = encoder_bytes(enc)
        return self._sizes[enc.fingerprint]

    def _make_room(self, incoming: int, keep: Collection[str]) -> None:
        if self.budget is None:
            return
        unloaded = False
        for fp in list(self.loaded):  # least recently used first
            if self.used_bytes + incoming <= self.budget:
                break
            if fp in keep:
                continue
            del self.loaded[fp]
            self.unloads += 1
            unloaded = True
            log.info("unloaded model %s to stay within %.1f MiB of encoders", self.entries[fp].name,
                     self.budget / 2**20)
        if unloaded:
            gc.collect()  # the model's tensors go now, not at some later collection

    # -- what the worker publishes ------------------------------------------------
    def describe(self) -> list[dict[str, Any]]:
        """Every served model for the worker's liveness row: the API reads names and
        fingerprints from it, and which models' configs the catalog holds for this run."""
        out = [{"name": self._default_entry.name, "path": self._default_entry.source.name,
                "fingerprint": self.default.fingerprint, "default": True, "loaded": True,
                "registered": True}]
        for fp, e in list(self.entries.items()):  # the liveness thread reads while a job may re-key
            out.append({"name": e.name, "path": e.source.name, "fingerprint": fp, "default": False,
                        "loaded": fp in self.loaded, "registered": fp in self.registered})
        return out
