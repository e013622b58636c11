"""bf16 Linear weights cast once (issue 28 item 1): the same numbers as autocast's
cast in every pass, and an fp32 encoder on the same weights untouched.

``layerbank.workers.precision.cast_linear_weights_once`` gives each frozen
``nn.Linear`` a bfloat16 copy of its weights, used only under autocast with
gradients off. These tests run a tiny random BERT (tests/conftest.py).
"""

from __future__ import annotations

import numpy as np
import torch

from layerbank.workers.encoder import Encoder

TEXTS = ["a short text", "another one, somewhat longer than the first", "x"]


def _plain_autocast_rows(enc: Encoder) -> dict[str, np.ndarray]:
    """What autocast alone gives: the model's Linear layers as transformers made them."""
    from transformers import AutoModel

    plain = AutoModel.from_pretrained(enc.name).eval().requires_grad_(False)
    twin = Encoder(plain, enc.tokenizer, enc.name, enc.fingerprint, enc.config, enc.device, dict(enc.info),
                   poolings=enc.poolings)
    twin._autocast = lambda: torch.autocast("cpu", dtype=torch.bfloat16)  # type: ignore[method-assign]
    return twin.encode(twin.tokenize(TEXTS)).pooled


def test_bf16_rows_equal_autocast_rows_and_fp32_rows_stay_fp32(tiny_model_dir: str) -> None:
    fp32 = Encoder.load(tiny_model_dir, device="cpu", precision="fp32")
    before = fp32.encode(fp32.tokenize(TEXTS)).pooled
    bf16 = fp32.with_precision("bf16")  # the same model object, another precision
    got = bf16.encode(bf16.tokenize(TEXTS)).pooled
    want = _plain_autocast_rows(bf16)
    for name in bf16.poolings:
        np.testing.assert_array_equal(got[name], want[name])  # bit for bit: the same rounding
        assert not np.array_equal(got[name], before[name])  # and bf16 rows are not fp32 rows
    after = fp32.encode(fp32.tokenize(TEXTS)).pooled  # the shared weights still give fp32 rows
    for name in fp32.poolings:
        np.testing.assert_array_equal(after[name], before[name])


def test_the_bf16_copy_is_made_once_and_remade_when_weights_change(tiny_model_dir: str) -> None:
    enc = Encoder.load(tiny_model_dir, device="cpu", precision="bf16")
    enc.encode(enc.tokenize(TEXTS))
    lin = next(m for m in enc.model.modules() if isinstance(m, torch.nn.Linear))
    first = lin.__dict__["_layerbank_low"][torch.bfloat16][1]
    assert first.dtype == torch.bfloat16
    enc.encode(enc.tokenize(TEXTS))
    assert lin.__dict__["_layerbank_low"][torch.bfloat16][1] is first  # no second cast
    with torch.no_grad():
        lin.weight.mul_(2.0)  # fine-tuned in place: the copy must follow
    enc.encode(enc.tokenize(TEXTS))
    again = lin.__dict__["_layerbank_low"][torch.bfloat16][1]
    torch.testing.assert_close(again.float(), lin.weight.to(torch.bfloat16).float())
