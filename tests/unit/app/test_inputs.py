"""layerbank.app.inputs: texts and labels from .txt, .jsonl, .csv and .tsv files.

Texts come back exactly as written (they are hashed as given), empty ones
are skipped and reported by line, and every error says where it is.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from layerbank.app.blank import is_blank
from layerbank.app.inputs import InputError, parse_texts, read_texts
from tests.data_paths import SST2 as SST2_DIR

SST2 = SST2_DIR / "test.tsv"


def write(tmp_path: Path, name: str, data: str | bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return p


# -- every format -------------------------------------------------------------

def test_txt_one_text_per_line(tmp_path: Path) -> None:
    t = read_texts(write(tmp_path, "a.txt", "first line\n second, with space \r\nthird\n"))
    assert t.texts == ["first line", " second, with space ", "third"]
    assert t.lines == [1, 2, 3] and t.labels is None and t.skipped_empty == []


def test_jsonl_with_text_and_label_fields(tmp_path: Path) -> None:
    p = write(tmp_path, "a.jsonl", '{"text": "good", "label": 1}\n'
                                  '{"text": "a \\"quoted\\" word", "label": 0}\n\n'
                                  '{"text": "caf\\u00e9", "label": 1}\n')
    t = read_texts(p, label_column="label")
    assert t.texts == ["good", 'a "quoted" word', "caf\u00e9"]
    assert t.labels == [1, 0, 1] and t.lines == [1, 2, 4]


def test_jsonl_named_text_field(tmp_path: Path) -> None:
    t = read_texts(write(tmp_path, "a.jsonl", '{"review": "x", "text": "not this"}\n'),
                   text_column="review")
    assert t.texts == ["x"]


def test_csv_with_quotes_commas_and_newlines_inside_fields(tmp_path: Path) -> None:
    p = write(tmp_path, "a.csv", 'text,label\n"Hello, world",pos\n"He said ""no""",neg\nplain,pos\n')
    t = read_texts(p, label_column="label")
    assert t.texts == ["Hello, world", 'He said "no"', "plain"]
    assert t.labels == ["pos", "neg", "pos"] and t.columns == ["text", "label"]


def test_tsv_is_unquoted_so_quotes_are_part_of_the_text(tmp_path: Path) -> None:
    p = write(tmp_path, "a.tsv", 'sentence\tlabel\n"the film" is "great" \t1\nit \'s fine , "ok\t0\n')
    t = read_texts(p, text_column="sentence", label_column="label")
    assert t.texts == ['"the film" is "great" ', 'it \'s fine , "ok']
    assert t.labels == ["1", "0"]


def test_the_real_sst2_file_reads_as_published() -> None:
    t = read_texts(SST2, text_column="sentence", label_column="label")
    assert len(t.texts) == 872 and t.columns == ["sentence", "label"]
    assert t.texts[0] == "it 's a charming and often affecting journey . "  # trailing space kept
    assert set(t.labels or []) == {"0", "1"}
    assert t.lines[:2] == [2, 3]


def test_no_header_names_columns_by_number(tmp_path: Path) -> None:
    p = write(tmp_path, "agnews.tsv", "Wall St. Bears Claw Back #39;s\tBusiness\nA goal\tSports\n")
    t = read_texts(p, header=False, label_column="1")
    assert t.texts == ["Wall St. Bears Claw Back #39;s", "A goal"]
    assert t.labels == ["Business", "Sports"] and t.columns == ["0", "1"] and t.lines == [1, 2]


def test_a_format_flag_overrides_the_suffix(tmp_path: Path) -> None:
    t = read_texts(write(tmp_path, "data.dat", "text\tlabel\nx\t1\n"), fmt="tsv")
    assert t.texts == ["x"]


def test_a_utf8_bom_is_not_part_of_the_header(tmp_path: Path) -> None:
    t = read_texts(write(tmp_path, "a.csv", "\ufefftext,label\nx,1\n"))
    assert t.columns == ["text", "label"] and t.texts == ["x"]


# -- empty texts --------------------------------------------------------------

def test_empty_and_whitespace_texts_are_skipped_and_reported_by_line(tmp_path: Path) -> None:
    p = write(tmp_path, "a.tsv", "sentence\tlabel\ngood\t1\n\t0\n   \t1\n\nbad\t0\n")
    t = read_texts(p, label_column="label")
    assert t.texts == ["good", "bad"] and t.labels == ["1", "0"]
    assert t.skipped_empty == [3, 4, 5] and t.lines == [2, 6]


def test_empty_lines_of_a_txt_file_are_reported(tmp_path: Path) -> None:
    t = read_texts(write(tmp_path, "a.txt", "a\n\n \t \nb\n"))
    assert t.texts == ["a", "b"] and t.skipped_empty == [2, 3]


def test_empty_jsonl_text_is_reported(tmp_path: Path) -> None:
    t = read_texts(write(tmp_path, "a.jsonl", '{"text": "a"}\n{"text": "  "}\n'))
    assert t.texts == ["a"] and t.skipped_empty == [2]


def test_a_file_of_only_empty_texts_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no non-empty texts"):
        read_texts(write(tmp_path, "a.txt", "\n  \n"))


# -- errors say where ---------------------------------------------------------

def test_non_utf8_names_the_line(tmp_path: Path) -> None:
    p = write(tmp_path, "a.tsv", b"sentence\tlabel\nfine\t1\ncaf\xe9 latin-1\t0\n")
    with pytest.raises(InputError) as e:
        read_texts(p)
    assert str(e.value) == f"{p}: line 3 is not valid UTF-8 (byte 4): convert the file to UTF-8"


def test_a_missing_column_lists_the_columns(tmp_path: Path) -> None:
    p = write(tmp_path, "a.tsv", "review\tstars\nx\t1\n")
    with pytest.raises(InputError) as e:
        read_texts(p, text_column="sentence")
    assert str(e.value) == f"{p}: no text column 'sentence'; the columns are ['review', 'stars']"
    with pytest.raises(InputError, match=r"say which column holds the text: --text-column one of "
                                         r"\['review', 'stars'\]"):
        read_texts(p)
    with pytest.raises(InputError, match=r"no label column 'label'; the columns are"):
        read_texts(p, text_column="review", label_column="label")


def test_a_wrong_field_count_names_the_line(tmp_path: Path) -> None:
    p = write(tmp_path, "a.tsv", "sentence\tlabel\nok\t1\nhas\ta tab\t0\n")
    with pytest.raises(InputError, match=r"line 3 has 3 fields, the header has 2"):
        read_texts(p)
    p = write(tmp_path, "b.csv", "text,label\nok,1\nno label\n")
    with pytest.raises(InputError, match=r"line 3 has 1 fields, the header has 2"):
        read_texts(p)


def test_csv_line_numbers_count_lines_not_records(tmp_path: Path) -> None:
    # a quoted field spanning two lines: the bad record starts on line 4
    p = write(tmp_path, "a.csv", 'text,label\n"two\nlines",1\nthree,fields,here\n')
    with pytest.raises(InputError, match=r"line 4 has 3 fields"):
        read_texts(p)


def test_csv_keeps_line_breaks_inside_quoted_fields_exactly(tmp_path: Path) -> None:
    # a Windows file: CRLF between records and inside a quoted field
    p = write(tmp_path, "a.csv", 'text,label\r\n"first\r\nsecond",1\r\nplain,0\r\n')
    t = read_texts(p, label_column="label")
    assert t.texts == ["first\r\nsecond", "plain"]
    assert t.lines == [2, 4]


def test_a_blank_line_in_a_csv_is_an_empty_text_not_a_field_count_error(tmp_path: Path) -> None:
    t = read_texts(write(tmp_path, "a.csv", "text,label\nx,1\n\ny,0\n"), label_column="label")
    assert t.texts == ["x", "y"] and t.skipped_empty == [3]


def test_a_csv_field_past_the_size_limit_is_an_input_error(tmp_path: Path) -> None:
    p = write(tmp_path, "a.csv", 'text\nshort\n"' + "x" * 200_000 + '"\n')
    with pytest.raises(InputError, match=r"line 3: field larger than field limit"):
        read_texts(p)


def test_bad_jsonl_names_the_line(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"line 2 is not valid JSON"):
        read_texts(write(tmp_path, "a.jsonl", '{"text": "a"}\n{"text": \n'))
    with pytest.raises(InputError, match=r"line 1: expected a JSON object, got list"):
        read_texts(write(tmp_path, "b.jsonl", '["a"]\n'))
    with pytest.raises(InputError, match=r"line 2: no text field 'text'; fields are \['body'\]"):
        read_texts(write(tmp_path, "c.jsonl", '{"text": "a"}\n{"body": "b"}\n'))
    with pytest.raises(InputError, match=r"line 1: field 'text' must be a string"):
        read_texts(write(tmp_path, "d.jsonl", '{"text": 3}\n'))


def test_unknown_suffix_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"cannot tell the format from '\.xlsx'"):
        read_texts(write(tmp_path, "a.xlsx", "x"))
    with pytest.raises(InputError, match="no such file"):
        read_texts(tmp_path / "missing.txt")
    (tmp_path / "d.txt").mkdir()
    with pytest.raises(InputError, match="is a directory"):
        read_texts(tmp_path / "d.txt")


def test_labels_need_columns(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="a .txt file has no columns"):
        read_texts(write(tmp_path, "a.txt", "x\n"), label_column="label")


# -- writers -> parse round trips ----------------------------------------------

# texts a user may have: any Unicode except what each format cannot hold
any_text = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=40)
nonblank = any_text.filter(lambda s: not is_blank(s))  # what parse_texts keeps
labels = st.sampled_from(["0", "1", "pos", "a,b", 'q"'])


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(nonblank, labels), min_size=1, max_size=12))
@example([("a\r\nb", "0"), ("\ra\r", "1"), ("x\n\ny", "a,b")])
def test_csv_writer_round_trips(rows: list[tuple[str, str]]) -> None:
    buf = io.StringIO(newline="")
    w = csv.writer(buf)
    w.writerow(["text", "label"])
    w.writerows(rows)
    t = parse_texts(buf.getvalue().encode(), "csv", label_column="label")
    assert t.texts == [r[0] for r in rows]
    assert t.labels == [r[1] for r in rows]


tsv_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\t\n\r"),
                   min_size=1, max_size=40).filter(lambda s: not is_blank(s))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(tsv_text, labels), min_size=1, max_size=12), st.booleans())
def test_tsv_writer_round_trips(rows: list[tuple[str, str]], header: bool) -> None:
    # what GLUE-style writers do: join on tabs, no quoting (csv.QUOTE_NONE with no escape char)
    lines = (["sentence\tlabel"] if header else []) + [f"{a}\t{b}" for a, b in rows]
    data = "\n".join(lines) + "\n"
    t = parse_texts(data.encode(), "tsv", header=header, label_column="label" if header else "1")
    assert t.texts == [r[0] for r in rows]
    assert t.labels == [r[1] for r in rows]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(nonblank, st.one_of(st.integers(), st.text(max_size=5))),
                min_size=1, max_size=12), st.booleans())
def test_jsonl_writer_round_trips(rows: list[tuple[str, object]], ascii_only: bool) -> None:
    data = "".join(json.dumps({"text": a, "label": b}, ensure_ascii=ascii_only) + "\n" for a, b in rows)
    t = parse_texts(data.encode(), "jsonl", label_column="label")
    assert t.texts == [r[0] for r in rows]
    assert t.labels == [r[1] for r in rows]
