"""layerbank.cache.views: every view against its written definition, and the grammar.

The definitions below are written out by hand from docs (h = [n, H, d],
H = L + 1 hidden states), not derived from View, so a wrong combine fails.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from layerbank.cache.views import NAMED_VIEWS, View, ViewError, parse_view

H, D = 7, 5  # the bundled model's 7 hidden states, a narrow width for speed


@pytest.fixture
def h() -> np.ndarray:
    return np.random.default_rng(0).normal(size=(4, H, D)).astype(np.float32)


DEFINITIONS = {
    "layer:0": lambda h: h[:, 0],
    "layer:6": lambda h: h[:, 6],
    "layer:-1": lambda h: h[:, 6],
    "layer:-2": lambda h: h[:, 5],
    "layer:-7": lambda h: h[:, 0],
    "layers:0,-1": lambda h: np.concatenate([h[:, 0], h[:, 6]], axis=1),
    "layers:3,1,3": lambda h: np.concatenate([h[:, 3], h[:, 1], h[:, 3]], axis=1),
    "concat_last_4": lambda h: np.concatenate([h[:, 3], h[:, 4], h[:, 5], h[:, 6]], axis=1),
    "sum_last_4": lambda h: h[:, 3] + h[:, 4] + h[:, 5] + h[:, 6],
    "mean_all": lambda h: sum(h[:, i] for i in range(H)) / H,
    "weighted:1,0,0,0,0,0,0": lambda h: h[:, 0],
    "weighted:0.5,0,0,0,0,0,-2": lambda h: 0.5 * h[:, 0] - 2 * h[:, 6],
    "all_layers": lambda h: h,
}


@pytest.mark.parametrize("spec", list(DEFINITIONS))
def test_view_matches_its_definition(spec: str, h: np.ndarray) -> None:
    view = parse_view(spec)
    want = DEFINITIONS[spec](h)
    got = view.apply(h)
    assert got.dtype == np.float32
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    # what the store does: read only the needed layers, then combine
    needed = view.needed_layers(H)
    np.testing.assert_allclose(view.combine(h[:, needed], H), want, rtol=1e-6, atol=1e-6)
    flat = want.shape[1] if want.ndim == 2 else want.shape[1] * want.shape[2]
    assert view.output_dim(H, D) == flat


def test_needed_layers_resolves_negative_indices() -> None:
    assert parse_view("layer:-2").needed_layers(7) == [5]
    assert parse_view("layers:-1,0,-7").needed_layers(7) == [6, 0, 0]
    assert parse_view("concat_last_4").needed_layers(13) == [9, 10, 11, 12]
    assert parse_view("all_layers").needed_layers(3) == [0, 1, 2]
    assert parse_view("mean_all").needed_layers(3) == [0, 1, 2]


def test_float16_input_is_summed_in_float32() -> None:
    # 7 copies of 60000 overflow float16 (max 65504) if summed in it
    h16 = np.full((1, H, 2), 60000, dtype=np.float16)
    out = parse_view("sum_last_4").apply(h16)
    assert out.dtype == np.float32
    assert out[0, 0] == pytest.approx(4 * 60000, rel=1e-3)


@pytest.mark.parametrize("spec, layer", [("layer:9", 9), ("layer:7", 7), ("layer:-8", -8),
                                         ("layers:0,9", 9)])
def test_missing_layer_error_names_the_layers_that_exist(spec: str, layer: int) -> None:
    with pytest.raises(ViewError) as e:
        parse_view(spec).needed_layers(7)
    assert str(e.value).startswith(f"layer {layer} does not exist; this model has hidden states 0..6")
    assert "-1..-7" in str(e.value)


def test_concat_last_4_on_a_model_with_fewer_states_is_an_error() -> None:
    with pytest.raises(ViewError, match="layer -4 does not exist; this model has hidden states 0..2"):
        parse_view("concat_last_4").needed_layers(3)


def test_weighted_needs_one_weight_per_hidden_state() -> None:
    with pytest.raises(ViewError, match=r"has 2 weights; this model has 7 hidden states 0..6, "
                                        r"so it needs 7 weights"):
        parse_view("weighted:1,2").needed_layers(7)


@pytest.mark.parametrize("spec, message", [
    ("", "unknown view ''"),
    ("layer", "unknown view 'layer'"),
    ("last", "unknown view 'last'"),
    ("layer:", "expected comma-separated layer numbers"),
    ("layer:1,2", "layer: takes one layer; use layers:I,J"),
    ("layer:a", "layer numbers must be integers"),
    ("layer:1.5", "layer numbers must be integers"),
    ("layers:1,,2", "expected comma-separated layer numbers"),
    ("weighted:", "expected comma-separated weights"),
    ("weighted:1,x", "weights must be numbers"),
    ("weighted:1,nan", "weights must be finite numbers, got nan"),
    ("weighted:1,inf", "weights must be finite numbers, got inf"),
    ("weighted:1e999", "weights must be finite numbers, got inf"),
    ("weighted:1e99,1,1", "these weights make values too large for float32"),
    ("weighted:3e33,-3e33", "must sum to at most 5.19e+33"),
])
def test_malformed_views_say_why(spec: str, message: str) -> None:
    with pytest.raises(ViewError) as e:
        parse_view(spec)
    assert message in str(e.value)


def test_a_non_string_is_a_view_error() -> None:
    with pytest.raises(ViewError, match="a view must be a string"):
        parse_view(3)  # type: ignore[arg-type]


def test_view_error_is_a_value_error() -> None:
    # callers that catch ValueError (HTTP validation) also catch bad views
    assert issubclass(ViewError, ValueError)


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_parse_raises_only_view_error_on_arbitrary_text(spec: str) -> None:
    try:
        view = parse_view(spec)
    except ViewError:
        return
    assert isinstance(view, View)
    # whatever parsed must resolve, or fail with a ViewError, on any model size
    for n in (1, 7):
        try:
            view.needed_layers(n)
        except ViewError:
            pass


grammar_words = st.sampled_from(["layer", "layers", "weighted", "concat", "mean", "all", "_"])
grammar_chars = st.sampled_from(list(":,-+.0123456789e ") + ["nan", "inf", "last_4", "_all"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(grammar_words, grammar_chars), max_size=12).map("".join))
def test_parse_raises_only_view_error_on_near_miss_specs(spec: str) -> None:
    # arbitrary text rarely looks like a view; these strings mostly almost do
    try:
        parse_view(spec)
    except ViewError:
        pass


ints = st.integers(min_value=-50, max_value=50)
# finite, and at most 8 of them sum under the float32-safe bound views enforce (5.19e33)
finite = st.floats(min_value=-6e32, max_value=6e32, allow_nan=False, allow_infinity=False, width=64)

valid_specs = st.one_of(
    ints.map(lambda k: (f"layer:{k}", "concat", (k,), ())),
    st.lists(ints, min_size=1, max_size=8).map(
        lambda ks: (f"layers:{','.join(map(str, ks))}", "concat", tuple(ks), ())),
    st.lists(finite, min_size=1, max_size=8).map(
        lambda ws: (f"weighted:{','.join(map(repr, ws))}", "weighted", (), tuple(ws))),
    st.sampled_from(NAMED_VIEWS).map(lambda s: (s, None, None, None)),
)


@settings(max_examples=300, deadline=None)
@given(valid_specs)
def test_valid_specs_round_trip(case: tuple) -> None:
    spec, kind, layers, weights = case
    view = parse_view(spec)
    assert view.spec == spec
    assert parse_view(view.spec) == view
    if kind is not None:
        assert view.kind == kind
        assert view.layers == layers
        assert view.weights == weights
        assert all(math.isfinite(w) for w in view.weights)


@settings(max_examples=100, deadline=None)
@given(st.lists(ints, min_size=1, max_size=8), st.integers(min_value=1, max_value=60))
def test_layers_in_range_resolve_and_others_are_named(ks: list[int], n: int) -> None:
    view = parse_view("layers:" + ",".join(map(str, ks)))
    if all(-n <= k < n for k in ks):
        assert view.needed_layers(n) == [k % n for k in ks]
    else:
        bad = next(k for k in ks if not -n <= k < n)
        with pytest.raises(ViewError, match=f"layer {bad} does not exist; this model has "
                                            f"hidden states 0..{n - 1}"):
            view.needed_layers(n)


# -- the exact words a user reads (mutation testing: bench/mutation.sh cache/views.py) --
GRAMMAR = "layer:K, layers:I,J,..., concat_last_4, sum_last_4, mean_all, weighted:W0,...,WL or all_layers"


def test_an_unknown_view_is_answered_with_the_whole_grammar_on_the_view_field() -> None:
    with pytest.raises(ViewError) as e:
        parse_view("last_layer")
    assert str(e.value) == f"unknown view 'last_layer'; expected {GRAMMAR}"
    assert e.value.field == "view"  # the 422 body's "field"


def test_a_missing_layer_is_named_with_the_negative_range_too() -> None:
    with pytest.raises(ViewError) as e:
        parse_view("layers:1,-8").needed_layers(7)
    assert str(e.value) == "layer -8 does not exist; this model has hidden states 0..6 (negative indices -1..-7 count from the last)"


@pytest.mark.parametrize(("form", "what"), [("layers", "layers"), ("weighted", "weights")])
def test_a_view_names_at_most_256_layers_or_weights(form: str, what: str) -> None:
    ok = parse_view(f"{form}:" + ",".join(["0"] * 256))
    assert len(ok.layers or ok.weights) == 256
    spec = f"{form}:" + ",".join(["0"] * 257)
    with pytest.raises(ViewError) as e:
        parse_view(spec)
    assert str(e.value) == f"view {spec[:40]!r}...: 257 {what}; a view names at most 256"


def test_views_are_values() -> None:
    # equal text, equal view: usable as a dict key or in a set, and never changed in place
    assert {parse_view("mean_all"): 1, parse_view(" mean_all"): 2} == {parse_view("mean_all"): 2}
    with pytest.raises(AttributeError):
        parse_view("layer:-2").layers = (0,)  # type: ignore[misc]


TOO_LARGE = ("these weights make values too large for float32 (their absolute values must sum to at most "
             "5.19e+33, so that any value a float16 shard holds stays finite); use smaller weights "
             "(e.g. ones that sum to 1)")
LONG_WEIGHTS = "weighted:" + ",".join(["1e33"] * 12)  # 69 characters: shown cut to 60


@pytest.mark.parametrize("spec, message", [
    ("layer:", "view 'layer:': expected comma-separated layer numbers"),
    ("layers: ", "view 'layers:': expected comma-separated layer numbers"),
    ("layers:1,,2", "view 'layers:1,,2': expected comma-separated layer numbers"),
    ("layer:1,2", "view 'layer:1,2': layer: takes one layer; use layers:I,J"),
    ("layers:1.5", "view 'layers:1.5': layer numbers must be integers"),
    ("weighted:", "view 'weighted:': expected comma-separated weights"),
    ("weighted:1,,2", "view 'weighted:1,,2': expected comma-separated weights"),
    ("weighted:1,x", "view 'weighted:1,x': weights must be numbers"),
    ("weighted:1,nan", "view 'weighted:1,nan': weights must be finite numbers, got nan"),
    ("weighted:-inf,2", "view 'weighted:-inf,2': weights must be finite numbers, got -inf"),
    ("weighted:3e33,-3e33", f"view 'weighted:3e33,-3e33': {TOO_LARGE}"),
    (LONG_WEIGHTS, f"view {LONG_WEIGHTS[:60]!r}: {TOO_LARGE}"),
    ("layers:" + ",".join(["0"] * 1000), ("view 'layers:0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0'...: 1,000 layers; "
                                          "a view names at most 256")),
])
def test_malformed_views_say_exactly_why(spec: str, message: str) -> None:
    with pytest.raises(ViewError) as e:
        parse_view(spec)
    assert str(e.value) == message


def test_a_non_string_view_says_what_a_view_looks_like() -> None:
    with pytest.raises(ViewError) as e:
        parse_view(None)  # type: ignore[arg-type]
    assert str(e.value) == "a view must be a string such as 'layer:-2'"


def test_weights_summing_to_exactly_the_bound_are_taken() -> None:
    from layerbank.cache.views import _MAX_WEIGHT_SUM

    assert parse_view(f"weighted:{_MAX_WEIGHT_SUM!r}").weights == (_MAX_WEIGHT_SUM,)


def test_a_weighted_sum_that_leaves_float32_is_refused_not_served_as_inf() -> None:
    # weights past the parse-time bound can only come from a View built in code
    view = View("weighted:big", "weighted", weights=(1e38, 1e38))
    with pytest.raises(ViewError) as e:
        view.combine(np.full((1, 2, 3), 10.0, np.float32), 2)
    assert str(e.value) == ("view 'weighted:big': these weights make values too large for float32; "
                            "use smaller weights (e.g. ones that sum to 1)")
    # rows that already hold inf give inf: stored values are served as they are
    out = view.combine(np.array([[[np.inf, 1.0], [0.0, 0.0]]], np.float32), 2)
    assert out[0, 0] == np.inf and out.dtype == np.float32
