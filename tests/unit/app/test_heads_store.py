"""The saved heads' table and directories on their own (app/api/probe_jobs/heads_store.py):
what a record holds, which ids may name a directory, a head's files moved into place
whole, its size, and what deleting and cleaning leave on disk. A bare catalog, no app
(0.5 s), so the mutation run (bench/mutation.sh) can use it.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from layerbank.app.api.probe_jobs.heads_store import HeadRecord, HeadStore
from layerbank.cache.catalog import Catalog

FIELDS = dict(name="sst2", job_id="job-1", dataset_id="ds_1", head="logistic", view="layer:4",
              pooling="mean", fingerprint="fp-abc", config="cfg-xyz", model="MiniLM")


@pytest.fixture
def store(tmp_path: Path) -> HeadStore:
    return HeadStore(Catalog(tmp_path / "catalog.sqlite"), tmp_path / "data")


def _written(store: HeadStore, head_id: str, arrays: bytes = b"A" * 100, meta: bytes = b"{}" * 7) -> Path:
    tmp = store.temp_directory(head_id)
    (tmp / "arrays.npz").write_bytes(arrays)
    (tmp / "head.json").write_bytes(meta)
    return tmp


def test_a_new_data_directory_gets_its_heads_folder_and_a_second_store_sees_the_same_heads(tmp_path: Path) -> None:
    cat = Catalog(tmp_path / "catalog.sqlite")
    first = HeadStore(cat, tmp_path / "not" / "made" / "yet")
    assert first.root == tmp_path / "not" / "made" / "yet" / "heads" and first.root.is_dir()
    rec = first.create(**FIELDS)
    again = HeadStore(cat, tmp_path / "not" / "made" / "yet")  # the next start of the server
    assert again.get(rec.id) == rec


def test_a_record_holds_what_it_was_given(store: HeadStore) -> None:
    before = time.time()
    rec = store.create(**FIELDS)
    assert re.fullmatch(r"hd_[0-9a-f]{12}", rec.id)
    assert rec == HeadRecord(id=rec.id, n_bytes=None, meta={}, created=rec.created, **FIELDS)
    assert before <= rec.created <= time.time()
    assert store.get(rec.id) == rec
    given = store.create(**FIELDS, meta={"seed": 3, "classes": ["a", "b"]}, head_id="hd_0123456789ab")
    assert given.id == "hd_0123456789ab" and given.meta == {"seed": 3, "classes": ["a", "b"]}
    assert store.get("hd_ffffffffffff") is None


def test_heads_are_listed_oldest_first(store: HeadStore) -> None:
    ids = []
    for i in range(3):
        ids.append(store.create(**{**FIELDS, "name": f"h{i}"}).id)
        time.sleep(0.002)
    assert [r.id for r in store.list()] == ids
    assert [r.name for r in store.list()] == ["h0", "h1", "h2"]


@pytest.mark.parametrize("bad", ["../etc", "hd_0123456789a", "hd_0123456789abc", "hd_0123456789AB",
                                 "hd_0123456789ab/../../x", "xx_0123456789ab", "hd_0123456789ab\n"])
def test_only_an_id_made_here_names_a_directory(store: HeadStore, bad: str) -> None:
    with pytest.raises(ValueError) as e:
        store.directory(bad)
    assert str(e.value) == f"not a head id: {bad!r}"
    with pytest.raises(ValueError):
        store.create(**FIELDS, head_id=bad)
    with pytest.raises(ValueError):
        store.temp_directory(bad)
    assert store.list() == [] and os.listdir(store.root) == []  # nothing recorded, nothing made


def test_publish_moves_the_files_into_place_and_records_their_size_and_meta(store: HeadStore) -> None:
    rec = store.create(**FIELDS)
    assert store.file_sizes(rec.id) == {}  # being fitted: no files yet
    tmp = _written(store, rec.id)
    assert tmp.parent == store.root and tmp.name.startswith(f".{rec.id}.tmp-{os.getpid()}-")
    got = store.publish(rec.id, tmp, {"classes": ["neg", "pos"], "n_examples": 40})
    assert got.n_bytes == 114 and got.meta == {"classes": ["neg", "pos"], "n_examples": 40}
    assert store.get(rec.id) == got
    assert not tmp.exists()
    assert sorted(os.listdir(store.root / rec.id)) == ["arrays.npz", "head.json"]
    assert (store.root / rec.id / "arrays.npz").read_bytes() == b"A" * 100
    assert store.file_sizes(rec.id) == {"arrays.npz": 100, "head.json": 14}
    (store.root / rec.id / "head.json").unlink()
    assert store.file_sizes(rec.id) == {"arrays.npz": 100}


def test_a_rerun_of_the_job_replaces_the_head_whole(store: HeadStore) -> None:
    rec = store.create(**FIELDS)
    store.publish(rec.id, _written(store, rec.id), {"run": 1})
    (store.root / rec.id / "stray.txt").write_text("from the first run")
    got = store.publish(rec.id, _written(store, rec.id, arrays=b"B" * 10, meta=b"{}"), {"run": 2})
    assert got.n_bytes == 12 and got.meta == {"run": 2}
    assert sorted(os.listdir(store.root / rec.id)) == ["arrays.npz", "head.json"]
    assert (store.root / rec.id / "arrays.npz").read_bytes() == b"B" * 10


def test_a_head_deleted_while_it_was_fitted_keeps_no_files(store: HeadStore) -> None:
    rec = store.create(**FIELDS)
    tmp = _written(store, rec.id)
    assert store.delete(rec.id) is True
    with pytest.raises(LookupError) as e:
        store.publish(rec.id, tmp, {})
    assert str(e.value) == f"head {rec.id} was deleted while it was being fitted"
    assert os.listdir(store.root) == []


def test_a_head_deleted_between_the_check_and_the_update_keeps_no_files(store: HeadStore,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    rec = store.create(**FIELDS)
    tmp = _written(store, rec.id)
    real_get = store.get
    calls = []

    def get(head_id: str) -> HeadRecord | None:
        calls.append(head_id)
        if len(calls) == 2:  # the DELETE of another request lands after the first check
            store.delete(head_id)
        return real_get(head_id)

    monkeypatch.setattr(store, "get", get)
    with pytest.raises(LookupError) as e:
        store.publish(rec.id, tmp, {})
    assert str(e.value) == f"head {rec.id} was deleted while it was being fitted"
    assert os.listdir(store.root) == [] and real_get(rec.id) is None


def test_delete_removes_the_row_and_the_files_of_that_head_only(store: HeadStore) -> None:
    keep, gone, unfitted = (store.create(**FIELDS) for _ in range(3))
    for rec in (keep, gone):
        store.publish(rec.id, _written(store, rec.id), {})
    assert store.delete(gone.id) is True
    assert store.delete(unfitted.id) is True  # never written: no directory to remove
    assert store.delete(gone.id) is False and store.delete("hd_000000000000") is False
    assert [r.id for r in store.list()] == [keep.id]
    assert os.listdir(store.root) == [keep.id]


def test_clean_removes_the_temp_directories_of_a_crash_and_counts_them(store: HeadStore) -> None:
    done, crashed = store.create(**FIELDS), store.create(**FIELDS)
    store.publish(done.id, _written(store, done.id), {})
    _written(store, crashed.id)
    store.temp_directory(crashed.id)  # an empty one too
    assert store.clean() == 2
    assert os.listdir(store.root) == [done.id]
    assert store.clean() == 0


def test_a_heads_folder_removed_while_the_server_runs_is_made_again_for_the_next_head(store: HeadStore) -> None:
    import shutil

    rec = store.create(**FIELDS)
    shutil.rmtree(store.root)  # an operator clearing heads/ by hand
    got = store.publish(rec.id, _written(store, rec.id), {})
    assert got.n_bytes == 114 and sorted(os.listdir(store.root)) == [rec.id]
