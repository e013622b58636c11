"""``layerbank.Client`` against a real ``layerbank serve`` (bundled model, real
HDF5, a real worker process): every route family, as numpy arrays and dicts.

One server for the module, with ``max_queue_depth=1`` so that a 429 is cheap
to provoke deterministically: a long extraction runs, a second one waits in
the queue, and a third is refused until the waiting one is cancelled.
Texts: SST-2 dev phrases at offsets 3100-4117 (this module's own server, so
no other module shares its cache).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import layerbank
from tests.integration.conftest import ServerProcess, sst_sentences

pytestmark = pytest.mark.integration
PNG = b"\x89PNG\r\n\x1a\n"
SETTINGS = {"max_texts_per_request": 64, "max_queue_depth": 1, "max_tokens_per_batch": 1024,
            "part_size": 64, "heartbeat_seconds": 1}
TEXTS, LABELS = sst_sentences(48, 3100)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    s = ServerProcess(tmp_path_factory.mktemp("client-server") / "data", SETTINGS)
    s.start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def lb(server: ServerProcess) -> Iterator[layerbank.Client]:
    with layerbank.Client(server.url) as c:
        yield c


@pytest.fixture(scope="module")
def dataset(lb: layerbank.Client) -> dict[str, Any]:
    """TEXTS with LABELS, uploaded as a list and extracted."""
    return lb.upload_dataset("sst-list", TEXTS, labels=LABELS, wait=True)


def test_features_come_in_input_order_and_more_texts_than_a_request_takes_are_split(
        lb: layerbank.Client) -> None:
    texts = sst_sentences(70, 3100)[0]  # 70 > max_texts_per_request=64: two requests
    x, info = lb.features(texts, view="layer:-1", return_info=True)
    assert x.shape == (70, 384) and x.dtype == np.float32
    assert [d["index"] for d in info["data"]] == list(range(70))
    assert info["usage"]["texts"] == 70 and info["usage"]["cache_hits"] == 0
    again = lb.features(texts[60:], view="layer:-1")  # one request, every row now cached
    np.testing.assert_array_equal(again, x[60:])
    assert np.linalg.norm(x[0] - x[1]) > 0.1  # different texts, different rows

    all_layers = lb.features(texts[:3], view="all_layers", pooling="cls")
    assert all_layers.shape == (3, 7, 384)
    assert lb.info()["limits"]["max_texts_per_request"] == 64


def test_embeddings_are_the_openai_route_as_a_matrix(lb: layerbank.Client) -> None:
    texts = TEXTS[:3]
    e, info = lb.embeddings(texts, return_info=True)
    assert e.shape == (3, 384) and e.dtype == np.float32
    # the model's recipe: the stored last layer, mean-pooled, normalised (test_embeddings_recipe.py)
    last = lb.features(texts, view="layer:-1")
    np.testing.assert_allclose(e, last / np.linalg.norm(last, axis=1, keepdims=True), atol=1e-6)
    assert info["usage"]["prompt_tokens"] > 3 and info["model"]
    one = lb.embeddings(texts[0], view="layer:-2", normalize=False)  # /v1/features' default rows
    np.testing.assert_array_equal(one[0], lb.features(texts[:1])[0])
    with pytest.raises(layerbank.ApiError) as err:
        lb.embeddings(texts, dimensions=17)
    assert (err.value.status, err.value.type) == (422, "validation")
    assert err.value.message == ("dimensions: this view gives 384-dimensional vectors; vectors are not "
                                 "truncated (omit dimensions or send 384)")


def test_datasets_from_a_list_a_dataframe_parquet_and_hugging_face_datasets(
        lb: layerbank.Client, dataset: dict[str, Any], tmp_path: Path) -> None:
    assert dataset["job"]["state"] == "succeeded" and dataset["n_items"] == 48
    assert sorted(dataset["labels"]) == ["0", "1"]
    X = lb.dataset_features(dataset, view="layer:-2")
    assert X.shape == (48, 384) and X.dtype == np.float32
    np.testing.assert_allclose(X, lb.features(TEXTS, view="layer:-2"), rtol=0, atol=0)

    frame = pd.DataFrame({"review": TEXTS[:20], "sentiment": [int(v) for v in LABELS[:20]]})
    from_df = lb.upload_dataset("sst-frame", frame, text_column="review", label_column="sentiment",
                                wait=True)
    # ints in the frame stay ints (the TSV's labels above are text and stay text)
    assert from_df["n_items"] == 20 and sorted(from_df["labels"]) == [0, 1]
    np.testing.assert_array_equal(lb.dataset_features(from_df), X[:20])

    path = tmp_path / "reviews.parquet"
    pq.write_table(pa.Table.from_pandas(frame.iloc[5:15], preserve_index=False), path)
    from_pq = lb.upload_dataset(path=path, text_column="review", label_column="sentiment", wait=True)
    assert from_pq["name"] == "reviews" and from_pq["n_items"] == 10
    np.testing.assert_array_equal(lb.dataset_features(from_pq["id"]), X[5:15])

    hf = datasets.Dataset.from_pandas(frame, preserve_index=False)
    from_hf = lb.upload_dataset("sst-hf", hf.select(range(10, 20)), text_column="review",
                                label_column="sentiment", wait=True)
    np.testing.assert_array_equal(lb.dataset_features(from_hf), X[10:20])
    hf.save_to_disk(tmp_path / "saved")
    from_disk = lb.upload_dataset(path=tmp_path / "saved", text_column="review", wait=True)
    assert from_disk["name"] == "saved" and from_disk["n_items"] == 20 and "labels" not in from_disk
    np.testing.assert_array_equal(lb.dataset_features(from_disk), X[:20])

    with pytest.raises(layerbank.ApiError) as err:  # checked here, before any request
        lb.upload_dataset("x", frame, text_column="text")
    assert (err.value.status, err.value.type) == (None, "validation")
    assert str(err.value) == "validation: no text column 'text'; the columns are ['review', 'sentiment']"

    ids = [d["id"] for d in lb.datasets()]
    assert {dataset["id"], from_df["id"], from_pq["id"]} <= set(ids)
    assert lb.delete_dataset(from_pq)["deleted"] is True
    with pytest.raises(layerbank.ApiError) as err:
        lb.dataset(from_pq["id"])
    assert err.value.status == 404 and err.value.message == f"no dataset {from_pq['id']!r}"


def test_probe_waits_with_a_progress_bar_and_returns_the_result_then_a_head_predicts(
        lb: layerbank.Client, dataset: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    result = lb.probe(dataset, views=["layer:-1", "layer:-2"], poolings=["mean"], cv=2,
                      control_task=False, learning_curve=False)
    assert "probe" in capsys.readouterr().err  # tqdm's bar, on stderr
    assert result["best"]["view"] in ("layer:-1", "layer:-2") and result["best"]["pooling"] == "mean"
    assert 0.0 <= result["best"]["accuracy"] <= 1.0
    assert lb.get_probe(result)["state"] == "succeeded"
    assert any(p["id"] == result["probe_id"] for p in lb.probes())
    assert lb.probe_plot(result).startswith(PNG)

    head = lb.head(probe=result)
    assert head["state"] == "succeeded" and head["view"] == result["best"]["view"]
    assert head["size_bytes"] > 0 and sorted(head["classes"]) == ["0", "1"]
    assert any(h["id"] == head["id"] for h in lb.heads())
    out = lb.predict(head, TEXTS[:4] + ["an utterly new sentence for this head"])
    assert len(out["labels"]) == 5 and set(out["labels"]) <= {"0", "1"}
    assert out["probabilities"].shape == (5, 2)
    np.testing.assert_allclose(out["probabilities"].sum(axis=1), 1.0, atol=1e-9)
    assert out["labels"] == [out["classes"][i] for i in out["probabilities"].argmax(axis=1)]
    assert out["cached"] == [True, True, True, True, False]

    with pytest.raises(layerbank.ApiError) as err:
        lb.probe(dataset, views=["layer:9"], progress=False)
    assert err.value.status == 422 and "layer 9 does not exist" in err.value.message
    assert lb.delete_head(head)["deleted"] is True


def test_regimes_returns_the_comparison(lb: layerbank.Client, dataset: dict[str, Any]) -> None:
    result = lb.regimes(dataset, regimes=["frozen"], seeds=1, max_epochs=1, progress=False, timeout=300)
    assert list(result["regimes"]) == ["frozen"] and result["best"] == "frozen"
    assert 0.0 <= result["regimes"]["frozen"]["accuracy_mean"] <= 1.0
    assert result["split"]["n_train"] + result["split"]["n_test"] < 48  # 48 = train + val + test
    assert lb.get_regimes(result["regimes_id"])["state"] == "succeeded"
    assert lb.regimes_plot(result).startswith(PNG)


def test_429_is_retried_after_retry_after_and_past_the_bound_the_servers_error_is_raised(
        lb: layerbank.Client, server: ServerProcess) -> None:
    long_ds = lb.upload_dataset("long", sst_sentences(900, 3200)[0])
    _until(lambda: lb.job(long_ds)["state"] == "running")
    waiting = lb.upload_dataset("waiting", sst_sentences(8, 4100)[0])  # queued behind it
    assert lb.job(waiting)["state"] == "queued"
    third = sst_sentences(8, 4110)[0]

    with layerbank.Client(server.url, max_retries=3, max_retry_seconds=5) as impatient:
        with pytest.raises(layerbank.ApiError) as err:  # Retry-After: 10 > 5 s allowed: raised at once
            impatient.upload_dataset("third", third)
        assert impatient.retries == []
    assert err.value.status == 429 and err.value.type == "overloaded"
    assert str(err.value) == ("429 overloaded: overloaded: 1 dataset extractions are already queued "
                              "(max_queue_depth); retry when one has started")

    patient = layerbank.Client(server.url, max_retries=3, max_retry_seconds=60)
    answer: dict[str, Any] = {}
    t = threading.Thread(target=lambda: answer.update(patient.upload_dataset("third", third)))
    t.start()
    _until(lambda: bool(patient.retries) or not t.is_alive())  # refused once, sleeping its Retry-After
    assert patient.retries == [(429, 10.0)]
    assert lb.cancel(waiting)["state"] == "cancelled"  # a queued job: at once, room in the queue
    cancelled = lb.cancel(long_ds)  # running: stops at its next batch
    assert cancelled["state"] == "running" and cancelled["cancel_requested"] is True
    t.join(60)
    assert answer["name"] == "third" and answer["job"]["state"] in ("queued", "running")
    assert patient.retries == [(429, 10.0)]
    patient.close()

    with pytest.raises(layerbank.JobFailed) as failed:
        lb.wait(long_ds, timeout=120)
    assert failed.value.job["state"] == "cancelled" and isinstance(failed.value, layerbank.ApiError)

    events = list(lb.events(answer))  # the third runs once the long one stopped
    assert events[-1][0] == "done" and events[-1][1]["state"] == "succeeded"
    assert all(name == "progress" for name, _ in events[:-1]) and events[-1][1]["progress"]["done"] == 8
    with pytest.raises(layerbank.ApiError) as err:
        lb.cancel(answer)
    assert err.value.status == 409 and "already succeeded" in err.value.message


def _until(cond: Any, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)
