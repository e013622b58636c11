"""Spans: entity-level scores for BIO-tagged sentences (CoNLL semantics).

Tags are BIO: ``O``, ``B-TYPE`` or ``I-TYPE`` (TYPE non-empty). Entities are
read as conlleval and seqeval's default mode read them: an entity starts at
``B-X``, and also at an ``I-X`` that follows ``O`` or a tag of another type;
it continues over ``I-X`` of the same type. Sentence ends close entities.

Scores match spans exactly (same sentence, type, start and end):

- micro precision / recall / F1 over all entities, plus the same per type;
- a precision with no predicted entity, a recall with no gold entity, and
  an F1 whose precision and recall are both 0 are 0.0 (as seqeval's
  default ``zero_division="warn"`` returns, without the warning);
- word accuracy: the share of words whose tag is exactly right.

Example::

    >>> extract_entities(["B-PER", "I-PER", "O", "I-LOC"])
    [Entity(type='PER', start=0, end=2), Entity(type='LOC', start=3, end=4)]
    >>> span_scores([["B-PER", "O"]], [["B-PER", "B-LOC"]]).f1
    0.6666666666666666
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

from layerbank.cache.errors import InputError

__all__ = [
    "Entity",
    "SpanScores",
    "TagSchemeError",
    "TypeScores",
    "check_bio",
    "extract_entities",
    "is_bio_tag",
    "span_scores",
    "word_accuracy",
]


class TagSchemeError(InputError):
    """Tags that are not BIO where entity spans are asked for."""


class Entity(NamedTuple):
    """An entity: its type and word range ``[start, end)`` in its sentence."""

    type: str
    start: int
    end: int


@dataclass(frozen=True)
class TypeScores:
    precision: float
    recall: float
    f1: float
    support: int  # gold entities of this type


@dataclass(frozen=True)
class SpanScores:
    """Entity-level micro scores, per-type scores and word accuracy."""

    precision: float
    recall: float
    f1: float
    n_gold: int
    n_predicted: int
    n_correct: int
    word_accuracy: float
    n_words: int
    per_type: dict[str, TypeScores] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-serializable dict."""
        return asdict(self)


def is_bio_tag(tag: object) -> bool:
    """True for ``O``, ``B-TYPE`` and ``I-TYPE`` with a non-empty TYPE."""
    return isinstance(tag, str) and (tag == "O" or (tag[:2] in ("B-", "I-") and len(tag) > 2))


def check_bio(tags: Sequence[Sequence[str]], *, what: str = "sentence") -> None:
    """Raise TagSchemeError naming the first sentence and tag that is not BIO.

    ``tags`` holds one tag list per sentence; ``what`` names them in the
    message (``"valid sentence"`` -> "valid sentence 12, word 3: ...").
    Sentences and words are counted from 0.
    """
    for s, sentence in enumerate(tags):
        if isinstance(sentence, str):
            raise TagSchemeError(f"{what} {s}: expected a list of tags, got the string {sentence!r}")
        for w, tag in enumerate(sentence):
            if not is_bio_tag(tag):
                raise TagSchemeError(
                    f"{what} {s}, word {w}: tag {tag!r} is not BIO; entity spans need "
                    "tags O, B-TYPE or I-TYPE (convert IOBES or IO tags to BIO first, "
                    "or score word accuracy only)"
                )


def extract_entities(tags: Sequence[str]) -> list[Entity]:
    """Entities of one BIO-tagged sentence, in order (see module docstring).

    Tags are assumed BIO (see check_bio); anything else that is not ``O``
    is read by its first letter and the text after the first hyphen.
    """
    entities: list[Entity] = []
    current: str | None = None  # type of the open entity, if any
    start = 0
    for i, tag in enumerate(tags):
        if tag == "O":
            prefix, kind = "O", None
        else:
            prefix, kind = tag[0], tag[2:]
        if current is not None and (prefix != "I" or kind != current):
            entities.append(Entity(current, start, i))
            current = None
        # I- after O or after another type opens an entity (conlleval's rule).
        if prefix == "B" or (prefix == "I" and current is None):
            current, start = kind, i
    if current is not None:
        entities.append(Entity(current, start, len(tags)))
    return entities


def _check_lengths(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> None:
    if len(gold) != len(predicted):
        raise ValueError(f"{len(gold)} gold sentences but {len(predicted)} predicted")
    for s, (g, p) in enumerate(zip(gold, predicted)):
        if len(g) != len(p):
            raise ValueError(f"sentence {s}: {len(g)} gold tags but {len(p)} predicted")


def word_accuracy(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> float:
    """Share of words whose predicted tag equals the gold tag (0.0 with no words)."""
    _check_lengths(gold, predicted)
    total = sum(len(g) for g in gold)
    right = sum(a == b for g, p in zip(gold, predicted) for a, b in zip(g, p))
    return right / total if total else 0.0


def _prf(correct: int, n_predicted: int, n_gold: int) -> tuple[float, float, float]:
    p = correct / n_predicted if n_predicted else 0.0
    r = correct / n_gold if n_gold else 0.0
    f = 2 * p * r / (p + r) if p + r else 0.0
    return p, r, f


def span_scores(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> SpanScores:
    """Exact-match entity scores of ``predicted`` against ``gold`` (lists of tag lists).

    Raises TagSchemeError if either side is not BIO, ValueError if the
    sentence counts or lengths differ.
    """
    _check_lengths(gold, predicted)
    check_bio(gold, what="gold sentence")
    check_bio(predicted, what="predicted sentence")
    gold_spans = {(s, *e) for s, tags in enumerate(gold) for e in extract_entities(tags)}
    pred_spans = {(s, *e) for s, tags in enumerate(predicted) for e in extract_entities(tags)}
    correct = gold_spans & pred_spans
    by_gold = Counter(e[1] for e in gold_spans)
    by_pred = Counter(e[1] for e in pred_spans)
    by_correct = Counter(e[1] for e in correct)
    per_type = {}
    for kind in sorted(set(by_gold) | set(by_pred)):
        p, r, f = _prf(by_correct[kind], by_pred[kind], by_gold[kind])
        per_type[kind] = TypeScores(p, r, f, by_gold[kind])
    p, r, f = _prf(len(correct), len(pred_spans), len(gold_spans))
    return SpanScores(
        precision=p,
        recall=r,
        f1=f,
        n_gold=len(gold_spans),
        n_predicted=len(pred_spans),
        n_correct=len(correct),
        word_accuracy=word_accuracy(gold, predicted),
        n_words=sum(len(g) for g in gold),
        per_type=per_type,
    )
