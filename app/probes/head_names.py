"""The heads by name: one list, without scikit-learn, that the API's field
descriptions, the CLI's help and docs/probes.md read.

``layerbank.app.probes.heads`` builds one estimator per name (``make_head``);
a test checks that both agree, and that the descriptions and docs name every
head. This module imports nothing, so the HTTP layer and ``layerbank --help``
can list the heads without loading scikit-learn.
"""

from __future__ import annotations

__all__ = ["HEADS", "HEAD_NAMES", "PROBE_HEADS", "describe"]

# name -> what it is (heads.py's docstring says how each is fitted)
HEADS: dict[str, str] = {
    "logistic": "standardize + L2 logistic regression, C by inner cross-validation (the default)",
    "ridge": "RidgeClassifierCV, alpha by leave-one-out",
    "linear_svm": "LinearSVC",
    "mlp": "one small ReLU hidden layer",
    "knn": "k nearest neighbours on standardized features",
    "scalar_mix": "learned scalar mix of all hidden states + linear softmax (its own view)",
}
HEAD_NAMES: tuple[str, ...] = tuple(HEADS)
# a probe fits its head on each view; scalar_mix reads all hidden states, so there it is a view
PROBE_HEADS: tuple[str, ...] = tuple(h for h in HEAD_NAMES if h != "scalar_mix")


def describe(names: tuple[str, ...] = HEAD_NAMES) -> str:
    """``"logistic (default), ridge, ..."`` for help texts and field descriptions."""
    return ", ".join(f"{n} (default)" if n == "logistic" else n for n in names)
