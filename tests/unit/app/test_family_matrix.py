"""Every encoder family through the whole path, on tiny random models with
tokenizers trained offline (tests/families.py): BERT, RoBERTa, XLM-R,
DistilBERT, ALBERT, ELECTRA, DeBERTa-v2, MPNet, ModernBERT, so the three
tokenizer kinds (WordPiece ``##``, byte-level BPE ``Ġ``, Unigram ``▁``) and
the layouts that differ from BERT's are each checked, not assumed.

Per family, one app with its worker in a thread (tiny_api_factory, here on
the family's model): extraction (rows equal plain ``transformers`` hidden
states within float16 storage rounding), ``/v1/features``, ``/v1/embeddings``,
a sentence probe, a head with predict, and a token dataset: its stored token
rows (ids, character offsets, word ids) equal the tokenizer's, its word
vectors (``first`` and ``mean`` of the sub-tokens) equal those taken from
plain ``transformers`` with the tokenizer's own word split
(``is_split_into_words``), and a token probe runs on it. The regimes of each
family are tests/unit/workers' (another module).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from layerbank.app.probes.word_features import word_states
from layerbank.cache.keys import text_key
from layerbank.cache.store import FeatureStore
from tests.families import FAMILIES, TOKENIZER_KIND

# words that split differently per tokenizer kind: punctuation inside a word, an accent,
# a long word, a one-letter word, a character no trained vocabulary holds (unknown / bytes)
SENTENCES = [
    ["New", "York", "is", "a", "city"],
    ["the", "U.S.", "film", "isn't", "bad"],
    ["a", "café", "in", "Paris", "Ω"],
    ["filmmaking", "naïve", "and", "warm"],
    ["Ann", "met", "Bob", "in", "Rome"],
    ["a", "dull", "film", "by", "Eve"],
]
TAGS = [
    ["B-LOC", "I-LOC", "O", "O", "O"],
    ["O", "B-LOC", "O", "O", "O"],
    ["O", "O", "O", "B-LOC", "O"],
    ["O", "O", "O", "O"],
    ["B-PER", "O", "B-PER", "O", "B-LOC"],
    ["O", "O", "O", "O", "B-PER"],
]
POS = ["a good film", "a great warm story", "good fun", "a lovely play", "great and fine", "a fine show"]
NEG = ["a bad film", "a dull cold story", "bad work", "an awful play", "dull and poor", "a poor show"]


@pytest.fixture(scope="module", params=FAMILIES)
def tiny_model_dir(request: pytest.FixtureRequest, family_model_dir: Any) -> str:
    """The family's tiny model in place of the tiny BERT: tiny_api_factory loads this one."""
    return family_model_dir(request.param)  # type: ignore[no-any-return]


def _wait(c: Any, job_id: str, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while (job := c.get(f"/v1/jobs/{job_id}").json())["state"] not in ("succeeded", "failed", "cancelled"):
        assert time.monotonic() < deadline, job
        time.sleep(0.02)
    return job  # type: ignore[no-any-return]


def _done(c: Any, r: Any) -> dict:
    assert r.status_code == 202, r.text
    job = _wait(c, r.json()["job_id"])
    assert job["state"] == "succeeded", job["error"]
    return r.json()  # type: ignore[no-any-return]


def _reference(path: str, texts: list[str]) -> list[np.ndarray]:
    """Every hidden state of each text, ``[t, H, d]``, from plain transformers, one text at a time."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path).eval()
    out = []
    with torch.inference_mode():
        for t in texts:
            ids = torch.tensor([tok(t)["input_ids"]])
            hs = model(input_ids=ids, attention_mask=torch.ones_like(ids), output_hidden_states=True).hidden_states
            out.append(torch.stack(hs, dim=2)[0].float().numpy())
    return out


def _user_word_ids(tok: Any, words: list[str], kind: str) -> list[int | None]:
    """Each token's user word, as the tokenizer itself splits pre-split words.

    Byte-level BPE marks a word's leading space in its tokens (``Ġ``): the
    joined text's words after the first are tokenized with that space."""
    items = [words[0]] + [" " + w for w in words[1:]] if kind == "bpe" else words
    split = tok(items, is_split_into_words=True)
    assert split["input_ids"] == tok(" ".join(words))["input_ids"]  # the same tokens as the stored text
    return split.word_ids()  # type: ignore[no-any-return]


def _strip_marker(token: str) -> str:
    return token.removeprefix("##").lstrip("Ġ▁")


def test_the_family_through_every_route(tiny_api_factory: Any, tiny_model_dir: str,
                                        request: pytest.FixtureRequest) -> None:
    from transformers import AutoTokenizer

    family = request.node.callspec.params["tiny_model_dir"]
    kind = TOKENIZER_KIND[family]
    api = tiny_api_factory()
    api.client.app.state.probe_service.executor_factory = lambda: ThreadPoolExecutor(1)
    c = api.client
    info = c.get("/info").json()
    m = api.client.app.state.layerbank.model
    H = info["n_hidden_states"]
    assert (H, info["hidden_size"]) == (4, 32), info  # 3 layers + embeddings, 32 wide

    # -- extraction: stored rows are plain transformers' hidden states, mean-pooled -----
    texts = [f"{p} number {i}" for i, p in enumerate(POS)] + [f"{n} number {i}" for i, n in enumerate(NEG)]
    r = c.post("/v1/features", json={"texts": texts[:4], "view": "all_layers", "pooling": "mean"})
    assert r.status_code == 200, r.text
    got = np.array([d["embedding"] for d in r.json()["data"]], np.float32)  # [4, H, d]
    ref = np.stack([s.mean(axis=0) for s in _reference(tiny_model_dir, texts[:4])])
    np.testing.assert_allclose(got, ref, rtol=4e-3, atol=4e-3)  # float16 storage

    # -- /v1/embeddings: no recipe ships with these models, so the documented default -----
    e = c.post("/v1/embeddings", json={"input": texts[:2]}).json()
    np.testing.assert_array_equal(np.array([d["embedding"] for d in e["data"]], np.float32), got[:2, -2])
    unit = c.post("/v1/embeddings", json={"input": texts[:2], "view": "layer:-1", "normalize": True}).json()
    np.testing.assert_allclose(np.linalg.norm([d["embedding"] for d in unit["data"]], axis=1), 1.0, atol=1e-6)

    # -- a sentence probe, and a head that predicts -------------------------------------
    labels = ["pos"] * len(POS) + ["neg"] * len(NEG)
    ds = _done(c, c.post("/v1/datasets", json={"name": "s", "texts": texts, "labels": labels}))
    probe = c.post("/v1/probes", json={"dataset": ds["id"], "views": ["each_layer"], "poolings": ["mean"],
                                       "cv": 2, "control_task": False, "learning_curve": False})
    result = c.get(f"/v1/probes/{_done(c, probe)['id']}").json()["result"]
    assert [row["view"] for row in result["results"]] == [f"layer:{i}" for i in range(H)]
    head = _done(c, c.post("/v1/heads", json={"dataset": ds["id"], "view": "layer:-1"}))
    out = c.post(f"/v1/heads/{head['id']}/predict", json={"texts": ["a good warm film", "a dull cold play"]})
    assert out.status_code == 200, out.text
    assert all(d["label"] in ("neg", "pos") and abs(sum(d["probabilities"]) - 1) < 1e-9
               for d in out.json()["data"])

    # -- a token dataset: stored token rows are the tokenizer's --------------------------
    conll = "\n\n".join("\n".join(f"{w} {t}" for w, t in zip(ws, ts)) for ws, ts in zip(SENTENCES, TAGS))
    train = _done(c, c.post("/v1/datasets", files={"file": ("train.conll", conll.encode())},
                            data={"format": "conll"}))
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    joined = [" ".join(ws) for ws in SENTENCES]
    store = FeatureStore(api.data_dir)
    try:
        rows = store.read_tokens_many([text_key(m.fingerprint, m.config, t) for t in joined])
        refs = _reference(tiny_model_dir, joined)
        for _words, text, row, states in zip(SENTENCES, joined, rows, refs):
            assert row is not None, text
            enc = tok(text, return_offsets_mapping=True)
            assert row.ids.tolist() == enc["input_ids"], (family, text)
            assert row.char_spans.tolist() == [list(o) for o in enc["offset_mapping"]], (family, text)
            assert row.word_ids.tolist() == [-1 if w is None else w for w in enc.word_ids()]
            np.testing.assert_allclose(row.states, states, rtol=4e-3, atol=4e-3)
            # every offset is the token's own text (less its marker, after the tokenizer's
            # normaliser: lower case, accents), where the token is not an unknown or a byte piece
            norm = tok.backend_tokenizer.normalizer
            for t, (s, e_) in zip(tok.convert_ids_to_tokens(enc["input_ids"]), enc["offset_mapping"]):
                piece = _strip_marker(t)
                if t in tok.all_special_tokens or not piece or not piece.isascii():
                    continue
                span = text[s:e_].strip()
                assert (norm.normalize_str(span) if norm else span) == piece, (family, t, span)
        # -- word vectors: first and mean sub-token, as the tokenizer splits the words -------
        for mode in ("first", "mean"):
            wf = word_states(store, m.fingerprint, m.config, SENTENCES, mode=mode)
            assert wf.covered.all()
            pos = 0
            for words, states in zip(SENTENCES, refs):
                wid = _user_word_ids(tok, words, kind)
                for j in range(len(words)):
                    mine = [i for i, w in enumerate(wid) if w == j]
                    want = states[mine[0]] if mode == "first" else states[mine].mean(axis=0)
                    np.testing.assert_allclose(wf.states[pos + j], want, rtol=4e-3, atol=4e-3,
                                               err_msg=f"{family} {mode} {words[j]!r}")
                pos += len(words)
    finally:
        store.close()

    # -- a long text: the encoder tokenizes a prefix (workers/long_texts.py); its tokens,
    # offsets and word ids are the whole text's, truncated, for every tokenizer kind
    enc = api.worker.encoder
    long = " ".join(POS + NEG + joined) * 8
    assert len(long) > 16 * enc.config.max_length
    mine = enc.tokenize([long], want_offsets=True)
    full = tok(long, truncation=True, max_length=enc.config.max_length, return_offsets_mapping=True)
    assert mine.input_ids[0] == full["input_ids"] and mine.truncated == [True]
    assert [list(o) for o in mine.offsets[0]] == [list(o) for o in full["offset_mapping"]]  # type: ignore[index]
    assert mine.word_ids[0] == [-1 if w is None else w for w in full.word_ids()]  # type: ignore[index]

    # -- a token probe on it --------------------------------------------------------------
    probe = c.post("/v1/probes", json={"task": "token", "dataset": train["id"], "valid_fraction": 0.34,
                                       "views": ["layer:-1"], "control_task": False})
    res = c.get(f"/v1/probes/{_done(c, probe)['id']}").json()["result"]
    assert res["rows"][0]["view"] == "layer:-1" and 0 <= res["rows"][0]["f1"] <= 1


def test_a_model_without_a_fast_tokenizer_is_one_clear_error(family_model_dir: Any,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import transformers

    from layerbank.workers.encoder import Encoder, ModelLoadError

    real = transformers.AutoTokenizer.from_pretrained

    class Slow:  # what a tokenizer without a Rust backend reports
        is_fast = False

        def __init__(self, tok: Any) -> None:
            self.tok = tok

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained",
                        lambda *a, **k: Slow(real(*a, **k)))
    path = family_model_dir("xlm-roberta")
    with pytest.raises(ModelLoadError) as e:
        Encoder.load(path, device="cpu")
    assert str(e.value).startswith(f"model {path!r} has no fast tokenizer")
    assert "offsets" in str(e.value) and "word ids" in str(e.value)


def test_byte_level_offsets_that_keep_the_leading_space(family_model_dir: Any, tmp_path: Any) -> None:
    """A byte-level BPE tokenizer whose offsets are not trimmed (``ĠYork`` at ``(3, 8)``, the
    space included, as tokenizers without a ByteLevel post-processor give): words still get
    their own tokens, first and mean as the tokenizer splits them."""
    import shutil

    from tokenizers import processors
    from transformers import AutoTokenizer

    from layerbank.cache.words import align_tokens_to_words, join_words, word_vectors
    from layerbank.workers.encoder import Encoder

    path = tmp_path / "untrimmed"
    shutil.copytree(family_model_dir("modernbert"), path)
    tok = AutoTokenizer.from_pretrained(path)
    cls_, sep = tok.cls_token, tok.sep_token
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{cls_} $A {sep}", special_tokens=[(cls_, tok.cls_token_id), (sep, tok.sep_token_id)])
    tok.save_pretrained(path)
    enc = Encoder.load(str(path), device="cpu")
    words = SENTENCES[0] + SENTENCES[2]
    text, spans = join_words(words)
    batch = enc.tokenize([text], want_offsets=True)
    pieces = [text[s:e] for s, e in batch.offsets[0]]
    assert " is" in pieces and " " in pieces, pieces  # 'Ġis' covers the space; a lone 'Ġ' is only it
    rows = enc.encode(batch, want_tokens=True).tokens[0]  # type: ignore[index]
    token_word = align_tokens_to_words(rows.char_spans, spans, rows.word_ids)
    wid = _user_word_ids(tok, words, "bpe")
    assert token_word.tolist() == [-1 if w is None else w for w in wid]
    for mode in ("first", "mean"):
        vectors, covered = word_vectors(rows.states, token_word, len(words), mode)
        assert covered.all()
        for j in range(len(words)):
            mine = [i for i, w in enumerate(wid) if w == j]
            want = rows.states[mine[0]] if mode == "first" else rows.states[mine].mean(axis=0)
            np.testing.assert_allclose(vectors[j], want, rtol=1e-6, atol=1e-6)
