"""What the regimes tests share: their texts and labels, one torch thread, and the HTTP steps.

- ``random_texts(n, seed)``: ``n`` texts of 2 to 8 words drawn from ``WORDS``,
  labelled 0, 1, 0, 1 ...; the words carry no label, so a regime's score says
  nothing and the tests check what was trained, stored and reported;
- ``POS`` / ``NEG``: ten texts each that a probe can separate (good/great
  against bad/dull);
- ``one_torch_thread``: the body of each module's autouse fixture
  (``_one_torch_thread = pytest.fixture(autouse=True)(one_torch_thread)``):
  tiny matrices, and on a shared machine a second OpenMP thread made
  training 9x slower;
- ``wait(client, job_id)`` / ``dataset(client, texts, labels)``: a job polled to
  its end, a dataset created and extracted, over ``/v1``;
- ``cli_regimes(tmp_path, model_dir, *flags)``: ``layerbank regimes`` on
  ``POS`` / ``NEG`` written as a TSV (labels pos / neg), on the CPU, one thread,
  data directory ``tmp_path / "d"``, no progress bar; returns the exit code.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

WORDS = ["good", "great", "fine", "bad", "awful", "poor", "film", "plot", "the", "a", "very"]

POS = ["a good film", "a great play", "good and warm", "a lovely story", "great fun", "a fine good show",
       "warm and great", "a good great time", "lovely work", "fine and good"]
NEG = ["a bad film", "a dull play", "bad and cold", "an awful story", "dull work", "a poor bad show",
       "cold and dull", "a bad awful time", "poor work", "awful and bad"]


def random_texts(n: int, seed: int = 0) -> tuple[list[str], list[int]]:
    rng = np.random.default_rng(seed)
    texts = [" ".join(rng.choice(WORDS, size=int(rng.integers(2, 9)))) for _ in range(n)]
    return texts, [int(i % 2) for i in range(n)]


def one_torch_thread() -> Iterator[None]:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def wait(c: Any, job_id: str, timeout: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while (job := c.get(f"/v1/jobs/{job_id}").json())["state"] not in ("succeeded", "failed", "cancelled"):
        assert time.monotonic() < deadline, job
        time.sleep(0.02)
    return job  # type: ignore[no-any-return]


def dataset(c: Any, texts: list[str], labels: list[str] | None = None) -> str:
    body: dict[str, Any] = {"name": "regimes", "texts": texts}
    if labels is not None:
        body["labels"] = labels
    ds = c.post("/v1/datasets", json=body).json()
    assert wait(c, ds["job_id"])["state"] == "succeeded"
    return str(ds["id"])


def cli_regimes(tmp_path: Path, model_dir: str, *flags: str) -> int:
    from layerbank.app.cli.main import main

    data = tmp_path / "s.tsv"
    data.write_text("sentence\tlabel\n" + "".join(f"{t}\tpos\n" for t in POS) +
                    "".join(f"{t}\tneg\n" for t in NEG), encoding="utf-8")
    return main(["regimes", str(data), "--text-column", "sentence", "--label-column", "label",
                 "--model", model_dir, "--device", "cpu", "--threads", "1",
                 "--data-dir", str(tmp_path / "d"), "--no-progress", *flags])
