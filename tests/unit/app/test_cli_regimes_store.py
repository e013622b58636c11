"""``layerbank regimes``: the frozen regime's features come through the one features
service (the texts extracted into the data directory, then read back from it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from layerbank.cache.store import FeatureStore
from tests.regimes_data import NEG, POS


def test_the_frozen_regime_reads_its_texts_from_the_store(tiny_model_dir: str, tmp_path: Path,
                                                          capsys: Any) -> None:
    from layerbank.app.cli.main import main

    data = tmp_path / "s.tsv"
    data.write_text("sentence\tlabel\n" + "".join(f"{t}\tpos\n" for t in POS) +
                    "".join(f"{t}\tneg\n" for t in NEG), encoding="utf-8")
    code = main(["regimes", str(data), "--text-column", "sentence", "--label-column", "label",
                 "--model", tiny_model_dir, "--device", "cpu", "--threads", "1",
                 "--data-dir", str(tmp_path / "d"), "--regimes", "frozen", "--seeds", "1",
                 "--max-epochs", "1", "--no-progress"])
    out = capsys.readouterr().out
    assert code == 0 and "frozen" in out
    store = FeatureStore(tmp_path / "d")
    try:
        [(fingerprint, n_rows)] = [(r[0], r[1]) for r in store.catalog.conn().execute(
            "SELECT model, SUM(n_rows) FROM shards GROUP BY model")]
        assert n_rows == len(set(POS + NEG))  # every distinct text stored once
    finally:
        store.close()
