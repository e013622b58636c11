"""Tiny random encoders of every family layerbank claims to support, built offline.

README says any Hugging Face encoder works; these builders are how the tests
check it for the families that differ in layout and tokenizer: BERT, RoBERTa,
XLM-R, DistilBERT, ALBERT, ELECTRA, DeBERTa-v2, MPNet and ModernBERT. Each is
a 3-layer, 32-wide random model of the family's own ``transformers`` class,
saved with ``save_pretrained`` next to a *fast* tokenizer of the family's kind,
trained here with the ``tokenizers`` library on the texts of
examples/sst2_sample.tsv (nothing is downloaded):

* WordPiece (``##`` continuations): BERT, DistilBERT, ELECTRA, MPNet
* byte-level BPE (``Ġ`` marks a leading space): RoBERTa, ModernBERT
* Unigram with a SentencePiece-style Metaspace (``▁``): XLM-R, ALBERT, DeBERTa-v2

with the family's special tokens, ids and template (``[CLS] .. [SEP]`` or
``<s> .. </s>``) and the family's tokenizer inputs (no ``token_type_ids``
where the real tokenizer gives none). ``AutoTokenizer.from_pretrained(dir)``,
``AutoModel.from_pretrained(dir)`` and ``Encoder.load(dir)`` accept every
directory. Building all nine takes about 2 s.

API
---
``FAMILIES``
    The family names (tuple, in the order above).
``TOKENIZER_KIND[name]``
    ``"wordpiece"``, ``"bpe"`` or ``"unigram"``.
``build_family(name, path, seed=0) -> Path``
    Builds one family's model into ``path`` (created) and returns it.
``family_model_dir`` (pytest fixture, session scope; tests/conftest.py imports it)
    ``family_model_dir(name) -> str``: the directory of ``name``'s tiny model,
    built once per session.

Example::

    def test_it(family_model_dir):
        path = family_model_dir("deberta-v2")
        model = AutoModel.from_pretrained(path)
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

__all__ = [
    "FAMILIES",
    "HIDDEN",
    "LAYERS",
    "TOKENIZER_KIND",
    "build_family",
    "corpus",
    "family_model_dir",
]

LAYERS = 3
HIDDEN = 32
HEADS = 2
INTERMEDIATE = 37
POSITIONS = 64  # longest input, special tokens included
VOCAB = 600  # target vocabulary of each trained tokenizer (the real one may be a little smaller)

FAMILIES = ("bert", "roberta", "xlm-roberta", "distilbert", "albert", "electra", "deberta-v2",
            "mpnet", "modernbert")

TOKENIZER_KIND = {"bert": "wordpiece", "distilbert": "wordpiece", "electra": "wordpiece",
                  "mpnet": "wordpiece", "roberta": "bpe", "modernbert": "bpe",
                  "xlm-roberta": "unigram", "albert": "unigram", "deberta-v2": "unigram"}

_EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "sst2_sample.tsv"


def corpus() -> list[str]:
    """The texts of examples/sst2_sample.tsv (the header and labels dropped)."""
    lines = _EXAMPLES.read_text(encoding="utf-8").splitlines()[1:]
    return [line.rsplit("\t", 1)[0].strip() for line in lines if line.strip()]


# -- tokenizers ---------------------------------------------------------------

# Special tokens per family, in vocabulary order (so ids match the real models':
# RoBERTa's <pad> is 1, ALBERT's <pad> is 0, DeBERTa's [PAD] 0 and [CLS] 1 ...),
# then the roles PreTrainedTokenizerFast needs, then the inputs the model takes.
_BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
_BERT_ROLES = {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]",
               "sep_token": "[SEP]", "mask_token": "[MASK]"}
_ROBERTA_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
_ROBERTA_ROLES = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>",
                  "cls_token": "<s>", "sep_token": "</s>", "mask_token": "<mask>"}
_WITH_TYPES = ["input_ids", "token_type_ids", "attention_mask"]
_NO_TYPES = ["input_ids", "attention_mask"]

_SPECIALS: dict[str, tuple[list[str], dict[str, str], list[str]]] = {
    "bert": (_BERT_SPECIALS, _BERT_ROLES, _WITH_TYPES),
    "electra": (_BERT_SPECIALS, _BERT_ROLES, _WITH_TYPES),
    "distilbert": (_BERT_SPECIALS, _BERT_ROLES, _NO_TYPES),
    "mpnet": (_ROBERTA_SPECIALS, _ROBERTA_ROLES, _NO_TYPES),
    "roberta": (_ROBERTA_SPECIALS, _ROBERTA_ROLES, _NO_TYPES),
    "modernbert": (["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"],
                   {k: v for k, v in _BERT_ROLES.items()}, _NO_TYPES),
    "xlm-roberta": (_ROBERTA_SPECIALS, _ROBERTA_ROLES, _NO_TYPES),
    "albert": (["<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]"],
               {"pad_token": "<pad>", "unk_token": "<unk>", "cls_token": "[CLS]", "sep_token": "[SEP]",
                "mask_token": "[MASK]", "bos_token": "[CLS]", "eos_token": "[SEP]"}, _WITH_TYPES),
    "deberta-v2": (["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"],
                   {**_BERT_ROLES, "bos_token": "[CLS]", "eos_token": "[SEP]"}, _WITH_TYPES),
}


def _train_tokenizer(name: str, texts: list[str]) -> Any:
    """A ``tokenizers.Tokenizer`` of the family's kind, trained on ``texts``."""
    from tokenizers import (
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    specials, roles, _ = _SPECIALS[name]
    kind = TOKENIZER_KIND[name]
    if kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token=roles["unk_token"], max_input_chars_per_word=100))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece(prefix="##")
        trainer: Any = trainers.WordPieceTrainer(vocab_size=VOCAB, special_tokens=specials,
                                                 continuing_subword_prefix="##")
    elif kind == "bpe":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=specials,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    else:  # unigram, as SentencePiece: "▁" replaces spaces and starts each word
        tok = Tokenizer(models.Unigram())
        tok.normalizer = normalizers.Sequence([normalizers.NFKC(),
                                               normalizers.Replace(Regex(" {2,}"), " ")]
                                              + ([normalizers.Lowercase()] if name == "albert" else []))
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
        trainer = trainers.UnigramTrainer(vocab_size=VOCAB, special_tokens=specials,
                                          unk_token=roles["unk_token"], shrinking_factor=0.75)
    tok.train_from_iterator(texts, trainer=trainer)
    first, last = roles["cls_token"], roles["sep_token"]
    if name == "roberta":
        tok.post_processor = processors.RobertaProcessing((last, tok.token_to_id(last)),
                                                          (first, tok.token_to_id(first)),
                                                          add_prefix_space=False, trim_offsets=True)
    else:
        pair = f"{first} $A {last} $B:1 {last}:1" if first == "[CLS]" else f"{first} $A {last} {last} $B {last}"
        tok.post_processor = processors.TemplateProcessing(
            single=f"{first} $A {last}", pair=pair,
            special_tokens=[(first, tok.token_to_id(first)), (last, tok.token_to_id(last))])
    if kind == "bpe" and name != "roberta":  # byte-level offsets cover the word, not its "Ġ"
        tok.post_processor = processors.Sequence([processors.ByteLevel(trim_offsets=True),
                                                  tok.post_processor])
    return tok


def _fast_tokenizer(name: str, texts: list[str], max_length: int) -> Any:
    from transformers import PreTrainedTokenizerFast

    _, roles, inputs = _SPECIALS[name]
    fast = PreTrainedTokenizerFast(tokenizer_object=_train_tokenizer(name, texts),
                                   model_max_length=max_length, **roles)
    fast.model_input_names = list(inputs)
    fast.init_kwargs["model_input_names"] = list(inputs)  # saved, so a reload keeps them
    return fast


# -- models -------------------------------------------------------------------

def _config(name: str, tok: Any) -> Any:
    """The family's config at the tiny size, with the tokenizer's vocabulary and special ids."""
    from transformers import AutoConfig

    V = len(tok)
    ids = {"pad_token_id": tok.pad_token_id}
    if tok.bos_token_id is not None:
        ids["bos_token_id"] = tok.bos_token_id
    if tok.eos_token_id is not None:
        ids["eos_token_id"] = tok.eos_token_id
    common: dict[str, Any] = {"vocab_size": V, "num_hidden_layers": LAYERS, "hidden_size": HIDDEN,
                              "num_attention_heads": HEADS, "intermediate_size": INTERMEDIATE,
                              "max_position_embeddings": POSITIONS, **ids}
    if name in ("roberta", "xlm-roberta", "mpnet"):  # positions start after the padding id
        common["max_position_embeddings"] = POSITIONS + tok.pad_token_id + 1
    if name == "roberta" or name == "xlm-roberta":
        common["type_vocab_size"] = 1
    if name == "distilbert":  # its own names; no token types
        common = {"vocab_size": V, "n_layers": LAYERS, "dim": HIDDEN, "n_heads": HEADS,
                  "hidden_dim": INTERMEDIATE, "max_position_embeddings": POSITIONS, **ids}
    elif name == "albert":  # factorised embeddings (E < d), one layer shared by all
        common.update(embedding_size=16, num_hidden_groups=1, inner_group_num=1)
    elif name == "electra":  # embeddings narrower than the encoder: embeddings_project
        common.update(embedding_size=16)
    elif name == "deberta-v2":  # DeBERTa-v3's layout: relative positions, no absolute ones
        common.update(relative_attention=True, position_buckets=16, max_relative_positions=-1,
                      pos_att_type=["p2c", "c2p"], position_biased_input=False, norm_rel_ebd="layer_norm",
                      share_att_key=True, type_vocab_size=0)
    elif name == "modernbert":  # global attention every 3rd layer, a local window elsewhere
        common.update(global_attn_every_n_layers=3, local_attention=16,
                      cls_token_id=tok.cls_token_id, sep_token_id=tok.sep_token_id,
                      bos_token_id=tok.cls_token_id, eos_token_id=tok.sep_token_id)
    return AutoConfig.for_model(name, **common)


def build_family(name: str, path: str | os.PathLike[str], seed: int = 0) -> Path:
    """A tiny random ``name`` model with its trained fast tokenizer, saved under ``path``."""
    import torch
    from transformers import AutoModel

    if name not in FAMILIES:
        raise ValueError(f"unknown family {name!r}; expected one of {FAMILIES}")
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    roberta_like = name in ("roberta", "xlm-roberta", "mpnet")
    tok = _fast_tokenizer(name, corpus(), POSITIONS)
    config = _config(name, tok)
    torch.manual_seed(seed)
    model = AutoModel.from_config(config).eval()
    model.save_pretrained(out)
    tok.save_pretrained(out)
    assert not roberta_like or config.max_position_embeddings >= POSITIONS + 2
    return out


@pytest.fixture(scope="session")
def family_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], str]:
    """``family_model_dir(name) -> str``: ``name``'s tiny model, built once per session."""
    import torch

    torch.set_num_threads(1)  # tiny models gain nothing from more (see tiny_model_dir)
    built: dict[str, str] = {}

    def get(name: str) -> str:
        if name not in built:
            built[name] = os.fspath(build_family(name, tmp_path_factory.mktemp(f"family-{name}")))
        return built[name]

    return get
