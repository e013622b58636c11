"""Long texts cost what truncation keeps, not what was sent.

A text is truncated at ``max_length`` tokens, but tokenizing all of it first
costs time in proportion to its length: one request of 300 texts of 99,000
characters held the encoder for 343 s (issue 16). ``head_for_tokens`` gives a
prefix that is cheap to tokenize and, when it already holds more than
``max_length`` tokens, yields exactly the tokens the whole text would keep:
it ends at a whitespace character, and tokenizers split words at whitespace
before anything else (their normalizers act on single characters), so the
tokens before a whitespace boundary do not depend on what follows it.

When the prefix turns out to hold too few tokens (very long "words": URLs,
base64), the caller tokenizes the whole text after all: the numbers never
depend on this shortcut, only the time does. Only for right truncation (the
default); a left-truncated text keeps its end, and is tokenized whole.
"""

from __future__ import annotations

import re

__all__ = ["CHARS_PER_TOKEN", "head_for_tokens"]

# generous: ordinary text runs 3-6 characters per token, so 16 x max_length
# characters hold more than max_length tokens unless the words are very long
CHARS_PER_TOKEN = 16
_LAST_SPACE = re.compile(r"\s\S*\Z")


def head_for_tokens(text: str, max_length: int) -> str | None:
    """A whitespace-ended prefix of ``text`` to tokenize instead, or None to tokenize it whole."""
    limit = int(max_length * CHARS_PER_TOKEN)
    if len(text) <= limit:
        return None
    m = _LAST_SPACE.search(text, 0, limit)
    if m is None or m.start() == 0:
        return None
    return text[: m.start()]
