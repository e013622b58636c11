"""Tiny random BERT encoders saved to disk, for tests that serve more than one
model (the shared ``tiny_model_dir`` fixture in tests/conftest.py is one of them).

Each has the bundled model's real tokenizer and weights of its own (a seed),
so its fingerprint and its numbers differ from every other's.

Example::

    path = save_tiny_bert(tmp_path / "other", seed=7, hidden=48, layers=3)
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["save_tiny_bert"]


def save_tiny_bert(out: Path, *, seed: int, hidden: int, layers: int) -> str:
    """A random ``BertModel`` with the bundled model's tokenizer, saved to ``out``."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    from layerbank.cache.fingerprint import default_model_path

    tok = AutoTokenizer.from_pretrained(default_model_path(), use_fast=True)
    config = BertConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=2,
                        intermediate_size=37, vocab_size=len(tok), max_position_embeddings=64)
    torch.manual_seed(seed)
    BertModel(config).eval().save_pretrained(out)
    tok.save_pretrained(out)
    return os.fspath(out)
