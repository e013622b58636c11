"""cache/postgres.py on a real PostgreSQL server: the dialect translation, schema
creation by several processes at once, jobs claimed once each under contention
(FOR UPDATE SKIP LOCKED), DB-API errors in sqlite3's classes, and a catalog
that goes down and comes back."""

from __future__ import annotations

import sqlite3
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from layerbank.cache.catalog import Catalog, catalog_url, redacted
from layerbank.cache.datasets import DatasetStore
from layerbank.cache.jobs import JobQueue
from layerbank.cache.postgres import CatalogUnavailable, translate

# run in the suite's PostgreSQL pass (LAYERBANK_TEST_CATALOGS), deselected in the SQLite one
pytestmark = pytest.mark.postgres_only


def test_statements_written_for_sqlite_read_as_postgresql() -> None:
    assert translate("SELECT a FROM t WHERE b = ? AND c LIKE 'x: %'") == \
        "SELECT a FROM t WHERE b = %s AND c LIKE 'x: %%'"
    # a REAL is 4 bytes in PostgreSQL: a timestamp would lose its seconds
    assert translate("CREATE TABLE t (a REAL NOT NULL, n INTEGER, s TEXT)") == \
        "CREATE TABLE t (a DOUBLE PRECISION NOT NULL, n BIGINT, s TEXT)"
    assert translate("ALTER TABLE jobs ADD COLUMN n INTEGER") == "ALTER TABLE jobs ADD COLUMN n BIGINT"
    assert translate("SELECT INTEGER_thing FROM realm") == "SELECT INTEGER_thing FROM realm"  # data: untouched


def test_urls_and_the_password_never_shown() -> None:
    assert redacted("postgresql://lb:s3cret@db:5432/layerbank") == "postgresql://lb:***@db:5432/layerbank"
    assert catalog_url("") is None  # "": the data directory's SQLite file, whatever the environment says
    with pytest.raises(ValueError, match="only postgresql://"):
        catalog_url("mysql://x/y")


@pytest.fixture
def pg_url(postgres_server) -> str:  # type: ignore[no-untyped-def]
    return postgres_server.new_schema_url()


def test_several_processes_create_the_schema_at_once(pg_url: str, tmp_path: Path) -> None:
    # replicas starting together: CREATE TABLE IF NOT EXISTS alone races on PostgreSQL
    barrier = threading.Barrier(6)

    def open_one(_: int) -> int:
        barrier.wait()
        cat = Catalog(tmp_path / "unused.sqlite", pg_url)
        try:
            JobQueue(cat), DatasetStore(cat)
            return int(cat.conn().execute("SELECT version FROM schema_versions WHERE part = 'jobs'")
                       .fetchone()[0])
        finally:
            cat.close()

    with ThreadPoolExecutor(6) as pool:
        assert list(pool.map(open_one, range(6))) == [1] * 6
    cat = Catalog(tmp_path / "unused.sqlite", pg_url)
    cols = [r[0] for r in cat.conn().execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'jobs' "
        "AND table_schema = current_schema()")]
    assert cols.count("error_type") == 1
    assert not (tmp_path / "unused.sqlite").exists()  # nothing went to SQLite
    cat.close()


def test_every_job_is_claimed_once_by_concurrent_claimers(pg_url: str, tmp_path: Path) -> None:
    cats = [Catalog(tmp_path / "x.sqlite", pg_url) for _ in range(4)]
    queues = [JobQueue(c) for c in cats]
    ids = {queues[0].submit("extract", {"i": i}) for i in range(60)}
    claimed: list[list[str]] = [[] for _ in queues]

    def claimer(i: int) -> None:
        while (job := queues[i].claim(f"host:{i}:w", ["extract"], 60)) is not None:
            claimed[i].append(job.id)
            assert queues[i].finish(job.id, f"host:{i}:w", {"by": i})

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [j for c in claimed for j in c]
    assert sorted(every) == sorted(ids)  # each exactly once, none lost
    assert queues[0].counts()["succeeded"] == 60
    assert all(q.get(j).attempts == 1 for q in queues[:1] for j in ids)  # type: ignore[union-attr]
    for c in cats:
        c.close()


def test_errors_come_in_sqlite3s_classes(pg_url: str, tmp_path: Path) -> None:
    ds = DatasetStore(Catalog(tmp_path / "x.sqlite", pg_url))
    ds.create("first", ["a"], model="m", config="{}", dataset_id="ds_x")
    with pytest.raises(sqlite3.IntegrityError):
        ds.create("again", ["b"], model="m", config="{}", dataset_id="ds_x")
    assert ds.items("ds_x").texts == ["a"]  # the failed transaction left nothing behind
    ds.catalog.close()


def test_a_catalog_that_goes_down_is_unavailable_then_works_again(tmp_path: Path) -> None:
    from tests.postgres_server import PostgresServer

    # its own server, as this test stops it; outside tmp_path, which the postgres user cannot enter
    server = PostgresServer.start(Path(tempfile.mkdtemp(prefix="layerbank-pg-")))
    try:
        url = server.new_schema_url()
        cat = Catalog(tmp_path / "x.sqlite", url)
        q = JobQueue(cat)
        job = q.submit("extract", {})
        server.stop_keeping_data()
        with pytest.raises(CatalogUnavailable, match="the PostgreSQL catalog is unavailable"):
            q.get(job)
        server.restart()
        assert q.get(job).state == "queued"  # type: ignore[union-attr]  # nothing lost, pool reconnected
        cat.close()
    finally:
        server.stop()


def test_a_nul_character_is_the_callers_error_and_stores_nothing(pg_url: str, tmp_path: Path) -> None:
    from layerbank.cache.errors import InputError

    ds = DatasetStore(Catalog(tmp_path / "x.sqlite", pg_url))
    with pytest.raises(InputError, match="NUL character"):
        ds.create("nul", ["fine", "not\x00fine"], model="m", config="{}", dataset_id="ds_nul")
    assert ds.get("ds_nul") is None and ds.items("ds_nul").texts == []


def test_reindex_makes_the_key_index_match_the_shard_files(pg_url: str, tmp_path: Path,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    # a catalog restored from a backup older than the shards, a shard file lost since,
    # and a file the backup never knew that cannot be read
    import logging

    import numpy as np

    from layerbank.cache.repair import reindex_catalog
    from layerbank.cache.store import FeatureStore

    from .test_store import CFG, contents, key

    store = FeatureStore(tmp_path / "data", catalog_url=pg_url)
    keys = {n: [key(store, f"{n} {i}") for i in range(5)] for n in ("a", "b", "c", "d")}
    for i, n in enumerate(keys):
        store.write(f"job-0000{i}", contents(keys[n], i), model="local:m", config=CFG)
    every = [k for ks in keys.values() for k in ks]
    want = store.read_pooled(every, "mean").data
    with store.catalog.tx() as db:  # the backup knew shards a and b
        db.execute("DELETE FROM entries WHERE shard NOT IN ('job-00000.h5', 'job-00001.h5')")
        db.execute("DELETE FROM shards WHERE name NOT IN ('job-00000.h5', 'job-00001.h5')")
    store.close()
    (store.shard_dir / "job-00000.h5").unlink()  # a's file is lost
    (store.shard_dir / "job-00003.h5").write_bytes(b"\x89HDF not a shard")  # d's cannot be read
    with caplog.at_level(logging.ERROR, logger="layerbank.repair"):
        report = reindex_catalog(tmp_path / "data", pg_url)
    assert (report.shards, report.keys) == (1, 10)  # c registered; b was listed and stays
    assert report.lost == {"shard job-00000.h5": "its file is missing; its 5 keys will be encoded again"}
    assert report.quarantined == ["job-00003.h5"]
    assert (tmp_path / "data" / "quarantine" / "job-00003.h5").read_bytes() == b"\x89HDF not a shard"
    assert any(r.getMessage().startswith("shard job-00003.h5 cannot be read (")
               and r.getMessage().endswith("): moved to quarantine/") for r in caplog.records)
    again = FeatureStore(tmp_path / "data", catalog_url=pg_url)
    got = again.read_pooled(every, "mean")
    assert got.found.tolist() == [False] * 5 + [True] * 10 + [False] * 5
    np.testing.assert_array_equal(got.data[5:15], want[5:15])  # the original numbers
    again.close()


def test_shards_sharing_keys_committed_at_once_never_deadlock(pg_url: str, tmp_path: Path) -> None:
    # two replicas' workers encoded the same texts at the same moment, in other orders
    keys = [f"{i:064d}" for i in range(300)]
    cats = [Catalog(tmp_path / "x.sqlite", pg_url) for _ in range(4)]
    barrier = threading.Barrier(4)

    def commit(i: int) -> None:
        order = keys if i % 2 else keys[::-1]
        barrier.wait()
        for round_ in range(5):
            cats[i].commit_shard(f"job{i}-{round_:05d}.h5", "local:m", "{}", order, [5] * 300, [False] * 300,
                                 has_tokens=False, n_bytes=1)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(commit, range(4)))  # a deadlock would raise here
    assert cats[0].stats()["keys"] == 300
    entries = cats[0].lookup(keys)
    assert len(entries) == 300 and len({e.shard for e in entries.values()}) >= 1
    for c in cats:
        c.close()


def test_a_directory_of_replicas_is_never_opened_on_a_sqlite_catalog(pg_url: str, tmp_path: Path) -> None:
    # a SQLite store's start-up clean-up would delete every shard its own file does not list
    from layerbank.cache.store import CatalogMismatch, FeatureStore

    from .test_store import CFG, contents, key

    store = FeatureStore(tmp_path / "data", catalog_url=pg_url)
    k = key(store, "kept")
    store.write("job-00000", contents([k], 0), model="local:m", config=CFG)
    store.close()
    assert "***" not in (tmp_path / "data" / "catalog.postgresql").read_text()  # no password to hide here
    with pytest.raises(CatalogMismatch, match="indexed by a PostgreSQL catalog"):
        FeatureStore(tmp_path / "data", clean=True, catalog_url="")
    assert (tmp_path / "data" / "shards" / "job-00000.h5").exists()
    again = FeatureStore(tmp_path / "data", catalog_url=pg_url)
    assert again.read_pooled([k], "mean").found.all()
    again.close()
