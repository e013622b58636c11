"""The texts of a big request travel to the worker in a file, not in the job row.

An ``encode`` job's payload held its texts. For one request of 300 texts x
99,000 characters that is a 30 MB row, and the row is touched all the time:
the API's batcher reads the whole job every 2 ms to see whether it is done
(60-115 ms to read and parse the 30 MB, so the event loop, and one of the
two cores, did nothing else), and every lease renewal or progress write
rewrites the whole row into the write-ahead log (50-300 ms, 30 MB each,
four times a second). Small requests waited behind both.

So texts over ``INLINE_MAX_CHARS`` in all go to ``<data dir>/requests/<job
id>.json``, written before the job is submitted, and the payload names the
file; smaller ones stay inline as before (no file for the common case).
The submitter removes the file once its wait is over; a file left by a
crashed API is removed by the next worker that starts
(``layerbank.cache.leftovers``). A missing file fails the job with a
message that says so.

Example::

    part = to_payload(store.root, job_id, texts)   # {"texts": [...]} or {"texts_file": "..."}
    queue.submit("encode", {**part, "model": fp}, job_id=job_id)
    texts = texts_of(store.root, job.payload)       # in the worker
    discard(store.root, job.payload)                # once the submitter is done waiting
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from .errors import InputError

__all__ = ["INLINE_MAX_CHARS", "discard", "requests_dir", "texts_of", "to_payload"]

# 1 M characters read and parsed in ~2 ms: small enough for a row that is polled
INLINE_MAX_CHARS = 1_000_000
_NAME = re.compile(r"[0-9A-Za-z_-]{1,64}\.json")


def requests_dir(root: str | os.PathLike[str]) -> Path:
    return Path(root) / "requests"


def to_payload(root: str | os.PathLike[str], job_id: str, texts: list[str]) -> dict[str, Any]:
    """``{"texts": texts}`` for small requests; else write the file and return ``{"texts_file": name}``."""
    if sum(len(t) for t in texts) <= INLINE_MAX_CHARS:
        return {"texts": texts}
    name = f"{job_id}.json"
    d = requests_dir(root)
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f"{name}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(texts, f, ensure_ascii=False)
        os.replace(tmp, d / name)  # never a half-written file under the name a worker reads
    except BaseException:  # a full disk: the request gets its 507, and no half file stays
        tmp.unlink(missing_ok=True)
        raise
    return {"texts_file": name}


def texts_of(root: str | os.PathLike[str], payload: dict[str, Any]) -> list[str]:
    """The job's texts, inline or from its file."""
    if "texts_file" not in payload:
        return list(payload["texts"])
    name = str(payload["texts_file"])
    if not _NAME.fullmatch(name):  # a file name, never a path
        raise InputError(f"bad texts_file {name!r} in the job's payload")
    try:
        with open(requests_dir(root) / name, encoding="utf-8") as f:
            texts = json.load(f)
    except FileNotFoundError:  # not the person's input: "internal", with the reason
        raise RuntimeError(f"the request's texts file requests/{name} is gone (its request "
                         "gave up waiting, or the data directory was cleaned)") from None
    return [str(t) for t in texts]


def discard(root: str | os.PathLike[str], payload: dict[str, Any]) -> None:
    """Remove the job's texts file, if it has one."""
    name = payload.get("texts_file")
    if isinstance(name, str) and _NAME.fullmatch(name):
        (requests_dir(root) / name).unlink(missing_ok=True)
