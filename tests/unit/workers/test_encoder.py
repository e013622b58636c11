"""layerbank.workers.encoder.Encoder on the tiny random BERT (tests/conftest.py).

The reference is the model run on each text **alone** (no padding, no
mask), pooled with plain torch: what "mean over real tokens", "first token"
and "max" mean. The encoder batches, pads and masks; the numbers must agree.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from layerbank.workers.encoder import Encoder, ModelLoadError

TEXTS = ["a", "The cat sat on the mat.", "Unbelievably, don't stop!", "x y z " * 5, "Grüße aus Köln"]


@pytest.fixture(scope="module")
def reference(tiny_model_dir: str):  # type: ignore[no-untyped-def]
    """(tokenizer, model) loaded independently of the Encoder."""
    from transformers import AutoModel, AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir), AutoModel.from_pretrained(tiny_model_dir).eval()


def states_alone(reference, ids: list[int]) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """[H, t, d] hidden states of one unpadded sequence."""
    _, model = reference
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    return torch.stack(out.hidden_states, dim=1)[0]


def test_pooled_vectors_equal_the_definition_on_unpadded_texts(tiny_encoder: Encoder, reference) -> None:  # type: ignore[no-untyped-def]
    tok, _ = reference
    batch = tiny_encoder.tokenize(TEXTS)
    assert len(set(batch.lengths)) > 1  # the batch really is padded
    out = tiny_encoder.encode(batch)
    assert tiny_encoder.calls == 1
    for name in ("mean", "cls", "max"):
        assert out.pooled[name].shape == (len(TEXTS), 3, 32)
        assert out.pooled[name].dtype == np.float32
    for i, text in enumerate(TEXTS):
        ids = tok(text)["input_ids"]
        assert batch.input_ids[i] == ids
        hs = states_alone(reference, ids)  # [H, t, d]
        np.testing.assert_allclose(out.pooled["mean"][i], hs.mean(dim=1).numpy(), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(out.pooled["cls"][i], hs[:, 0].numpy(), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(out.pooled["max"][i], hs.amax(dim=1).numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(out.n_tokens, batch.lengths)
    assert not out.truncated.any()


def test_mean_uses_the_mask_not_the_padded_length(tiny_encoder: Encoder, reference) -> None:  # type: ignore[no-untyped-def]
    # a 1-word text padded to a 30-token batch: a mask-less mean would differ by far
    out = tiny_encoder.encode(tiny_encoder.tokenize(["a", "long " * 28]))
    hs = states_alone(reference, reference[0]("a")["input_ids"])
    np.testing.assert_allclose(out.pooled["mean"][0], hs.mean(dim=1).numpy(), rtol=1e-4, atol=1e-5)
    alone = tiny_encoder.encode(tiny_encoder.tokenize(["a"]))
    np.testing.assert_allclose(out.pooled["max"][0], alone.pooled["max"][0], rtol=1e-4, atol=1e-5)


def test_truncation_flag_and_token_count(tiny_model_dir: str, reference) -> None:  # type: ignore[no-untyped-def]
    tok, _ = reference
    enc = Encoder.load(tiny_model_dir, device="cpu", max_length=8)
    assert enc.config.max_length == 8
    long_text = "one two three four five six seven eight nine ten"
    batch = enc.tokenize(["short", long_text])
    assert batch.truncated == [False, True]
    assert batch.lengths == [3, 8]
    full = tok(long_text)["input_ids"]
    assert batch.input_ids[1] == full[:7] + [full[-1]]  # [CLS] one .. six [SEP]
    out = enc.encode(batch)
    assert out.n_tokens.tolist() == [3, 8] and out.truncated.tolist() == [False, True]
    hs = states_alone(reference, batch.input_ids[1])
    np.testing.assert_allclose(out.pooled["mean"][1], hs.mean(dim=1).numpy(), rtol=1e-4, atol=1e-5)


def test_left_truncation_keeps_the_end(tiny_model_dir: str, reference) -> None:  # type: ignore[no-untyped-def]
    tok, _ = reference
    enc = Encoder.load(tiny_model_dir, device="cpu", max_length=6, truncation_side="left")
    text = "one two three four five six seven"
    full = tok(text)["input_ids"]
    batch = enc.tokenize([text])
    assert batch.input_ids[0] == [full[0]] + full[-5:]  # [CLS] four .. seven [SEP]
    assert enc.config.truncation_side == "left"


def test_max_length_is_capped_at_what_the_model_can_take(tiny_model_dir: str) -> None:
    enc = Encoder.load(tiny_model_dir, device="cpu", max_length=10_000)
    assert enc.config.max_length == 64  # the tiny model's position embeddings
    assert Encoder.load(tiny_model_dir, device="cpu").config.max_length == 64
    # a text past the model's limit is cut, not an index error
    out = enc.encode(enc.tokenize(["word " * 200]))
    assert out.n_tokens.tolist() == [64] and out.truncated.tolist() == [True]


def test_token_rows_equal_per_token_hidden_states(tiny_encoder: Encoder, reference) -> None:  # type: ignore[no-untyped-def]
    tok, _ = reference
    texts = ["Unbelievably, don't stop!", "a b"]
    batch = tiny_encoder.tokenize(texts, want_offsets=True)
    out = tiny_encoder.encode(batch, want_tokens=True)
    assert out.tokens is not None and len(out.tokens) == 2
    for i, text in enumerate(texts):
        enc = tok(text, return_offsets_mapping=True)
        rows = out.tokens[i]
        t = len(enc["input_ids"])
        assert rows.states.shape == (t, 3, 32)
        hs = states_alone(reference, enc["input_ids"])  # [H, t, d]
        np.testing.assert_allclose(rows.states, hs.permute(1, 0, 2).numpy(), rtol=1e-4, atol=1e-5)
        assert rows.ids.tolist() == enc["input_ids"]
        assert [tuple(s) for s in rows.char_spans.tolist()] == [tuple(s) for s in enc["offset_mapping"]]
        assert rows.word_ids.tolist() == [-1 if w is None else w for w in enc.word_ids()]
        assert rows.word_ids[0] == -1 and rows.word_ids[-1] == -1  # [CLS], [SEP]
        # each real token's span is where it sits in the text (the tokenizer lower-cases)
        pieces = tok.convert_ids_to_tokens(enc["input_ids"])
        for piece, (a, b) in zip(pieces[1:-1], rows.char_spans[1:-1].tolist()):
            assert text[a:b].lower() == piece.removeprefix("##")


def test_token_rows_need_offsets(tiny_encoder: Encoder) -> None:
    with pytest.raises(ValueError, match="want_offsets=True"):
        tiny_encoder.encode(tiny_encoder.tokenize(["a"]), want_tokens=True)


def test_load_reports_what_it_loaded(tiny_encoder: Encoder, tiny_model_dir: str) -> None:
    info = tiny_encoder.info
    assert (info["num_layers"], info["n_hidden_states"], info["hidden_size"]) == (2, 3, 32)
    assert info["device"] == "cpu" and info["precision"] == "fp32" and info["storage_dtype"] == "float16"
    assert tiny_encoder.fingerprint.startswith("local:")
    assert tiny_encoder.config.precision == "fp32"


@pytest.mark.parametrize("name", ["/no/such/model", "./no-such-model", "../missing/dir"])
def test_a_missing_model_path_is_a_clear_error(name: str) -> None:
    with pytest.raises(ModelLoadError) as e:
        Encoder.load(name, device="cpu")
    assert str(e.value) == f"cannot load model {name!r}: there is no model directory at that path"


def test_a_directory_without_a_model_is_a_model_load_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ModelLoadError, match="cannot load model"):
        Encoder.load(str(tmp_path), device="cpu")
