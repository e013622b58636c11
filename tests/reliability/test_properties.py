"""Property-based tests for what the unit tests do not already cover.

tests/unit holds the round trips (writer -> parser), the view grammar on
arbitrary and near-miss text, and the key's definition and collisions. Here:
parsers fed *anything* (random bytes, hostile JSON: deep nesting, huge
numbers, NaN, wrong types) raise only their own error type, and whatever they
accept is well formed; views never turn finite stored values into inf or NaN;
any text's key survives a trip through a shard's key column.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from layerbank.app.inputs import FORMATS, InputError, parse_texts
from layerbank.app.probes.wordsets import WORDSET_FORMATS, WordSetError, parse_wordset
from layerbank.cache.keys import ExtractionConfig, text_key
from layerbank.cache.shard import ShardContents, ShardReader, write_shard
from layerbank.cache.views import ViewError, parse_view

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(120)]

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# -- hostile input for the file parsers ------------------------------------------------------
json_leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8))
json_value = st.recursive(json_leaf, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(["text", "label", "words", "tags", "x"]),
                                                 inner, max_size=4)), max_leaves=12)
# raw lines that are JSON-ish: deep nesting, numbers Python refuses to convert, bare NaN
hostile_line = st.one_of(
    json_value.map(lambda v: json.dumps(v)),
    st.integers(1, 3000).map(lambda n: "[" * n + "]" * n),
    st.integers(4301, 6000).map(lambda n: '{"text": "a b", "label": ' + "9" * n + "}"),
    st.sampled_from(['{"text": NaN}', '{"text": "x", "label": Infinity}', '{"text": "\\ud800"}',
                     '{"words": ["a"], "tags": [NaN]}', '{"words": "ab", "tags": "cd"}', "\ufeff{}"]),
    st.text(max_size=30),
)
hostile_bytes = st.one_of(
    st.binary(max_size=300),
    st.lists(hostile_line, min_size=1, max_size=5).map(lambda ls: "\n".join(ls).encode("utf-8", "surrogatepass")),
    st.lists(st.text(st.sampled_from("ab ,\t\"\n\r\x00é"), max_size=20), min_size=1, max_size=6)
    .map(lambda ls: "\n".join(ls).encode()),
)


def _well_formed_texts(t) -> None:  # type: ignore[no-untyped-def]
    assert t.texts and all(isinstance(x, str) and x.strip() for x in t.texts)
    assert t.labels is None or len(t.labels) == len(t.texts)
    assert len(t.lines) == len(t.texts) and t.lines == sorted(t.lines)


@FAST
@given(hostile_bytes, st.sampled_from(FORMATS), st.booleans(),
       st.sampled_from([None, "text", "label", "0", "1"]), st.sampled_from([None, "label", "1"]))
@example(b'{"text": "ok", "label": ' + b"9" * 5000 + b"}\n", "jsonl", True, None, "label")
@example(b"[" * 5000 + b"]" * 5000 + b"\n", "jsonl", True, None, None)
def test_text_parsers_raise_only_input_error(data: bytes, fmt: str, header: bool,
                                             text_col: str | None, label_col: str | None) -> None:
    try:
        t = parse_texts(data, fmt, text_column=text_col, label_column=label_col, header=header)
    except InputError as e:
        assert str(e)  # says what is wrong
        return
    _well_formed_texts(t)


@FAST
@given(hostile_bytes, st.sampled_from(WORDSET_FORMATS), st.integers(-3, 3))
@example(b"[" * 5000 + b"]" * 5000, "json", 1)
@example(b'[{"words": ["a"], "tags": [' + b"1" * 5000 + b"]}]", "json", 1)
def test_word_set_parsers_raise_only_their_errors(data: bytes, fmt: str, tag_column: int) -> None:
    try:
        sents = parse_wordset(data, fmt, tag_column=tag_column)
    except WordSetError as e:
        assert str(e)
        return
    except ValueError as e:  # only for a bad tag_column argument, which is the caller's
        assert tag_column == 0 and "tag_column" in str(e)
        return
    assert sents
    for s in sents:
        assert len(s.words) == len(s.tags) > 0
        assert all(isinstance(w, str) and w and not any(c.isspace() for c in w) for w in s.words)
        assert all(isinstance(x, str) for x in s.tags)


# -- views never serve inf or NaN -------------------------------------------------------------
decimal = st.builds(lambda m, e: f"{m}e{e}" if e else str(m),
                    st.integers(-10**15, 10**15), st.integers(-40, 99))
stored = st.floats(-65504, 65504, width=16)  # what a float16 shard can hold


@FAST
@given(st.integers(1, 8).flatmap(lambda h: st.tuples(
    st.just(h), st.lists(decimal, min_size=h, max_size=h),
    st.lists(stored, min_size=h * 3, max_size=h * 3))))
@example((3, ["1e99", "1", "1"], [1.0] * 9))
@example((2, ["3e38", "3e38"], [65504.0] * 6))
def test_weighted_views_are_finite_or_refused(case: tuple) -> None:
    h, weights, values = case
    stack = np.asarray(values, dtype=np.float16).reshape(1, h, 3)
    try:
        view = parse_view("weighted:" + ",".join(weights))
        out = view.combine(stack, h)
    except ViewError as e:
        assert "too large for float32" in str(e)
        # refused only when some float16 rows could leave float32 (checked when parsed, the
        # same on every route), or these rows' exact sum truly does
        exact = [sum(float(w) * float(stack[0, i, j]) for i, w in enumerate(weights)) for j in range(3)]
        worst = sum(abs(float(w)) for w in weights) * 65504.0
        assert worst > 3.4028234e38 or any(abs(x) > 3.0e38 for x in exact), (worst, exact)
        return
    assert out.dtype == np.float32 and np.isfinite(out).all()
    exact = np.einsum("nld,l->nd", stack.astype(np.float64), np.array([float(w) for w in weights]))
    np.testing.assert_allclose(out, exact, rtol=1e-6, atol=1e-30)


layer = st.integers(-9, 9).map(str)
# mostly views written by the grammar (random text alone parsed in 0-7 of 150 examples,
# so the test could not fail), plus random text for what the parser must refuse
view_specs = st.one_of(
    st.sampled_from(["concat_last_4", "sum_last_4", "mean_all", "all_layers"]),
    layer.map(lambda k: "layer:" + k),
    st.lists(layer, min_size=1, max_size=6).map(lambda ks: "layers:" + ",".join(ks)),
    st.lists(decimal, min_size=1, max_size=8).map(lambda ws: "weighted:" + ",".join(ws)),
    st.text(max_size=40),
)


@FAST
@given(view_specs, st.integers(1, 8), st.lists(stored, min_size=8 * 8 * 2, max_size=8 * 8 * 2))
def test_any_view_that_parses_gives_finite_rows(spec: str, h: int, values: list[float]) -> None:
    try:
        view = parse_view(spec)
        needed = view.needed_layers(h)
    except ViewError:
        return
    stack = np.asarray(values[: 2 * len(needed) * 2], dtype=np.float16).reshape(2, len(needed), 2)
    event(f"parsed: {view.kind}")
    try:
        out = view.combine(stack, h)
    except ViewError:
        assert view.kind == "weighted"
        return
    assert np.isfinite(out).all()
    assert out.shape[0] == 2


# -- keys survive the shard -------------------------------------------------------------------
@settings(max_examples=30, deadline=None)
@given(st.lists(st.text(max_size=30), min_size=1, max_size=20, unique=True),
       st.text(max_size=20))
def test_every_text_key_round_trips_through_a_shard(tmp_path_factory: pytest.TempPathFactory,
                                                    texts: list[str], fingerprint: str) -> None:
    cfg = ExtractionConfig(max_length=16)
    keys = [text_key(fingerprint, cfg, t) for t in texts]  # lone surrogates included
    assert all(len(k) == 64 and set(k) <= set("0123456789abcdef") for k in keys)
    n = len(keys)
    path = Path(tmp_path_factory.mktemp("keys")) / "s.h5"
    write_shard(path, ShardContents(keys, np.ones(n), np.zeros(n), {"mean": np.zeros((n, 2, 3))}),
                "float16")
    r = ShardReader(path)
    assert r.read_keys() == keys
    r.close()
