"""`layerbank regimes --eval`: every regime scored on a shifted evaluation set too (bundled model).

Train on SST-2 training *phrases* (short fragments), evaluate in domain on
held-out phrases and out of domain on the GLUE development *sentences*
(full sentences: longer, more negation and contrast). Frozen regime only,
so the test runs in seconds; the fine-tuned regimes share the code path
(tests/unit/workers/test_regimes.py checks it on the tiny model).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tests.data_paths import SST2

pytestmark = pytest.mark.integration
DATA = SST2


def _sample(path: Path, n: int, seed: int, out: Path, min_words: int = 0) -> Path:
    lines = path.read_text(encoding="utf-8").splitlines()
    rows = [r for r in lines[1:] if len(r.split("\t")[0].split()) >= min_words]
    out.write_text("\n".join([lines[0], *random.Random(seed).sample(rows, n)]) + "\n", encoding="utf-8")
    return out


def test_cli_scores_every_regime_on_the_evaluation_set_with_its_gap(tmp_path: Path) -> None:
    train = _sample(DATA / "train.tsv", 240, 0, tmp_path / "phrases.tsv", min_words=3)
    shifted = _sample(DATA / "test.tsv", 120, 0, tmp_path / "sentences.tsv")
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [sys.executable, "-m", "layerbank.app.cli.main", "regimes", str(train), "--text-column", "sentence",
         "--label-column", "label", "--regimes", "frozen", "--eval", f"sentences={shifted}",
         "--data-dir", str(tmp_path / "data"), "--no-progress", "--threads", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    row = result["regimes"]["frozen"]
    shifted_scores = row["evals"]["sentences"]
    # 240 texts -> 168 in the train split: the seed rule gives ceil(1500 / 168) = 9 seeds
    assert result["settings"]["seeds_by_size"] == {"168": 9}
    assert result["settings"]["eval_sets"] == {"sentences": 120}
    assert len(row["runs"]) == 9 and all("sentences" in r["eval_scores"] for r in row["runs"])
    assert 0.55 <= shifted_scores["macro_f1_mean"] <= 1.0  # frozen MiniLM reads sentiment out of domain too
    assert shifted_scores["gap_mean"] == pytest.approx(row["macro_f1_mean"] - shifted_scores["macro_f1_mean"])
    assert result["by_eval"]["sentences"]["best"] == "frozen"
    # what the user reads: the evaluation set's line with the same numbers
    line = next(s for s in proc.stdout.splitlines() if s.strip().startswith("frozen") and "gap" in s)
    assert f"{shifted_scores['macro_f1_mean']:.3f}" in line and f"gap {shifted_scores['gap_mean']:+.3f}" in line
    assert "best on sentences: frozen" in proc.stdout


def test_cli_refuses_a_malformed_eval_option_before_any_work(tmp_path: Path) -> None:
    train = _sample(DATA / "train.tsv", 40, 0, tmp_path / "phrases.tsv")
    proc = subprocess.run(
        [sys.executable, "-m", "layerbank.app.cli.main", "regimes", str(train), "--text-column", "sentence",
         "--label-column", "label", "--eval", "no-equals-sign", "--data-dir", str(tmp_path / "data")],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "--eval: expected NAME=FILE, got 'no-equals-sign'" in proc.stderr
    assert not (tmp_path / "data").exists() or not any((tmp_path / "data").rglob("*.h5"))
