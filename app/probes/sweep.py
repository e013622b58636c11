"""Probe engine: which layer, which pooling, how separable, on cached features.

``run_probe`` is a pure function over numpy arrays (no HTTP, no storage).
``get_states(pooling)`` returns every hidden state of that pooling,
``[n, H, d]``; ``labels`` has one label per row. For every (view, pooling)
it cross-validates a head on the same ``StratifiedKFold(cv, shuffle=True,
random_state=seed)`` folds (paired comparison), so each fold score equals
``cross_val_score(make_head(head, seed), X, labels, cv=those folds)``.

Views: ``"each_layer"`` (layer:0 .. layer:L), ``"scalar_mix"`` (a learned
ELMo mix of all states with its own linear softmax, layerbank.app.probes.scalar_mix, whatever
``head`` is), or any layerbank.cache.views spec such as ``concat_last_4``.

It also reports (all JSON-serializable, see ``run_probe``):

- the best (view, pooling) by mean accuracy, and every entry's gap to it;
- a control task (Hewitt & Liang 2019): the labels permuted once with
  ``seed``, probed the same way for every single layer of the best pooling
  and for the best view; selectivity = task accuracy - control accuracy.
  A high control score means the head memorizes rather than reads labels;
- MDL (Voita & Titov 2020, layerbank.app.probes.mdl): the online
  codelength of the labels given each (view, pooling), in kbits, and its
  compression (uniform / online); for the control task's views the same on
  the permuted labels (``control_compression``, ~1.0 when nothing is
  learnt). Between views of equal accuracy, the one that compresses more
  needs fewer examples to read the property;
- a learning curve for the best view: each training fold subsampled
  (stratified) to ``train_sizes`` below the fold size, scored on the
  held-out fold, plus "all" (the sweep's own scores).

Input errors raise ``ProbeInputError`` (a ValueError) with the reason
(layerbank.app.probes.inputs).

Example::

    >>> result = run_probe(store.states_for(keys), labels, views=["each_layer", "scalar_mix"])
    >>> result["best"]
    {'view': 'layer:4', 'pooling': 'mean', 'accuracy': 0.91, 'macro_f1': 0.91}
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import numpy as np
from sklearn.base import clone
from sklearn.exceptions import ConvergenceWarning
from sklearn.metrics import accuracy_score, f1_score
from sklearn.model_selection import StratifiedKFold, train_test_split
from threadpoolctl import threadpool_limits

from layerbank.app.probes.heads import make_head
from layerbank.app.probes.inputs import (
    ProbeInputError,
    check_labels,
    check_options,
    check_states,
    expand_views,
    single_layer,
)
from layerbank.app.probes.mdl import online_codelength
from layerbank.app.probes.options import ProbeOptions
from layerbank.app.probes.scalar_mix import ScalarMixHead, weighted_view_spec
from layerbank.cache.views import parse_view

__all__ = ["ProbeInputError", "ProbeOptions", "fit_head", "run_probe"]

Folds = list[tuple[np.ndarray, np.ndarray]]


def _features(spec: str, states: np.ndarray) -> np.ndarray:
    if spec == "scalar_mix":
        return states
    X = parse_view(spec).apply(states)  # spec already checked by expand_views
    return X.reshape(len(X), -1)  # all_layers is [n, H, d]


# Worker threads of a parallel sweep mark themselves here; their fits record
# ConvergenceWarnings into ``caught`` instead of using warnings.catch_warnings,
# which swaps module-global state and so is not thread-safe.
_thread = threading.local()


def quiet_fit(head: Any, X: np.ndarray, y: np.ndarray) -> tuple[Any, list[str]]:
    """Fit ``head``; return it and its convergence warnings as text (reported
    once per (view, pooling) in the result instead of once per fold)."""
    if getattr(_thread, "routed", False):  # inside _routed_warnings, on a worker thread
        _thread.caught = []
        try:
            head.fit(X, y)
            return head, _thread.caught
        finally:
            _thread.caught = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        head.fit(X, y)
    for w in caught:
        if not issubclass(w.category, ConvergenceWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return head, [str(w.message) for w in caught if issubclass(w.category, ConvergenceWarning)]


@contextmanager
def _routed_warnings() -> Iterator[None]:
    """For the duration (set up on the calling thread, once): a worker's
    ConvergenceWarning goes to that worker's ``_thread.caught``; any other
    warning is shown as usual."""
    with warnings.catch_warnings():
        warnings.simplefilter("always", ConvergenceWarning)
        show = warnings.showwarning

        def route(message: Any, category: type[Warning], filename: str, lineno: int,
                  file: Any = None, line: str | None = None) -> None:
            caught = getattr(_thread, "caught", None)
            if caught is not None and issubclass(category, ConvergenceWarning):
                caught.append(str(message))
            else:
                show(message, category, filename, lineno, file, line)

        warnings.showwarning = route
        yield


def _mark_routed() -> None:
    _thread.routed = True


def _summary(values: list[float]) -> dict[str, Any]:
    return {"mean": float(np.mean(values)), "std": float(np.std(values)), "folds": [float(v) for v in values]}


def _fit_fold(estimator: Any, X: np.ndarray, y: np.ndarray, train: np.ndarray,
              test: np.ndarray) -> tuple[float, float, float, list[str], Any]:
    t0 = time.perf_counter()
    model, messages = quiet_fit(clone(estimator), X[train], y[train])
    seconds = time.perf_counter() - t0
    pred = model.predict(X[test])
    return (accuracy_score(y[test], pred), f1_score(y[test], pred, average="macro"), seconds,
            messages, model)


class _Fits:
    """Runs fold fits, on ``n_jobs`` threads when > 1.

    Threads, not processes: the fits spend their time in BLAS products and
    numpy loops, which release the GIL; no data is copied or pickled. Each
    fit is independent and deterministic (BLAS capped by ``threads``), so
    the scores do not depend on ``n_jobs``.
    """

    def __init__(self, n_jobs: int, tick: Callable[[], None]) -> None:
        self.tick = tick
        self.pool = (ThreadPoolExecutor(n_jobs, thread_name_prefix="probe-fit", initializer=_mark_routed)
                     if n_jobs > 1 else None)

    def cross_validate(self, jobs: list[tuple[Any, np.ndarray, bool]], y: np.ndarray,
                       folds: Folds) -> list[dict[str, Any]]:
        """One score dict per (estimator, X, keep) in ``jobs``, each over all ``folds``;
        the same maths as cross_val_score(scoring=...)."""
        tasks = [(j, f) for j in range(len(jobs)) for f in range(len(folds))]
        done: dict[tuple[int, int], Any] = {}
        if self.pool is None:
            for j, f in tasks:
                done[j, f] = _fit_fold(jobs[j][0], jobs[j][1], y, *folds[f])
                self.tick()
        else:
            futures = {self.pool.submit(_fit_fold, jobs[j][0], jobs[j][1], y, *folds[f]): (j, f)
                       for j, f in tasks}
            for future in as_completed(futures):
                done[futures[future]] = future.result()
                self.tick()
        out = []
        for j, (_, _, keep) in enumerate(jobs):
            acc, f1, seconds, messages, models = zip(*(done[j, f] for f in range(len(folds))))
            scores = {"accuracy": _summary(list(acc)), "macro_f1": _summary(list(f1)),
                      "fit_seconds": {"mean": float(np.mean(seconds)), "total": float(np.sum(seconds))},
                      "folds_not_converged": sum(bool(m) for m in messages)}
            out.append(scores | ({"_models": list(models)} if keep else {}))
        return out

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)


@contextmanager
def _closing(fits: _Fits) -> Iterator[None]:
    try:
        yield
    finally:
        fits.close()


def default_jobs() -> int:
    """Fit threads when ``n_jobs`` is None: the cores this process may use, at most 2."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(2, cores))


def _estimator(spec: str, head: str, seed: int, storage_dtype: str = "float16") -> Any:
    # storage_dtype: the heads leave out dimensions below its resolution (stored rounding noise)
    return ScalarMixHead(random_state=seed) if spec == "scalar_mix" else make_head(head, seed, storage_dtype)


def fit_head(states: np.ndarray, labels: Sequence[Any] | np.ndarray, view: str, *,
             head: str = "logistic", seed: int = 0, threads: int | None = 1,
             storage_dtype: str = "float16") -> Any:
    """Fit one head on all rows of ``states`` [n, H, d] (e.g. the best view and
    pooling of a probe result), ready for ``save_head``; ``storage_dtype``: what
    the states were stored as (the heads' noise floor, layerbank.linear_probe.standardize)."""
    y = check_labels(labels, cv=1)
    states = check_states(states, len(y), "given")
    expand_views([view], states.shape[1])
    with threadpool_limits(limits=threads):
        return quiet_fit(_estimator(view, head, seed, storage_dtype), _features(view, states), y)[0]


def _learning_sizes(train_sizes: Sequence[int], folds: Folds, n_classes: int) -> list[int]:
    smallest = min(len(train) for train, _ in folds)
    return sorted({int(s) for s in train_sizes if n_classes <= int(s) < smallest})


def run_probe(get_states: Callable[[str], np.ndarray], labels: Sequence[Any] | np.ndarray,
              options: ProbeOptions | None = None, *, model_info: dict[str, Any] | None = None,
              progress: Callable[[int, int], None] | None = None, **option_fields: Any) -> dict[str, Any]:
    """Cross-validate ``head`` on every (view, pooling); see the module docstring.

    ``options`` (layerbank.app.probes.options.ProbeOptions) says what to sweep;
    its fields may be given as keywords instead (``views=..., cv=3``), or
    override some of ``options``'.

    ``progress(done, total)`` is called after every fit; ``total`` is fixed
    up front (fits that turn out unnecessary are counted as done).
    ``threads`` caps BLAS threads while fitting: these matrices are small, and
    on a shared 2-core machine oversubscribed OpenBLAS threads made a fit ~10x
    slower than one thread. ``None`` keeps the library default.
    ``n_jobs`` fits run at once, on threads (None: ``default_jobs()``, the
    usable cores up to 2; 1: in the calling thread). Scores do not depend on
    it. Keep ``n_jobs * threads`` within the cores.

    Returns a dict with keys:

    - ``task``: n_examples, classes, class_counts, chance_accuracy (most
      frequent class), n_hidden_states, hidden_size, cv, seed, head, metric;
    - ``model``: ``model_info`` as given;
    - ``results``: one entry per (view, pooling): view, pooling, layer (int
      for one-layer views, else None), accuracy and macro_f1 as {mean, std,
      folds}, fit_seconds {mean, total}, folds_not_converged, gap_to_best;
    - ``best``: view, pooling, layer, accuracy, accuracy_std, macro_f1,
      selectivity (None without the control task);
    - ``scalar_mix``: per pooling {accuracy, macro_f1, layer_weights,
      layer_weights_fold_std, gamma, C, view ("weighted:...")}, or None;
    - ``control_task``: {method, pooling, results: [{view, layer,
      task_accuracy, control_accuracy, control_accuracy_std, control_folds,
      selectivity}], best}, or None;
    - ``learning_curve``: {view, pooling, points: [{train_size, label,
      accuracy, macro_f1}]} (last label "all"), or None;
    - ``warnings`` (list of text) and ``seconds``.
    """
    started = time.perf_counter()
    o = ProbeOptions(**option_fields) if options is None else replace(options, **option_fields)
    views, poolings, head, cv, seed = o.views, o.poolings, o.head, o.cv, o.seed
    control_task, learning_curve, threads = o.control_task, o.learning_curve, o.threads
    check_options(cv=cv, head=head, views=views, poolings=poolings)  # before any work
    y = check_labels(labels, cv)
    classes, counts = np.unique(y, return_counts=True)
    folds: Folds = list(StratifiedKFold(cv, shuffle=True, random_state=seed).split(np.zeros(len(y)), y))

    def load(pooling: str) -> np.ndarray:
        return check_states(get_states(pooling), len(y), pooling)

    first = load(poolings[0])
    n_states, hidden = first.shape[1:]
    specs = expand_views(views, n_states)
    singles = [s for s in specs if single_layer(s, n_states) is not None]
    sizes = _learning_sizes(o.train_sizes, folds, len(classes)) if learning_curve else []
    per_pooling = len(specs) * cv + (1 if "scalar_mix" in specs else 0)
    coded = [s for s in specs if s != "scalar_mix"] if o.mdl else []  # a mix has no fixed features to code
    total = (len(poolings) * (per_pooling + len(coded)) + (len(singles) + 1) * (cv + o.mdl) * control_task
             + len(sizes) * cv)
    y_index = np.searchsorted(classes, y)
    mdl_seconds = 0.0

    def codelength(X: np.ndarray, labels_index: np.ndarray) -> dict[str, Any]:
        nonlocal mdl_seconds
        start = time.perf_counter()
        code = online_codelength(X, labels_index, len(classes), seed=seed, storage_dtype=o.storage_dtype)
        mdl_seconds += time.perf_counter() - start
        tick()
        return {"online_kbits": round(code["online_bits"] / 1000, 3),
                "uniform_kbits": round(code["uniform_bits"] / 1000, 3),
                "compression": code["compression"], "converged": code["converged"]}
    done = 0

    def tick(steps: int = 1) -> None:
        nonlocal done
        done += steps
        if progress is not None:
            progress(done, total)

    results: list[dict[str, Any]] = []
    mixes: dict[str, Any] = {}
    warned: list[str] = []
    jobs = default_jobs() if o.n_jobs is None else max(1, int(o.n_jobs))
    fits = _Fits(jobs, tick)
    with threadpool_limits(limits=threads), _routed_warnings(), _closing(fits):
        for i, pooling in enumerate(poolings):
            states = first if i == 0 else load(pooling)
            # every view of this pooling at once (fits across views keep both
            # threads busy); one pooling's states in memory at a time
            all_scores = fits.cross_validate(
                [(_estimator(spec, head, seed, o.storage_dtype), _features(spec, states), spec == "scalar_mix")
                 for spec in specs],
                y, folds)
            for spec, scores in zip(specs, all_scores):
                entry: dict[str, Any] = {"view": spec, "pooling": pooling,  # a result row: mixed values
                                         "layer": single_layer(spec, n_states)}
                if spec == "scalar_mix":
                    weights = np.array([m.layer_weights_ for m in scores.pop("_models")])
                    full = fit_head(states, y, "scalar_mix", seed=seed, threads=threads)
                    tick()
                    mixes[pooling] = {"accuracy": scores["accuracy"], "macro_f1": scores["macro_f1"],
                                      "layer_weights": full.layer_weights_.tolist(),
                                      "layer_weights_fold_std": weights.std(axis=0).tolist(),
                                      "gamma": full.gamma_, "C": full.C_, "view": weighted_view_spec(full)}
                if scores["folds_not_converged"]:
                    warned.append(f"{spec} / {pooling}: {scores['folds_not_converged']} of {cv} fits "
                                  "stopped at max_iter before converging")
                entry["mdl"] = codelength(_features(spec, states), y_index) if spec in coded else None
                if entry["mdl"] and not entry["mdl"]["converged"]:
                    warned.append(f"{spec} / {pooling}: an MDL block's fit stopped at max_iter before converging")
                results.append(entry | scores)
            del states
        best = max(results, key=lambda r: (r["accuracy"]["mean"], r["macro_f1"]["mean"]))
        for r in results:
            r["gap_to_best"] = best["accuracy"]["mean"] - r["accuracy"]["mean"]
        best_states = first if best["pooling"] == poolings[0] else load(best["pooling"])
        del first
        task = {r["view"]: r["accuracy"]["mean"] for r in results if r["pooling"] == best["pooling"]}
        task_f1 = {r["view"]: r["macro_f1"]["mean"] for r in results if r["pooling"] == best["pooling"]}
        control = (_control_task(best_states, y, best, singles, task, task_f1, head, seed, cv, tick, fits,
                                 (lambda X, yc: codelength(X, np.searchsorted(classes, yc))) if o.mdl else None,
                                 storage_dtype=o.storage_dtype)
                   if control_task else None)
        curve = (_learning_curve(best_states, y, best, sizes, folds, head, seed, fits, o.storage_dtype)
                 if learning_curve else None)
    tick(total - done)
    return {
        "task": {"n_examples": len(y), "classes": [c.item() for c in classes],
                 "class_counts": {str(c.item()): int(k) for c, k in zip(classes, counts)},
                 "chance_accuracy": float(counts.max() / len(y)), "n_hidden_states": int(n_states),
                 "hidden_size": int(hidden), "cv": cv, "seed": seed, "head": head, "metric": "accuracy"},
        "model": model_info,
        "results": results,
        "best": {"view": best["view"], "pooling": best["pooling"], "layer": best["layer"],
                 "accuracy": best["accuracy"]["mean"], "accuracy_std": best["accuracy"]["std"],
                 "macro_f1": best["macro_f1"]["mean"],
                 "selectivity": control["best"]["selectivity"] if control else None,
                 "selectivity_macro_f1": control["best"]["selectivity_macro_f1"] if control else None,
                 "mdl": best.get("mdl")},
        "scalar_mix": mixes or None,
        "control_task": control,
        "learning_curve": curve,
        "warnings": warned,
        "mdl_seconds": round(mdl_seconds, 3) if o.mdl else None,
        "seconds": time.perf_counter() - started,
    }


def _control_task(states: np.ndarray, y: np.ndarray, best: dict[str, Any], singles: list[str],
                  task: dict[str, float], task_f1: dict[str, float], head: str, seed: int, cv: int,
                  tick: Callable[..., None], fits: _Fits,
                  codelength: Callable[[np.ndarray, np.ndarray], dict[str, Any]] | None, *,
                  storage_dtype: str = "float16") -> dict[str, Any]:
    """Same probe on labels permuted once with ``seed`` (same class counts).

    ``task`` and ``task_f1`` map each view of the best pooling to its task
    accuracy and macro-F1; ``codelength(X, labels)`` (None: no MDL) codes the
    permuted labels too.
    """
    y_control = np.random.default_rng(seed).permutation(y)
    folds = list(StratifiedKFold(cv, shuffle=True, random_state=seed).split(np.zeros(len(y)), y_control))
    specs = singles + ([best["view"]] if best["view"] not in singles else [])
    rows = []
    all_scores = fits.cross_validate([(_estimator(spec, head, seed, storage_dtype), _features(spec, states), False)
                                      for spec in specs], y_control, folds)
    for spec, scores in zip(specs, all_scores):
        control = scores["accuracy"]["mean"]
        control_f1 = scores["macro_f1"]["mean"]
        # a learnt mix has no fixed features to code with (as in the sweep)
        code = (codelength(_features(spec, states), y_control)
                if codelength is not None and spec != "scalar_mix" else None)
        rows.append({"view": spec, "pooling": best["pooling"], "layer": single_layer(spec, states.shape[1]),
                     "task_accuracy": task[spec], "control_accuracy": control,
                     "control_accuracy_std": scores["accuracy"]["std"],
                     "control_folds": scores["accuracy"]["folds"], "selectivity": task[spec] - control,
                     "task_macro_f1": task_f1[spec], "control_macro_f1": control_f1,
                     "selectivity_macro_f1": task_f1[spec] - control_f1,
                     "control_compression": code["compression"] if code else None})
    if best["view"] in singles:
        tick(cv + (codelength is not None))  # the best view was one of the layers: its extra fits are not needed
    return {"method": "labels permuted once with the seed (Hewitt & Liang 2019 control task)",
            "pooling": best["pooling"], "results": rows,
            "best": next(r for r in rows if r["view"] == best["view"])}


def _learning_curve(states: np.ndarray, y: np.ndarray, best: dict[str, Any], sizes: list[int],
                    folds: Folds, head: str, seed: int, fits: _Fits,
                    storage_dtype: str = "float16") -> dict[str, Any]:
    """Stratified subsamples of each training fold, scored on the held-out fold."""
    X = _features(best["view"], states)
    estimator = _estimator(best["view"], head, seed, storage_dtype)
    points = []
    for size in sizes:
        sub = [(train_test_split(train, train_size=size, stratify=y[train], random_state=seed)[0], test)
               for train, test in folds]
        scores = fits.cross_validate([(estimator, X, False)], y, sub)[0]
        points.append({"train_size": size, "label": str(size), "accuracy": scores["accuracy"],
                       "macro_f1": scores["macro_f1"]})
    points.append({"train_size": int(np.mean([len(t) for t, _ in folds])), "label": "all",
                   "accuracy": best["accuracy"], "macro_f1": best["macro_f1"]})
    return {"view": best["view"], "pooling": best["pooling"], "points": points}
