"""Word sets: datasets of sentences given as words with one tag per word.

Three formats are read, all UTF-8:

- **CoNLL** columns: one word per line, ``word TAG ...`` separated by
  whitespace; a blank line ends a sentence; ``-DOCSTART-`` lines are skipped.
  The word is column 0 and the tag is column ``tag_column``. Its default is
  **1**, not the last column: CoNLL-2003 as shipped in ``../shared/data`` has
  lines ``EU B-ORG 0``, where the last column is not the tag. Negative values
  count from the end (``-1`` = last column, as in the original 4-column
  ``word POS CHUNK NER`` files).
- **JSON**: a list of objects ``{"words": [...], "tags": [...]}`` (other keys
  are ignored).
- **JSONL**: one such object per line; blank lines are skipped.

Every parser returns ``list[TaggedSentence]`` and raises ``WordSetError`` (a
ValueError) naming the line for: words and tags of different lengths, an empty
sentence (JSON/JSONL), an empty word or a word/tag containing whitespace,
non-UTF-8 bytes, a malformed line or object, and a file with no sentence.

Example::

    >>> parse_conll("EU B-ORG 0\\nrejects O 0\\n\\nPeter B-PER 0\\n")
    [TaggedSentence(words=('EU', 'rejects'), tags=('B-ORG', 'O')), \
TaggedSentence(words=('Peter',), tags=('B-PER',))]
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from layerbank.cache.errors import InputError

__all__ = [
    "WORDSET_FORMATS",
    "TaggedSentence",
    "WordSetError",
    "format_conll",
    "parse_conll",
    "parse_json",
    "parse_jsonl",
    "parse_wordset",
    "read_wordset",
]

WORDSET_FORMATS = ("conll", "json", "jsonl")
_DOCSTART = "-DOCSTART-"


class WordSetError(InputError):
    """A word set that cannot be read; ``line`` is 1-based (None if unknown)."""

    def __init__(self, message: str, line: int | None = None, source: str | None = None, *,
                 field: str | None = None):
        self.line = line
        self.source = source
        where = ", ".join(p for p in (source, f"line {line}" if line else None) if p)
        super().__init__(f"{where}: {message}" if where else message, field=field)


@dataclass(frozen=True)
class TaggedSentence:
    """One sentence: its words and one tag per word (tuples, so hashable)."""

    words: tuple[str, ...]
    tags: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "words", tuple(self.words))
        object.__setattr__(self, "tags", tuple(self.tags))


def _decode(data: bytes | str, source: str | None) -> str:
    if isinstance(data, str):
        return data.removeprefix("\ufeff")  # as utf-8-sig does for bytes
    try:
        # utf-8-sig: a byte-order mark written by some editors is not a word.
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise WordSetError(f"not UTF-8: byte 0x{data[e.start]:02x} cannot be decoded", line, source) from None


def _lines(text: str) -> Iterable[tuple[int, str]]:
    # Split on "\n" only: str.splitlines() would also break on \x0b, \x1c,
    # U+2028 ..., which may legitimately sit inside a JSON string.
    for number, line in enumerate(text.split("\n"), start=1):
        yield number, line.rstrip("\r")


def _check_token(kind: str, value: Any, index: int, line: int, source: str | None) -> str:
    if not isinstance(value, str):
        raise WordSetError(f"{kind} {index} is {type(value).__name__}, expected a string", line, source)
    if not value:
        raise WordSetError(f"{kind} {index} is empty", line, source)
    if any(ch.isspace() for ch in value):
        raise WordSetError(f"{kind} {index} ({value!r}) contains whitespace", line, source)
    return value


def parse_conll(data: bytes | str, *, tag_column: int = 1, source: str | None = None) -> list[TaggedSentence]:
    """Parse CoNLL column text (see module docstring); ``source`` names the file in errors."""
    if isinstance(tag_column, bool) or not isinstance(tag_column, int) or tag_column == 0:
        raise ValueError(f"tag_column must be a non-zero integer (column 0 is the word), got {tag_column!r}")
    text = _decode(data, source)
    sentences: list[TaggedSentence] = []
    words: list[str] = []
    tags: list[str] = []
    for number, line in _lines(text):
        columns = line.split()
        if not columns:
            if words:
                sentences.append(TaggedSentence(tuple(words), tuple(tags)))
                words, tags = [], []
            continue
        if columns[0] == _DOCSTART:
            continue
        if not -len(columns) <= tag_column < len(columns) or tag_column == -len(columns):
            raise WordSetError(
                f"malformed line {line.strip()!r}: expected 'word TAG ...' with the tag in "
                f"column {tag_column}, found {len(columns)} column(s)",
                number,
                source,
            )
        words.append(columns[0])
        tags.append(columns[tag_column])
    if words:
        sentences.append(TaggedSentence(tuple(words), tuple(tags)))
    if not sentences:
        raise WordSetError("no sentences found", None, source)
    return sentences


def _sentence_from_object(obj: Any, line: int, source: str | None) -> TaggedSentence:
    if not isinstance(obj, dict) or "words" not in obj or "tags" not in obj:
        raise WordSetError('expected an object {"words": [...], "tags": [...]}', line, source)
    words, tags = obj["words"], obj["tags"]
    for kind, value in (("words", words), ("tags", tags)):
        if not isinstance(value, list):
            raise WordSetError(f'"{kind}" must be a list, got {type(value).__name__}', line, source)
    if not words:
        raise WordSetError("empty sentence: a sentence needs at least one word", line, source)
    if len(words) != len(tags):
        raise WordSetError(f"{len(words)} words but {len(tags)} tags", line, source)
    return TaggedSentence(
        tuple(_check_token("word", w, i, line, source) for i, w in enumerate(words)),
        tuple(_check_token("tag", t, i, line, source) for i, t in enumerate(tags)),
    )


def parse_json(data: bytes | str, *, source: str | None = None) -> list[TaggedSentence]:
    """Parse a JSON list of ``{"words", "tags"}`` objects; errors name the object's line."""
    text = _decode(data, source)
    decoder = json.JSONDecoder()
    # Decode element by element (rather than json.loads on the whole list) so
    # that an invalid sentence is reported at the line where its object starts.
    pos = _skip_ws(text, 0)
    if not text.startswith("[", pos):
        raise WordSetError("expected a JSON list of sentences", text.count("\n", 0, pos) + 1, source)
    sentences: list[TaggedSentence] = []
    pos = _skip_ws(text, pos + 1)
    # line numbers counted incrementally: counting from 0 for every sentence is quadratic
    line, counted = 1, 0
    if text.startswith("]", pos):
        pos += 1
    else:
        while True:
            line += text.count("\n", counted, pos)
            counted = pos
            try:
                obj, pos = decoder.raw_decode(text, pos)
            except json.JSONDecodeError as e:
                raise WordSetError(f"invalid JSON: {e.msg}", e.lineno, source) from None
            except RecursionError:
                raise WordSetError("invalid JSON: nested too deeply", line, source) from None
            except ValueError as e:  # e.g. an integer of more than 4,300 digits
                raise WordSetError(f"cannot be read: {str(e).split(':')[0]}", line, source) from None
            sentences.append(_sentence_from_object(obj, line, source))
            pos = _skip_ws(text, pos)
            if text.startswith(",", pos):
                pos = _skip_ws(text, pos + 1)
            elif text.startswith("]", pos):
                pos += 1
                break
            else:
                line = text.count("\n", 0, pos) + 1
                raise WordSetError("invalid JSON: expected ',' or ']' after a sentence", line, source)
    if _skip_ws(text, pos) != len(text):
        line = text.count("\n", 0, pos) + 1
        raise WordSetError("invalid JSON: extra data after the list", line, source)
    if not sentences:
        raise WordSetError("no sentences found", None, source)
    return sentences


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def parse_jsonl(data: bytes | str, *, source: str | None = None) -> list[TaggedSentence]:
    """Parse JSON Lines: one ``{"words", "tags"}`` object per line."""
    text = _decode(data, source)
    sentences: list[TaggedSentence] = []
    for number, line in _lines(text):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise WordSetError(f"invalid JSON: {e.msg}", number, source) from None
        except RecursionError:
            raise WordSetError("invalid JSON: nested too deeply", number, source) from None
        except ValueError as e:  # e.g. an integer of more than 4,300 digits
            raise WordSetError(f"cannot be read: {str(e).split(':')[0]}", number, source) from None
        sentences.append(_sentence_from_object(obj, number, source))
    if not sentences:
        raise WordSetError("no sentences found", None, source)
    return sentences


def parse_wordset(
    data: bytes | str, fmt: str, *, tag_column: int = 1, source: str | None = None
) -> list[TaggedSentence]:
    """Parse ``data`` in format ``fmt`` (one of WORDSET_FORMATS)."""
    if fmt == "conll":
        return parse_conll(data, tag_column=tag_column, source=source)
    if fmt == "json":
        return parse_json(data, source=source)
    if fmt == "jsonl":
        return parse_jsonl(data, source=source)
    raise ValueError(f"unknown word set format {fmt!r}; expected one of {', '.join(WORDSET_FORMATS)}")


def read_wordset(path: str | Path, fmt: str | None = None, *, tag_column: int = 1) -> list[TaggedSentence]:
    """Read a word set file; ``fmt`` defaults from the suffix (.json, .jsonl, else conll)."""
    p = Path(path)
    if fmt is None:
        fmt = {".json": "json", ".jsonl": "jsonl"}.get(p.suffix.lower(), "conll")
    return parse_wordset(p.read_bytes(), fmt, tag_column=tag_column, source=str(p))


def format_conll(sentences: Sequence[TaggedSentence]) -> str:
    """Write sentences as two-column CoNLL (``word TAG``), readable by parse_conll."""
    blocks = []
    for n, s in enumerate(sentences):
        if not s.words or len(s.words) != len(s.tags):
            raise ValueError(f"sentence {n}: {len(s.words)} words and {len(s.tags)} tags")
        for i, (w, t) in enumerate(zip(s.words, s.tags)):
            # A word that would not read back the same is refused, not mangled.
            for kind, value in (("word", w), ("tag", t)):
                if not isinstance(value, str) or not value or any(c.isspace() for c in value):
                    raise ValueError(f"sentence {n}: {kind} {i} ({value!r}) cannot be written as a column")
            if w == _DOCSTART:
                raise ValueError(f"sentence {n}: word {i} is {_DOCSTART}, which CoNLL readers skip")
        blocks.append("".join(f"{w} {t}\n" for w, t in zip(s.words, s.tags)))
    return "\n".join(blocks)
