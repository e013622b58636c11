"""cache/repair.py: a damaged, destroyed or deleted catalog is rebuilt from the shards,
every stored row answers with its original numbers, and what could be read of the
other tables is kept (what could not is named)."""

from __future__ import annotations

import logging
import re
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from layerbank.cache.catalog import Catalog
from layerbank.cache.datasets import DatasetStore
from layerbank.cache.jobs import JobQueue
from layerbank.cache.repair import check_catalog, repair_catalog
from layerbank.cache.store import FeatureStore

from .test_store import CFG, contents, key

# the SQLite file itself: its pages, its header; a PostgreSQL catalog is repaired by PostgreSQL
pytestmark = pytest.mark.sqlite_only


def _page_of(path: Path, table: str) -> tuple[int, int]:
    db = sqlite3.connect(path)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # everything into the main file
    root = db.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)).fetchone()[0]
    size = db.execute("PRAGMA page_size").fetchone()[0]
    db.close()
    return (root - 1) * size, size


def _smash(path: Path, offset: int, n: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        fh.write(np.random.default_rng(0).integers(0, 256, n, dtype=np.uint8).tobytes())


@pytest.fixture
def filled(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray], str]:
    """A closed store: 3 shards of 40 keys each, a dataset, a job; returns the directory,
    each key's stored mean rows and the dataset id."""
    root = tmp_path / "data"
    store = FeatureStore(root)
    want: dict[str, np.ndarray] = {}
    for s in range(3):
        keys = [key(store, f"shard {s} text {i}") for i in range(40)]
        c = contents(keys, s)
        store.write(f"job{s}-00000", c, model="local:m", config=CFG)
        want.update({k: c.pooled["mean"][i] for i, k in enumerate(keys)})
    tok_keys = [key(store, f"with tokens {i}") for i in range(3)]
    store.write("tok-00000", contents(tok_keys, 9, tokens=True), model="local:m", config=CFG)
    ds = DatasetStore(store.catalog)
    job = JobQueue(store.catalog).submit("extract", {"texts": 3})
    d = ds.create("kept", ["a", "b", "c"], labels=["x", "y", "x"], model="local:m",
                  config=CFG.canonical(), job_id=job)
    store.close()
    return root, want, d.id


def _rows_answer(root: Path, want: dict[str, np.ndarray]) -> None:
    store = FeatureStore(root)
    keys = list(want)
    res = store.read_pooled(keys, "mean")
    assert res.found.all()
    for i, k in enumerate(keys):
        np.testing.assert_array_equal(res.data[i], want[k])
    # what compaction and token reads rely on came back from the shards too
    for name in store.catalog.shard_names():
        info = store.catalog.shard_info(name)
        assert (info["model"], info["config"]) == ("local:m", CFG.canonical()), info  # type: ignore[index]
        assert bool(info["has_tokens"]) == name.startswith("tok-"), info  # type: ignore[index]
    tokens = store.read_tokens(key(store, "with tokens 1"))
    assert tokens is not None and tokens.states.shape[0] == 2
    store.close()


def test_a_sound_catalog_passes_its_check(filled) -> None:  # type: ignore[no-untyped-def]
    root, _, _ = filled
    assert check_catalog(root / "catalog.sqlite") is None
    assert check_catalog(root / "missing.sqlite") is None


def test_damaged_key_pages_are_rebuilt_and_the_other_tables_kept(filled) -> None:  # type: ignore[no-untyped-def]
    root, want, ds_id = filled
    path = root / "catalog.sqlite"
    offset, size = _page_of(path, "entries")
    _smash(path, offset + 8, size - 8)  # the page header stays, the cells are noise
    problem = check_catalog(path)
    assert problem is not None, "quick_check did not see the damage"

    report = repair_catalog(root)
    assert check_catalog(path) is None
    assert report.shards == 4 and report.keys == 123 and report.quarantined == []
    assert report.kept["datasets"] == 1 and report.kept["dataset_items"] == 3 and report.kept["jobs"] == 1
    assert report.lost == {}
    assert Path(report.damaged_file).exists()  # type: ignore[arg-type]
    _rows_answer(root, want)
    cat = Catalog(path)
    items = DatasetStore(cat).items(ds_id)
    assert items.texts == ["a", "b", "c"] and items.labels == ["x", "y", "x"]
    cat.close()


def test_a_destroyed_header_loses_the_tables_but_not_the_rows(filled) -> None:  # type: ignore[no-untyped-def]
    root, want, ds_id = filled
    path = root / "catalog.sqlite"
    _page_of(path, "entries")  # checkpoint
    _smash(path, 0, 100)
    assert "not a database" in (check_catalog(path) or "")
    report = repair_catalog(root)
    assert report.keys == 123 and report.kept == {}
    assert "every table but the key index" in report.lost
    assert any(line.startswith("LOST every table but the key index") for line in report.lines())
    _rows_answer(root, want)


def test_a_deleted_catalog_is_rebuilt_from_the_shards(filled) -> None:  # type: ignore[no-untyped-def]
    root, want, _ = filled
    for p in root.glob("catalog.sqlite*"):
        p.unlink()
    report = repair_catalog(root)
    assert report.damaged_file is None and report.keys == 123 and report.lost == {}
    _rows_answer(root, want)


def test_a_damaged_shard_met_during_repair_is_quarantined(filled) -> None:  # type: ignore[no-untyped-def]
    root, want, _ = filled
    (root / "catalog.sqlite").unlink()
    with __import__("h5py").File(root / "shards" / "job1-00000.h5", "r") as f:
        lost = {k.decode() for k in f["keys"][:]}
    _smash(root / "shards" / "job1-00000.h5", 0, 64)  # its superblock
    report = repair_catalog(root)
    assert report.quarantined == ["job1-00000.h5"] and report.keys == 83
    assert (root / "quarantine" / "job1-00000.h5").exists()
    _rows_answer(root, {k: v for k, v in want.items() if k not in lost})


def test_what_a_repair_says(filled, caplog) -> None:  # type: ignore[no-untyped-def]
    """The lines `layerbank repair` prints (and logs), and the error a damaged catalog raises."""
    from layerbank.cache.repair import CatalogDamaged

    root, _, _ = filled
    path = root / "catalog.sqlite"
    offset, size = _page_of(path, "entries")
    _smash(path, offset + 8, size - 8)
    _smash(root / "shards" / "job1-00000.h5", 0, 64)
    caplog.set_level(logging.INFO, "layerbank.repair")
    report = repair_catalog(root)
    aside = Path(report.damaged_file)  # type: ignore[arg-type]
    assert aside.parent == root and re.fullmatch(r"catalog\.sqlite\.damaged-\d{8}-\d{6}", aside.name), aside
    assert aside.exists() and Path(f"{aside}-wal").exists()  # its write-ahead log moved along with it
    said = ["re-indexed 83 keys from 3 shards", f"the damaged catalog is kept as {aside}",
            ("shard job1-00000.h5 could not be read and was moved to quarantine/ (its texts will be encoded "
             "again when asked for)"),
            "kept 0 rows of counters", "kept 3 rows of dataset_items", "kept 1 rows of datasets",
            "kept 1 rows of jobs", "kept 0 rows of models", "kept 2 rows of schema_versions", "kept 0 rows of workers"]
    assert report.lines() == said
    assert [(r.name, r.levelname, r.getMessage()) for r in caplog.records] == [
        ("layerbank.repair", "ERROR", ("shard job1-00000.h5 cannot be read (Unable to synchronously open file "
                                       "(file signature not found)): moved to quarantine/")),
        *[("layerbank.repair", "WARNING", f"repair: {line}") for line in said]]
    e = CatalogDamaged(path, "file is not a database")
    assert (str(e), e.reason) == ((f"the catalog {path} is damaged (file is not a database); stop the server and "
                                   f"run `layerbank repair --data-dir {root}` to rebuild it from the shards"),
                                  "file is not a database")


def test_a_destroyed_header_is_named_in_the_lost_line(filled) -> None:  # type: ignore[no-untyped-def]
    root, _, _ = filled
    _page_of(root / "catalog.sqlite", "entries")  # checkpoint
    _smash(root / "catalog.sqlite", 0, 100)
    assert check_catalog(root / "catalog.sqlite") == "file is not a database"
    assert repair_catalog(root).lines()[-1] == ("LOST every table but the key index: the schema cannot be read: "
                                                "file is not a database")


def test_a_table_only_the_app_made_is_kept_and_a_shard_without_pooled_states_quarantined(filled, caplog) -> None:  # type: ignore[no-untyped-def]
    root, _, _ = filled
    path = root / "catalog.sqlite"
    db = sqlite3.connect(path)  # a table no cache/ module creates (app/ makes its own, heads say)
    db.execute("CREATE TABLE app_notes (id INTEGER PRIMARY KEY, note TEXT NOT NULL)")
    db.execute("INSERT INTO app_notes VALUES (7, 'kept')")
    db.commit()
    db.close()
    offset, size = _page_of(path, "entries")
    _smash(path, offset + 8, size - 8)
    with __import__("h5py").File(root / "shards" / "job2-00000.h5", "r+") as f:
        del f["pooled"]  # keys and counts agree, but there is nothing to serve
    caplog.set_level(logging.INFO, "layerbank.repair")
    report = repair_catalog(root)
    assert report.kept["app_notes"] == 1 and "kept 1 rows of app_notes" in report.lines()
    assert report.quarantined == ["job2-00000.h5"] and report.keys == 83
    assert caplog.records[0].getMessage() == ("shard job2-00000.h5 cannot be read (keys, n_tokens and truncated "
                                              "disagree in length, or no pooled states): moved to quarantine/")
    db = sqlite3.connect(path)
    assert db.execute("SELECT * FROM app_notes").fetchall() == [(7, "kept")]
    db.close()



def test_what_cannot_be_salvaged_is_named_and_the_rest_kept(filled) -> None:  # type: ignore[no-untyped-def]
    root, want, _ = filled
    path = root / "catalog.sqlite"
    db = sqlite3.connect(path)
    db.execute("ALTER TABLE jobs ADD COLUMN from_a_newer_version TEXT")  # its rows no longer fit
    db.execute("CREATE TABLE app_log (id INTEGER PRIMARY KEY, line TEXT NOT NULL)")  # made after jobs
    db.executemany("INSERT INTO app_log VALUES (?, ?)", [(i, f"line {i:05d} " + "x" * 200) for i in range(400)])
    db.commit()
    db.close()
    _, size = _page_of(path, "app_log")  # checkpoint; the file's last page is one of app_log's leaves
    end = path.stat().st_size
    _smash(path, end - size + 8, size - 8)
    report = repair_catalog(root)
    n = report.kept["app_log"]
    assert 0 < n < 400
    assert report.lost["app_log"] == f"rows after the first {n:,} could not be read (database disk image is malformed)"
    assert report.lost["jobs"].startswith("1 rows read but not accepted by the new catalog (table jobs has ")
    assert report.lost["jobs"].endswith(" values were supplied)")
    assert "jobs" not in report.kept and report.kept["datasets"] == 1 and report.kept["dataset_items"] == 3
    assert f"LOST app_log: {report.lost['app_log']}" in report.lines()
    _rows_answer(root, want)


def test_a_catalog_that_cannot_be_opened_at_all_loses_its_tables_not_its_rows(filled) -> None:  # type: ignore[no-untyped-def]
    root, want, _ = filled
    for p in root.glob("catalog.sqlite*"):
        p.unlink()
    (root / "catalog.sqlite").mkdir()  # something that is no file at all
    report = repair_catalog(root)
    assert report.kept == {} and report.keys == 123
    assert report.lines()[-1] == "LOST every table but the key index: the file cannot be opened: disk I/O error"
    assert (root / "catalog.sqlite").is_file()  # a new catalog where the directory was
    _rows_answer(root, want)
