"""`layerbank probe` on 400 seeded SST-2 sentences with the bundled model.

What a data scientist would check, through the command line end to end
(extraction, probe, table, plots, JSON):

- mean pooling beats [CLS] pooling on the lower hidden states (h_0..h_2).
  all-MiniLM-L6-v2 was trained with mean pooling; its [CLS] vector on the
  embedding output is one fixed token embedding (plus position), so it cannot
  separate anything. Measured with seed 0: mean 0.717/0.725/0.730 against
  cls 0.510/0.632/0.677; margins below are about half of the smallest gap.
- the control task (labels shuffled once) scores near chance on every layer
  (measured 0.465-0.562 with chance 0.51), so the probe reads the
  representation rather than memorizing: selectivity of the best ~0.29.
"""

from __future__ import annotations

import json
import random
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.conftest import DATA, ROOT

pytestmark = pytest.mark.integration


def _sst2_test(n: int, seed: int = 0) -> tuple[list[str], list[str]]:
    rows = []
    with open(DATA / "sst2" / "test.tsv", encoding="utf-8") as fh:
        next(fh)
        for line in fh:
            text, label = line.rstrip("\n").split("\t")
            rows.append((text, label))
    random.Random(seed).shuffle(rows)
    return [t for t, _ in rows[:n]], [lab for _, lab in rows[:n]]


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


def test_cli_probe_sst2_mean_beats_cls_low_layers_and_control_is_chance(tmp_path: Path) -> None:
    texts, labels = _sst2_test(400)
    tsv = tmp_path / "sst2.tsv"
    tsv.write_text("sentence\tlabel\n" + "".join(f"{t}\t{lab}\n" for t, lab in zip(texts, labels)))
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [sys.executable, "-m", "layerbank.app.cli.main", "probe", str(tsv), "--label-column", "label",
         "--views", "each_layer", "--poolings", "mean,cls", "--cv", "5", "--seed", "0",
         "--data-dir", str(tmp_path / "data"), "--threads", "1", "--no-progress",
         "--plot", str(tmp_path / "plots"), "--json", str(out)],
        check=False, cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    acc = {(r["layer"], r["pooling"]): r["accuracy"]["mean"] for r in result["results"]}
    assert len(acc) == 14  # h_0..h_6 x mean, cls

    gaps = [acc[(k, "mean")] - acc[(k, "cls")] for k in (0, 1, 2)]
    assert all(g >= 0.025 for g in gaps), gaps
    assert sum(gaps) / 3 >= 0.06, gaps
    assert acc[(0, "cls")] <= result["task"]["chance_accuracy"] + 0.05  # one fixed vector per position

    chance = result["task"]["chance_accuracy"]
    assert 0.5 <= chance <= 0.56
    control = [r["control_accuracy"] for r in result["control_task"]["results"]]
    assert len(control) == 7 and all(abs(c - chance) <= 0.1 for c in control), (chance, control)
    assert abs(sum(control) / 7 - chance) <= 0.05
    best = result["best"]
    assert best["pooling"] == "mean" and 0.72 <= best["accuracy"] <= 0.86
    assert best["selectivity"] >= 0.15
    # MDL on real features: [CLS] of h_0 is one fixed vector (nothing to code with), the best
    # view compresses the labels, and shuffled labels compress to ~1 on every layer
    mdl = {(r["layer"], r["pooling"]): r["mdl"] for r in result["results"]}
    assert mdl[(0, "cls")]["compression"] < 1.02, mdl[(0, "cls")]
    assert best["mdl"]["compression"] > 1.15, best["mdl"]
    assert all(r["control_compression"] < 1.05 for r in result["control_task"]["results"])

    # what the user reads: the table, the best, the curve, the advice
    table = proc.stdout
    assert table.splitlines()[0].split() == ["view", "pooling", "accuracy", "macro-F1", "control",
                                             "selectivity", "sel.", "F1", "compression", "fit", "s/fold"]
    row = next(line for line in table.splitlines() if line.startswith(f"{best['view']} ") and " mean " in line)
    assert f"{best['accuracy']:.3f} ±" in row
    assert f"best: {best['view']}, mean pooling: accuracy {best['accuracy']:.3f}" in table
    assert "learning curve (" in table and "(all):" in table
    assert "recommendation:" in table
    advice = result["recommendation"]["text"]
    assert "400 labelled examples" in advice and "Storage: this head" in advice
    assert " ".join(advice.split()[:6]) in " ".join(table.split())  # printed (wrapped) in full
    assert _png_size(tmp_path / "plots" / "probe.png") == (1100, 650)
    assert _png_size(tmp_path / "plots" / "learning_curve.png") == (900, 600)
