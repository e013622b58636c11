"""The command line's store-first path (layerbank.app.cli.store_first) on the tiny model.

It may answer only what the encoder path would answer: the same keys, and
no row that lacks a pooling the settings store (such a row is re-encoded).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from layerbank.app.api.settings import Settings
from layerbank.app.cli.store_first import StoreFirst, locate
from layerbank.cache.views import parse_view
from layerbank.workers.local import LocalExtractor

TEXTS = ["a fine film", "a dull one", "a fine film", "neither here nor there"]


def _extract(data: Path, model: str, poolings: str) -> np.ndarray:
    with LocalExtractor.open(data, model=model, device="cpu", poolings=poolings) as ex:
        summary = ex.extract(TEXTS, job_id="t")
        res = ex.store.read_view(summary.keys, parse_view("layer:-1"), "mean", ex.encoder.info["n_hidden_states"])
        assert res.found.all()
        return res.data


def test_stored_texts_are_answered_with_the_encoders_rows(tiny_model_dir: str, tmp_path: Path) -> None:
    data = tmp_path / "data"
    settings = Settings(data_dir=data, model=tiny_model_dir, device="cpu")
    with StoreFirst.open(settings, locate(settings)) as sf:
        assert sf.model is None and sf.n_hidden_states == 3  # not registered: config.json says 3
        assert sf.all_stored(TEXTS) is None
    expected = _extract(data, tiny_model_dir, settings.poolings)
    with StoreFirst.open(settings, locate(settings)) as sf:
        summary = sf.all_stored(TEXTS)
        assert summary is not None
        counts = (summary.texts, summary.unique_texts, summary.cache_hits, summary.texts_encoded)
        assert counts == (4, 3, 3, 0)
        res = sf.read_view(TEXTS, parse_view("layer:-1"), "mean")
        assert res is not None and np.array_equal(res.data, expected)
        assert sf.all_stored(TEXTS + ["never seen"]) is None
        assert sf.all_stored(TEXTS, want_tokens=True) is None  # stored without token states


def test_rows_stored_without_a_pooling_of_the_setting_are_not_answered(
        tiny_model_dir: str, tmp_path: Path) -> None:
    data = tmp_path / "data"
    _extract(data, tiny_model_dir, "mean")
    narrow = Settings(data_dir=data, model=tiny_model_dir, device="cpu", poolings="mean")
    wide = Settings(data_dir=data, model=tiny_model_dir, device="cpu")  # mean, cls, max
    with StoreFirst.open(narrow, locate(narrow)) as sf:
        assert sf.all_stored(TEXTS) is not None
    with StoreFirst.open(wide, locate(wide)) as sf:
        assert sf.all_stored(TEXTS) is None  # the encoder path re-encodes them with cls and max
