"""The regimes' curves over HTTP and in the CLI (issue 27): top_k and xi lists in a request,
their 422s, the layer-cut curve in the result and its PNG, ``--top-k`` / ``--xi`` and
``--plot``'s layer_cut.png."""

from __future__ import annotations

import json
from typing import Any

from tests.regimes_data import NEG, POS, dataset, wait


def test_a_layer_cut_job_over_http(tiny_api: Any) -> None:
    c = tiny_api.client
    ds = dataset(c, POS + NEG, ["pos"] * 10 + ["neg"] * 10)
    for body, field, words in (({"top_k": [0, 3]}, "top_k", "has 2"), ({"xi": 0}, "xi", "(0, 1.5]"),
                               ({"xi": [0.5, 2.0]}, "xi", "(0, 1.5]"), ({"top_k": []}, "top_k", "0..2")):
        r = c.post("/v1/regimes", json={"dataset": ds, **body})
        assert r.status_code == 422 and r.json()["field"] == field and words in r.json()["error"], r.text
    r = c.post("/v1/regimes", json={"dataset": ds, "regimes": ["top_k", "full"], "top_k": [0, 1, 2],
                                    "seeds": 1, "max_epochs": 1})
    assert r.status_code == 202, r.text
    rid = r.json()["id"]
    assert r.json()["request"]["top_k"] == [0, 1, 2]
    job = wait(c, rid)
    assert job["state"] == "succeeded", job["error"]
    out = c.get(f"/v1/regimes/{rid}").json()
    result = out["result"]
    assert list(result["regimes"]) == ["top_k:0", "top_k:1", "top_k:2", "full"]
    assert [p["fine_tuned_layers"] for p in result["layer_cut"]["points"]] == [0, 1, 2]
    assert result["layer_cut"]["full"]["variant"] == "full"
    png = c.get(out["links"]["layer_cut_plot"])
    assert png.status_code == 200 and png.content[:8] == b"\x89PNG\r\n\x1a\n"
    # one cut: no curve, and the plot says why
    r = c.post("/v1/regimes", json={"dataset": ds, "regimes": ["frozen"], "seeds": 1})
    rid2 = r.json()["id"]
    assert wait(c, rid2)["state"] == "succeeded"
    none = c.get(f"/v1/regimes/{rid2}/layer_cut.png")
    assert none.status_code == 409 and "two or more cut points" in none.json()["error"]


def test_the_cli_takes_cut_points_and_xi_values(tiny_model_dir: str, tmp_path: Any, capsys: Any) -> None:
    from layerbank.app.cli.main import main

    data = tmp_path / "s.tsv"
    data.write_text("sentence\tlabel\n" + "".join(f"{t}\tpos\n" for t in POS) +
                    "".join(f"{t}\tneg\n" for t in NEG), encoding="utf-8")
    code = main(["regimes", str(data), "--text-column", "sentence", "--label-column", "label",
                 "--model", tiny_model_dir, "--device", "cpu", "--threads", "1",
                 "--data-dir", str(tmp_path / "d"), "--regimes", "top_k,full", "--top-k", "1,2", "--xi", "0.8",
                 "--seeds", "1", "--max-epochs", "1", "--json", str(tmp_path / "r.json"),
                 "--plot", str(tmp_path / "p"), "--no-progress"])
    out = capsys.readouterr().out
    result = json.loads((tmp_path / "r.json").read_text())
    assert code == 0 and list(result["regimes"]) == ["top_k:1", "top_k:2", "full"]
    assert all(r["xi"] == 0.8 for r in result["regimes"].values())
    assert "layer cut (Lee et al.): fine-tuned layers -> test macro-F1: 0:" in out and "layer cut: " in out
    assert (tmp_path / "p" / "layer_cut.png").read_bytes()[:4] == b"\x89PNG"
