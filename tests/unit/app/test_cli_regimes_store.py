"""``layerbank regimes``: the frozen regime's features come through the one features
service (the texts extracted into the data directory, then read back from it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from layerbank.cache.store import FeatureStore
from tests.regimes_data import NEG, POS, cli_regimes


def test_the_frozen_regime_reads_its_texts_from_the_store(tiny_model_dir: str, tmp_path: Path,
                                                          capsys: Any) -> None:
    code = cli_regimes(tmp_path, tiny_model_dir, "--regimes", "frozen", "--seeds", "1", "--max-epochs", "1")
    out = capsys.readouterr().out
    assert code == 0 and "frozen" in out
    store = FeatureStore(tmp_path / "d")
    try:
        [(fingerprint, n_rows)] = [(r[0], r[1]) for r in store.catalog.conn().execute(
            "SELECT model, SUM(n_rows) FROM shards GROUP BY model")]
        assert n_rows == len(set(POS + NEG))  # every distinct text stored once
    finally:
        store.close()
