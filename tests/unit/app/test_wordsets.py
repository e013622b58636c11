"""layerbank.app.probes.wordsets: CoNLL, JSON and JSONL word/tag datasets."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from layerbank.app.probes.wordsets import (
    TaggedSentence,
    WordSetError,
    format_conll,
    parse_conll,
    parse_json,
    parse_jsonl,
    parse_wordset,
    read_wordset,
)
from tests.data_paths import CONLL2003

EXPECTED = [
    TaggedSentence(("EU", "rejects", "German"), ("B-ORG", "O", "B-MISC")),
    TaggedSentence(("Peter", "Blackburn"), ("B-PER", "I-PER")),
]


def test_conll_reads_the_shipped_three_column_layout():
    text = "EU B-ORG 0\nrejects O 0\nGerman B-MISC 0\n\nPeter B-PER 0\nBlackburn I-PER 0\n"
    assert parse_conll(text) == EXPECTED


def test_conll_skips_docstart_extra_blank_lines_and_handles_crlf_and_tabs():
    text = (
        "\ufeff-DOCSTART- -X- -X- O\r\n\r\n\r\n"
        "EU\tNNP\tB-NP\tB-ORG\r\nrejects VBZ B-VP O\r\nGerman JJ B-NP B-MISC\r\n  \r\n"
        "-DOCSTART- -X- -X- O\n\nPeter NNP B-NP B-PER\nBlackburn NNP I-NP I-PER"
    )
    # The original four-column files carry the NER tag last.
    assert parse_conll(text.encode(), tag_column=-1) == EXPECTED
    assert parse_conll(text.encode(), tag_column=3) == EXPECTED
    assert parse_conll(text.encode(), tag_column=1)[0].tags == ("NNP", "VBZ", "JJ")


def test_json_and_jsonl():
    objects = [{"words": list(s.words), "tags": list(s.tags), "id": i} for i, s in enumerate(EXPECTED)]
    assert parse_json(json.dumps(objects, indent=2)) == EXPECTED
    assert parse_jsonl("\n".join(json.dumps(o) for o in objects) + "\n\n") == EXPECTED
    assert parse_wordset(json.dumps(objects).encode(), "json") == EXPECTED


def test_read_wordset_picks_the_format_from_the_suffix(tmp_path):
    objects = [{"words": list(s.words), "tags": list(s.tags)} for s in EXPECTED]
    (tmp_path / "a.json").write_text(json.dumps(objects))
    (tmp_path / "a.jsonl").write_text("\n".join(map(json.dumps, objects)))
    (tmp_path / "a.txt").write_text(format_conll(EXPECTED))
    for name in ("a.json", "a.jsonl", "a.txt"):
        assert read_wordset(tmp_path / name) == EXPECTED
    with pytest.raises(ValueError, match="unknown word set format"):
        parse_wordset("", "csv")


def error_of(call):
    with pytest.raises(WordSetError) as info:
        call()
    return info.value


@pytest.mark.parametrize(
    "parse, data, line, message",
    [
        # CoNLL
        (parse_conll, "EU B-ORG 0\nrejects\n", 2, "malformed line 'rejects'"),
        (parse_conll, "EU B-ORG 0\n\n\nx O 0\n\xff O 0\n".encode("latin-1"), 5, "not UTF-8"),
        (parse_conll, "\n\n-DOCSTART- O\n", None, "no sentences"),
        # JSON: errors name the line where the sentence's object starts
        (
            parse_json,
            '[\n {"words": ["a"], "tags": ["O"]},\n {"words": ["a", "b"], "tags": ["O"]}\n]',
            3,
            "2 words but 1 tags",
        ),
        (
            parse_json,
            '[\n {"words": ["a"], "tags": ["O"]},\n\n {"words": [], "tags": []}]',
            4,
            "empty sentence",
        ),
        (
            parse_json,
            '[{"words": ["a"], "tags": ["O"]},\n {"words": ["New York"], "tags": ["B-LOC"]}]',
            2,
            "word 0 ('New York') contains whitespace",
        ),
        (parse_json, '[{"words": ["a"], "tags": ["O"]},\n {"words": ["a"]}]', 2, "expected an object"),
        (
            parse_json,
            '[{"words": ["a"], "tags": ["O"]}\n\n {"words": ["a"], "tags": ["O"]}]',
            3,
            "expected ','",
        ),
        (parse_json, '[{"words": ["a"],\n "tags": ["O"}]', 2, "invalid JSON"),
        (parse_json, '{"words": ["a"], "tags": ["O"]}', 1, "expected a JSON list"),
        (parse_json, '[{"words": ["a"], "tags": ["O"]}]\n[]', 1, "extra data"),
        (parse_json, '[\n{"words": ["caf\xe9"], "tags": ["O"]}]'.encode("latin-1"), 2, "not UTF-8"),
        (parse_json, "[]", None, "no sentences"),
        # JSONL
        (
            parse_jsonl,
            '{"words": ["a"], "tags": ["O"]}\n{"words": ["a"], "tags": ["O", "O"]}',
            2,
            "1 words but 2 tags",
        ),
        (parse_jsonl, '\n{"words": [], "tags": []}\n', 2, "empty sentence"),
        (
            parse_jsonl,
            '{"words": ["a"], "tags": ["O"]}\n{"words": ["a\\u00a0b"], "tags": ["O"]}',
            2,
            "whitespace",
        ),
        (parse_jsonl, '{"words": ["a"], "tags": ["O"]}\n{"words": ["a"], "tags": [1]}', 2, "tag 0 is int"),
        (parse_jsonl, '{"words": ["a"], "tags": ["O"]}\n\n{"words": ["a"], "tags": ["O"]', 3, "invalid JSON"),
        (parse_jsonl, '{"words": "a", "tags": ["O"]}', 1, '"words" must be a list'),
        (parse_jsonl, b'{"words": ["a"], "tags": ["O"]}\n{"words": ["\xc3"], "tags": ["O"]}', 2, "not UTF-8"),
    ],
)
def test_errors_name_the_line(parse, data, line, message):
    err = error_of(lambda: parse(data, source="set.txt"))
    assert isinstance(err, ValueError)
    assert err.line == line
    assert message in str(err)
    assert str(err).startswith(f"set.txt, line {line}: " if line else "set.txt: ")


def test_conll_tag_column_must_exist_and_not_be_the_word():
    err = error_of(lambda: parse_conll("EU B-ORG 0\n", tag_column=3))
    assert err.line == 1 and "column 3" in str(err)
    with pytest.raises(ValueError, match="non-zero"):
        parse_conll("EU B-ORG 0\n", tag_column=0)
    assert error_of(lambda: parse_conll("EU B-ORG 0\n", tag_column=-3)).line == 1


WORD = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\r"), min_size=1, max_size=8
).filter(lambda w: not any(c.isspace() for c in w) and w != "-DOCSTART-" and not w.startswith("\ufeff"))
TAG = st.sampled_from(["O", "B-PER", "I-PER", "B-LOC", "NN", "VBZ"])


@st.composite
def sentences(draw):
    out = []
    for _ in range(draw(st.integers(1, 5))):
        n = draw(st.integers(1, 6))
        out.append(
            TaggedSentence(
                draw(st.lists(WORD, min_size=n, max_size=n)), draw(st.lists(TAG, min_size=n, max_size=n))
            )
        )
    return out


@settings(max_examples=100, deadline=None)
@given(sentences())
def test_round_trip_conll_and_jsonl(data):
    assert parse_conll(format_conll(data).encode()) == data
    jsonl = "\n".join(json.dumps({"words": list(s.words), "tags": list(s.tags)}) for s in data)
    assert parse_jsonl(jsonl.encode()) == data


def test_real_conll2003_valid_set():
    data = read_wordset(CONLL2003 / "valid.txt")
    assert len(data) == 3250
    assert sum(len(s.words) for s in data) == 51362
    assert data[0] == TaggedSentence(
        ("CRICKET", "-", "LEICESTERSHIRE", "TAKE", "OVER", "AT", "TOP", "AFTER", "INNINGS", "VICTORY", "."),
        ("O", "O", "B-ORG", "O", "O", "O", "O", "O", "O", "O", "O"),
    )
    assert {t for s in data for t in s.tags} == {
        "O",
        "B-PER",
        "I-PER",
        "B-LOC",
        "I-LOC",
        "B-ORG",
        "I-ORG",
        "B-MISC",
        "I-MISC",
    }


@pytest.mark.parametrize("words", [("New York",), ("",), ("-DOCSTART-",), ()])
def test_format_conll_refuses_what_would_not_read_back(words):
    with pytest.raises(ValueError, match="sentence 0"):
        format_conll([TaggedSentence(words, ("O",) * len(words))])
