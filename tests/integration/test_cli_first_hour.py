"""The command line a newcomer meets (issue 14, rows 2-6 of its table), on
the real bundled model, the sample shipped in examples/, and real processes.

Each test runs ``layerbank`` as a user would and asserts what they would
see: the exit code, the one line on stderr, the bytes on disk. Whether torch,
transformers or scikit-learn were imported is read from ``python -X
importtime`` (its lines are told apart from the command's own stderr).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.data_paths import CONLL2003

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "examples" / "sst2_sample.tsv"
HEAVY = {"torch", "transformers", "sklearn"}
LAYER_9 = ("layerbank: error: layer 9 does not exist; this model has hidden states 0..6 "
           "(negative indices -1..-7 count from the last)")


@dataclass
class Run:
    code: int
    stdout: str
    stderr: list[str]  # the command's own lines (import-time lines removed)
    imported: set[str]  # top-level packages imported
    seconds: float


def layerbank(*args: str, cwd: Path, data_dir: Path, **env_extra: str) -> Run:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LAYERBANK_", "HF_"))}
    # engine torch as in the rest of the suite: auto times ONNX against torch on a fresh
    # data directory's first run (tests/integration/test_engines.py covers that)
    env.update({"LAYERBANK_THREADS": "1", "LAYERBANK_DATA_DIR": str(data_dir), "HF_HUB_OFFLINE": "1",
                "LAYERBANK_ENGINE": "torch", **env_extra})
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "layerbank.app.cli.main", *args],
                       cwd=cwd, env=env, capture_output=True, text=True, timeout=240, check=False)
    seconds = time.perf_counter() - t0
    own = [line for line in r.stderr.splitlines() if not line.startswith("import time:")]
    imported = {line.split("|")[-1].strip().split(".")[0] for line in r.stderr.splitlines()
                if line.startswith("import time:") and "|" in line}
    return Run(r.returncode, r.stdout, own, imported, seconds)


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data directory holding the sample (the first run: the encoder loads)."""
    data = tmp_path_factory.mktemp("first-hour") / "data"
    r = layerbank("extract", str(SAMPLE), "--text-column", "sentence", "--no-progress",
                  cwd=ROOT, data_dir=data)
    assert r.code == 0, r.stderr
    assert "encoded    300 texts" in r.stdout and "torch" in r.imported
    return data


def test_a_cached_rerun_encodes_nothing_and_never_imports_torch(stored: Path) -> None:
    r = layerbank("extract", str(SAMPLE), "--text-column", "sentence", cwd=ROOT, data_dir=stored)
    assert r.code == 0, r.stderr
    assert "cache hits 300" in r.stdout and "encoded    0 texts, 0 tokens" in r.stdout
    assert not HEAVY & r.imported


def test_a_probe_on_stored_texts_never_imports_torch(stored: Path) -> None:
    r = layerbank("probe", str(SAMPLE), "--text-column", "sentence", "--label-column", "label",
                  "--views", "layer:-2", "--poolings", "mean", "--cv", "3", "--no-control-task",
                  "--no-learning-curve", "--no-progress", cwd=ROOT, data_dir=stored)
    assert r.code == 0, r.stderr
    row = next(line for line in r.stdout.splitlines() if line.startswith("layer:-2"))
    assert row.split()[1] == "mean" and 0.6 < float(row.split()[2]) < 1.0  # accuracy
    assert "sklearn" in r.imported and not {"torch", "transformers"} & r.imported


def _conll_head(name: str, n: int, out: Path) -> Path:
    """The first ``n`` sentences of a CoNLL-2003 split (tests/data, as the other NER tests)."""
    blocks = (CONLL2003 / f"{name}.txt").read_text(
        encoding="utf-8").split("\n\n")
    out.write_text("\n\n".join(blocks[:n]) + "\n", encoding="utf-8")
    return out


def test_a_token_probe_rerun_reads_word_states_without_torch(tmp_path: Path) -> None:
    train = _conll_head("train", 60, tmp_path / "train.txt")
    valid = _conll_head("valid", 30, tmp_path / "valid.txt")
    args = ("probe", "--task", "token", "--train", str(train), "--valid", str(valid), "--views",
            "layer:-1,layer:0", "--no-control-task", "--no-mdl", "--no-progress")
    first = layerbank(*args, cwd=tmp_path, data_dir=tmp_path / "data")
    again = layerbank(*args, cwd=tmp_path, data_dir=tmp_path / "data")
    assert first.code == again.code == 0, (first.stderr, again.stderr)
    assert "torch" in first.imported and not {"torch", "transformers"} & again.imported

    def scores(stdout: str) -> list[list[str]]:  # every column but the fit's seconds
        rows = [line.split() for line in stdout.splitlines() if line.startswith("layer:")]
        return [row[:8] + row[9:] for row in rows]
    assert len(scores(first.stdout)) == 2 and scores(again.stdout) == scores(first.stdout)


def test_features_writes_the_format_its_suffix_names(stored: Path, tmp_path: Path) -> None:
    for name in ("X.npy", "X.parquet", "X.h5"):
        r = layerbank("features", str(SAMPLE), "--text-column", "sentence", "--out",
                      str(tmp_path / name), cwd=ROOT, data_dir=stored)
        assert r.code == 0, r.stderr
        assert r.stderr == [f"wrote {tmp_path / name}: 300 texts x 384 (layer:-2, mean, float32)"]
        assert not HEAVY & r.imported  # all cached: answered from the store
    assert sorted(p.name for p in tmp_path.iterdir()) == ["X.h5", "X.npy", "X.parquet"]
    assert (tmp_path / "X.npy").read_bytes()[:6] == b"\x93NUMPY"
    raw = (tmp_path / "X.parquet").read_bytes()
    assert raw[:4] == raw[-4:] == b"PAR1"
    assert (tmp_path / "X.h5").read_bytes()[:8] == b"\x89HDF\r\n\x1a\n"
    x = np.load(tmp_path / "X.npy")
    table = pq.read_table(tmp_path / "X.parquet")
    from_parquet = table.column("features").combine_chunks().flatten().to_numpy().reshape(300, 384)
    with h5py.File(tmp_path / "X.h5", "r") as f:
        from_h5 = f["features"][:]
        assert f["features"].attrs["view"] == "layer:-2"
        first_text = f["texts"][0].decode()
    assert x.shape == (300, 384) and x.dtype == np.float32
    assert np.array_equal(x, from_parquet) and np.array_equal(x, from_h5)
    first = SAMPLE.read_text(encoding="utf-8").splitlines()[1].split("\t")[0]
    assert table.column("text")[0].as_py() == first == first_text


def test_an_unknown_out_suffix_is_refused_before_any_work(tmp_path: Path) -> None:
    data = tmp_path / "never-made"
    r = layerbank("features", str(SAMPLE), "--text-column", "sentence", "--out",
                  str(tmp_path / "X.csv"), cwd=ROOT, data_dir=data)
    assert r.code == 2
    assert r.stderr == [f"layerbank: error: cannot write {str(tmp_path / 'X.csv')!r}: --out must end "
                        "in .npy, .parquet, .h5 (the suffix says the format; got '.csv')"]
    assert not data.exists() and not HEAVY & r.imported
    assert list(tmp_path.iterdir()) == []


def test_a_missing_layer_is_refused_before_loading_the_model(stored: Path, tmp_path: Path) -> None:
    # the model known from the catalog, and a data directory that has never seen it
    # (then the layer count comes from the model's config.json)
    for data in (stored, tmp_path / "fresh"):
        r = layerbank("features", str(SAMPLE), "--text-column", "sentence", "--view", "layer:9",
                      "--out", str(tmp_path / "X.npy"), cwd=ROOT, data_dir=data)
        assert r.code == 2
        assert r.stderr == [LAYER_9]
        assert not HEAVY & r.imported
    assert not (tmp_path / "X.npy").exists()
    assert list((tmp_path / "fresh" / "shards").iterdir()) == []
    r = layerbank("probe", str(SAMPLE), "--text-column", "sentence", "--label-column", "label",
                  "--views", "layer:9", cwd=ROOT, data_dir=tmp_path / "fresh")
    assert (r.code, r.stderr) == (2, [LAYER_9])
    assert not {"torch", "transformers"} & r.imported
    assert list((tmp_path / "fresh" / "shards").iterdir()) == []


def test_a_comma_separated_file_named_tsv_is_explained(tmp_path: Path) -> None:
    (tmp_path / "reviews.tsv").write_text("sentence,label\na fine film,1\na dull one,0\n")
    r = layerbank("extract", "reviews.tsv", "--text-column", "sentence", cwd=tmp_path,
                  data_dir=tmp_path / "data")
    assert r.code == 2
    assert r.stderr == ["layerbank: error: reviews.tsv: no text column 'sentence'; the columns are "
                        "['sentence,label']; this looks comma-separated: use --format csv or rename "
                        "the file to .csv"]


@pytest.mark.parametrize("offline", [False, True])
def test_a_model_that_cannot_be_had_fails_at_once_in_one_line(tmp_path: Path, offline: bool) -> None:
    # no network to the hub whatever the machine: an empty cache and an endpoint
    # that refuses connections (port 9, discard); offline mode must not even try it
    shutil.copy(SAMPLE, tmp_path / "s.tsv")
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": "http://127.0.0.1:9",
           "HF_HUB_OFFLINE": "1" if offline else "0"}
    r = layerbank("extract", "s.tsv", "--text-column", "sentence", "--model", "bert-base-uncased",
                  cwd=tmp_path, data_dir=tmp_path / "data", **env)
    assert r.code == 2
    assert r.seconds < 30  # 55 s of hub retries before; ~1-3 s of Python start-up here
    assert len(r.stderr) == 1, r.stderr
    line = r.stderr[0]
    assert line.startswith("layerbank: error: cannot load model 'bert-base-uncased': not a local "
                           f"directory, not in the Hugging Face cache ({tmp_path / 'hf' / 'hub'})")
    assert ("HF_HUB_OFFLINE is set" if offline else "(http://127.0.0.1:9) cannot be reached") in line
    for how in ("--model /path/to/model", "HF_HOME", "HF_HUB_OFFLINE=1"):
        assert how in line
    assert not HEAVY & r.imported


def test_a_data_directory_held_by_a_server_is_refused_in_one_line(tmp_path: Path) -> None:
    from layerbank.cache.lock import DataDirLock

    with DataDirLock(tmp_path / "data"):  # as `layerbank serve` holds it
        r = layerbank("extract", str(SAMPLE), "--text-column", "sentence", cwd=tmp_path,
                      data_dir=tmp_path / "data")
    assert r.code == 2
    holder = f"data directory {tmp_path / 'data'} is in use by pid {os.getpid()}"
    assert r.stderr == [f"layerbank: error: {holder}; stop it or choose another --data-dir "
                        "(while a server runs, send work to its API)"]
    assert not HEAVY & r.imported
