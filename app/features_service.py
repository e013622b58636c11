"""Features for these texts: read the store, encode only the misses, read them back.

Every caller that answers "the rows of these texts" takes this one path: the
HTTP routes (``/v1/features``, ``/v1/embeddings``, heads; layerbank.app.api.text_features,
the micro-batcher as the encoder), ``layerbank.Bank`` and ``layerbank probe``
(the in-process extractor as the encoder). The caller plugs in three things, a
``TextSource``: how a text's key is made, how rows are read for keys (one
ReadResult per thing asked, e.g. one per pooling), and how missing texts are
encoded and stored. The steps are then the same everywhere:

1. key every text (when the keys need the loaded encoder, encode first);
2. read all keys; a row is found when every read found it;
3. encode the texts of the misses (each distinct text once), read those keys
   again and put their rows in place; twice, since a shard quarantined between
   its commit and the read is recomputed once; still missing: ``TextsLost``.

The steps are written once, as a generator that asks for reads and encodings
(``_steps``); ``features_for`` answers it with plain calls and
``features_for_async`` with awaits, so the HTTP layer answers rows in memory on
the event loop and awaits the batcher, while a notebook runs the same steps
without an event loop. Nothing here imports torch: the encoder is the caller's.

Example::

    source = TextSource(keys=lambda ts: [key(t) for t in ts],
                        read=lambda ks: [store.read_pooled(ks, "mean")],
                        encode=lambda ts, ks: extractor.extract(ts, job_id="nb").texts_encoded)
    got = features_for(texts, source)      # TextsLost when rows cannot be read back
    got.results[0].data                    # [n, H, d] float32, input order
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

import numpy as np

from layerbank.cache.catalog import Entry
from layerbank.cache.store import ReadResult

__all__ = ["AsyncTextSource", "Features", "TextSource", "TextsLost", "features_for",
           "features_for_async"]

# a shard quarantined between commit and read is recomputed once; a second loss is reported
_ATTEMPTS = 2

R = TypeVar("R")
N = TypeVar("N")


class TextsLost(RuntimeError):
    """Texts encoded (and stored) whose rows could still not be read back: each caller
    words it its own way (HTTP 500 "retry", the CLI's "run again")."""

    def __init__(self, lost: int) -> None:
        super().__init__(f"{lost} texts could not be read back from the store")
        self.lost = lost


@dataclass
class Features:
    """What the store answered for ``keys`` (input order, repeats kept)."""

    keys: list[str]
    results: list[ReadResult]  # one per read the source makes; every row found
    cached: np.ndarray  # bool [n]: found before anything was encoded for this call
    encoded: int  # what the source's encode returned, summed (texts the encoder ran on)

    @property
    def entries(self) -> list[Entry]:
        """Each row's catalog entry (token count, truncated flag), from the first read."""
        return cast(list[Entry], self.results[0].entries)  # every row found: no None


@dataclass
class _Read:
    keys: list[str]


@dataclass
class _Encode:
    texts: list[str]  # distinct texts, in first-seen order
    keys: list[str] | None  # their rows' keys, None when the keys need the encoder first


@dataclass
class TextSource(Generic[R, N]):
    """The caller's store and encoder, in plain calls (``features_for``).

    ``keys(texts)``: each text's key, or None while the model's keys cannot be made
    (a model the catalog does not know yet: the encoder must load first);
    ``read(keys)``: ReadResults for ``keys``; ``encode(texts, keys)``: store the texts'
    rows, returning how many the encoder ran on (``keys`` is None with ``keys()``)."""

    keys: Callable[[list[str]], list[str] | None]
    read: Callable[[list[str]], R]
    encode: Callable[[list[str], list[str] | None], N]


# the same three, with ``read`` and ``encode`` awaited (``features_for_async``)
AsyncTextSource = TextSource[Awaitable[list[ReadResult]], Awaitable[int]]


def features_for(texts: Sequence[str], source: TextSource[list[ReadResult], int]) -> Features:
    """The rows of ``texts``, encoding the misses once; TextsLost if some cannot be read back."""
    steps = _steps(list(texts), source.keys)
    reply: Any = None
    try:
        while True:
            ask = steps.send(reply)
            reply = source.read(ask.keys) if isinstance(ask, _Read) else source.encode(ask.texts, ask.keys)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]  # the generator's return value


async def features_for_async(texts: Sequence[str], source: AsyncTextSource) -> Features:
    """``features_for`` with ``read`` and ``encode`` awaited (the HTTP layer)."""
    steps = _steps(list(texts), source.keys)
    reply: Any = None
    try:
        while True:
            ask = steps.send(reply)
            reply = await (source.read(ask.keys) if isinstance(ask, _Read)
                           else source.encode(ask.texts, ask.keys))
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]  # the generator's return value


def _steps(texts: list[str], make_keys: Callable[[list[str]], list[str] | None]
           ) -> Generator[_Read | _Encode, Any, Features]:
    encoded, attempts = 0, _ATTEMPTS
    keys = make_keys(texts)
    if keys is None:  # the encoder must load to make the keys: it encodes what is not stored
        encoded += yield _Encode(list(dict.fromkeys(texts)), None)
        attempts -= 1
        keys = make_keys(texts)
        if keys is None:
            raise RuntimeError("the encoder ran but the texts' keys are still unknown")
    results: list[ReadResult] = yield _Read(keys)
    found = _found(results)
    cached = found.copy()
    for _ in range(attempts):
        if found.all():
            break
        miss = [int(i) for i in np.flatnonzero(~found)]
        miss_keys = [keys[i] for i in miss]
        encoded += yield _Encode(list(dict.fromkeys(texts[i] for i in miss)), miss_keys)
        got: list[ReadResult] = yield _Read(miss_keys)
        results = [_merge(r, g, miss) for r, g in zip(results, got)]
        found = _found(results)
    if not found.all():
        raise TextsLost(int((~found).sum()))
    return Features(keys, results, cached, encoded)


def _found(results: list[ReadResult]) -> np.ndarray:
    """A row is found when every read found it (a pooling stored in another shard is a miss)."""
    found = results[0].found.copy()
    for r in results[1:]:
        found &= r.found
    return found


def _merge(into: ReadResult, got: ReadResult, idx: list[int]) -> ReadResult:
    """``into`` with the rows ``got`` found for positions ``idx`` put in place."""
    data, found, entries = into.data, into.found.copy(), list(into.entries)
    sel = np.flatnonzero(got.found)
    if got.data.size and sel.size:
        if data.shape[1:] != got.data.shape[1:]:  # nothing was found at first: data is empty
            data = np.zeros((len(found),) + got.data.shape[1:], dtype=np.float32)
        data[np.asarray(idx)[sel]] = got.data[sel]
    for j in map(int, sel):
        found[idx[j]] = True
        entries[idx[j]] = got.entries[j]
    return ReadResult(data, found, entries)
