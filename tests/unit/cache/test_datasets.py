"""layerbank.cache.datasets.DatasetStore: named lists of texts, inserted all or nothing."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from layerbank.cache.catalog import Catalog
from layerbank.cache.datasets import DatasetStore


@pytest.fixture
def ds(tmp_path: Path) -> DatasetStore:
    cat = Catalog(tmp_path / "catalog.sqlite")
    yield DatasetStore(cat)
    cat.close()


def test_sentence_dataset_round_trips_texts_and_labels(ds: DatasetStore) -> None:
    texts = ["good film . ", " bad", "ok\ttab", "\u00e9t\u00e9"]
    d = ds.create("sst2-mini", texts, labels=[1, 0, "1", None], model="m", config="{}",
                  meta={"source": "test.tsv"})
    assert d.id.startswith("ds_") and d.task == "sentence" and d.n_items == 4
    assert d.meta == {"source": "test.tsv", "labels": ["0", "1"], "label_type": "str"}  # mixed: as text
    items = ds.items(d.id)
    assert items.texts == texts  # exactly as given: spaces and tabs kept
    assert items.labels == ["1", "0", "1", None]
    assert items.words is None and items.tags is None
    pub = d.public()
    assert pub["name"] == "sst2-mini" and pub["n_items"] == 4 and pub["labels"] == ["0", "1"]


def test_token_dataset_round_trips_words_and_tags(ds: DatasetStore) -> None:
    words = [["EU", "rejects", "German"], ["Peter", "Blackburn"]]
    tags = [["B-ORG", "O", "B-MISC"], ["B-PER", "I-PER"]]
    d = ds.create("conll", ["EU rejects German", "Peter Blackburn"], words=words, tags=tags,
                  model="m", config="{}")
    assert d.task == "token"
    items = ds.items(d.id)
    assert items.words == words and items.tags == tags


def test_get_list_delete(ds: DatasetStore) -> None:
    a = ds.create("a", ["x"], model="m", config="{}", dataset_id="ds_a")
    b = ds.create("b", ["y", "z"], model="m", config="{}")
    assert [d.id for d in ds.list()] == [a.id, b.id]
    assert ds.get("ds_a") == a
    assert ds.delete("ds_a") is True
    assert ds.get("ds_a") is None and ds.items("ds_a").texts == []
    assert ds.delete("ds_a") is False
    assert [d.id for d in ds.list()] == [b.id]


def test_a_bad_item_leaves_no_half_dataset(ds: DatasetStore, tmp_path: Path) -> None:
    with pytest.raises(sqlite3.IntegrityError):
        ds.create("broken", ["fine", None, "fine too"], model="m", config="{}",  # type: ignore[list-item]
                  dataset_id="ds_broken")
    assert ds.get("ds_broken") is None
    assert ds.catalog.conn().execute("SELECT COUNT(*) FROM dataset_items").fetchone()[0] == 0


def test_a_duplicate_id_is_refused_and_the_first_kept(ds: DatasetStore) -> None:
    ds.create("first", ["a", "b"], model="m", config="{}", dataset_id="ds_x")
    with pytest.raises(sqlite3.IntegrityError):
        ds.create("second", ["c"], model="m", config="{}", dataset_id="ds_x")
    assert ds.get("ds_x").name == "first"  # type: ignore[union-attr]
    assert ds.items("ds_x").texts == ["a", "b"]
