"""Whether a text has anything to encode: one rule for the API and the command line.

Whitespace-only texts were refused, but a text of zero-width characters
(``"\u200b"``, a byte-order mark, a soft hyphen, joiners) was accepted and
encoded although it shows nothing and says nothing (issue 25). A text is blank
when every character is whitespace, a separator (Unicode category Z*), a
control character (Cc) or a format character (Cf: zero-width space, ZWJ/ZWNJ,
word joiner, BOM, soft hyphen, bidi marks) or the Hangul fillers that render
as nothing.

Example::

    is_blank(" \\u200b\\ufeff")   # True
    is_blank("a\\u200bb")         # False
"""

from __future__ import annotations

import unicodedata

__all__ = ["is_blank"]

_INVISIBLE_CATEGORIES = ("Zs", "Zl", "Zp", "Cc", "Cf")
_FILLERS = frozenset("\u115f\u1160\u3164\uffa0")  # Hangul fillers: letters that draw nothing


def is_blank(text: str) -> bool:
    """True when no character of ``text`` is visible (see the module docstring)."""
    for c in text:
        if c.isspace() or c in _FILLERS:
            continue
        if unicodedata.category(c) not in _INVISIBLE_CATEGORIES:
            return False
    return True
