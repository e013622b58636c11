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

The file is verified before its texts are trusted: the payload carries
the sha256 of the file's bytes (``texts_sha256``), and the file must hash
to it, decode as UTF-8 JSON and hold a list of strings. A file that fails
(issue 25 filled one with random bytes: a 500 ``UnicodeDecodeError`` that
named nothing) fails the job with ``DamagedRequestTexts``, which names the
file and what was wrong; it is of failure type "unavailable" (the request
is fine and may be sent again, which writes a fresh file). A payload of
an older API, without the checksum, is checked by its schema alone.

Example::

    part = to_payload(store.root, job_id, texts)   # {"texts": [...]} or {"texts_file": "..."}
    queue.submit("encode", {**part, "model": fp}, job_id=job_id)
    texts = texts_of(store.root, job.payload)       # in the worker
    discard(store.root, job.payload)                # once the submitter is done waiting
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

from .errors import InputError

__all__ = ["INLINE_MAX_CHARS", "DamagedRequestTexts", "discard", "requests_dir", "texts_of", "to_payload"]

# 1 M characters read and parsed in ~2 ms: small enough for a row that is polled
INLINE_MAX_CHARS = 1_000_000
_NAME = re.compile(r"[0-9A-Za-z_-]{1,64}\.json")


class DamagedRequestTexts(RuntimeError):
    """A request's texts file that fails its checksum or is not a list of texts."""

    failure_type = "unavailable"  # the request is fine: sent again, it writes a fresh file


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
    data = json.dumps(texts, ensure_ascii=False).encode("utf-8")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, d / name)  # never a half-written file under the name a worker reads
    except BaseException:  # a full disk: the request gets its 507, and no half file stays
        tmp.unlink(missing_ok=True)
        raise
    return {"texts_file": name, "texts_sha256": hashlib.sha256(data).hexdigest()}


def texts_of(root: str | os.PathLike[str], payload: dict[str, Any]) -> list[str]:
    """The job's texts, inline or from its file."""
    if "texts_file" not in payload:
        return list(payload["texts"])
    name = str(payload["texts_file"])
    if not _NAME.fullmatch(name):  # a file name, never a path
        raise InputError(f"bad texts_file {name!r} in the job's payload")
    try:
        data = (requests_dir(root) / name).read_bytes()
    except FileNotFoundError:  # not the person's input: "internal", with the reason
        raise RuntimeError(f"the request's texts file requests/{name} is gone (its request "
                         "gave up waiting, or the data directory was cleaned)") from None
    want = payload.get("texts_sha256")
    if want is not None and hashlib.sha256(data).hexdigest() != want:
        raise DamagedRequestTexts(f"the request's texts file requests/{name} is damaged (it fails "
                                  "the sha256 it was written with); send the request again")
    try:
        texts = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise DamagedRequestTexts(f"the request's texts file requests/{name} is damaged (not UTF-8 "
                                  f"JSON: {e}); send the request again") from None
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise DamagedRequestTexts(f"the request's texts file requests/{name} is damaged (it holds "
                                  "no list of texts); send the request again")
    return texts


def discard(root: str | os.PathLike[str], payload: dict[str, Any]) -> None:
    """Remove the job's texts file, if it has one."""
    name = payload.get("texts_file")
    if isinstance(name, str) and _NAME.fullmatch(name):
        (requests_dir(root) / name).unlink(missing_ok=True)
