"""Issue 25, row 14: a text with no visible character is refused like a whitespace-only one,
and the "too few examples per class" 422 names a few classes and the count, not all of them."""

from __future__ import annotations

import pytest

from layerbank.app.blank import is_blank
from layerbank.app.probes.inputs import ProbeInputError, check_labels

INVISIBLE = ["\u200b", " \u200b\u200c\u200d ", "\ufeff", "\u2060\u00ad", "\u3164", "\u202e\u200e"]


@pytest.mark.parametrize("text", INVISIBLE)
def test_zero_width_texts_are_blank(text: str) -> None:
    assert is_blank(text)


@pytest.mark.parametrize("text", ["a\u200bb", "\u200bx", "é", "😀", "\u0301a"])
def test_a_visible_character_is_not_blank(text: str) -> None:
    assert not is_blank(text)


def test_a_zero_width_text_is_refused_over_http_like_a_blank_one(tiny_api) -> None:  # type: ignore[no-untyped-def]
    c = tiny_api.client
    blank = c.post("/v1/features", json={"texts": ["a text", "   "]})
    assert blank.status_code == 422 and blank.json()["field"] == "texts.1"
    for text in INVISIBLE:
        r = c.post("/v1/features", json={"texts": ["a text", text]})
        assert r.status_code == 422, (repr(text), r.text)
        assert r.json()["field"] == "texts.1" and "no visible character" in r.json()["error"]
    r = c.post("/v1/datasets", json={"name": "d", "texts": ["ok", "\u200b"]})
    assert r.status_code == 422 and r.json()["field"] == "texts.1", r.text


def test_the_per_class_message_names_a_few_classes_and_the_count() -> None:
    labels = [f"class {i}" for i in range(2000)] + ["class 1"] * 5
    with pytest.raises(ProbeInputError) as got:
        check_labels(labels, cv=5)
    msg = str(got.value)
    assert len(msg) < 600, len(msg)  # it listed every class: 48 KB
    assert msg.startswith("1,999 of 2,000 classes (") and "and 1,994 more" in msg
    assert "each class needs at least 5" in msg
