"""The tiny family models (tests/families.py) load as a user's model would:
AutoTokenizer gives a fast tokenizer of the family's kind, AutoModel the family's class."""

from __future__ import annotations

import pytest

from tests.families import FAMILIES, LAYERS, TOKENIZER_KIND

_MARK = {"wordpiece": "##", "bpe": "Ġ", "unigram": "▁"}


@pytest.mark.parametrize("family", FAMILIES)
def test_family_loads_with_its_tokenizer_kind(family_model_dir, family: str) -> None:
    from transformers import AutoModel, AutoTokenizer

    path = family_model_dir(family)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path)
    assert tok.is_fast and model.config.model_type == family
    assert model.config.num_hidden_layers == LAYERS
    pieces = [t for text in ("holden caulfield did it better .", "a moviegoing pleasure")
              for t in tok.tokenize(text)]
    assert any(_MARK[TOKENIZER_KIND[family]] in t for t in pieces), pieces
    enc = tok(["holden caulfield did it better ."], return_tensors="pt")
    out = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"])
    assert out.last_hidden_state.shape[-1] == model.config.hidden_size
