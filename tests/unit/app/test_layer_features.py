"""layerbank.LayerFeatures on the tiny random model: the scikit-learn contract
(clone, pickle, Pipeline, GridSearchCV, estimator checks that apply to texts)
and one encoder pass per unique text for a whole search."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.exceptions import NotFittedError
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import Pipeline

from layerbank.app.bank import Bank
from layerbank.app.layer_features import LayerFeatures
from layerbank.cache.catalog import Catalog

TEXTS = [f"great movie number {i}" for i in range(12)] + [f"dull film, take {i}" for i in range(12)]
Y = [1] * 12 + [0] * 12


@pytest.fixture
def params(tmp_path: Path, tiny_model_dir: str):  # type: ignore[no-untyped-def]
    p = {"model": tiny_model_dir, "data_dir": str(tmp_path / "data")}
    yield p
    Bank.shared(p["data_dir"], tiny_model_dir).close()  # release the directory for the next test


def test_init_only_stores_params_and_fit_sets_the_width(params: dict) -> None:
    f = LayerFeatures("layers:0,2", "cls", **params)
    assert f.get_params() == {"view": "layers:0,2", "pooling": "cls", **params, "url": None}
    assert vars(f) == f.get_params()  # no handle, nothing computed
    with pytest.raises(NotFittedError):
        f.transform(TEXTS)
    assert f.fit(TEXTS) is f and f.n_features_out_ == 64
    x = f.transform(TEXTS)
    assert x.dtype == np.float32 and x.shape == (24, 64)
    assert list(f.get_feature_names_out()[:2]) == ["layers:0,2_cls_0", "layers:0,2_cls_1"]
    assert f.fit_transform(TEXTS).tolist() == x.tolist()


def test_bad_params_fail_at_fit_with_the_banks_message(params: dict) -> None:
    with pytest.raises(ValueError, match="unknown pooling 'avg'; known: mean, cls, max"):
        LayerFeatures(pooling="avg", **params).fit(TEXTS)
    with pytest.raises(ValueError, match="layer 5 does not exist"):
        LayerFeatures(view="layer:5", **params).fit(TEXTS)
    with pytest.raises(TypeError, match="got one string"):
        LayerFeatures(**params).fit("one text")


def test_clone_and_pickle_keep_params_and_answers(params: dict) -> None:
    f = LayerFeatures("layer:1", **params).fit(TEXTS)
    x = f.transform(TEXTS[:3])
    c = clone(f)
    assert c.get_params() == f.get_params() and not hasattr(c, "n_features_out_")
    g = pickle.loads(pickle.dumps(f))
    assert g.n_features_out_ == 32
    np.testing.assert_array_equal(g.transform(TEXTS[:3]), x)


def test_grid_search_encodes_each_unique_text_once(params: dict) -> None:
    pipe = Pipeline([("feats", LayerFeatures(**params)), ("clf", LogisticRegression(max_iter=200))])
    grid = {"feats__view": ["layer:1", "layer:-1", "layers:0,2"], "feats__pooling": ["mean", "cls"]}
    search = GridSearchCV(pipe, grid, cv=3).fit(TEXTS, Y)
    bank = Bank.shared(params["data_dir"], params["model"])
    # 6 candidates x 3 folds x (fit + score) + the refit: 37 fits read 24 texts, encoded once
    assert bank.stats["encoded"] == 24
    assert Catalog(Path(params["data_dir"]) / "catalog.sqlite").stats()["keys"] == 24
    assert bank.stats["cached"] > 24 * 6
    assert search.best_params_["feats__view"] in grid["feats__view"]
    assert search.best_params_["feats__pooling"] in grid["feats__pooling"]
    assert search.predict(TEXTS[:2]).shape == (2,)


# sklearn's checks that do not feed data. check_estimator itself runs only
# check_estimator_cloneable for a transformer whose tags say "texts, not a 2-D
# numeric array" (sklearn skips the rest with "Can't test estimator"); the
# data checks that matter for texts are restated below with texts.
DATA_FREE_CHECKS = ("check_estimator_cloneable", "check_estimator_repr", "check_estimator_tags_renamed",
                    "check_do_not_raise_errors_in_init_or_set_params", "check_no_attributes_set_in_init",
                    "check_parameters_default_constructible", "check_get_params_invariance",
                    "check_set_params", "check_mixin_order")


@pytest.mark.parametrize("check", DATA_FREE_CHECKS)
def test_sklearn_checks_without_data(check: str) -> None:
    from sklearn.utils import estimator_checks

    getattr(estimator_checks, check)("LayerFeatures", LayerFeatures())  # no Bank is opened


def test_sklearn_data_checks_restated_with_texts(params: dict) -> None:
    f = LayerFeatures("layer:1", "max", **params)
    before = f.get_params()
    x = f.fit(TEXTS).transform(TEXTS)  # check_estimators_fit_returns_self is test_init_only_...
    assert f.get_params() == before  # check_estimators_overwrite_params
    np.testing.assert_array_equal(f.fit(TEXTS).transform(TEXTS), x)  # check_fit_idempotent
    order = np.random.default_rng(0).permutation(len(TEXTS))
    np.testing.assert_array_equal(f.transform([TEXTS[i] for i in order]), x[order])  # sample order
    np.testing.assert_array_equal(f.transform(TEXTS[5:9]), x[5:9])  # check_methods_subset_invariance
    np.testing.assert_array_equal(f.transform(np.array(TEXTS, dtype=object)), x)  # array input
    assert "layer:1" in repr(f)
