"""``layerbank.LayerFeatures``: one layer (or mix of layers) as a scikit-learn
transformer, so that a grid search can choose the layer and the pooling.

Every instance with the same (data_dir, model, url) reads through one
process-wide layerbank.Bank (``Bank.shared``), so the encoder runs once per
unique text for a whole ``GridSearchCV``: the first fit stores every layer of
its texts, and every other (view, pooling, fold) reads them back. The
estimator itself holds no handle (only its parameters and ``n_features_out_``),
so ``clone`` and pickling (joblib) need nothing special; an unpickled copy
opens, or finds, its process's Bank on first use.

Example::

    pipe = Pipeline([("feats", LayerFeatures()), ("clf", LogisticRegression(max_iter=1000))])
    search = GridSearchCV(pipe, {"feats__view": ["layer:2", "layer:-2", "concat_last_4"],
                                 "feats__pooling": ["mean", "cls"]}, cv=5).fit(texts, y)
    search.best_params_          # {'feats__pooling': 'mean', 'feats__view': 'layer:-2'}

A Bank holds its data directory until ``layerbank.app.bank.close_shared()``
or the end of the process; joblib workers in other processes (``n_jobs>1``)
cannot open a directory this process holds, so give them ``url=`` or use
``n_jobs=1`` (see docs/notebook.md).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.utils.validation import check_is_fitted

from layerbank.app.bank import Bank, as_texts

__all__ = ["LayerFeatures"]


class LayerFeatures(TransformerMixin, BaseEstimator):
    """Texts -> float32 ``[n, dim]`` features of ``view`` with ``pooling``.

    ``view``: ``layer:K`` (negative K from the end), ``concat_last_4``,
    ``sum_last_4``, ``mean_all``, ``layers:I,J``, ``weighted:W0,...``,
    ``all_layers`` (flattened); ``pooling``: one the data directory stores
    (mean, cls, max by default). ``model``,
    ``data_dir``, ``url``: as layerbank.Bank (None: the CLI's defaults).
    ``fit`` learns nothing; it checks the parameters and sets
    ``n_features_out_``.
    """

    def __init__(self, view: str = "layer:-2", pooling: str = "mean", model: str | None = None,
                 data_dir: str | None = None, url: str | None = None) -> None:
        self.view = view
        self.pooling = pooling
        self.model = model
        self.data_dir = data_dir
        self.url = url

    def _bank(self) -> Bank:
        return Bank.shared(self.data_dir, self.model, self.url)

    def fit(self, X: Any, y: Any = None) -> LayerFeatures:
        as_texts(X)  # the input error now, not at transform
        # ValueError for a pooling, view or layer the model lacks, before any encoding
        self.n_features_out_ = self._bank().dimension(self.view, self.pooling)
        return self

    def transform(self, X: Any) -> np.ndarray:
        check_is_fitted(self, "n_features_out_")
        x = self._bank().features(as_texts(X), self.view, self.pooling)
        return x.reshape(len(x), -1)  # all_layers is [n, H, d]

    def get_feature_names_out(self, input_features: Any = None) -> np.ndarray:
        check_is_fitted(self, "n_features_out_")
        return np.asarray([f"{self.view}_{self.pooling}_{i}" for i in range(self.n_features_out_)],
                          dtype=object)

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.input_tags.two_d_array = False  # texts, not a numeric matrix
        tags.input_tags.string = True
        tags.requires_fit = True
        return tags
