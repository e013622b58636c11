"""Table inputs (layerbank.app.tables) and the CLI's file reader on them: pandas
DataFrames, pyarrow Tables, Hugging Face datasets in memory and on disk, Parquet."""

from __future__ import annotations

from pathlib import Path

import datasets
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from layerbank.app.inputs import InputError, read_texts
from layerbank.app.tables import table_texts

TEXTS = ["a great film", "  ", "a dull play", "quietly moving"]
LABELS = [1, 0, 0, 1]


def _frame() -> pd.DataFrame:
    return pd.DataFrame({"review": TEXTS, "stars": LABELS, "id": [10, 11, 12, 13]})


@pytest.mark.parametrize("make", [
    _frame,
    lambda: pa.Table.from_pandas(_frame(), preserve_index=False),
    lambda: datasets.Dataset.from_pandas(_frame(), preserve_index=False),
], ids=["pandas", "arrow", "datasets"])
def test_every_table_kind_gives_texts_and_labels_by_column_name(make) -> None:  # type: ignore[no-untyped-def]
    table = table_texts(make(), text_column="review", label_column="stars")
    assert table.texts == ["a great film", "a dull play", "quietly moving"]
    assert table.labels == [1, 0, 1] and all(type(v) is int for v in table.labels)  # JSON-ready
    assert table.lines == [1, 3, 4] and table.skipped_empty == [2]  # rows, 1-based
    assert table.columns == ["review", "stars", "id"]


def test_a_missing_column_is_an_error_naming_the_columns_present() -> None:
    with pytest.raises(InputError) as e:
        table_texts(_frame(), text_column="text", label_column="stars")
    assert str(e.value) == "no text column 'text'; the columns are ['review', 'stars', 'id']"
    with pytest.raises(InputError, match=r"no label column 'label'; the columns are \['review'"):
        table_texts(_frame(), text_column="review", label_column="label")
    with pytest.raises(InputError, match=r"say which column holds the texts .*\['review', 'stars', 'id'\]"):
        table_texts(_frame())


def test_text_defaults_to_a_sentence_column_and_labels_only_when_named() -> None:
    table = table_texts(pd.DataFrame({"sentence": ["one", "two"], "label": [0, 1]}))
    assert table.texts == ["one", "two"] and table.labels is None


def test_a_non_text_cell_names_its_row_and_a_datasetdict_its_splits() -> None:
    with pytest.raises(InputError, match=r"^row 2: column 'text' has no value$"):
        table_texts(pd.DataFrame({"text": ["fine", None]}))
    with pytest.raises(InputError, match=r"^row 1: column 'text' holds 7 \(int\), not a text$"):
        table_texts(pa.table({"text": [7]}))
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": ["a"]}),
                               "test": datasets.Dataset.from_dict({"text": ["b"]})})
    with pytest.raises(InputError, match=r"several splits \['train', 'test'\]; give one of them, e.g. ds\['train'\]"):
        table_texts(dd)


def test_a_shuffled_dataset_is_read_in_its_own_order() -> None:
    ds = datasets.Dataset.from_dict({"text": ["a", "b", "c"], "label": [0, 1, 2]}).select([2, 0])
    table = table_texts(ds, label_column="label")
    assert (table.texts, table.labels) == (["c", "a"], [2, 0])


def test_the_file_reader_takes_parquet_and_save_to_disk_directories(tmp_path: Path) -> None:
    pq.write_table(pa.Table.from_pandas(_frame(), preserve_index=False), tmp_path / "r.parquet")
    t = read_texts(tmp_path / "r.parquet", text_column="review", label_column="stars")
    assert (t.texts, t.labels) == (["a great film", "a dull play", "quietly moving"], [1, 0, 1])

    datasets.Dataset.from_pandas(_frame(), preserve_index=False).save_to_disk(tmp_path / "saved")
    t = read_texts(tmp_path / "saved", text_column="review")
    assert t.texts == ["a great film", "a dull play", "quietly moving"] and t.labels is None

    datasets.DatasetDict({"train": datasets.Dataset.from_pandas(_frame(), preserve_index=False)}
                         ).save_to_disk(tmp_path / "splits")
    with pytest.raises(InputError, match=r"holds several splits \['train'\]; give one of them, e.g. .*splits/train"):
        read_texts(tmp_path / "splits", text_column="review")
    assert read_texts(tmp_path / "splits" / "train", text_column="review").texts[0] == "a great film"


def test_the_file_reader_names_the_parquet_file_in_its_errors(tmp_path: Path) -> None:
    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "b.parquet")
    with pytest.raises(InputError, match=r"b.parquet: no text column 'text'; the columns are \['body'\]"):
        read_texts(tmp_path / "b.parquet", text_column="text")
    (tmp_path / "bad.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(InputError, match=r"bad.parquet is not a readable Parquet file"):
        read_texts(tmp_path / "bad.parquet")
    (tmp_path / "plain").mkdir()
    with pytest.raises(InputError, match="plain is a directory, not a file nor a dataset saved with save_to_disk"):
        read_texts(tmp_path / "plain")
