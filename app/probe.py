"""Probe engine: which layer, which pooling, how separable, on cached features.

``run_probe`` is a pure function over numpy arrays (no HTTP, no storage).
``get_states(pooling)`` returns every hidden state of that pooling,
``[n, H, d]``; ``labels`` has one label per row. For every (view, pooling)
it cross-validates a head on the same ``StratifiedKFold(cv, shuffle=True,
random_state=seed)`` folds (paired comparison), so each fold score equals
``cross_val_score(make_head(head, seed), X, labels, cv=those folds)``.

Views: ``"each_layer"`` (layer:0 .. layer:L), ``"scalar_mix"`` (a learned
ELMo mix of all states, app.scalar_mix), or any cache.views spec.

It also reports (all JSON-serializable, see ``run_probe``):

- the best (view, pooling) by mean accuracy, and every entry's gap to it;
- a control task (Hewitt & Liang 2019): the labels permuted once with
  ``seed``, probed the same way for every single layer of the best pooling
  and for the best view; selectivity = task accuracy - control accuracy.
  A high control score means the head memorizes rather than reads labels;
- a learning curve for the best view: each training fold subsampled
  (stratified) to ``train_sizes`` below the fold size, scored on the
  held-out fold, plus "all" (the sweep's own scores).

Input errors raise ``ProbeInputError`` (a ValueError) with the reason.

Example::

    >>> result = run_probe(store.states_for(keys), labels, views=["each_layer", "scalar_mix"])
    >>> result["best"]
    {'view': 'layer:4', 'pooling': 'mean', 'accuracy': 0.91, 'macro_f1': 0.91}
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from sklearn.base import clone
from sklearn.exceptions import ConvergenceWarning
from sklearn.metrics import accuracy_score, f1_score
from sklearn.model_selection import StratifiedKFold, train_test_split
from threadpoolctl import threadpool_limits

from app.heads import ProbeInputError, make_head
from app.scalar_mix import ScalarMixHead, weighted_view_spec
from cache.views import View, ViewError, parse_view

__all__ = ["run_probe", "fit_head", "check_labels", "ProbeInputError"]

Folds = list[tuple[np.ndarray, np.ndarray]]


def check_labels(labels: Sequence[Any] | np.ndarray | None, cv: int) -> np.ndarray:
    """Labels as a 1-D array, or ProbeInputError saying what is wrong."""
    if labels is None:
        raise ProbeInputError("labels are missing: give one label per text")
    values = list(labels)
    missing = [i for i, v in enumerate(values)
               if v is None or (isinstance(v, str) and not v.strip())
               or (isinstance(v, float) and math.isnan(v))]
    if missing:
        raise ProbeInputError(f"{len(missing)} of {len(values)} labels are missing (None, NaN or empty); "
                              f"the first is at index {missing[0]}")
    y = np.asarray(values)
    if y.dtype == object:  # mixed types: compare them as text
        y = y.astype(str)
    if y.ndim != 1:
        raise ProbeInputError(f"labels must be one label per text; got shape {y.shape}")
    classes, counts = np.unique(y, return_counts=True)
    if len(classes) < 2:
        raise ProbeInputError(f"all {len(y)} labels are the same class {classes[0].item()!r}; "
                              "a probe needs at least 2 classes")
    small = [(c.item(), int(k)) for c, k in zip(classes, counts) if k < cv]
    if small:
        named = ", ".join(f"{c!r} has {k}" for c, k in small)
        raise ProbeInputError(f"class {named} example(s), fewer than the {cv} cross-validation folds; "
                              f"each class needs at least {cv} (label more, or lower cv). Class counts: "
                              + ", ".join(f"{c.item()!r}: {int(k)}" for c, k in zip(classes, counts)))
    return y


def _parse(spec: str) -> View:
    try:
        return parse_view(spec)
    except ViewError as e:
        raise ProbeInputError(str(e)) from None


def _expand_views(views: Sequence[str], n_states: int) -> list[str]:
    out: list[str] = []
    for spec in views:
        new = [f"layer:{k}" for k in range(n_states)] if spec == "each_layer" else [spec]
        out += [s for s in new if s not in out]
    return out


def _features(spec: str, states: np.ndarray) -> np.ndarray:
    if spec == "scalar_mix":
        return states
    try:
        X = parse_view(spec).apply(states)
    except ViewError as e:
        raise ProbeInputError(str(e)) from None
    return X.reshape(len(X), -1)  # all_layers is [n, H, d]


def _single_layer(spec: str, n_states: int) -> int | None:
    if spec == "scalar_mix":
        return None
    v = parse_view(spec)
    return v.layers[0] % n_states if v.kind == "concat" and len(v.layers) == 1 else None


def quiet_fit(head: Any, X: np.ndarray, y: np.ndarray) -> tuple[Any, list[str]]:
    """Fit ``head``; return it and its convergence warnings as text (reported
    once per (view, pooling) in the result instead of once per fold)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        head.fit(X, y)
    for w in caught:
        if not issubclass(w.category, ConvergenceWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return head, [str(w.message) for w in caught if issubclass(w.category, ConvergenceWarning)]


def _summary(values: list[float]) -> dict[str, Any]:
    return {"mean": float(np.mean(values)), "std": float(np.std(values)), "folds": [float(v) for v in values]}


def _cross_validate(estimator: Any, X: np.ndarray, y: np.ndarray, folds: Folds,
                    tick: Callable[[], None], keep: bool = False) -> dict[str, Any]:
    """Fit a clone per fold; the same maths as cross_val_score(scoring=...)."""
    acc, f1, seconds, warned, fitted = [], [], [], 0, []
    for train, test in folds:
        t0 = time.perf_counter()
        model, messages = quiet_fit(clone(estimator), X[train], y[train])
        seconds.append(time.perf_counter() - t0)
        warned += bool(messages)
        pred = model.predict(X[test])
        acc.append(accuracy_score(y[test], pred))
        f1.append(f1_score(y[test], pred, average="macro"))
        fitted.append(model if keep else None)
        tick()
    out = {"accuracy": _summary(acc), "macro_f1": _summary(f1),
           "fit_seconds": {"mean": float(np.mean(seconds)), "total": float(np.sum(seconds))},
           "folds_not_converged": warned}
    return out | ({"_models": fitted} if keep else {})


def _estimator(spec: str, head: str, seed: int) -> Any:
    return ScalarMixHead() if spec == "scalar_mix" else make_head(head, seed)


def fit_head(states: np.ndarray, labels: Sequence[Any] | np.ndarray, view: str, *,
             head: str = "logistic", seed: int = 0) -> Any:
    """Fit one head on all rows (e.g. the best view of a probe) to save it."""
    y = check_labels(labels, cv=1)
    return quiet_fit(_estimator(view, head, seed), _features(view, np.asarray(states)), y)[0]


def _learning_sizes(train_sizes: Sequence[int], folds: Folds, n_classes: int) -> list[int]:
    smallest = min(len(train) for train, _ in folds)
    return sorted({int(s) for s in train_sizes if n_classes <= int(s) < smallest})


def run_probe(get_states: Callable[[str], np.ndarray], labels: Sequence[Any] | np.ndarray, *,
              views: Sequence[str], poolings: Sequence[str] = ("mean", "cls"), head: str = "logistic",
              cv: int = 5, seed: int = 0, control_task: bool = True, learning_curve: bool = True,
              train_sizes: Sequence[int] = (50, 100, 200, 500, 1000),
              model_info: dict[str, Any] | None = None,
              progress: Callable[[int, int], None] | None = None, threads: int | None = 1) -> dict[str, Any]:
    """Cross-validate ``head`` on every (view, pooling); see the module docstring.

    ``threads`` caps BLAS threads while fitting: these matrices are small, and
    on a shared 2-core machine oversubscribed OpenBLAS threads made a fit ~10x
    slower than one thread. ``None`` keeps the library default.

    Returns a dict with keys ``task``, ``model``, ``results`` (one entry per
    (view, pooling): accuracy and macro_f1 as {mean, std, folds}, fit_seconds,
    gap_to_best, layer), ``best``, ``scalar_mix`` (per pooling: accuracy,
    layer_weights, gamma, view), ``control_task``, ``learning_curve``,
    ``warnings`` and ``seconds``.
    """
    started = time.perf_counter()
    if not isinstance(cv, int) or isinstance(cv, bool) or cv < 2:
        raise ProbeInputError(f"cv must be an integer >= 2 (number of folds); got {cv!r}")
    if head == "scalar_mix":
        raise ProbeInputError("'scalar_mix' reads all hidden states; ask for it as a view, not a head")
    make_head(head, seed)  # unknown head: fail before any work
    y = check_labels(labels, cv)
    if isinstance(views, str) or not views:
        raise ProbeInputError("views must be a non-empty list, e.g. ['each_layer', 'scalar_mix']")
    if isinstance(poolings, str) or not poolings:
        raise ProbeInputError("poolings must be a non-empty list, e.g. ['mean', 'cls']")
    for spec in views:
        if spec not in ("each_layer", "scalar_mix"):
            _parse(spec)
    classes, counts = np.unique(y, return_counts=True)
    folds: Folds = list(StratifiedKFold(cv, shuffle=True, random_state=seed).split(np.zeros(len(y)), y))

    def load(pooling: str) -> np.ndarray:
        states = np.asarray(get_states(pooling))
        if states.ndim != 3 or len(states) != len(y):
            raise ProbeInputError(f"pooling {pooling!r}: expected hidden states [n={len(y)}, H, d]; "
                                  f"got shape {states.shape}")
        return states

    first = load(poolings[0])
    n_states, hidden = first.shape[1:]
    specs = _expand_views(views, n_states)
    for spec in specs:
        if spec != "scalar_mix":
            try:
                _parse(spec).needed_layers(n_states)
            except ViewError as e:
                raise ProbeInputError(str(e)) from None
    singles = [s for s in specs if _single_layer(s, n_states) is not None]
    sizes = _learning_sizes(train_sizes, folds, len(classes)) if learning_curve else []
    per_pooling = len(specs) * cv + (1 if "scalar_mix" in specs else 0)
    total = len(poolings) * per_pooling + (len(singles) + 1) * cv * control_task + len(sizes) * cv
    done = 0

    def tick(steps: int = 1) -> None:
        nonlocal done
        done += steps
        if progress is not None:
            progress(done, total)

    results: list[dict[str, Any]] = []
    mixes: dict[str, Any] = {}
    warned: list[str] = []
    with threadpool_limits(limits=threads):
        for i, pooling in enumerate(poolings):
            states = first if i == 0 else load(pooling)
            for spec in specs:
                entry = {"view": spec, "pooling": pooling, "layer": _single_layer(spec, n_states)}
                X = _features(spec, states)
                scores = _cross_validate(_estimator(spec, head, seed), X, y, folds, tick, keep=spec == "scalar_mix")
                if spec == "scalar_mix":
                    weights = np.array([m.layer_weights_ for m in scores.pop("_models")])
                    full = fit_head(states, y, "scalar_mix")
                    tick()
                    mixes[pooling] = {"accuracy": scores["accuracy"], "macro_f1": scores["macro_f1"],
                                      "layer_weights": full.layer_weights_.tolist(),
                                      "layer_weights_fold_std": weights.std(axis=0).tolist(),
                                      "gamma": full.gamma_, "view": weighted_view_spec(full)}
                if scores["folds_not_converged"]:
                    warned.append(f"{spec} / {pooling}: {scores['folds_not_converged']} of {cv} fits "
                                  "stopped at max_iter before converging")
                results.append(entry | scores)
            del states
        best = max(results, key=lambda r: (r["accuracy"]["mean"], r["macro_f1"]["mean"]))
        for r in results:
            r["gap_to_best"] = best["accuracy"]["mean"] - r["accuracy"]["mean"]
        best_states = first if best["pooling"] == poolings[0] else load(best["pooling"])
        del first
        task = {r["view"]: r["accuracy"]["mean"] for r in results if r["pooling"] == best["pooling"]}
        control = (_control_task(best_states, y, best, singles, task, head, seed, cv, tick)
                   if control_task else None)
        curve = _learning_curve(best_states, y, best, sizes, folds, head, seed, tick) if learning_curve else None
    tick(total - done)
    return {
        "task": {"n_examples": int(len(y)), "classes": [c.item() for c in classes],
                 "class_counts": {str(c.item()): int(k) for c, k in zip(classes, counts)},
                 "chance_accuracy": float(counts.max() / len(y)), "n_hidden_states": int(n_states),
                 "hidden_size": int(hidden), "cv": cv, "seed": seed, "head": head, "metric": "accuracy"},
        "model": model_info,
        "results": results,
        "best": {"view": best["view"], "pooling": best["pooling"], "layer": best["layer"],
                 "accuracy": best["accuracy"]["mean"], "accuracy_std": best["accuracy"]["std"],
                 "macro_f1": best["macro_f1"]["mean"],
                 "selectivity": control["best"]["selectivity"] if control else None},
        "scalar_mix": mixes or None,
        "control_task": control,
        "learning_curve": curve,
        "warnings": warned,
        "seconds": time.perf_counter() - started,
    }


def _control_task(states: np.ndarray, y: np.ndarray, best: dict[str, Any], singles: list[str],
                  task: dict[str, float], head: str, seed: int, cv: int,
                  tick: Callable[..., None]) -> dict[str, Any]:
    """Same probe on labels permuted once with ``seed`` (same class counts).

    ``task`` maps each view of the best pooling to its task accuracy.
    """
    y_control = np.random.default_rng(seed).permutation(y)
    folds = list(StratifiedKFold(cv, shuffle=True, random_state=seed).split(np.zeros(len(y)), y_control))
    specs = singles + ([best["view"]] if best["view"] not in singles else [])
    rows = []
    for spec in specs:
        scores = _cross_validate(_estimator(spec, head, seed), _features(spec, states), y_control, folds, tick)
        control = scores["accuracy"]["mean"]
        rows.append({"view": spec, "pooling": best["pooling"], "layer": _single_layer(spec, states.shape[1]),
                     "task_accuracy": task[spec], "control_accuracy": control,
                     "control_accuracy_std": scores["accuracy"]["std"],
                     "control_folds": scores["accuracy"]["folds"], "selectivity": task[spec] - control})
    if best["view"] in singles:
        tick(cv)  # the best view was one of the layers: its planned extra fits are not needed
    return {"method": "labels permuted once with the seed (Hewitt & Liang 2019 control task)",
            "pooling": best["pooling"], "results": rows,
            "best": next(r for r in rows if r["view"] == best["view"])}


def _learning_curve(states: np.ndarray, y: np.ndarray, best: dict[str, Any], sizes: list[int],
                    folds: Folds, head: str, seed: int, tick: Callable[..., None]) -> dict[str, Any]:
    """Stratified subsamples of each training fold, scored on the held-out fold."""
    X = _features(best["view"], states)
    estimator = _estimator(best["view"], head, seed)
    points = []
    for size in sizes:
        sub = [(train_test_split(train, train_size=size, stratify=y[train], random_state=seed)[0], test)
               for train, test in folds]
        scores = _cross_validate(estimator, X, y, sub, tick)
        points.append({"train_size": size, "label": str(size), "accuracy": scores["accuracy"],
                       "macro_f1": scores["macro_f1"]})
    points.append({"train_size": int(np.mean([len(t) for t, _ in folds])), "label": "all",
                   "accuracy": best["accuracy"], "macro_f1": best["macro_f1"]})
    return {"view": best["view"], "pooling": best["pooling"], "points": points}
