"""An encoder whose layers cannot be found: a 422 over HTTP and one line on the CLI,
naming what was not found, before anything trains; and an unlisted family whose
layers *can* be found from its module tree, trained with its counts checked there.

Both models are tiny custom ``transformers`` classes registered with the Auto
classes in this process (so the in-thread worker loads them too), saved next to
the tiny BERT family's WordPiece tokenizer (tests/families.py).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from transformers import AutoConfig, AutoModel, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput

from tests.regimes_data import NEG, POS, wait


class BlobConfig(PretrainedConfig):
    model_type = "blobformer"

    def __init__(self, vocab_size: int = 600, hidden_size: int = 32, num_hidden_layers: int = 2,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.vocab_size, self.hidden_size, self.num_hidden_layers = vocab_size, hidden_size, num_hidden_layers


class BlobModel(PreTrainedModel):
    """One mixing MLP applied L times: no list of blocks, no attention at all."""

    config_class = BlobConfig
    base_model_prefix = "blob"

    def __init__(self, config: BlobConfig) -> None:
        super().__init__(config)
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.mix = nn.Sequential(nn.Linear(config.hidden_size, config.hidden_size), nn.Tanh())
        self.post_init()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                output_hidden_states: bool | None = None, **_: Any) -> BaseModelOutput:
        states = [self.embed(input_ids)]
        for _ in range(self.config.num_hidden_layers):
            states.append(self.mix(states[-1]))
        return BaseModelOutput(last_hidden_state=states[-1], hidden_states=tuple(states))


class StackConfig(PretrainedConfig):
    model_type = "stackformer"

    def __init__(self, vocab_size: int = 600, hidden_size: int = 32, num_hidden_layers: int = 2,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.vocab_size, self.hidden_size, self.num_hidden_layers = vocab_size, hidden_size, num_hidden_layers


class StackBlock(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.norm = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        scores = self.q(x) @ self.k(x).transpose(1, 2) / x.shape[-1] ** 0.5
        scores = scores.masked_fill(mask[:, None, :] == 0, -1e4)
        return self.norm(x + self.o(scores.softmax(-1) @ self.v(x)))


class StackModel(PreTrainedModel):
    """An unlisted family with a recognisable layout: blocks in a ModuleList, q/k/v Linears."""

    config_class = StackConfig
    base_model_prefix = "stack"

    def __init__(self, config: StackConfig) -> None:
        super().__init__(config)
        self.token_embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.blocks = nn.ModuleList(StackBlock(config.hidden_size) for _ in range(config.num_hidden_layers))
        self.final = nn.LayerNorm(config.hidden_size)
        self.post_init()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                output_hidden_states: bool | None = None, **_: Any) -> BaseModelOutput:
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        states = [self.token_embed(input_ids)]
        for block in self.blocks:
            states.append(block(states[-1], mask))
        states[-1] = self.final(states[-1])
        return BaseModelOutput(last_hidden_state=states[-1], hidden_states=tuple(states))


for _config, _model in ((BlobConfig, BlobModel), (StackConfig, StackModel)):
    AutoConfig.register(_config.model_type, _config, exist_ok=True)
    AutoModel.register(_config, _model, exist_ok=True)


def _save(model_cls: type[PreTrainedModel], config: PretrainedConfig, out: Path, tokenizer_from: str) -> str:
    torch.manual_seed(0)
    model_cls(config).eval().save_pretrained(out)
    for f in Path(tokenizer_from).iterdir():  # the tiny BERT's WordPiece tokenizer
        if f.name.startswith(("tokenizer", "special_tokens", "vocab")):
            shutil.copy(f, out / f.name)
    return str(out)


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, family_model_dir: Any) -> str:
    """Overrides conftest's: the unmappable blob model, so ``tiny_api`` serves it."""
    return _save(BlobModel, BlobConfig(), tmp_path_factory.mktemp("blob"), family_model_dir("bert"))


def test_unmappable_model_is_a_422_naming_what_was_not_found(tiny_api: Any) -> None:
    c = tiny_api.client
    ds = c.post("/v1/datasets", json={"name": "blob", "texts": POS + NEG,
                                      "labels": ["pos"] * 10 + ["neg"] * 10}).json()
    assert wait(c, ds["job_id"])["state"] == "succeeded"  # extraction works on any encoder
    r = c.post("/v1/regimes", json={"dataset": ds["id"], "regimes": ["frozen", "lora", "top_k"]})
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["type"] == "validation" and body["field"] == "regimes"
    assert "BlobModel" in body["error"] and "'blobformer'" in body["error"]
    assert "['lora', 'top_k']" in body["error"]
    assert "no nn.ModuleList of blocks of one class with parameters" in body["error"]
    assert c.get("/v1/jobs").status_code == 200 and not [j for j in c.get("/v1/jobs").json().get("jobs", [])
                                                       if j.get("kind") == "regimes"]
    # what needs no layers still runs: the frozen probe and BitFit
    r = c.post("/v1/regimes", json={"dataset": ds["id"], "regimes": ["frozen", "bitfit"], "seeds": 1,
                                    "max_epochs": 1})
    assert r.status_code == 202, r.text
    job = wait(c, r.json()["job_id"])
    assert job["state"] == "succeeded", job
    assert set(job["result"]["regimes"]) == {"frozen", "bitfit"}


def test_unmappable_model_is_one_line_on_the_cli(tiny_model_dir: str, tmp_path: Path, capsys: Any) -> None:
    from layerbank.app.cli.main import main

    data = tmp_path / "s.tsv"
    data.write_text("sentence\tlabel\n" + "".join(f"{t}\tpos\n" for t in POS) +
                    "".join(f"{t}\tneg\n" for t in NEG), encoding="utf-8")
    with pytest.raises(SystemExit) as exit_:
        main(["regimes", str(data), "--text-column", "sentence", "--label-column", "label",
              "--model", tiny_model_dir, "--device", "cpu", "--threads", "1", "--data-dir", str(tmp_path / "d"),
              "--regimes", "lora,gradual", "--seeds", "1", "--max-epochs", "1", "--no-progress"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("layerbank: error:")]
    assert exit_.value.code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert "BlobModel" in lines[0] and "['gradual', 'lora']" in lines[0]
    assert "no nn.ModuleList of blocks" in lines[0]
    assert not (tmp_path / "d" / "regimes").exists()  # nothing trained, nothing stored


def test_an_unlisted_family_is_discovered_from_its_module_tree(family_model_dir: Any,
                                                               tmp_path: Path) -> None:
    from layerbank.workers.regimes.run import run_regimes
    from layerbank.workers.regimes.trainable import configure

    path = _save(StackModel, StackConfig(num_hidden_layers=2), tmp_path / "stack", family_model_dir("bert"))
    model = AutoModel.from_pretrained(path)
    d, r = 32, 8
    block = 4 * (d * d + d) + 2 * d  # q, k, v, o + LayerNorm, counted here by hand
    assert configure(model, "lora") == 2 * 2 * r * (d + d)  # q and v of both blocks
    assert {n for n, m in model.named_modules() if hasattr(m, "lora_A")} == \
        {"blocks.0.q", "blocks.0.v", "blocks.1.q", "blocks.1.v"}
    assert configure(AutoModel.from_pretrained(path), "top_k", top_k=1) == block + 2 * d  # + final norm
    assert configure(AutoModel.from_pretrained(path), "bitfit") == 2 * (4 * d + d) + d
    torch.set_num_threads(1)
    result = run_regimes(POS + NEG, ["pos"] * 10 + ["neg"] * 10, model_path=path,
                         regimes=("lora", "top_k", "gradual"), seeds=1, max_epochs=1, device="cpu")
    rows = result["regimes"]
    assert all(row["matches_formula"] and row["expected_from"] == "module tree" for row in rows.values())
    assert result["model"]["layout"]["source"] == "discovered"
    assert result["model"]["layout"]["layers"] == "blocks"
