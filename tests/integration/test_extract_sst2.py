"""The real CLI and the bundled all-MiniLM-L6-v2 on 50 SST-2 sentences.

The reference is computed here with plain ``transformers``: each sentence
run alone, its hidden states pooled by definition. The stored numbers (every
layer, every pooling), every view, and the matrices ``layerbank features``
writes must agree with it within float16 rounding. The CLI runs as a user
runs it: ``layerbank`` in a subprocess, in a temporary working directory.
"""

from __future__ import annotations

import os
import random
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from layerbank.cache.fingerprint import default_model_path, model_fingerprint
from layerbank.cache.keys import ExtractionConfig, text_key
from layerbank.cache.store import FeatureStore
from layerbank.cache.views import parse_view
from tests.data_paths import SST2 as SST2_DIR

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SST2 = SST2_DIR / "test.tsv"
LAYERBANK = Path(sys.executable).parent / "layerbank"
H, D = 7, 384
# float16 keeps 11 bits: |stored - exact| <= |x| * 2**-11; atol covers the fp32
# difference between a padded batch and a sentence run alone
TOL = {"rtol": 2e-3, "atol": 2e-3}


def sample(n: int = 50, seed: int = 0) -> list[str]:
    lines = SST2.read_text(encoding="utf-8").splitlines()[1:]
    return [line.split("\t")[0] for line in random.Random(seed).sample(lines, n)]


TEXTS = sample()


def layerbank(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAYERBANK_")}
    env.update(LAYERBANK_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    if os.environ.get("LAYERBANK_CATALOG_URL"):  # the suite's PostgreSQL pass (tests/conftest.py)
        env["LAYERBANK_CATALOG_URL"] = os.environ["LAYERBANK_CATALOG_URL"]
    return subprocess.run([str(LAYERBANK), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120, check=False)


@pytest.fixture(scope="module")
def reference() -> dict[str, object]:
    """Hidden states of each sentence run alone through transformers."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    torch.set_num_threads(1)  # on a busy 2-core machine 2 threads ran 15x slower
    tok = AutoTokenizer.from_pretrained(default_model_path())
    model = AutoModel.from_pretrained(default_model_path()).eval()
    pooled = {p: np.zeros((len(TEXTS), H, D), np.float32) for p in ("mean", "cls", "max")}
    tokens, ids = [], []
    with torch.no_grad():
        for i, text in enumerate(TEXTS):
            enc = tok(text, return_tensors="pt")
            hs = torch.stack(model(**enc, output_hidden_states=True).hidden_states, dim=1)[0]  # [H, t, d]
            pooled["mean"][i] = hs.mean(dim=1).numpy()
            pooled["cls"][i] = hs[:, 0].numpy()
            pooled["max"][i] = hs.amax(dim=1).numpy()
            tokens.append(hs.permute(1, 0, 2).numpy())  # [t, H, d]
            ids.append(enc["input_ids"][0].tolist())
    return {"pooled": pooled, "tokens": tokens, "ids": ids}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("sst2")
    (d / "sample.tsv").write_text("sentence\tlabel\n" + "".join(f"{t}\t1\n" for t in TEXTS),
                                  encoding="utf-8")
    return d


@pytest.fixture(scope="module")
def first_run(workdir: Path) -> subprocess.CompletedProcess[str]:
    # with --tokens: one run stores both, and later plain requests must hit these rows
    r = layerbank("extract", "sample.tsv", "--text-column", "sentence", "--device", "cpu",
                  "--tokens", "--no-progress", cwd=workdir)
    assert r.returncode == 0, r.stderr
    return r


def stored_keys() -> list[str]:
    # the documented key, computed without the encoder: what a second process would use
    cfg = ExtractionConfig(max_length=512, storage_dtype="float16", precision="fp32")
    return [text_key(model_fingerprint(default_model_path()), cfg, t) for t in TEXTS]


def test_first_run_encodes_every_sentence(first_run: subprocess.CompletedProcess[str]) -> None:
    out = first_run.stdout
    assert "texts      50 (50 unique, 0 empty skipped)" in out
    assert "cache hits 0\n" in out
    assert "encoded    50 texts" in out
    assert "Traceback" not in first_run.stderr


def test_every_stored_layer_and_pooling_matches_transformers(first_run, workdir: Path, reference) -> None:  # type: ignore[no-untyped-def]
    store = FeatureStore(workdir / "layerbank-data")
    keys = stored_keys()
    for pooling in ("mean", "cls", "max"):
        res = store.read_pooled(keys, pooling)
        assert res.found.all(), "the CLI stored rows under other keys than the documented ones"
        assert res.data.shape == (50, H, D)
        np.testing.assert_allclose(res.data, reference["pooled"][pooling], **TOL)
    entries = store.lookup(keys)
    assert [entries[k].n_tokens for k in keys] == [len(ids) for ids in reference["ids"]]
    assert not any(e.truncated for e in entries.values())
    store.close()


VIEWS = {
    "layer:0": lambda h: h[:, 0],
    "layer:-1": lambda h: h[:, 6],
    "layer:-2": lambda h: h[:, 5],
    "layers:2,-1": lambda h: np.concatenate([h[:, 2], h[:, 6]], axis=1),
    "concat_last_4": lambda h: np.concatenate([h[:, 3], h[:, 4], h[:, 5], h[:, 6]], axis=1),
    "sum_last_4": lambda h: h[:, 3] + h[:, 4] + h[:, 5] + h[:, 6],
    "mean_all": lambda h: h.sum(axis=1) / 7,
    "weighted:0,0,0,0,0,0.25,0.75": lambda h: 0.25 * h[:, 5] + 0.75 * h[:, 6],
    "all_layers": lambda h: h,
}


def test_every_view_matches_its_definition(first_run, workdir: Path, reference) -> None:  # type: ignore[no-untyped-def]
    store = FeatureStore(workdir / "layerbank-data")
    for spec, definition in VIEWS.items():
        for pooling in ("mean", "max"):
            res = store.read_view(stored_keys(), parse_view(spec), pooling, H)
            want = definition(reference["pooled"][pooling])
            assert res.data.shape == want.shape, spec
            # sums of 4..7 layers add up to 7 roundings
            np.testing.assert_allclose(res.data, want, rtol=2e-3, atol=1e-2, err_msg=spec)
    store.close()


def test_a_second_run_is_all_cache_hits(first_run, workdir: Path) -> None:  # type: ignore[no-untyped-def]
    r = layerbank("extract", "sample.tsv", "--text-column", "sentence", "--device", "cpu",
                  "--no-progress", cwd=workdir)
    assert r.returncode == 0, r.stderr
    assert "cache hits 50\n" in r.stdout
    assert "encoded    0 texts, 0 tokens" in r.stdout
    assert "written    0 bytes in 0 shards" in r.stdout


def test_features_writes_the_view_in_input_order(first_run, workdir: Path, reference) -> None:  # type: ignore[no-untyped-def]
    r = layerbank("features", "sample.tsv", "--text-column", "sentence", "--device", "cpu",
                  "--view", "layer:-2", "--out", "X.npy", cwd=workdir)
    assert r.returncode == 0, r.stderr
    x = np.load(workdir / "X.npy")
    assert x.shape == (50, 384) and x.dtype == np.float32
    np.testing.assert_allclose(x, reference["pooled"]["mean"][:, 5], **TOL)
    assert "wrote X.npy: 50 texts x 384 (layer:-2, mean, float32)" in r.stderr


def test_features_all_layers_keeps_the_layer_axis(first_run, workdir: Path, reference) -> None:  # type: ignore[no-untyped-def]
    r = layerbank("features", "sample.tsv", "--text-column", "sentence", "--device", "cpu",
                  "--view", "all_layers", "--pooling", "cls", "--out", "A.npy", cwd=workdir)
    assert r.returncode == 0, r.stderr
    a = np.load(workdir / "A.npy")
    assert a.shape == (50, 7, 384)
    np.testing.assert_allclose(a, reference["pooled"]["cls"], **TOL)


def test_a_view_naming_a_missing_layer_fails_naming_the_layers(first_run, workdir: Path) -> None:  # type: ignore[no-untyped-def]
    r = layerbank("features", "sample.tsv", "--text-column", "sentence", "--device", "cpu",
                  "--view", "layer:9", "--out", "bad.npy", cwd=workdir)
    assert r.returncode != 0
    assert "layer 9 does not exist; this model has hidden states 0..6" in r.stderr
    assert "Traceback" not in r.stderr
    assert not (workdir / "bad.npy").exists()


def test_an_unknown_model_path_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "t.txt").write_text("a text\n")
    r = layerbank("extract", "t.txt", "--model", "/no/such/model", "--device", "cpu", cwd=tmp_path)
    assert r.returncode != 0
    assert r.stderr.strip() == ("layerbank: error: cannot load model '/no/such/model': "
                                "there is no model directory at that path")


def test_a_non_utf8_file_names_the_line(tmp_path: Path) -> None:
    (tmp_path / "latin1.tsv").write_bytes(b"sentence\tlabel\ngood\t1\nna\xefve\t0\n")
    r = layerbank("extract", "latin1.tsv", cwd=tmp_path)
    assert r.returncode != 0
    assert "line 3 is not valid UTF-8" in r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "layerbank-data").exists()  # refused before touching the store


@pytest.mark.sqlite_only  # reads catalog.sqlite with plain sqlite3, as docs/storage.md shows
def test_tokens_are_stored_and_readable_with_plain_h5py(first_run, workdir: Path, reference) -> None:  # type: ignore[no-untyped-def]
    data = workdir / "layerbank-data"
    keys = stored_keys()
    with sqlite3.connect(data / "catalog.sqlite") as db:
        rows = {k: db.execute("SELECT shard, row, has_tokens FROM entries WHERE key = ?", (k,)).fetchone()
                for k in keys}
    for i, k in enumerate(keys):
        shard, row, has_tokens = rows[k]
        assert has_tokens == 1
        with h5py.File(data / "shards" / shard, "r") as f:
            assert f["keys"][row].decode() == k
            off = f["tokens/offsets"][:]
            a, b = int(off[row]), int(off[row + 1])
            assert f["tokens/ids"][a:b].tolist() == reference["ids"][i]
            states = np.stack([f[f"tokens/layer_{layer}"][a:b] for layer in range(H)], axis=1)
            assert states.dtype == np.float16
            np.testing.assert_allclose(states, reference["tokens"][i], **TOL)
            word_ids = f["tokens/word_ids"][a:b]
            assert word_ids[0] == -1 and word_ids[-1] == -1 and (word_ids[1:-1] >= 0).all()
            # the real tokens' character spans tile the text's non-space characters
            spans = f["tokens/char_spans"][a + 1 : b - 1]
            text = TEXTS[i]
            assert "".join(text[s:e] for s, e in spans) == text.replace(" ", "")


@pytest.mark.sqlite_only  # the example opens catalog.sqlite with plain sqlite3
def test_the_plain_h5py_example_in_docs_storage_md_runs(first_run, workdir: Path, reference) -> None:  # type: ignore[no-untyped-def]
    doc = (Path(__file__).resolve().parents[2] / "docs" / "storage.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", doc, flags=re.DOTALL)
    assert len(blocks) == 2
    code = "\n".join(blocks)
    code = code.replace('data_dir = "layerbank-data"', f"data_dir = {str(workdir / 'layerbank-data')!r}")
    code = re.sub(r"^texts = \[.*\]$", f"texts = {TEXTS[:3]!r}", code, count=1, flags=re.MULTILINE)
    ns: dict[str, object] = {}
    exec(compile(code, "docs/storage.md", "exec"), ns)  # noqa: S102 - our own documentation
    np.testing.assert_allclose(ns["X"], reference["pooled"]["mean"][:3, 5], **TOL)
    # the token block read the first text's last-layer token states
    np.testing.assert_allclose(ns["last_layer_tokens"], reference["tokens"][0][:, 6], **TOL)
    assert list(ns["token_ids"]) == reference["ids"][0]
