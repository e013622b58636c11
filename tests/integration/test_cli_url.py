"""``layerbank features`` and ``layerbank probe`` with ``--url``: read through a
running server, as ``Bank(url=...)`` does, and the refusal of a data directory a
server holds names that flag.

The commands run as a user runs them (a real process, tests/integration/
test_cli_first_hour.py's ``layerbank``) against the session's real server; the
matrix written must be the one ``Client.features`` gets, and nothing heavy
(torch, transformers; scikit-learn but for the probe's input checks) may load in the command's own process.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from tests.integration.conftest import ServerProcess, write_tsv
from tests.integration.test_cli_first_hour import HEAVY, layerbank

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

GOOD = ["a warm and funny film", "a moving, wise story", "beautifully acted and shot",
        "a delight from start to finish", "sharp, tender and true", "an instant classic of its kind"]
BAD = ["a dull and lifeless mess", "tedious from the first scene", "a waste of two hours",
       "clumsy, loud and empty", "badly written and worse acted", "a boring, overlong slog"]


def _texts(tag: str) -> tuple[list[str], list[str]]:
    # texts of this module only: the session server's cache is shared
    texts = [f"{t} ({tag} {i})" for i, t in enumerate(GOOD + BAD)]
    return texts, ["1"] * len(GOOD) + ["0"] * len(BAD)


def test_features_through_a_server_write_the_clients_matrix(layerbank_server: ServerProcess,
                                                            tmp_path: Path) -> None:
    texts, labels = _texts("cli-url features")
    f = write_tsv(tmp_path / "f.tsv", texts, labels)
    r = layerbank("features", str(f), "--text-column", "sentence", "--view", "layer:-2",
                  "--pooling", "mean", "--out", str(tmp_path / "X.npy"), "--url", layerbank_server.url,
                  cwd=tmp_path, data_dir=tmp_path / "unused")
    assert r.code == 0, r.stderr
    x = np.load(tmp_path / "X.npy")
    expected = layerbank_server.client().features(texts, view="layer:-2", pooling="mean")
    assert x.shape == (12, 384) and x.dtype == np.float32
    np.testing.assert_array_equal(x, expected)
    assert not HEAVY & r.imported, r.imported & HEAVY
    assert not (tmp_path / "unused").exists()  # nothing local was opened

    # LAYERBANK_URL is the flag's twin
    r = layerbank("features", str(f), "--text-column", "sentence", "--out", str(tmp_path / "Y.npy"),
                  cwd=tmp_path, data_dir=tmp_path / "unused", LAYERBANK_URL=layerbank_server.url)
    assert r.code == 0, r.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "Y.npy"), expected)


def test_probe_through_a_server_prints_the_report(layerbank_server: ServerProcess, tmp_path: Path) -> None:
    texts, labels = _texts("cli-url probe")
    f = write_tsv(tmp_path / "p.tsv", texts, labels)
    r = layerbank("probe", str(f), "--text-column", "sentence", "--label-column", "label",
                  "--views", "layer:-1", "--poolings", "mean", "--cv", "2", "--no-mdl",
                  "--no-learning-curve", "--no-control-task", "--no-progress", "--json", str(tmp_path / "r.json"),
                  "--url", layerbank_server.url, cwd=tmp_path, data_dir=tmp_path / "unused")
    assert r.code == 0, r.stderr
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["task"]["n_examples"] == 12 and result["task"]["cv"] == 2
    assert [(x["view"], x["pooling"]) for x in result["results"]] == [("layer:-1", "mean")]
    assert f"best: layer:-1, mean pooling: accuracy {result['best']['accuracy']:.3f}" in r.stdout
    # the input checks import scikit-learn (as the in-process probe does); the model never loads here
    assert not {"torch", "transformers"} & r.imported


def test_a_held_data_directory_names_the_url_flag(tmp_path: Path) -> None:
    from layerbank.cache.lock import DataDirLock

    data = tmp_path / "data"
    f = write_tsv(tmp_path / "s.tsv", *_texts("cli-url held"))
    held = (f"layerbank: error: data directory {data} is in use by pid {os.getpid()}; stop it or choose "
            "another --data-dir (while a server runs, send work to its API)")
    features = ["features", str(f), "--text-column", "sentence", "--out", "X.npy"]
    with DataDirLock(data):  # as `layerbank serve` holds it
        r = layerbank(*features, cwd=tmp_path, data_dir=data)
        assert (r.code, r.stderr) == (2, [held + "; to read through a server: --url URL (env LAYERBANK_URL)"])
        # a server writes its address there: the hint is the flag to copy
        (data / "server.json").write_text('{"url": "http://127.0.0.1:8123", "pid": 1}')
        with_url = held + "; to read through that server: --url http://127.0.0.1:8123"
        r = layerbank(*features, cwd=tmp_path, data_dir=data)
        assert (r.code, r.stderr) == (2, [with_url])
        r = layerbank("probe", str(f), "--text-column", "sentence", "--label-column", "label",
                      cwd=tmp_path, data_dir=data)
        assert (r.code, r.stderr) == (2, [with_url])
