"""The official ``openai`` package, pointed at a real layerbank server, works unchanged."""

from __future__ import annotations

import numpy as np
import openai
import pytest

from .conftest import ServerProcess, sst_sentences

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def client(layerbank_server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=layerbank_server.url + "/v1", api_key="unused", max_retries=0)


def _features(server: ServerProcess, texts: list[str], view: str = "layer:-2") -> tuple[np.ndarray, list[int]]:
    body = server.post("/v1/features", json={"texts": texts, "view": view}).json()
    return (np.array([d["embedding"] for d in body["data"]], dtype=np.float32),
            [d["n_tokens"] for d in body["data"]])


def test_default_call_base64_decoded_by_the_client(client: openai.OpenAI,
                                                   layerbank_server: ServerProcess) -> None:
    texts, _ = sst_sentences(5, 1000)
    # the client asks for base64 when no encoding_format is given, and decodes float32
    res = client.embeddings.create(model="all-MiniLM-L6-v2", input=texts)
    assert res.object == "list" and res.model == "all-MiniLM-L6-v2 (embedded)"
    assert [d.index for d in res.data] == list(range(5))
    got = np.array([d.embedding for d in res.data], dtype=np.float32)
    # the model's recipe (last layer, mean, normalised: test_embeddings_recipe.py), from the stored rows
    want, n_tokens = _features(layerbank_server, texts, view="layer:-1")
    np.testing.assert_allclose(got, want / np.linalg.norm(want, axis=1, keepdims=True), atol=1e-6)
    assert res.usage.prompt_tokens == res.usage.total_tokens == sum(n_tokens)


def test_float_format_single_string_and_extra_view(client: openai.OpenAI,
                                                   layerbank_server: ServerProcess) -> None:
    texts, _ = sst_sentences(2, 1010)
    one = client.embeddings.create(model="all-MiniLM-L6-v2", input=texts[0], encoding_format="float")
    assert len(one.data) == 1 and len(one.data[0].embedding) == 384
    last = client.embeddings.create(model="all-MiniLM-L6-v2", input=texts, encoding_format="float",
                                    extra_body={"view": "layer:-2", "pooling": "mean", "normalize": False})
    want, _ = _features(layerbank_server, texts, view="layer:-2")
    np.testing.assert_array_equal(np.array([d.embedding for d in last.data], np.float32), want)
    first = _features(layerbank_server, texts[:1], view="layer:-1")[0][0]
    np.testing.assert_allclose(np.array(one.data[0].embedding, np.float32),
                               first / np.linalg.norm(first), atol=1e-6)


def test_errors_reach_the_client_as_openai_exceptions(client: openai.OpenAI) -> None:
    # the SDK puts only error.message of OpenAI's shape into str(e): the reason must be there
    with pytest.raises(openai.UnprocessableEntityError) as e:
        client.embeddings.create(model="text-embedding-3-small", input=["a text"])
    assert e.value.status_code == 422
    assert str(e.value).startswith("Error code: 422 - model 'text-embedding-3-small' is not served here")
    assert "send model= one of 'default', 'all-MiniLM-L6-v2 (embedded)', 'all-MiniLM-L6-v2'" in str(e.value)
    assert (e.value.type, e.value.param, e.value.code) == ("invalid_request_error", "model", "validation")
    with pytest.raises(openai.UnprocessableEntityError) as e:
        client.embeddings.create(model="all-MiniLM-L6-v2", input=["a text"], dimensions=256)
    assert str(e.value) == ("Error code: 422 - dimensions: this view gives 384-dimensional vectors; "
                            "vectors are not truncated (omit dimensions or send 384)")
    assert e.value.param == "dimensions"


def test_bad_input_reaches_the_client_with_its_reason(client: openai.OpenAI) -> None:
    with pytest.raises(openai.UnprocessableEntityError) as e:
        client.embeddings.create(model="all-MiniLM-L6-v2", input=["a text", "   "])
    assert "input.1" in str(e.value) and e.value.param == "input.1", str(e.value)
    with pytest.raises(openai.UnprocessableEntityError) as e:
        client.embeddings.create(model="all-MiniLM-L6-v2", input=[[101, 2023, 102]])  # token ids
    assert str(e.value).startswith("Error code: 422 - input"), str(e.value)
    with pytest.raises(openai.APIStatusError) as e:
        client.embeddings.create(model="all-MiniLM-L6-v2", input=["x" * 5000])
    assert e.value.status_code == 413
    assert "input.0 has 5,000 characters" in str(e.value), str(e.value)
