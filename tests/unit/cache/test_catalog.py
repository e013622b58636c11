"""layerbank.cache.catalog: keys to (shard, row), committed atomically, each key once."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from layerbank.cache.catalog import Catalog, Entry, catalog_url


def k(i: int) -> str:
    return f"{i:064x}"


@pytest.fixture
def cat(tmp_path: Path) -> Catalog:
    c = Catalog(tmp_path / "catalog.sqlite")
    yield c
    c.close()


def commit(cat: Catalog, name: str, keys: list[str], *, tokens: bool = False) -> None:
    cat.commit_shard(name, "local:m", "{}", keys, [10 + i for i in range(len(keys))],
                     [i % 2 == 1 for i in range(len(keys))], has_tokens=tokens, n_bytes=1000)


def entries(path: Path) -> list[tuple]:
    """Rows of the entries table, read with a connection of their own (plain sqlite3 as a
    user would, or psycopg on the PostgreSQL catalog the test runs on)."""
    url = catalog_url()
    if url is None:
        with sqlite3.connect(path) as db:
            return db.execute("SELECT key, shard, row FROM entries ORDER BY key").fetchall()
    import psycopg

    with psycopg.connect(url) as db:
        return [tuple(r) for r in db.execute("SELECT key, shard, row FROM entries ORDER BY key")]


def test_commit_then_lookup(cat: Catalog) -> None:
    commit(cat, "a.h5", [k(1), k(2), k(3)])
    got = cat.lookup([k(3), k(1), k(9), k(1)])
    assert got == {k(1): Entry(k(1), "a.h5", 0, 10, False, False),
                   k(3): Entry(k(3), "a.h5", 2, 12, False, False)}
    assert cat.shard_info("a.h5") == {"name": "a.h5", "model": "local:m", "config": "{}",
                                      "n_rows": 3, "n_bytes": 1000, "has_tokens": 0,
                                      "poolings": ("mean", "cls", "max")}
    assert cat.shard_names() == {"a.h5"}
    assert cat.stats() == {"keys": 3, "shards": 1, "bytes": 1000}
    assert cat.lookup([k(2)])[k(2)].truncated is True


def test_lookup_of_more_keys_than_sqlite_parameters(cat: Catalog) -> None:
    keys = [k(i) for i in range(2500)]
    commit(cat, "big.h5", keys[::2])
    got = cat.lookup(keys)
    assert sorted(got) == sorted(keys[::2])
    assert got[k(2498)].row == 1249


def test_need_tokens_skips_rows_stored_without_them(cat: Catalog) -> None:
    commit(cat, "plain.h5", [k(1), k(2)])
    commit(cat, "tok.h5", [k(3)], tokens=True)
    assert set(cat.lookup([k(1), k(2), k(3)], need_tokens=True)) == {k(3)}
    assert set(cat.lookup([k(1), k(2), k(3)])) == {k(1), k(2), k(3)}


def test_drop_shard_returns_its_keys_and_forgets_them(cat: Catalog) -> None:
    commit(cat, "a.h5", [k(1), k(2)])
    commit(cat, "b.h5", [k(3)])
    assert sorted(cat.drop_shard("a.h5")) == [k(1), k(2)]
    assert set(cat.lookup([k(1), k(2), k(3)])) == {k(3)}
    assert cat.shard_names() == {"b.h5"}
    assert cat.drop_shard("a.h5") == []


@pytest.mark.sqlite_only  # the SQLite file's journal mode
def test_wal_mode_is_on(cat: Catalog, tmp_path: Path) -> None:
    commit(cat, "a.h5", [k(1)])
    assert cat.conn().execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    # the mode is persistent: a plain sqlite3 connection sees it too
    with sqlite3.connect(tmp_path / "catalog.sqlite") as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert (tmp_path / "catalog.sqlite-wal").exists()


def test_recommitting_a_shard_name_replaces_its_rows(cat: Catalog, tmp_path: Path) -> None:
    commit(cat, "job-00000.h5", [k(1), k(2), k(3)])
    # a re-run of the same part writes the same name with (here) other rows
    commit(cat, "job-00000.h5", [k(3), k(4)])
    assert entries(tmp_path / "catalog.sqlite") == [(k(3), "job-00000.h5", 0),
                                                   (k(4), "job-00000.h5", 1)]
    assert cat.shard_info("job-00000.h5")["n_rows"] == 2  # type: ignore[index]
    assert cat.stats() == {"keys": 2, "shards": 1, "bytes": 1000}


def test_a_key_is_listed_once_even_when_stored_twice(cat: Catalog, tmp_path: Path) -> None:
    commit(cat, "a.h5", [k(1), k(2)])
    commit(cat, "b.h5", [k(2), k(3)])
    rows = entries(tmp_path / "catalog.sqlite")
    assert [r[0] for r in rows] == [k(1), k(2), k(3)]
    assert cat.lookup([k(2)])[k(2)].shard == "b.h5"


def test_a_key_with_tokens_is_not_repointed_to_a_shard_without(cat: Catalog) -> None:
    commit(cat, "tok.h5", [k(1)], tokens=True)
    commit(cat, "plain.h5", [k(1), k(2)])
    assert cat.lookup([k(1)])[k(1)].shard == "tok.h5"
    assert cat.lookup([k(2)])[k(2)].shard == "plain.h5"
    # and a key without tokens moves to a shard with them
    commit(cat, "tok2.h5", [k(2)], tokens=True)
    assert cat.lookup([k(2)], need_tokens=True)[k(2)].shard == "tok2.h5"


def test_a_shard_left_with_no_rows_is_not_listed(cat: Catalog) -> None:
    commit(cat, "tok.h5", [k(1)], tokens=True)
    commit(cat, "plain.h5", [k(1)])  # its only key stays with tok.h5
    assert cat.shard_names() == {"tok.h5"}


def test_a_failed_commit_changes_nothing(cat: Catalog) -> None:
    commit(cat, "a.h5", [k(1)])
    # the bad key fails inside the transaction, after the old rows of a.h5 were deleted
    with pytest.raises(sqlite3.Error):
        cat.commit_shard("a.h5", "m", "{}", [k(2), object()], [1, 1], [False, False],  # type: ignore[list-item]
                         has_tokens=False, n_bytes=1)
    assert cat.shard_names() == {"a.h5"}
    assert cat.lookup([k(1), k(2)]) == {k(1): Entry(k(1), "a.h5", 0, 10, False, False)}
    # the connection is usable afterwards (no transaction left open)
    commit(cat, "c.h5", [k(4)])
    assert set(cat.lookup([k(4)])) == {k(4)}


def test_counters_and_models_persist_across_connections(cat: Catalog, tmp_path: Path) -> None:
    cat.bump("quarantined_shards")
    cat.bump("quarantined_shards", 2)
    cat.register_model("local:m", "/models/m", {"hidden_size": 32})
    other = Catalog(tmp_path / "catalog.sqlite")
    assert other.counter("quarantined_shards") == 3
    assert other.counter("never_bumped") == 0
    assert other.model_info("local:m") == {"hidden_size": 32}
    assert other.model_info("local:x") is None
    other.close()


def test_commits_from_many_threads_all_land(cat: Catalog) -> None:
    def work(t: int) -> None:
        for j in range(5):
            commit(cat, f"t{t}-{j}.h5", [k(t * 100 + j)])

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert cat.stats()["keys"] == 20 and cat.stats()["shards"] == 20
