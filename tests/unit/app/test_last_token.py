"""``last_token``, added through the pooling registry alone: a data directory
written by ``layerbank extract --poolings mean,cls,max`` keeps answering mean
from the store under a server set to also store ``last_token``, and a
``last_token`` request on those texts is recomputed (once, for those texts),
with the numbers an independent transformers computation gives for the tiny
model, right or left padded."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from transformers import AutoModel, AutoTokenizer

from layerbank.app.cli.main import main
from layerbank.cache.store import FeatureStore

TEXTS = ["a text stored before last_token existed", "short one", "and a third, of middling length"]


def _transformers_last_token(model_dir: str, texts: list[str], padding_side: str) -> np.ndarray:
    """[n, d]: the last layer at each text's last real token, straight from transformers."""
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = padding_side
    model = AutoModel.from_pretrained(model_dir).eval()
    batch = tok(texts, padding=True, return_tensors="pt")
    # BERT's positions are absolute: a left-padded text starts at position 0 all the same
    positions = (batch["attention_mask"].cumsum(dim=1) - 1).clamp(min=0)
    with torch.no_grad():
        last_layer = model(**batch, position_ids=positions, output_hidden_states=True).hidden_states[-1]
    out = []
    for i, mask in enumerate(batch["attention_mask"]):
        real = torch.nonzero(mask).flatten()
        out.append(last_layer[i, int(real.max())].numpy())
    return np.stack(out)


def _rows(body: dict) -> np.ndarray:
    return np.array([d["embedding"] for d in body["data"]], dtype=np.float32)


def test_texts_stored_before_last_token_answer_mean_and_last_token_is_recomputed(
        tiny_api_factory, tiny_model_dir: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    root = tmp_path / "data"
    src = tmp_path / "texts.txt"
    src.write_text("\n".join(TEXTS) + "\n")
    assert main(["extract", str(src), "--data-dir", str(root), "--model", tiny_model_dir, "--device", "cpu",
                 "--poolings", "mean,cls,max", "--no-progress"]) == 0
    old = FeatureStore(root)
    (old_shard,) = old.catalog.shard_names()
    assert old.catalog.shard_info(old_shard)["poolings"] == ("mean", "cls", "max")  # type: ignore[index]
    old.close()

    api = tiny_api_factory(data_dir=root, poolings="mean,cls,max,last_token")
    c, enc = api.client, api.worker.encoder
    assert c.get("/info").json()["poolings"] == ["mean", "cls", "max", "last_token"]
    mean = c.post("/v1/features", json={"texts": TEXTS, "view": "layer:-1", "pooling": "mean"})
    assert mean.status_code == 200, mean.text
    assert [d["cached"] for d in mean.json()["data"]] == [True] * 3
    assert enc.calls == 0  # mean came from the store

    last = c.post("/v1/features", json={"texts": TEXTS, "view": "layer:-1", "pooling": "last_token"})
    assert last.status_code == 200, last.text
    body = last.json()
    assert [d["cached"] for d in body["data"]] == [False] * 3
    assert body["usage"]["tokens_computed"] == sum(d["n_tokens"] for d in body["data"])
    assert enc.calls >= 1
    for side in ("right", "left"):
        np.testing.assert_allclose(_rows(body), _transformers_last_token(tiny_model_dir, TEXTS, side),
                                   rtol=2e-3, atol=2e-3)  # float16 storage

    # the store: one new shard holding the three texts with all four poolings
    store = FeatureStore(root)
    new = [store.catalog.shard_info(n) for n in store.catalog.shard_names() if n != old_shard]
    assert [(s["n_rows"], s["poolings"]) for s in new] == [(3, ("mean", "cls", "max", "last_token"))]  # type: ignore[index]
    store.close()

    calls = enc.calls
    again = {p: c.post("/v1/features", json={"texts": TEXTS, "view": "layer:-1", "pooling": p}).json()
             for p in ("last_token", "mean")}
    assert enc.calls == calls
    assert all(d["cached"] for p in again for d in again[p]["data"])
    np.testing.assert_array_equal(_rows(again["last_token"]), _rows(body))
    np.testing.assert_array_equal(_rows(again["mean"]), _rows(mean.json()))
