"""A file named for the wrong format is explained, not just refused (issue 14)."""

from __future__ import annotations

import pytest

from layerbank.app.inputs import InputError, parse_texts


@pytest.mark.parametrize("data, fmt, hint", [
    (b"sentence,label\na fine film,1\n", "tsv",
     "this looks comma-separated: use --format csv or rename the file to .csv"),
    (b"sentence\tlabel\na fine film\t1\n", "csv",
     "this looks tab-separated: use --format tsv or rename the file to .tsv"),
])
def test_a_header_holding_the_other_separator_names_the_fix(data: bytes, fmt: str, hint: str) -> None:
    with pytest.raises(InputError) as e:
        parse_texts(data, fmt, text_column="sentence")
    assert str(e.value).endswith(hint)
    with pytest.raises(InputError, match=hint):  # also when no column was named
        parse_texts(data, fmt)


def test_a_missing_column_in_a_well_formed_file_gets_no_hint() -> None:
    with pytest.raises(InputError) as e:
        parse_texts(b"text\tlabel\na fine film\t1\n", "tsv", text_column="sentence")
    assert str(e.value) == "no text column 'sentence'; the columns are ['text', 'label']"


def test_the_right_format_reads_the_same_file() -> None:
    table = parse_texts(b"sentence,label\na fine film,1\n", "csv", text_column="sentence",
                        label_column="label")
    assert (table.texts, table.labels) == (["a fine film"], ["1"])
