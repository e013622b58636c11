"""The command line reads Parquet files and ``save_to_disk`` directories as it
reads a TSV: same texts, same stored rows (the tiny random encoder)."""

from __future__ import annotations

from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from layerbank.app.cli.main import main

TEXTS = ["a great film", "a dull play", "", "quietly moving", "a great film"]


def test_extract_reads_a_parquet_file_and_features_a_saved_dataset_to_the_same_rows(
        tmp_path: Path, tiny_model_dir: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LAYERBANK_DATA_DIR", raising=False)
    common = ["--model", tiny_model_dir, "--data-dir", str(tmp_path / "data"), "--threads", "1"]
    pq.write_table(pa.table({"review": TEXTS, "stars": [5, 1, 3, 4, 5]}), tmp_path / "reviews.parquet")
    assert main(["extract", str(tmp_path / "reviews.parquet"), "--text-column", "review",
                 "--no-progress", *common]) == 0
    out = capsys.readouterr()
    assert "texts      4 (3 unique, 1 empty skipped)" in out.out
    assert "encoded    3 texts" in out.out
    assert "skipped 1 empty texts (lines 3)" in out.err  # a Parquet row counts as a line

    datasets.Dataset.from_dict({"review": TEXTS}).save_to_disk(tmp_path / "saved")
    tsv = tmp_path / "reviews.tsv"
    tsv.write_text("review\n" + "".join(t + "\n" for t in TEXTS if t), encoding="utf-8")
    for src, name in ((tmp_path / "saved", "from_disk.npy"), (tsv, "from_tsv.npy")):
        assert main(["features", str(src), "--text-column", "review", "--view", "layer:-1",
                     "--out", str(tmp_path / name), *common]) == 0
    from_disk, from_tsv = np.load(tmp_path / "from_disk.npy"), np.load(tmp_path / "from_tsv.npy")
    assert from_disk.shape == (4, 32)
    np.testing.assert_array_equal(from_disk, from_tsv)
    np.testing.assert_array_equal(from_disk[0], from_disk[3])  # the repeated text, one stored row


def test_a_parquet_file_without_the_column_fails_with_the_columns_present(
        tmp_path: Path, tiny_model_dir: str, capsys: pytest.CaptureFixture[str]) -> None:
    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "b.parquet")
    with pytest.raises(SystemExit) as e:
        main(["extract", str(tmp_path / "b.parquet"), "--model", tiny_model_dir,
              "--data-dir", str(tmp_path / "data")])
    assert e.value.code != 0
    assert "b.parquet: say which column holds the texts (text_column=...): the columns are ['body']" \
        in capsys.readouterr().err
