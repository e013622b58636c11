"""Every regime end to end on a small seeded SST-2 subset, bundled model, CPU.

300 sentences are drawn (seed 0) from tests/data/sst2/train.tsv; the
stratified split keeps 60 for test and 30 for validation, and each regime
trains on 120 of the rest for at most 2 epochs at max_length 64, one seed.
The thresholds are what a working pipeline reaches (frozen MiniLM features
separate sentiment well; Adam's moments for 22.6M parameters are visible in
the full regime's memory), not what any output would pass.
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import pytest
import torch

from layerbank.app.probes.regimes_plot import format_regimes_table
from layerbank.workers.regimes.run import run_regimes
from tests.data_paths import SST2 as SST2_DIR

pytestmark = pytest.mark.integration
SST2 = SST2_DIR / "train.tsv"


def _sample(n: int, seed: int) -> tuple[list[str], list[int]]:
    rows = [line.split("\t") for line in SST2.read_text(encoding="utf-8").splitlines()[1:]]
    rows = random.Random(seed).sample(rows, n)
    return [r[0] for r in rows], [int(r[1]) for r in rows]


def _digest(directory: str) -> str:
    h = hashlib.sha256()
    for p in sorted(Path(directory).rglob("*")):
        if p.is_file():
            h.update(p.name.encode() + p.read_bytes())
    return h.hexdigest()


def test_every_regime_on_a_seeded_sst2_subset(tmp_path: Path) -> None:
    from layerbank.cache.fingerprint import default_model_path

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the machine is shared; one thread was the fastest there
    try:
        texts, labels = _sample(300, seed=0)
        before = _digest(default_model_path())
        result = run_regimes(texts, labels, seeds=1, train_sizes=[120], max_epochs=2, top_k=3,  # one cut: fast
                             max_length=64, device="cpu", out_dir=tmp_path / "heads")
    finally:
        torch.set_num_threads(threads)
    print(format_regimes_table(result))  # shown with -s, and on failure
    assert _digest(default_model_path()) == before
    rows = result["regimes"]
    assert result["split"] == {"n_train": 210, "n_val": 30, "n_test": 60, "split_seed": 0,
                               "test_size": 0.2, "val_size": 0.1}
    assert all(r["matches_formula"] for r in rows.values())
    assert rows["lora"]["encoder_trainable"] == 6 * 2 * 2 * 384 * 8
    assert rows["frozen"]["accuracy_mean"] > 0.65
    # fine-tuning starts from the probe (LP-FT), so no regime should fall to chance
    assert min(rows[r]["accuracy_mean"] for r in rows if r != "frozen") > 0.6
    adam_moments = 2 * 4 * rows["full"]["encoder_trainable"]
    assert rows["full"]["peak_memory_bytes"] - rows["bitfit"]["peak_memory_bytes"] > adam_moments
    assert rows["frozen"]["bytes_per_task"] < 10_000 < rows["lora"]["bytes_per_task"] < 400_000
    assert (tmp_path / "heads" / "size120" / "lora" / "seed0.safetensors").stat().st_size < 400_000
