"""The poolings layerbank knows: one list, torch-free, that the API, the CLI,
the catalog and the docs read.

A pooling turns one hidden state's token vectors [t, d] into one vector [d].
Each name here has a function of the same name next to the encoder
(``layerbank.workers.pooling.POOL_FUNCTIONS``; a test checks that both lists
agree), so adding a pooling is one line here, one function there, docs and
tests. Which of them a data directory stores is a setting (``--poolings``,
``LAYERBANK_POOLINGS``, default ``mean,cls,max``); every shard records the
poolings it holds, and a pooling a shard lacks is a cache miss.

Example::

    >>> parse_poolings("mean, max")
    ('mean', 'max')
    >>> LEGACY_POOLINGS
    ('mean', 'cls', 'max')
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Literal

__all__ = ["DEFAULT_POOLINGS", "LEGACY_POOLINGS", "POOLINGS", "POOLING_NAMES", "PoolingName", "parse_poolings"]

# name -> what it is, for a person (help texts, schema descriptions, docs/storage.md)
POOLINGS: dict[str, str] = {
    "mean": "mean over the real tokens (mask-aware, special tokens included)",
    "cls": "the first token's vector ([CLS] in BERT-family models)",
    "max": "elementwise maximum over the real tokens",
    "last_token": "the last real token's vector (mask-aware, right or left padding), what "
                  "decoder-style embedders use; [SEP] in BERT-family models",
}
POOLING_NAMES: tuple[str, ...] = tuple(POOLINGS)
# the type pydantic models and settings use: their JSON-schema enum is this registry
# (a Literal built from a tuple, which type checkers cannot follow: they see str)
if TYPE_CHECKING:
    PoolingName = str
else:
    PoolingName = Literal[POOLING_NAMES]

# what every shard written before shards recorded their poolings holds
LEGACY_POOLINGS: tuple[str, ...] = ("mean", "cls", "max")
DEFAULT_POOLINGS = "mean,cls,max"


def parse_poolings(spec: str | Iterable[str]) -> tuple[str, ...]:
    """``"mean,cls"`` (or a list) -> ``("mean", "cls")``: known names, no repeats, in the order given.

    Raises ValueError naming the poolings that exist.
    """
    names = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec)]
    names = [n for n in names if n]
    if not names:
        raise ValueError(f"name at least one pooling; known: {', '.join(POOLING_NAMES)}")
    unknown = [n for n in names if n not in POOLINGS]
    if unknown:
        raise ValueError(f"unknown pooling {unknown[0]!r}; known: {', '.join(POOLING_NAMES)}")
    return tuple(dict.fromkeys(names))
