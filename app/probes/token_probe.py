"""Token probe: which layer (or view) of a frozen encoder tags words best.

``run_token_probe(train, valid, views=...)`` fits one linear head per word
(noise-aware standardisation + multinomial LogisticRegression) for each view on the
training words' states and scores it on the validation words:

- entity precision / recall / F1 (exact spans, CoNLL semantics, see
  layerbank.app.probes.spans) and word accuracy; with ``span_f1=False`` (tags that are not
  BIO, e.g. part-of-speech) only word accuracy, and f1/precision/recall None;
- a **control task** (Hewitt & Liang, 2019): every word type (the exact word
  string) gets a fixed random tag drawn from the training tag distribution;
  the same head is trained and scored on those tags **with the task's own
  metric** (entity F1 for BIO tags, macro-F1 otherwise), and
  ``selectivity = task metric - control metric`` (``selectivity_accuracy``
  is the same on word accuracy). Word accuracy alone says little here: ``O``
  is ~80% of CoNLL words, so a control head that answers mostly ``O`` scores
  0.82-0.88 and accuracy selectivity is noise. A high selectivity says the
  states encode the task, not just the identity of the word. The draw for a
  word depends only on ``seed`` and the word, so it is reproducible and the
  same in train and valid;
- **MDL** (``mdl=True``, layerbank.app.probes.mdl): the online codelength of
  the covered training words' tags given each view's states, in kbits, and
  the compression (uniform / online); the same for the control tags. Not
  for ``scalar_mix`` (its features are learnt with the head). The view's
  training rows are permuted in place into the code's seeded order first, so
  every block is a slice (gathered rows cost ~2x at every step), and each
  block's C is chosen by the same inner CV walked from the previous block's C
  (``walk_from_previous``: 2-3 Cs a block instead of 4-6; on 29k CoNLL words
  MDL took 17.8 s instead of 24.6 s, compression 9.1921 against 9.1932).

Views: ``"each_layer"`` expands to ``layer:0 .. layer:L``; any other string
is a layerbank.cache.views spec (``layer:-2``, ``concat_last_4``, ``mean_all``,
``weighted:...``, ``all_layers`` flattened), or ``"scalar_mix"``: a learned
ELMo mix of all hidden states fitted jointly with the linear head
(layerbank.app.probes.scalar_mix.ScalarMixHead with ``Cs=(C,)``: the same C as the other
views, not chosen by inner CV; at most ``mix_rounds`` rounds of its
alternating fit, each about one logistic fit: on 20k words a full 30 rounds
took 20 minutes on 2 busy cores); its row adds ``mix`` = {"layer_weights"
(softmax, sums to 1), "gamma", "weighted_view" (the ``weighted:...`` spec that
reproduces the mix up to a shift), "rounds"}; other rows have ``mix`` None.

Memory: ``train.states`` / ``valid.states`` may be an array ``[n_words, H,
d]`` (everything in memory, as ``word_states`` reads it) or a lazy source
with ``view_matrix(view, keep=covered)`` (``word_views``,
layerbank.app.probes.word_views): then each view's matrix is read from the
store when its turn comes and dropped before the next, so the probe holds
one view at a time (the full CoNLL-2003 training set: 2.2 GB of states in
float32 against ~0.3 GB for one layer).

Words the encoder never saw (cut off by truncation, ``covered`` False) are
left out of training, predicted ``"O"`` when scoring (so a gold entity there
counts as missed), and counted in ``n_uncovered``. Their state rows are never
read, so they may hold anything.

The result is JSON-serializable::

    {"rows": [{"view", "f1", "precision", "recall", "word_accuracy",
               "fit_seconds", "control_accuracy", "control_f1" | "control_macro_f1",
               "selectivity", "selectivity_accuracy", "control_fit_seconds",
               "converged", "per_type", "macro_f1", "mdl": {"online_kbits",
               "compression", "control_compression", "seconds", ...}}, ...],
     "best": "layer:3", "metric": "f1", "tags": [...], "n_words": {...},
     "n_uncovered": {...}, "n_hidden_states": H, "hidden_size": d,
     "warnings": ["layer:0: the tagger stopped at max_iter (200, grown to 800) before converging", ...], ...}

Features are standardised once per view by the training rows, without a
copy: the mean and spread are folded into the head's weights
(``Standardizer.rows``, layerbank.linear_probe.standardize.StandardizedRows),
so the fits read the view's matrix as it was read (float16 for a view
wider than one layer: ``concat_last_4`` of the full CoNLL-2003 training set
is 0.63 GB, against 1.25 GB for the float32 copy sklearn needed). Dimensions
whose spread is below one float16 step (stored rounding noise) get no weight;
the row's ``dropped_dims`` counts them: plain standardisation scaled that
noise to unit variance and cost 0.7 F1 on MiniLM's ``layer:-1``. The tagger
and the control head share those rows. The head is
layerbank.linear_probe.logistic's L-BFGS fit of scikit-learn's
``LogisticRegression(C=C)`` objective (multinomial, intercepts unpenalised,
the same stopping rule), streamed over row chunks.

The iteration budget: a tagger gets ``ITER_GROWTH`` times ``max_iter``
L-BFGS iterations in one run (L-BFGS on 200k CoNLL words needed ~400-600
iterations on some views; the default 200 left 4 of 6 views unconverged,
when sklearn's fit was restarted, warm, with the budget doubled). The streamed
fits run whitened (layerbank.linear_probe.whitening): on ``concat_last_4`` the
tagger now takes 46 steps and its control head 71, where they took 229 and 473,
to a lower objective; the full default run went from 16.0 to 5.2 minutes. ``converged`` is
False when the view's tagger or its control head still stopped at that cap; ``warnings`` says which, one sentence per fit, as the
sentence probe's result does, so every table can show it. ``progress(done,
total)`` is called after each fit (a view's tagger, its control head, then
its MDL blocks): on the full CoNLL-2003 training set a fit takes about a
minute.
"""

from __future__ import annotations

import hashlib
import time
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.metrics import f1_score
from threadpoolctl import threadpool_limits

from layerbank.app.probes.mdl import online_codelengths
from layerbank.app.probes.scalar_mix import ScalarMixHead, weighted_view_spec
from layerbank.app.probes.spans import check_bio, span_scores, word_accuracy
from layerbank.cache.views import View, parse_view
from layerbank.linear_probe.logistic import decision, fit_logistic
from layerbank.linear_probe.standardize import Standardizer

__all__ = ["WordStates", "WordStatesLike", "control_tags", "expand_views", "run_token_probe"]

UNCOVERED_TAG = "O"
SCALAR_MIX = "scalar_mix"


class WordStatesLike(Protocol):
    """What the probe reads: any object with these attributes will do."""

    states: np.ndarray  # [n_words_total, H, d], sentences concatenated in order
    words: Sequence[Sequence[str]]
    tags: Sequence[Sequence[str]]


@dataclass
class WordStates:
    """Per-word states of one split of a word set.

    ``states[i]`` is the i-th word of the concatenated sentences, as
    ``[H, d]`` (every hidden state); ``covered`` (bool, one per word) is False
    for words truncated away; None means every word was encoded.
    """

    states: np.ndarray
    words: Sequence[Sequence[str]]
    tags: Sequence[Sequence[str]]
    covered: np.ndarray | None = None


def _checked(split: WordStatesLike, name: str) -> tuple[Any, np.ndarray, np.ndarray]:
    """Validate a split; return (states: an array or a lazy source, covered mask, flat tags)."""
    states = split.states if hasattr(split.states, "view_matrix") else np.asarray(split.states)
    if len(states.shape) != 3:
        raise ValueError(f"{name}.states must be [n_words, H, d], got shape {list(states.shape)}")
    if len(split.words) != len(split.tags):
        raise ValueError(f"{name}: {len(split.words)} sentences of words but {len(split.tags)} of tags")
    for s, (w, t) in enumerate(zip(split.words, split.tags)):
        if len(w) != len(t):
            raise ValueError(f"{name} sentence {s}: {len(w)} words but {len(t)} tags")
    n = sum(len(t) for t in split.tags)
    if states.shape[0] != n:
        raise ValueError(f"{name}: {n} words in the sentences but {states.shape[0]} state rows")
    covered = getattr(split, "covered", None)
    mask = np.ones(n, dtype=bool) if covered is None else np.asarray(covered, dtype=bool)
    if mask.shape != (n,):
        raise ValueError(f"{name}.covered must have one entry per word ({n}), got {list(mask.shape)}")
    flat = np.array([t for sentence in split.tags for t in sentence], dtype=object)
    return states, mask, flat


def expand_views(views: Sequence[str], n_hidden_states: int) -> list[tuple[str, View | None]]:
    """Expand ``each_layer`` and parse every view; duplicates are dropped.

    ``scalar_mix`` has no fixed View (its weights are learned): it comes back as ``None``.
    """
    if isinstance(views, str):
        views = [views]
    names: list[str] = []
    for spec in views:
        if spec == "each_layer":
            names.extend(f"layer:{i}" for i in range(n_hidden_states))
        else:
            names.append(spec)
    out: list[tuple[str, View | None]] = []
    for spec in dict.fromkeys(names):
        if spec == SCALAR_MIX:
            out.append((spec, None))
            continue
        view = parse_view(spec)
        view.needed_layers(n_hidden_states)  # raises ViewError naming the layers that exist
        out.append((spec, view))
    if not out:
        raise ValueError("no views to probe; pass e.g. views=['each_layer']")
    return out


def control_tags(words: Sequence[str], tag_counts: dict[str, int] | Counter[str], seed: int) -> np.ndarray:
    """Control-task tag of each word: a fixed draw per word type.

    The tag is drawn from ``tag_counts`` (normalised) with a uniform number
    hashed from ``(seed, word)``, so a word type always gets the same tag
    regardless of where, or in which split, it appears.
    """
    tags = sorted(tag_counts)
    if not tags:
        raise ValueError("control task needs at least one training tag")
    counts = np.array([tag_counts[t] for t in tags], dtype=np.float64)
    cdf = np.cumsum(counts / counts.sum())
    cache: dict[str, str] = {}
    out = np.empty(len(words), dtype=object)
    for i, word in enumerate(words):
        tag = cache.get(word)
        if tag is None:
            digest = hashlib.blake2b(f"{seed}\x00{word}".encode(), digest_size=8).digest()
            u = int.from_bytes(digest, "big") / 2.0**64
            tag = tags[min(int(np.searchsorted(cdf, u, side="right")), len(tags) - 1)]
            cache[word] = tag
        out[i] = tag
    return out


# a tagger that did not converge in max_iter gets up to this many times the budget, warm-started
ITER_GROWTH = 4


def _fit_predict(
    x_train: Any, y_train: np.ndarray, x_valid: Any, *, seed: int, max_iter: int, c: float,
    mix: bool = False, mix_rounds: int = 10,
) -> tuple[np.ndarray, float, bool, Any]:
    """Predictions on x_valid, fit seconds, converged, and the fitted head (None if not fitted).

    ``x_train`` / ``x_valid`` are ``StandardizedRows`` (``_standardised``: the stored rows,
    standardisation folded into the weights), except for a scalar mix, which takes the
    states ``[n, H, d]`` and standardises what it mixes itself."""
    classes = np.unique(y_train)
    if classes.size == 1:
        # What the head would learn anyway; LogisticRegression refuses one class
        # (possible for control tags of a tiny vocabulary).
        return np.full(x_valid.shape[0], classes[0], dtype=object), 0.0, True, None
    start = time.perf_counter()
    if mix:
        # One C, as for the other views (no inner CV): the head's logistic
        # regression at the uniform mix is then the mean_all row's, up to scaling.
        head = ScalarMixHead(Cs=(c,), random_state=seed, max_iter=mix_rounds).fit(x_train, y_train)
        converged = bool(np.max(head.n_iter_) < head.max_iter)
        return head.predict(x_valid), time.perf_counter() - start, converged, head
    # scikit-learn's LogisticRegression(C=c, solver="lbfgs") objective, streamed over the rows
    # (layerbank.linear_probe.logistic): sklearn would want the standardised float32 (or float64)
    # matrix, 1.25 GB (2.5 GB) for concat_last_4 of the full CoNLL-2003 training set. One
    # L-BFGS run with the whole budget: what sklearn's warm-started restarts reached, without
    # losing the curvature memory at each restart.
    budget = ITER_GROWTH * max_iter
    y_index = np.searchsorted(classes, y_train)
    params, n_iter = fit_logistic(x_train, y_index, int(classes.size), c, max_iter=budget)
    scores = decision(x_valid, params)
    picked = (scores[:, 0] > 0).astype(np.int64) if scores.shape[1] == 1 else scores.argmax(axis=1)
    return classes[picked], time.perf_counter() - start, n_iter < budget, None


def _permute_rows(x: np.ndarray, order: np.ndarray) -> np.ndarray:
    """``x[order]``: in ``x``'s own memory where the probe owns it (a view's matrix read from the
    store), cycle by cycle with one spare row, so no second copy of a corpus-sized matrix is
    made; else (a view of the caller's states) a new array."""
    if not (x.flags.owndata and x.flags.c_contiguous and x.flags.writeable):
        return x[order]
    spare = np.empty_like(x[0])
    dest = order.tolist()
    done = [False] * len(dest)
    for i in range(len(dest)):
        if done[i] or dest[i] == i:
            continue
        spare[...] = x[i]
        j = i
        while True:  # x[j] takes x[dest[j]] along the cycle through i
            done[j] = True
            k = dest[j]
            if k == i:
                x[j] = spare
                break
            x[j] = x[k]
            j = k
    return x


def _mdl_row(x: np.ndarray, y: np.ndarray, y_control: np.ndarray | None, n_tags: int, *, seed: int,
             C: float, max_iter: int, n_jobs: int) -> dict[str, Any]:
    """Online codelength of the tags (and of the control tags) given ``x``: one pass over the
    blocks for both, their fits side by side on ``n_jobs`` threads. ``x`` and the tags are in
    the code's order already (``_permute_rows`` by the code's seeded permutation)."""
    start = time.perf_counter()
    # products in float32 over the stored rows: no block is copied, each is a slice of x
    # (layerbank.app.probes.mdl)
    codes = online_codelengths(x, [y] if y_control is None else [y, y_control], n_tags, seed=seed, C=C,
                               max_iter=max_iter, dtype=np.float32, n_jobs=n_jobs, shuffle=False,
                               walk_from_previous=True)
    task, control = codes[0], (codes[1] if y_control is not None else None)
    return {
        "online_kbits": round(task["online_bits"] / 1000, 3),
        "uniform_kbits": round(task["uniform_bits"] / 1000, 3),
        "compression": task["compression"],
        "control_online_kbits": None if control is None else round(control["online_bits"] / 1000, 3),
        "control_compression": None if control is None else control["compression"],
        "dropped_dims": task["dropped_dims"],
        "converged": task["converged"] and (control is None or control["converged"]),
        "seconds": round(time.perf_counter() - start, 3),
    }


class _Done:
    """A result already computed, read like a Future's (fits run one after another)."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def result(self) -> Any:
        return self.value


def _standardised(x_tr: np.ndarray, x_va: np.ndarray) -> tuple[Any, Any, int]:
    """Both splits standardised by the training rows' mean and spread (float16 rounding noise
    dimensions dropped: see layerbank.linear_probe.standardize), as ``StandardizedRows`` over
    the arrays as they are (no copy; products in float32); and how many dimensions were dropped."""
    scaler = Standardizer("float16", "float32").fit(x_tr)
    return scaler.rows(x_tr), scaler.rows(x_va), scaler.n_dropped


def _split(flat: np.ndarray, like: Sequence[Sequence[str]]) -> list[list[str]]:
    out, pos = [], 0
    for sentence in like:
        out.append([str(t) for t in flat[pos : pos + len(sentence)]])
        pos += len(sentence)
    return out


def run_token_probe(
    train: WordStatesLike,
    valid: WordStatesLike,
    *,
    views: Sequence[str] = ("each_layer",),
    seed: int = 0,
    control_task: bool = True,
    max_iter: int = 200,
    mix_rounds: int = 10,
    C: float = 1.0,
    span_f1: bool = True,
    mdl: bool = True,
    progress: Callable[[int, int], None] | None = None,
    threads: int | None = 1,
    n_jobs: int = 2,
) -> dict[str, Any]:
    """Fit and score a linear word tagger per view; see the module docstring.

    ``threads``: BLAS threads per fit (None: the library's default). ``n_jobs``: fits run
    side by side (the tagger and its control head; the task's and the control's MDL
    blocks). On a shared 2-core machine one BLAS thread per fit and two fits at once was
    5-7x faster than BLAS's own two threads (29k CoNLL words, load 5-7: a tagger 10.6 s
    against 55 s; both codelengths 6 s against 251 s).

    Raises TagSchemeError (a ValueError) naming the sentence and tag if
    ``span_f1`` and the tags are not BIO; ValueError / ViewError for
    inconsistent inputs or unknown views.
    """
    tr_states, tr_cov, tr_tags = _checked(train, "train")
    va_states, va_cov, va_tags = _checked(valid, "valid")
    if tr_states.shape[1:] != va_states.shape[1:]:
        raise ValueError(
            f"train states are [H, d] = {list(tr_states.shape[1:])} per word but valid "
            f"are {list(va_states.shape[1:])}: not the same encoder"
        )
    if span_f1:
        check_bio(train.tags, what="train sentence")
        check_bio(valid.tags, what="valid sentence")
    if len(set(tr_tags[tr_cov])) < 2:
        raise ValueError("the covered training words carry fewer than 2 distinct tags; nothing to learn")
    n_hidden = tr_states.shape[1]
    specs = expand_views(views, n_hidden)
    x_tr_all: Any = None
    x_va_all: Any = None
    lazy = hasattr(tr_states, "view_matrix") or hasattr(va_states, "view_matrix")
    if not lazy:
        # Copy only the covered rows, once, instead of once per view.
        x_tr_all = tr_states if tr_cov.all() else tr_states[tr_cov]
        x_va_all = va_states if va_cov.all() else va_states[va_cov]

    def features(states: Any, cov: np.ndarray, everything: Any, view: View | None) -> np.ndarray:
        # a lazy source (layerbank.app.probes.word_views) reads only this view's layers, covered
        # rows only; a view wider than one layer in the stored dtype where that is exact (the
        # fits read any dtype: concat_last_4 of CoNLL's training set is 0.63 GB in float16)
        if hasattr(states, "view_matrix"):
            wide = view is not None and view.output_dim(n_hidden, states.shape[2]) > states.shape[2]
            return states.view_matrix(view, keep=cov, compact=wide)
        sel = everything if everything is not None else np.asarray(states)[cov]
        return sel if view is None else view.apply(sel).reshape(sel.shape[0], -1)
    gold = [list(t) for t in valid.tags]

    if control_task or mdl:
        counts = Counter(str(t) for t in tr_tags)
        ctl_tr = control_tags([w for s in train.words for w in s], counts, seed)
        ctl_va = control_tags([w for s in valid.words for w in s], counts, seed)
    tag_index = {tag: i for i, tag in enumerate(sorted({str(t) for t in tr_tags}))}

    def indices(tags: np.ndarray) -> np.ndarray:
        return np.array([tag_index[str(t)] for t in tags], dtype=np.int64)

    def metric_of(gold_flat: np.ndarray, predicted_flat: np.ndarray) -> float:
        # the task's own metric: entity F1 over sentences for BIO tags, else macro-F1 over words
        if span_f1:
            return span_scores(_split(gold_flat, valid.tags), _split(predicted_flat, valid.tags)).f1
        return float(f1_score(gold_flat.astype(str), predicted_flat.astype(str), average="macro",
                              zero_division=0))

    def full_prediction(predicted_covered: np.ndarray) -> np.ndarray:
        full = np.full(va_tags.shape[0], UNCOVERED_TAG, dtype=object)
        full[va_cov] = predicted_covered
        return full

    rows: list[dict[str, Any]] = []
    warned: list[str] = []
    # a tick per fit: the tagger, the control head, the MDL blocks (not for a scalar mix)
    n_fits = sum(1 + control_task + (mdl and view is not None) for _, view in specs)
    done = 0

    def tick() -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, n_fits)

    def not_converged(name: str, what: str, mix: bool) -> str:
        limit = (f"{mix_rounds} rounds of the scalar mix" if mix
                 else f"max_iter ({max_iter}, grown to {ITER_GROWTH * max_iter})")
        return f"{name}: {what} stopped at {limit} before converging"

    if progress is not None:
        progress(0, n_fits)

    def view_row(name: str, view: View | None, pool: ThreadPoolExecutor | None) -> dict[str, Any]:
        mix = view is None
        # view None: [n, H, d], the head mixes the states itself
        x_tr = features(tr_states, tr_cov, x_tr_all, view)
        code, dropped = None, None
        y_tr, y_ctl = tr_tags[tr_cov], (ctl_tr[tr_cov] if control_task else None)
        if not mix:
            if mdl:  # on the stored values: each block is standardised from the rows sent before it
                # The training rows in the code's order (online_codelengths' seeded permutation), in
                # place: the blocks are then slices, which the fits read ~2x faster than gathered
                # rows; the tagger and the control head read the same rows (their fits do not
                # depend on the order of the rows).
                order = np.random.default_rng(seed).permutation(x_tr.shape[0])
                x_tr, y_tr = _permute_rows(x_tr, order), y_tr[order]
                y_ctl = None if y_ctl is None else y_ctl[order]
                code = _mdl_row(x_tr, indices(y_tr), None if y_ctl is None else indices(y_ctl),
                                len(tag_index), seed=seed, C=C, max_iter=max_iter, n_jobs=n_jobs)
                tick()
        # read after MDL: its blocks (up to half the training rows) and this matrix are not held at once
        x_va = features(va_states, va_cov, x_va_all, view)
        if not mix:
            x_tr, x_va, dropped = _standardised(x_tr, x_va)
        def fit(y: np.ndarray) -> tuple[np.ndarray, float, bool, Any]:
            return _fit_predict(x_tr, y, x_va, seed=seed, max_iter=max_iter, c=C, mix=mix, mix_rounds=mix_rounds)
        # the tagger and the control head read the same standardised rows, side by side
        control_fit = None
        if y_ctl is not None:
            control_fit = pool.submit(fit, y_ctl) if pool is not None else _Done(fit(y_ctl))
        pred, seconds, converged, head = fit(y_tr)
        tick()
        if not converged:
            warned.append(not_converged(name, "the tagger", mix))
        predicted = _split(full_prediction(pred), valid.tags)
        row: dict[str, Any] = {"view": name}
        if span_f1:
            scores = span_scores(gold, predicted)
            row.update(f1=scores.f1, precision=scores.precision, recall=scores.recall)
            row["word_accuracy"] = scores.word_accuracy
            row["per_type"] = {k: vars(v) for k, v in scores.per_type.items()}
        else:
            row.update(f1=None, precision=None, recall=None)
            row["word_accuracy"] = word_accuracy(gold, predicted)
        row["macro_f1"] = metric_of(va_tags, full_prediction(pred)) if not span_f1 else None
        row["fit_seconds"] = seconds
        row["converged"] = converged
        row["dropped_dims"] = dropped
        row["mix"] = None
        if mix and head is not None:
            row["mix"] = {
                "layer_weights": [float(w) for w in head.layer_weights_],
                "gamma": float(head.gamma_),
                "weighted_view": weighted_view_spec(head),
                "rounds": int(head.n_iter_),
            }
        control_key = "control_f1" if span_f1 else "control_macro_f1"
        row.update({"control_accuracy": None, control_key: None, "selectivity": None,
                    "selectivity_accuracy": None, "control_fit_seconds": None})
        if control_fit is not None:
            c_pred, c_seconds, c_converged, _ = control_fit.result()
            tick()
            if not c_converged:
                warned.append(not_converged(name, "the control task's head", mix))
            c_full = full_prediction(c_pred)
            c_acc = float(np.mean(c_full == ctl_va)) if ctl_va.size else 0.0
            c_metric = metric_of(ctl_va, c_full)
            task_metric = row["f1"] if span_f1 else row["macro_f1"]
            row.update({
                "control_accuracy": c_acc,
                control_key: c_metric,
                "selectivity": task_metric - c_metric,
                "selectivity_accuracy": row["word_accuracy"] - c_acc,
                "control_fit_seconds": c_seconds,
            })
            row["converged"] = converged and c_converged
        row["mdl"] = code
        if code is not None and not code["converged"]:
            warned.append(f"{name}: an MDL block's fit stopped at max_iter ({max_iter}) before converging")
        # this view's matrices go when this returns, before the next view's are built
        return row

    pool = ThreadPoolExecutor(n_jobs) if n_jobs > 1 and control_task else None
    with threadpool_limits(limits=threads), warnings.catch_warnings():
        # convergence is read from each fit's iteration count (warnings are process-wide, not per thread)
        warnings.simplefilter("ignore", ConvergenceWarning)
        try:
            for name, view in specs:
                rows.append(view_row(name, view, pool))
        finally:
            if pool is not None:
                pool.shutdown()

    metric = "f1" if span_f1 else "word_accuracy"
    best = max(rows, key=lambda r: r[metric])  # first of equals: the earlier view
    return {
        "rows": rows,
        "best": best["view"],
        "metric": metric,
        "tags": sorted({str(t) for t in tr_tags}),
        "n_words": {"train": int(tr_tags.shape[0]), "valid": int(va_tags.shape[0])},
        "n_uncovered": {"train": int((~tr_cov).sum()), "valid": int((~va_cov).sum())},
        "uncovered_policy": f"left out of training; predicted {UNCOVERED_TAG!r} when scoring",
        "n_hidden_states": int(n_hidden),
        "hidden_size": int(tr_states.shape[2]),
        "seed": seed,
        "control_task": control_task,
        "warnings": warned,
    }
