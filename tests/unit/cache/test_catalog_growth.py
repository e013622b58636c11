"""layerbank.cache.catalog as the store grows: a commit costs what its own rows cost, not what
the catalog already holds (bench/scale.py found every commit scanning all stored keys)."""

from __future__ import annotations

from pathlib import Path

import pytest

from layerbank.cache.catalog import Catalog


def k(i: int) -> str:
    return f"{i:064x}"


def commit(cat: Catalog, name: str, keys: list[str], replaces: tuple[str, ...] = ()) -> None:
    cat.commit_shard(name, "local:m", "{}", keys, [5] * len(keys), [False] * len(keys),
                     has_tokens=False, n_bytes=100, replaces=replaces)


def _steps_of_one_small_commit(path: Path, stored: int) -> int:
    """SQLite virtual-machine steps (in thousands) of committing a 4-row shard into a catalog
    holding ``stored`` keys in shards of 1,000."""
    cat = Catalog(path)
    try:
        for s in range(0, stored, 1000):
            commit(cat, f"big{s}.h5", [k(i) for i in range(s, s + 1000)])
        steps = [0]

        def count() -> int:
            steps[0] += 1
            return 0  # go on

        cat.conn().set_progress_handler(count, 1000)
        commit(cat, "small.h5", [k(10**9 + i) for i in range(4)])
        cat.conn().set_progress_handler(None, 0)
        return steps[0]
    finally:
        cat.close()


@pytest.mark.sqlite_only  # counts SQLite's own virtual-machine steps
def test_a_small_commit_does_not_scan_the_stored_keys(tmp_path: Path) -> None:
    few = _steps_of_one_small_commit(tmp_path / "few.sqlite", 1_000)
    many = _steps_of_one_small_commit(tmp_path / "many.sqlite", 40_000)
    # a scan of every key in the commit shows as ~40x the work at 40x the keys
    assert many <= 2 * few + 5, (few, many)


def test_compaction_forgets_the_shards_it_replaces_and_keeps_the_others(tmp_path: Path) -> None:
    cat = Catalog(tmp_path / "catalog.sqlite")
    try:
        commit(cat, "a.h5", [k(1), k(2)])
        commit(cat, "b.h5", [k(3)])
        commit(cat, "c.h5", [k(4), k(5)])
        # the merged shard takes every row of a and b, and one of c's
        commit(cat, "merged.h5", [k(1), k(2), k(3), k(4)], replaces=("a.h5", "b.h5", "c.h5"))
        assert cat.shard_names() == {"merged.h5", "c.h5"}
        got = cat.lookup([k(i) for i in range(1, 6)])
        assert {key: e.shard for key, e in got.items()} == {
            k(1): "merged.h5", k(2): "merged.h5", k(3): "merged.h5", k(4): "merged.h5", k(5): "c.h5"}
    finally:
        cat.close()
