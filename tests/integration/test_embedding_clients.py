"""The embedding clients people use, pointed at a real ``layerbank serve``, as
docs/api.md shows them: LangChain's ``OpenAIEmbeddings`` (langchain-openai) and
llama-index's ``OpenAIEmbedding`` (llama-index-embeddings-openai); the OpenAI SDK
itself is tests/integration/test_openai_client.py. Each vector must be the one
the server's own recipe gives (the OpenAI SDK's answer for the same texts).

LangChain with its defaults counts tokens with tiktoken and sends token-id arrays;
the server refuses those with a 422 that says so and names the setting that makes
LangChain send text. tiktoken downloads its encodings from the internet at first
use, which a test machine cannot: a byte-level encoding built here stands in (the
server sees token ids either way, which is all the refusal is about).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import openai
import pytest
import tiktoken

from .conftest import ServerProcess, sst_sentences

pytestmark = pytest.mark.integration
MODEL = "all-MiniLM-L6-v2"


@pytest.fixture(scope="module")
def reference(layerbank_server: ServerProcess) -> Any:
    """texts -> the vectors the OpenAI SDK gets for them (float format)."""
    sdk = openai.OpenAI(base_url=layerbank_server.url + "/v1", api_key="unused", max_retries=0)

    def vectors(texts: list[str]) -> np.ndarray:
        res = sdk.embeddings.create(model=MODEL, input=texts, encoding_format="float")
        return np.array([d.embedding for d in res.data], dtype=np.float32)

    return vectors


def test_langchain_openai_embeddings_as_documented(layerbank_server: ServerProcess, reference: Any) -> None:
    from langchain_openai import OpenAIEmbeddings

    texts, _ = sst_sentences(3, 1100)
    # api_key as users write it (pydantic makes it a SecretStr; the stubs want one)
    emb = OpenAIEmbeddings(model=MODEL, base_url=layerbank_server.url + "/v1", api_key="unused",  # type: ignore[arg-type]
                           check_embedding_ctx_length=False, max_retries=0)
    docs = np.array(emb.embed_documents(texts), dtype=np.float32)
    assert docs.shape == (3, 384)
    np.testing.assert_allclose(docs, reference(texts), atol=1e-6)
    query = np.array(emb.embed_query(texts[0]), dtype=np.float32)
    np.testing.assert_allclose(query, docs[0], atol=1e-6)
    assert abs(float(np.linalg.norm(query)) - 1.0) < 1e-5  # the model's recipe normalises


def _byte_encoding() -> tiktoken.Encoding:
    """A tiktoken encoding that needs no download: one token per byte."""
    return tiktoken.Encoding(name="bytes", pat_str=r"\S+|\s+",
                             mergeable_ranks={bytes([i]): i for i in range(256)}, special_tokens={})


def test_langchain_defaults_send_token_ids_and_get_a_422_that_names_the_fix(
        layerbank_server: ServerProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    from langchain_openai import OpenAIEmbeddings

    enc = _byte_encoding()
    monkeypatch.setattr(tiktoken, "encoding_for_model", lambda name: enc)
    monkeypatch.setattr(tiktoken, "get_encoding", lambda name: enc)
    sent: list[Any] = []
    emb = OpenAIEmbeddings(model=MODEL, base_url=layerbank_server.url + "/v1", api_key="unused",  # type: ignore[arg-type]
                           max_retries=0)  # the defaults: check_embedding_ctx_length=True
    original = emb.client.create

    def spy(**kw: Any) -> Any:
        sent.append(kw["input"])
        return original(**kw)

    monkeypatch.setattr(emb.client, "create", spy)
    with pytest.raises(openai.UnprocessableEntityError) as e:
        emb.embed_documents(["a short text"])
    assert sent and isinstance(sent[0][0], list) and all(isinstance(t, int) for t in sent[0][0]), sent
    assert e.value.status_code == 422
    message = str(e.value)
    assert "token ids are not accepted" in message, message
    assert "check_embedding_ctx_length=False" in message, message


def test_llama_index_openai_embedding_as_documented(layerbank_server: ServerProcess, reference: Any) -> None:
    from llama_index.embeddings.openai import OpenAIEmbedding

    texts, _ = sst_sentences(2, 1110)
    emb = OpenAIEmbedding(model_name=MODEL, api_base=layerbank_server.url + "/v1", api_key="unused",
                          max_retries=0)
    one = np.array(emb.get_text_embedding(texts[0]), dtype=np.float32)
    both = np.array(emb.get_text_embedding_batch(texts), dtype=np.float32)
    want = reference(texts)
    np.testing.assert_allclose(one, want[0], atol=1e-6)
    np.testing.assert_allclose(both, want, atol=1e-6)
    np.testing.assert_allclose(np.array(emb.get_query_embedding(texts[1]), np.float32), want[1], atol=1e-6)


def test_llama_index_takes_the_model_as_model_name_not_model() -> None:
    # why docs/api.md says model_name=: model= is an enum of OpenAI's own models in this client
    from llama_index.embeddings.openai import OpenAIEmbedding

    with pytest.raises(ValueError, match="'all-MiniLM-L6-v2' is not a valid OpenAIEmbeddingModelType"):
        OpenAIEmbedding(model=MODEL, api_base="http://127.0.0.1:1/v1", api_key="unused")
