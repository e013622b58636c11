"""``/v1/embeddings`` answers the model's own sentence embedding: for the bundled
all-MiniLM-L6-v2, what ``SentenceTransformer(path).encode`` gives (its
modules.json: last layer, mean pooling, Normalize), made from the stored rows,
through a real server and the OpenAI SDK; ``/v1/features`` keeps its research
default; ``view``/``pooling``/``normalize`` override the recipe; ``/info`` names it."""

from __future__ import annotations

import numpy as np
import openai
import pytest

from layerbank.cache.fingerprint import default_model_path

from .conftest import ServerProcess, sst_sentences

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def client(layerbank_server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=layerbank_server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def st_model():  # type: ignore[no-untyped-def]
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(default_model_path(), device="cpu")


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def test_the_sdk_gets_sentence_transformers_vectors(client: openai.OpenAI, st_model,  # type: ignore[no-untyped-def]
                                                    layerbank_server: ServerProcess) -> None:
    texts, _ = sst_sentences(6, 2000)
    texts += ["The cat sat on the mat.", "Quarterly revenue rose by four percent."]
    res = client.embeddings.create(model="all-MiniLM-L6-v2", input=texts)  # base64, decoded by the SDK
    got = np.array([d.embedding for d in res.data], dtype=np.float32)
    want = st_model.encode(texts, convert_to_numpy=True)
    assert got.shape == want.shape == (len(texts), 384)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    cos = _cos(got, want)
    assert cos.min() >= 0.999, cos  # float16 storage of the pooled row is the only difference
    # the neighbours a retrieval user sees are the model's: the similarity matrix matches
    np.testing.assert_allclose(got @ got.T, want @ want.T, atol=2e-3)
    floats = client.embeddings.create(model="all-MiniLM-L6-v2", input=texts[:2], encoding_format="float")
    np.testing.assert_allclose(np.array([d.embedding for d in floats.data], np.float32), got[:2], atol=1e-7)

    # /v1/features keeps the research default (layer:-2, mean, as stored): not the recipe
    feats = layerbank_server.post("/v1/features", json={"texts": texts[:2]}).json()
    assert (feats["view"], feats["pooling"]) == ("layer:-2", "mean")
    x = np.array([d["embedding"] for d in feats["data"]], np.float32)
    assert np.linalg.norm(x, axis=1).min() > 2.0  # unnormalised
    assert _cos(x, want[:2]).max() < 0.99


def test_overrides_and_info(layerbank_server: ServerProcess, st_model) -> None:  # type: ignore[no-untyped-def]
    texts, _ = sst_sentences(3, 2010)

    def emb(**extra: object) -> np.ndarray:
        r = layerbank_server.post("/v1/embeddings", json={"input": texts, **extra})
        assert r.status_code == 200, r.text
        return np.array([d["embedding"] for d in r.json()["data"]], np.float32)

    def feats(view: str, pooling: str) -> np.ndarray:
        body = layerbank_server.post("/v1/features", json={"texts": texts, "view": view,
                                                           "pooling": pooling}).json()
        return np.array([d["embedding"] for d in body["data"]], np.float32)

    # normalize=false: the stored last-layer mean row itself
    raw = emb(normalize=False)
    np.testing.assert_array_equal(raw, feats("layer:-1", "mean"))
    # a view alone: that layer, with the recipe's pooling and normalisation
    second = emb(view="layer:-2")
    want = feats("layer:-2", "mean")
    np.testing.assert_allclose(second, want / np.linalg.norm(want, axis=1, keepdims=True), atol=1e-6)
    # a pooling alone, and all three
    cls = emb(pooling="cls", normalize=False)
    np.testing.assert_array_equal(cls, feats("layer:-1", "cls"))
    np.testing.assert_array_equal(emb(view="layer:-2", pooling="max", normalize=False),
                                  feats("layer:-2", "max"))

    info = layerbank_server.get("/info").json()
    e = info["models"][0]["embeddings"]
    assert (e["view"], e["pooling"], e["normalize"], e["source"]) == \
        ("layer:-1", "mean", True, "sentence-transformers recipe")
    path = default_model_path()
    assert e["files"] == [f"{path}/modules.json", f"{path}/1_Pooling/config.json"]
    assert any("max_seq_length=256" in n for n in e["notes"])
    assert info["model"]["sentence_recipe"]["usable"] is True


def test_token_ids_are_refused_with_what_to_set(client: openai.OpenAI,
                                                layerbank_server: ServerProcess) -> None:
    for body in ([101, 2023, 102], [[101, 2023, 102], [101, 102]]):
        r = layerbank_server.post("/v1/embeddings", json={"input": body})
        assert r.status_code == 422
        err = r.json()["error"]
        assert "token ids are not accepted" in err["message"], err
        assert "check_embedding_ctx_length=False" in err["message"]
        assert (err["param"], err["type"]) == ("input", "invalid_request_error")
    with pytest.raises(openai.UnprocessableEntityError) as e:
        client.embeddings.create(model="all-MiniLM-L6-v2", input=[[101, 2023, 102]])
    assert "token ids are not accepted" in str(e.value)
