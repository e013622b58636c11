"""layerbank.Bank and layerbank.LayerFeatures with the bundled model on SST-2.

What a notebook user would check against the command line and the server:

- ``Bank.features`` gives the bytes ``layerbank features`` writes for the
  same texts and view, and ``Bank.probe`` the same scores as ``layerbank
  probe --json`` on the same store (same folds, same seed);
- a directory held by a real ``layerbank serve`` is refused with the CLI's
  own message, and ``Bank(url=...)`` reads through that server instead;
- a GridSearchCV over ``LayerFeatures`` (3 views x 2 poolings x 5 folds, on
  300 sentences) runs the encoder once per unique text: the catalog's key
  count and ``Bank.stats`` both say 300.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.integration.conftest import DATA, ROOT

pytestmark = pytest.mark.integration


def _sst2_test(n: int, seed: int) -> tuple[list[str], list[str]]:
    """``n`` of the 872 SST-2 test sentences (a seeded shuffle) and their labels."""
    with open(DATA / "sst2" / "test.tsv", encoding="utf-8") as fh:
        next(fh)
        rows = [tuple(line.rstrip("\n").split("\t")) for line in fh]
    random.Random(seed).shuffle(rows)
    assert len({t for t, _ in rows[:n]}) == n  # distinct texts: counts below are per text
    return [t for t, _ in rows[:n]], [lab for _, lab in rows[:n]]


def _tsv(path: Path, texts: list[str], labels: list[str]) -> Path:
    path.write_text("sentence\tlabel\n" + "".join(f"{t}\t{lab}\n" for t, lab in zip(texts, labels)),
                    encoding="utf-8")
    return path


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "layerbank.app.cli.main", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=400, check=False)


def test_bank_features_and_probe_equal_the_cli(tmp_path: Path) -> None:
    from layerbank import Bank

    texts, labels = _sst2_test(200, seed=1)
    tsv = _tsv(tmp_path / "sst2.tsv", texts, labels)
    r = _cli("features", str(tsv), "--text-column", "sentence", "--view", "layer:-2", "--pooling", "mean",
             "--out", str(tmp_path / "cli.npy"), "--data-dir", str(tmp_path / "cli-data"),
             "--device", "cpu", "--threads", "1")
    assert r.returncode == 0, r.stderr[-2000:]
    from_cli = np.load(tmp_path / "cli.npy")

    with Bank(tmp_path / "data", device="cpu", threads=1) as bank:  # its own store: encoded again
        x = bank.features(texts, view="layer:-2", pooling="mean")
        assert bank.stats == {"encoded": 200, "cached": 0}
        assert x.shape == (200, 384) and x.dtype == np.float32
        assert x.tobytes() == from_cli.tobytes()

        result = bank.probe(texts, labels, views=["each_layer"], poolings=["mean"], learning_curve=False,
                            mdl=False)
        assert bank.stats == {"encoded": 200, "cached": 200}  # the probe read the store only

    r = _cli("probe", str(tsv), "--label-column", "label", "--views", "each_layer", "--poolings", "mean",
             "--no-learning-curve", "--no-mdl", "--no-progress", "--json", str(tmp_path / "cli.json"),
             "--data-dir", str(tmp_path / "data"), "--device", "cpu", "--threads", "1")
    assert r.returncode == 0, r.stderr[-2000:]
    cli = json.loads((tmp_path / "cli.json").read_text())
    folds = {x["view"]: x["accuracy"]["folds"] for x in result["results"]}
    assert folds == {x["view"]: x["accuracy"]["folds"] for x in cli["results"]}
    assert len(folds) == 7  # h_0 .. h_6 of the 6-layer MiniLM
    assert result["best"] == cli["best"]
    assert result["recommendation"]["text"] == cli["recommendation"]["text"]
    # sentiment is readable from the frozen encoder: well above always answering one class
    assert result["best"]["accuracy"] >= result["task"]["chance_accuracy"] + 0.15


@pytest.mark.sqlite_only  # the data directory's lock; beside a PostgreSQL catalog a Bank is one more replica
def test_bank_refuses_a_served_directory_and_reads_through_its_url(
        server_factory: Any, tmp_path: Path) -> None:
    from layerbank import Bank, LayerFeatures

    server = server_factory()
    texts, labels = _sst2_test(20, seed=3)
    with pytest.raises(RuntimeError) as refused:
        Bank(server.data_dir)
    r = _cli("features", str(_tsv(tmp_path / "few.tsv", texts, labels)), "--text-column", "sentence",
             "--out", str(tmp_path / "x.npy"), "--data-dir", str(server.data_dir))
    assert r.returncode == 2
    cli_message = r.stderr.strip().removeprefix("layerbank: error: ")
    assert cli_message.startswith(f"data directory {server.data_dir} is in use by pid ")
    # the same refusal, each naming its own way to read through the server
    held, _, cli_hint = cli_message.rpartition("; ")
    assert cli_hint == f"to read through that server: --url {server.url}"
    assert str(refused.value) == f"{held}; to read through that server: Bank(url={server.url!r})"

    with Bank(url=server.url) as remote:
        x = remote.features(texts, view="layer:-2", pooling="mean")
        assert remote.stats == {"encoded": 20, "cached": 0}
        assert np.array_equal(remote.features(texts[::-1], "layer:-2", "mean"), x[::-1])
        assert remote.stats == {"encoded": 20, "cached": 20}
        assert remote.dimension("concat_last_4") == 4 * 384
        result = remote.probe(texts, labels, views=["layer:-1"], poolings=["mean"], cv=2,
                              control_task=False, learning_curve=False, mdl=False)
        assert result["task"]["n_examples"] == 20 and result["best"]["view"] == "layer:-1"
        assert result["recommendation"]["text"].startswith("Best frozen probe: layer:-1")
    with Bank(tmp_path / "local", device="cpu", threads=1) as local:
        # the server batches differently (its micro-batcher): equal up to float16 rounding
        np.testing.assert_allclose(x, local.features(texts, "layer:-2", "mean"), atol=2e-3)

    f = LayerFeatures(view="layer:-2", url=server.url).fit(texts)
    try:
        assert f.n_features_out_ == 384
        assert np.array_equal(f.transform(texts), x)
    finally:
        Bank.shared(url=server.url).close()


def test_grid_search_over_layer_features_encodes_each_text_once(tmp_path: Path) -> None:
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import GridSearchCV
    from sklearn.pipeline import Pipeline

    from layerbank import Bank, LayerFeatures
    from layerbank.cache.catalog import Catalog

    texts, y = _sst2_test(300, seed=2)
    data = str(tmp_path / "data")
    grid = {"feats__view": ["layer:2", "layer:-2", "concat_last_4"], "feats__pooling": ["mean", "cls"]}
    pipe = Pipeline([("feats", LayerFeatures(data_dir=data)), ("clf", LogisticRegression(max_iter=1000))])
    search = GridSearchCV(pipe, grid, cv=5).fit(texts, y)
    bank = Bank.shared(data)
    try:
        assert Catalog(Path(data) / "catalog.sqlite").stats()["keys"] == 300
        # 6 candidates x 5 folds x (fit on 240 + score on 60) + the refit on 300: 9,300 texts
        # asked for, 300 encoded (the first fold's), every other one read from the store
        assert bank.stats == {"encoded": 300, "cached": 6 * 5 * 300 + 300 - 300}
    finally:
        bank.close()
    assert search.best_params_["feats__view"] in grid["feats__view"]
    assert search.best_params_["feats__pooling"] in grid["feats__pooling"]
    assert search.best_score_ >= 0.7  # SST-2 sentiment from frozen MiniLM features


def test_readme_notebook_block_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    """README's "In a notebook" block, as written, from a fresh directory
    (so ./layerbank-data is new) next to the repository's examples/."""
    from layerbank import Bank

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("\n## In a notebook\n"):]
    code = section[section.index("```python\n") + len("```python\n"):section.index("\n```\n")]
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    monkeypatch.chdir(tmp_path)
    for name in [k for k in os.environ if k.startswith("LAYERBANK_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("LAYERBANK_THREADS", "1")  # the test machine's cores are shared
    try:
        exec(compile(code, "README.md (In a notebook)", "exec"), {"__name__": "__readme__"})
    finally:
        Bank.shared().close()
    printed = capsys.readouterr().out.splitlines()
    assert printed[1] == "{'encoded': 300, 'cached': 300}"
    assert printed[-1] == "{'encoded': 0, 'cached': 9300}"
    assert (tmp_path / "layerbank-data" / "catalog.sqlite").is_file()
