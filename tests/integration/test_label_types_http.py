"""Labels keep their type over HTTP, against the real server and model (issue 23, item 6).

What a notebook user does with ``layerbank.Client``: a DataFrame whose label
column holds ints goes up; the probe's classes and predict's labels come back
as ints (they came back as ``['1', '0']``). Strings stay strings. A NaN label
is an ``ApiError`` naming the row before anything is sent; a ``None`` label is
no class in the dataset's stats. tests/unit/app/test_label_types.py covers
every route on the tiny model; this is the one end-to-end pass.
"""

from __future__ import annotations

import pandas as pd
import pytest

from layerbank.app.client import ApiError
from tests.integration.conftest import ServerProcess

pytestmark = pytest.mark.integration

GOOD = ["a warm and funny film", "a moving, wise story", "beautifully acted and shot",
        "a delight from start to finish", "sharp, tender and true", "an instant classic"]
BAD = ["a dull and lifeless mess", "tedious from the first scene", "a waste of two hours",
       "clumsy, loud and empty", "badly written and worse acted", "a boring, overlong slog"]


def test_int_labels_come_back_as_ints_strings_as_strings(layerbank_server: ServerProcess) -> None:
    c = layerbank_server.client()
    df = pd.DataFrame({"sentence": [f"{t} (label types)" for t in GOOD + BAD], "label": [1] * 6 + [0] * 6})
    ds = c.upload_dataset("ints", df, text_column="sentence", label_column="label", wait=True)
    result = c.probe(ds, views=["layer:-1"], poolings=["mean"], cv=2, control_task=False,
                     learning_curve=False, mdl=False, progress=False)
    assert result["task"]["classes"] == [0, 1]
    head = c.head(probe=result)
    assert head["classes"] == [0, 1]
    out = c.predict(head, ["an instant classic, warm and wise", "two hours I want back"])
    assert out["classes"] == [0, 1] and all(type(v) is int for v in out["labels"]), out["labels"]
    assert out["labels"] == [1, 0]

    ds = c.upload_dataset("strings", [f"{t} (label strings)" for t in GOOD + BAD],
                          labels=["pos"] * 6 + ["neg"] * 6, wait=True)
    head = c.head(ds, view="layer:-1", pooling="mean")
    out = c.predict(head, ["an instant classic, warm and wise"])
    assert head["classes"] == out["classes"] == ["neg", "pos"] and out["labels"] == ["pos"]


def test_a_none_label_is_no_class_in_the_stats(layerbank_server: ServerProcess) -> None:
    c = layerbank_server.client()
    ds = c.upload_dataset("gaps", ["one (gaps)", "two (gaps)", "three (gaps)"], labels=[1, None, 0], wait=True)
    stats = c.request("GET", f"/v1/datasets/{ds['id']}/stats")
    assert stats["labels"] == {"0": 1, "1": 1} and stats["unlabelled"] == 1  # no class "None"


def test_a_nan_label_is_refused_naming_its_row_before_anything_is_sent(
        layerbank_server: ServerProcess) -> None:
    c = layerbank_server.client()
    before = len(c.datasets())
    df = pd.DataFrame({"sentence": ["one (nan label)", "two (nan label)", "three (nan label)"],
                       "label": [1, None, 0]})  # pandas makes the gap a NaN (a float column)
    with pytest.raises(ApiError, match=r"^validation: row 2 \(labels\[1\]\) is nan, not a label"):
        c.upload_dataset("nan", df, text_column="sentence", label_column="label")
    with pytest.raises(ApiError, match=r"^validation: labels\[2\] is <NA>, not a label"):
        c.upload_dataset("na", ["a (na)", "b (na)", "c (na)"], labels=pd.array([1, 0, None], dtype="Int64"))
    assert len(c.datasets()) == before
