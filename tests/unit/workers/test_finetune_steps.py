"""Fine-tuning really updates what it trains: the audit removed ``optimizer.step()`` and the
regimes tests still passed on their accuracy floors. Here every trained parameter of the
best state must differ from where it started, and the frozen ones must not be stored."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModel, AutoTokenizer

from layerbank.workers.regimes.finetune import Split, TrainSettings, finetune


@pytest.mark.parametrize("regime", ["full", "bitfit"])
def test_every_trained_parameter_moves(tiny_model_dir: str, regime: str) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    encoder = AutoModel.from_pretrained(tiny_model_dir).eval()
    texts = [f"{w} movie number {i}" for i, w in enumerate(["good", "bad"] * 16)]
    ids = [tok(t)["input_ids"] for t in texts]
    y = np.array([i % 2 for i in range(len(texts))])
    split = Split(ids, y)
    head = (np.zeros((2, encoder.config.hidden_size), np.float32), np.zeros(2, np.float32))
    s = TrainSettings(regime=regime, lr=1e-3, head_lr=1e-2, max_epochs=1, patience=1, batch_size=8,
                      head_init=head)
    result = finetune(encoder, split, split, split, 2, tok.pad_token_id, s)
    start = {f"encoder.{n}": p.detach() for n, p in encoder.named_parameters()}
    start["head.weight"], start["head.bias"] = torch.as_tensor(head[0]), torch.as_tensor(head[1])
    assert result.state, "nothing was trained"
    assert {"head.weight", "head.bias"} <= set(result.state)
    if regime == "bitfit":
        assert all(n.endswith("bias") or n.startswith("head.") for n in result.state), \
            [n for n in result.state if not n.endswith("bias")]
    unmoved = [n for n, v in result.state.items() if torch.equal(v, start[n])]
    assert not unmoved, unmoved  # a step was taken on every trained tensor
