"""layerbank.Bank on the tiny random model: store-first reads, the encoder only
for misses, counters, the data-directory lock, input checks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from layerbank.app.bank import Bank, as_texts
from layerbank.cache.catalog import Catalog
from layerbank.cache.lock import DataDirLock

TEXTS = ["a first text", "the second one is longer than the first", "third", "a first text"]


@pytest.fixture
def bank(tmp_path: Path, tiny_model_dir: str):  # type: ignore[no-untyped-def]
    with Bank(tmp_path / "data", tiny_model_dir, device="cpu") as b:
        yield b


def test_features_match_the_encoder_and_count_encoded_then_cached(bank: Bank, tiny_encoder) -> None:
    x = bank.features(TEXTS, view="layer:-1", pooling="mean")
    assert x.dtype == np.float32 and x.shape == (4, 32)
    assert bank.stats == {"encoded": 3, "cached": 0}  # the repeated text once
    np.testing.assert_array_equal(x[0], x[3])
    # the last layer's mean over tokens, computed here with transformers, stored as float16
    import torch

    batch = tiny_encoder.tokenizer(TEXTS[:1], return_tensors="pt")
    with torch.no_grad():
        last = tiny_encoder.model(**batch, output_hidden_states=True).hidden_states[-1][0]
    np.testing.assert_allclose(x[0], last.mean(0).numpy(), atol=4e-3)

    y = bank.features(TEXTS[::-1], view="layers:0,2", pooling="cls")
    assert y.shape == (4, 2 * 32)
    assert bank.stats == {"encoded": 3, "cached": 3}


def test_a_second_bank_reads_the_store_without_loading_the_encoder(tmp_path: Path,
                                                                  tiny_model_dir: str) -> None:
    with Bank(tmp_path / "data", tiny_model_dir, device="cpu") as first:
        x = first.features(TEXTS, "layer:1")
    with Bank(tmp_path / "data", tiny_model_dir, device="cpu") as second:
        y = second.features(TEXTS, "layer:1")
        assert second._extractor is None  # answered from the catalog's model row alone
        assert second.stats == {"encoded": 0, "cached": 3}
        second.features(TEXTS + ["new"], "layer:1")
        assert second._extractor is not None and second.stats == {"encoded": 1, "cached": 6}
    np.testing.assert_array_equal(x, y)


def test_another_setting_makes_other_keys(tmp_path: Path, tiny_model_dir: str) -> None:
    with Bank(tmp_path / "data", tiny_model_dir, device="cpu") as b:
        b.features(TEXTS, "layer:1")
    with Bank(tmp_path / "data", tiny_model_dir, device="cpu", max_length=8) as b:
        b.features(TEXTS, "layer:1")
        assert b.stats == {"encoded": 3, "cached": 0}  # cut at 8 tokens: not the same numbers
    assert Catalog(tmp_path / "data" / "catalog.sqlite").stats()["keys"] == 6


def test_close_releases_the_directory(tmp_path: Path, tiny_model_dir: str) -> None:
    b = Bank(tmp_path / "data", tiny_model_dir)
    with pytest.raises(RuntimeError, match=r"is in use by pid \d+; stop it"):
        DataDirLock(tmp_path / "data").acquire()
    b.close()
    b.close()  # idempotent
    DataDirLock(tmp_path / "data").acquire().release()
    with pytest.raises(RuntimeError, match="closed"):
        b.features(["x"])


def test_a_held_directory_is_refused_with_the_cli_message_and_the_server_url(tmp_path: Path) -> None:
    data = tmp_path / "data"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys; from layerbank.cache.lock import DataDirLock; "
        f"DataDirLock({str(data)!r}).acquire(); print('held', flush=True); sys.stdin.read()")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(RuntimeError) as e:
            Bank(data)
        assert str(e.value) == (f"data directory {data} is in use by pid {holder.pid}; stop it or choose "
                                "another --data-dir (while a server runs, send work to its API)")
        (data / "server.json").write_text('{"url": "http://127.0.0.1:8123", "pid": 1}')
        with pytest.raises(RuntimeError, match=r"send work to its API\); to read through that server: "
                           r"Bank\(url='http://127.0.0.1:8123'\)$"):
            Bank(data)
    finally:
        holder.communicate("")


def test_bad_input_fails_before_the_model_loads(bank: Bank) -> None:
    with pytest.raises(TypeError, match="got one string"):
        bank.features("one text")
    with pytest.raises(TypeError, match="text 1 is int, not str"):
        bank.features(["a", 3])
    with pytest.raises(ValueError, match="unknown pooling 'sum'; known: mean, cls, max"):
        bank.features(["a"], pooling="sum")
    with pytest.raises(ValueError, match="view"):
        bank.features(["a"], view="layer:x")
    with pytest.raises(ValueError, match="cv must be an integer >= 2"):
        bank.probe(["a", "b"], [0, 1], cv=1)
    assert bank._extractor is None
    with pytest.raises(ValueError, match="layer"):  # this model has 3 hidden states
        bank.features(["a"], view="layer:7")
    assert bank.stats == {"encoded": 0, "cached": 0}


def test_as_texts_takes_lists_arrays_and_one_column() -> None:
    assert as_texts(("a", "b")) == ["a", "b"]
    assert as_texts(np.array(["a", "b"])) == ["a", "b"]
    assert as_texts(np.array([["a"], ["b"]], dtype=object)) == ["a", "b"]
    with pytest.raises(ValueError, match=r"shape \(1, 2\)"):
        as_texts([["a", "b"]])


def test_probe_gives_the_cli_result_shape(bank: Bank) -> None:
    texts = [f"good film number {i}" for i in range(10)] + [f"bad awful film {i}" for i in range(10)]
    labels = [1] * 10 + [0] * 10
    r = bank.probe(texts, labels, views=["each_layer"], poolings=["mean"], cv=2, learning_curve=False,
                   control_task=False)
    assert [x["view"] for x in r["results"]] == ["layer:0", "layer:1", "layer:2"]
    assert r["task"]["n_examples"] == 20 and r["task"]["name"] == "sentence_classification"
    assert r["recommendation"]["text"].startswith("Best frozen probe:")
    assert bank.stats == {"encoded": 20, "cached": 0}
    with pytest.raises(ValueError, match="20 texts but 19 labels"):
        bank.probe(texts, labels[:-1], cv=2)


def test_shared_returns_the_open_bank(bank: Bank, tmp_path: Path, tiny_model_dir: str) -> None:
    assert Bank.shared(tmp_path / "data", tiny_model_dir) is bank
    other = Bank.shared(tmp_path / "other", tiny_model_dir)
    try:
        assert other is not bank and Bank.shared(tmp_path / "other", tiny_model_dir) is other
    finally:
        other.close()
    assert Bank.shared(tmp_path / "other", tiny_model_dir) is not other
    Bank.shared(tmp_path / "other", tiny_model_dir).close()


def test_a_dataframe_by_column_name(bank: Bank) -> None:
    import pandas as pd

    df = pd.DataFrame({"review": TEXTS[:3], "stars": [1, 0, 1]})
    np.testing.assert_array_equal(bank.features(df, "layer:1", text_column="review"),
                                  bank.features(TEXTS[:3], "layer:1"))
    with pytest.raises(ValueError, match=r"1 empty texts \(rows \[2\]\); drop or fill them first"):
        bank.features(pd.DataFrame({"text": ["a", " "]}))
    with pytest.raises(ValueError, match="give labels"):
        bank.probe(df, text_column="review")


def test_reaching_bank_imports_neither_torch_nor_sklearn() -> None:
    code = ("import sys, layerbank; layerbank.Bank; "
            "print(sorted(m for m in ('torch', 'transformers', 'sklearn') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_pooling_the_directory_does_not_store_is_refused(tmp_path: Path, tiny_model_dir: str) -> None:
    with Bank(tmp_path / "data", tiny_model_dir, device="cpu", poolings="mean") as b:
        with pytest.raises(ValueError, match=r"pooling 'cls' is not among the poolings stored \(mean\); "
                           r"open the Bank with poolings='mean,cls'"):
            b.features(["a"], pooling="cls")
        assert b.features(["a"], pooling="mean").shape == (1, 32) and b.stats["encoded"] == 1


def test_a_directory_open_in_this_process_names_that_bank(bank: Bank, tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"is already open in this process: Bank\(.*data'.*; get that one "
                       r"with layerbank.Bank.shared\(data_dir, model\), or close\(\) it first"):
        Bank(tmp_path / "data")
