"""A small CoNLL-2003 subset end to end through the HTTP API (bundled model):
CoNLL upload -> token-level extraction -> token probe job -> result and plot.

Measured on these 80 training / 40 validation sentences (first sub-token,
seed 0): entity F1 0.283 (h_0), 0.393 (h_3), 0.204 (h_6); word accuracy at
h_3 0.872 against 0.801 on control tags. The margins below are about half
of those gaps: the middle layers tag entities best, as the literature on
BERT-family encoders reports.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.conftest import DATA, ServerProcess

pytestmark = pytest.mark.integration


def _head(src: Path, n: int, dst: Path) -> tuple[Path, int]:
    blocks = src.read_text(encoding="utf-8").strip().split("\n\n")[:n]
    dst.write_text("\n\n".join(blocks) + "\n", encoding="utf-8")
    return dst, sum(len(b.splitlines()) for b in blocks)


def test_conll_subset_token_probe_over_http(layerbank_server: ServerProcess, tmp_path: Path) -> None:
    s = layerbank_server
    train, n_train = _head(DATA / "conll2003" / "train.txt", 80, tmp_path / "train.conll")
    valid, n_valid = _head(DATA / "conll2003" / "valid.txt", 40, tmp_path / "valid.conll")
    ids = {}
    for split, path, n in (("train", train, 80), ("valid", valid, 40)):
        with open(path, "rb") as fh:
            r = s.post("/v1/datasets", files={"file": (path.name, fh)}, data={"format": "conll"})
        assert r.status_code == 202, r.text
        assert r.json()["task"] == "token" and r.json()["n_items"] == n
        ids[split] = r.json()["id"]
        assert s.wait_job(r.json()["job_id"])["state"] == "succeeded"

    r = s.post("/v1/probes", json={"task": "token_classification", "train": ids["train"],
                                   "valid": ids["valid"], "views": ["layer:0", "layer:3", "layer:6"]})
    assert r.status_code == 202, r.text
    probe = r.json()
    job = s.wait_job(probe["id"])
    assert job["state"] == "succeeded", job["error"]
    result = s.get(f"/v1/probes/{probe['id']}").json()["result"]
    assert result["metric"] == "f1" and result["n_words"] == {"train": n_train, "valid": n_valid}
    assert result["n_sentences"] == {"train": 80, "valid": 40}
    assert set(result["tags"]) == {"O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC",
                                   "B-MISC", "I-MISC"}
    assert result["runtime"]["blas_threads"] == 1
    f1 = {row["view"]: row["f1"] for row in result["rows"]}
    assert f1["layer:3"] >= f1["layer:0"] + 0.05 and f1["layer:3"] >= f1["layer:6"] + 0.09, f1
    mid = next(row for row in result["rows"] if row["view"] == "layer:3")
    assert mid["selectivity"] >= 0.03 and mid["word_accuracy"] >= 0.82, mid
    assert result["best"] == "layer:3" and "Best view: layer:3 with f1" in result["summary"]
    assert set(mid["per_type"]) == {"PER", "ORG", "LOC", "MISC"}

    png = s.get(f"/v1/probes/{probe['id']}/plot.png")
    assert png.status_code == 200 and png.content[:8] == b"\x89PNG\r\n\x1a\n"
    r = s.get(f"/v1/probes/{probe['id']}/learning_curve.png")
    assert r.status_code == 404 and "no learning curve" in r.json()["error"]

    r = s.post("/v1/probes", json={"task": "token_classification", "train": ids["train"],
                                   "valid": ids["valid"], "views": ["layer:9"]})
    assert r.status_code == 422 and "layer 9 does not exist" in r.json()["error"]
