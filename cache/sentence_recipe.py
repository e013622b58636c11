"""A model's own sentence embedding, read from its sentence-transformers files.

A model trained with sentence-transformers ships how its sentence vector is
made: ``modules.json`` lists the modules (Transformer, Pooling, Normalize,
...), ``1_Pooling/config.json`` (the Pooling module's folder) says which
pooling. sentence-transformers, text-embeddings-inference and Infinity all
answer that recipe; ``/v1/embeddings`` does too (app/api/embedding_recipe.py),
from the rows the store already holds: the last hidden state (``layer:-1``,
what the Transformer module hands to Pooling), the stored pooling of the same
name, L2-normalised when a Normalize module follows. No second encoder pass.

What cannot be made from stored rows is said, not approximated: a Dense or
other module after Pooling, a pooling layerbank does not store
(``weightedmean``, ``mean_sqrt_len_tokens``), several poolings concatenated.
Such a recipe is returned with ``usable=False`` and the reason; the route
then answers the server's default and ``/info`` says why.

Only JSON is read here (no torch), so the worker (when it loads a model) and
the HTTP layer (for a catalog row registered before recipes were recorded)
can both call it.

Example::

    >>> r = read_recipe(default_model_path())        # the bundled all-MiniLM-L6-v2
    >>> (r["view"], r["pooling"], r["normalize"], r["usable"])
    ('layer:-1', 'mean', True, True)
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["ST_POOLINGS", "read_recipe"]

# sentence-transformers' pooling modes (old boolean keys and new names) -> layerbank's stored pooling;
# None: a mode no stored pooling gives
ST_POOLINGS: dict[str, str | None] = {
    "mean": "mean", "cls": "cls", "max": "max", "lasttoken": "last_token",
    "mean_sqrt_len_tokens": None, "weightedmean": None,
}
_LEGACY_KEYS = {
    "pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max", "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean", "pooling_mode_lasttoken": "lasttoken",
}
# modules that change nothing the recipe computes from the last layer's token vectors
_NEUTRAL = {"Transformer", "Pooling", "Normalize"}


def _json(path: Path) -> Any:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def _modes(cfg: dict[str, Any]) -> list[str]:
    """The pooling modes a Pooling config turns on, in either file format."""
    mode = cfg.get("pooling_mode")
    if isinstance(mode, str):
        return [mode]
    if isinstance(mode, list):
        return [str(m) for m in mode]
    return [name for key, name in _LEGACY_KEYS.items() if cfg.get(key) is True]


def read_recipe(directory: str | os.PathLike[str] | None) -> dict[str, Any] | None:
    """The recipe of the model in ``directory``; None when it ships none (no modules.json).

    The answer is a plain dict (it is stored in the catalog's models row):
    ``view``, ``pooling``, ``normalize``, ``usable``, ``reason`` (why it
    cannot be served, or None), ``files`` (the files read), ``notes``
    (differences that remain, e.g. a shorter ``max_seq_length``).
    """
    if directory is None:
        return None
    root = Path(directory)
    modules_path = root / "modules.json"
    if not modules_path.is_file():
        return None
    files = [str(modules_path)]
    out: dict[str, Any] = {"view": "layer:-1", "pooling": None, "normalize": False, "usable": False,
                           "reason": None, "files": files, "notes": []}
    try:
        modules = _json(modules_path)
        if not isinstance(modules, list):
            raise TypeError("modules.json is not a list")
        kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
        pooling_entry = next((m for m, k in zip(modules, kinds) if k == "Pooling"), None)
        other = [k for k in kinds if k not in _NEUTRAL]
        if other:
            out["reason"] = (f"modules.json holds {', '.join(other)} besides Transformer, Pooling and "
                             "Normalize; stored layers cannot give its output")
            return out
        if pooling_entry is None:
            out["reason"] = "modules.json has no Pooling module"
            return out
        pooling_path = root / str(pooling_entry.get("path") or "") / "config.json"
        files.append(str(pooling_path))
        cfg = _json(pooling_path)
        if not isinstance(cfg, dict):
            raise TypeError(f"{pooling_path} is not a JSON object")
    except (OSError, ValueError, TypeError, AttributeError) as e:
        out["reason"] = f"the recipe cannot be read: {e}"
        return out
    out["normalize"] = "Normalize" in kinds
    modes = _modes(cfg)
    if len(modes) != 1:
        out["reason"] = (f"the Pooling config turns on {len(modes)} poolings ({', '.join(modes) or 'none'}); "
                         "layerbank serves one stored pooling")
        return out
    pooling = ST_POOLINGS.get(modes[0])
    if pooling is None:
        out["reason"] = f"pooling {modes[0]!r} is not one layerbank stores (mean, cls, max, last_token)"
        return out
    out.update(pooling=pooling, usable=True)
    _add_notes(root, cfg, out["notes"])
    return out


def _add_notes(root: Path, pooling_cfg: dict[str, Any], notes: list[str]) -> None:
    """What still differs from ``SentenceTransformer(path).encode`` (said, since it is not applied)."""
    try:
        st = _json(root / "sentence_bert_config.json")
    except (OSError, ValueError):
        st = {}
    if isinstance(st, dict):
        if isinstance(st.get("max_seq_length"), int):
            notes.append(f"sentence-transformers cuts texts at max_seq_length={st['max_seq_length']} "
                         "tokens; layerbank at the extraction config's max_length")
        if st.get("do_lower_case") is True:
            notes.append("sentence-transformers lower-cases texts first (do_lower_case); layerbank "
                         "does not")
    try:
        cst = _json(root / "config_sentence_transformers.json")
    except (OSError, ValueError):
        cst = {}
    if isinstance(cst, dict) and cst.get("default_prompt_name"):
        notes.append(f"the default prompt {cst['default_prompt_name']!r} is not prepended; add it to "
                     "the texts")
    if pooling_cfg.get("include_prompt") is False:
        notes.append("include_prompt is false: a prompt you prepend is pooled too")
