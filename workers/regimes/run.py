"""Freeze or fine-tune, measured: every regime on one stratified split.

``run_regimes`` splits the labelled texts once (stratified train/validation/
test, ``split_seed``), then for each training size and seed trains every
requested regime (``layerbank.workers.regimes.trainable``) and scores it on the same test split.

* ``frozen`` is the probe on cached features: mean-pooled hidden states
  ``[n, L + 1, d]`` (``frozen_features``, as the store holds them; computed
  with the encoder in inference mode, float32, when not given). For every
  hidden state the probe sweep's logistic head is fit on train (the same
  noise-aware standardisation and inner-CV choice of C, from
  ``layerbank.linear_probe``; ``linear_probe.probe_layers``); the state with
  the best validation macro-F1 (first on ties) is scored on test. Its inner
  folds come from ``split_seed``, so it is deterministic and its spread over
  seeds comes only from the training subsample (zero when the whole train
  split is used). ``storage_dtype``: what given features were stored as
  (their noise floor; computed ones are float32).
* the other regimes fine-tune a copy of the encoder (``layerbank.workers.regimes.finetune``),
  the head starting by default from a probe on the last hidden state of the
  same training rows (LP-FT; ``probe_head``).

Rows: one per ``layerbank.regime_names.variants`` entry (``top_k`` once per
cut point, ``full`` / ``top_k`` / ``gradual`` once per ``xi`` value when
several are given); each block adds ``layer_cut`` and ``xi_sweep``
(``layerbank.workers.regimes.curves``), and a learning curve ``crossover``.

With ``train_sizes``, seed ``s`` draws a stratified subsample of the train
split that every regime shares (paired comparison); validation and test stay
fixed. The headline (``regimes``, ``best``, ...) is the largest size. Without
``seeds``, each size gets ``options.default_seeds(size)`` seeds (more for
smaller sets; ``settings.seed_rule`` says so).

``eval_sets`` (name -> (texts, labels)): extra evaluation sets, e.g. a
shifted domain. Every regime's chosen state is scored on each with the same
standing as the in-domain test split; each row gets ``evals`` (scores over
seeds and the in-domain minus out-of-domain gap) and the verdict ``by_eval``
(Kumar et al. 2022: LP-FT gained ~1% in distribution but ~10% out of it over
full fine-tuning, so one in-domain score can hide the difference that
matters). Their labels must be among the training classes.

Selection uses test macro-F1: ``best`` has the highest mean; ``within_noise``
lists the regimes whose mean is within one standard deviation (ddof=1 over
seeds) of the best's; ``cheapest_within_one_std`` is the one of those with
the fewest bytes to store per task (float32: head, plus biases, adapters,
layers or the whole encoder). Shares are trainable / (encoder + head), the
unused pooler excluded. Each run records ``converged``: for a fine-tune,
whether validation macro-F1 stopped improving before the epoch budget ran
out (best epoch < ``max_epochs``; still rising at the last epoch means more
epochs might score higher); for ``frozen``, whether every logistic fit
stopped before ``max_iter``. ``progress(done, total)`` counts epochs (a
frozen probe counts one); ``stage(text)`` names each regime and seed as it
starts ("lora, seed 2 of 3, 400 training texts"). With ``out_dir``, each run's trained tensors go to
``out_dir/size<n>/<regime>/seed<s>.safetensors`` with a JSON sidecar; the
model directory is never written.

Example::

    >>> result = run_regimes(texts, labels, regimes=("frozen", "lora"), seeds=3)
    >>> result["best"], result["cheapest_within_one_std"]
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from layerbank.cache.fingerprint import default_model_path
from layerbank.regime_names import REGIMES, Variant, variants
from layerbank.workers.batching import token_budget_batches
from layerbank.workers.encoder import Encoder, Tokenized
from layerbank.workers.regimes.curves import crossover, layer_cut, xi_sweep
from layerbank.workers.regimes.families import describe, layout_summary, require
from layerbank.workers.regimes.finetune import Split, TrainSettings, finetune
from layerbank.workers.regimes.linear_probe import probe_head, probe_layers, stratified_split, subsample
from layerbank.workers.regimes.options import RegimesOptions, default_seeds
from layerbank.workers.regimes.resources import PeakMemory, check_cancel, freeing_on_cancel
from layerbank.workers.regimes.result import choose, save_artifact, table_row
from layerbank.workers.regimes.trainable import LORA_RANK, encoder_params

__all__ = ["DEFAULT_LR", "RegimesOptions", "run_regimes"]

# Encoder learning rates (the head always uses head_lr): few parameters need
# large steps (BitFit, LoRA), whole layers need small ones.
DEFAULT_LR = {"bitfit": 1e-3, "bitfit_query": 1e-3, "lora": 5e-4, "top_k": 5e-5, "gradual": 5e-5, "full": 5e-5}
Progress = Callable[[int, int], None] | None


def run_regimes(texts: Sequence[str], labels: Sequence[Any], options: RegimesOptions | None = None, *,
                model_path: str | None = None, frozen_features: np.ndarray | None = None,
                out_dir: str | os.PathLike[str] | None = None, progress: Progress = None,
                should_cancel: Callable[[], bool] | None = None,
                stage: Callable[[str], None] | None = None,
                eval_sets: Mapping[str, tuple[Sequence[str], Sequence[Any]]] | None = None,
                **option_fields: Any) -> dict[str, Any]:
    """Train and score every regime; return a JSON-serialisable result (module docstring).

    ``options`` (layerbank.workers.regimes.options.RegimesOptions) says what to
    train; its fields may be given as keywords instead (``regimes=..., seeds=2``),
    or override some of ``options``'. The rest is the data and the hooks.

    ``top_k`` is how many bottom layers the ``top_k`` regime freezes, or a list of such cut
    points (one row each, ``top_k:k``; default every layer count 0..L, every other above 12
    layers: ``layer_cut`` in each block); ``xi`` the per-layer rate factor of ``full``,
    ``top_k`` and ``gradual``, or a list of them (one row each: ``xi_sweep``);
    ``max_epochs`` may map each train size to its epoch budget; ``lr`` overrides
    ``DEFAULT_LR`` for all regimes (a float) or some (a mapping); ``head_init``
    "probe" starts every fine-tuned head from ``probe_head`` on the last hidden
    state's mean-pooled features of the same training rows, "random" from
    PyTorch's init. Raises
    ``Cancelled`` (memory already freed) when ``should_cancel()`` turns true, and
    ``ValueError`` for inconsistent input.
    """
    o = RegimesOptions(**option_fields) if options is None else replace(options, **option_fields)
    regimes = REGIMES if o.regimes is None else o.regimes
    seeds, top_k, train_sizes, split_seed = o.seeds, o.top_k, o.train_sizes, o.split_seed
    max_epochs, lr, head_init, device = o.max_epochs, o.lr, o.head_init, o.device
    unknown = set(regimes) - set(REGIMES)
    if unknown or not regimes:
        raise ValueError(f"unknown regimes {sorted(unknown)}; choose from {REGIMES}")
    if len(texts) != len(labels):
        raise ValueError(f"{len(texts)} texts but {len(labels)} labels")
    sizes: list[int | None] = [*sorted(set(train_sizes))] if train_sizes else [None]
    model_path = str(model_path or default_model_path())
    out = None if out_dir is None else Path(out_dir).resolve()
    if out is not None and out.is_relative_to(Path(model_path).resolve()):
        raise ValueError("out_dir must not be inside the model directory (weights are read-only)")
    if head_init not in ("probe", "random"):
        raise ValueError(f"head_init must be 'probe' or 'random', got {head_init!r}")
    rates = dict(DEFAULT_LR)
    rates.update(lr if isinstance(lr, Mapping) else {} if lr is None else dict.fromkeys(rates, lr))
    dev = device if device != "auto" else ("cuda" if _cuda() else "cpu")
    for name, (eval_texts, eval_labels) in (eval_sets or {}).items():
        if len(eval_texts) != len(eval_labels) or not len(eval_texts):
            raise ValueError(f"evaluation set {name!r}: {len(eval_texts)} texts and {len(eval_labels)} "
                             "labels (needs the same number, at least one)")
    job = _Job(regimes=tuple(regimes), seeds=None if seeds is None else
               [*range(seeds)] if isinstance(seeds, int) else [*seeds],
               sizes=sizes, epochs={s: _epochs(max_epochs, s) for s in sizes},
               split_seed=split_seed, top_k=top_k, xi=o.xi, patience=o.patience, batch_size=o.batch_size,
               rates=rates, head_lr=o.head_lr, head_init=head_init, device=dev, out=out, progress=progress,
               should_cancel=should_cancel, stage=stage, eval_sets=dict(eval_sets or {}),
               storage_dtype=o.storage_dtype)
    return freeing_on_cancel(dev, job.run, list(texts), labels, model_path, o.test_size, o.val_size,
                             o.max_length, frozen_features)


def _epochs(max_epochs: int | Mapping[int, int], size: int | None) -> int:
    if isinstance(max_epochs, Mapping):
        if size is None or size not in max_epochs:
            raise ValueError("max_epochs as a mapping needs an entry for every train size")
        return int(max_epochs[size])
    return int(max_epochs)


def _cuda() -> bool:
    import torch
    return bool(torch.cuda.is_available())


@dataclass
class _Job:
    """One regimes job's settings, and the data it loads as it runs."""

    regimes: tuple[str, ...]
    seeds: list[int] | None  # None: options.default_seeds per training size
    sizes: list[int | None]
    epochs: dict[int | None, int]
    split_seed: int
    top_k: int | Sequence[int] | None
    xi: float | Sequence[float] | None
    patience: int
    batch_size: int
    rates: dict[str, float]
    head_lr: float
    head_init: str
    device: str
    out: Path | None
    progress: Progress
    should_cancel: Callable[[], bool] | None
    stage: Callable[[str], None] | None = None
    eval_sets: dict[str, tuple[Sequence[str], Sequence[Any]]] | None = None
    storage_dtype: str = "float16"
    features_dtype: str = "float32"  # the frozen features' noise floor: storage_dtype when given
    done: int = 0
    total: int = 0

    def _seeds(self, n_train: int) -> list[int]:
        return self.seeds if self.seeds is not None else [*range(default_seeds(n_train))]

    def _tick(self, done: int) -> None:
        self.done = done
        if self.progress is not None:
            self.progress(done, self.total)

    def run(self, texts: list[str], labels: Sequence[Any], model_path: str, test_size: float,
            val_size: float, max_length: int, features: np.ndarray | None) -> dict[str, Any]:
        classes, y = np.unique(np.asarray(labels), return_inverse=True)
        train, val, test = stratified_split(y, test_size, val_size, self.split_seed)
        index = {c: i for i, c in enumerate(classes.tolist())}
        evals_y = {}
        for name, (_, eval_labels) in (self.eval_sets or {}).items():
            unknown = sorted({str(v) for v in np.asarray(eval_labels).tolist() if v not in index})
            if unknown:
                raise ValueError(f"evaluation set {name!r}: labels {unknown[:5]} are not among the "
                                 f"training classes {classes.tolist()}")
            evals_y[name] = np.array([index[v] for v in np.asarray(eval_labels).tolist()])
        seeds_by_size = {s: self._seeds(len(train) if s is None else min(s, len(train))) for s in self.sizes}
        encoder = Encoder.load(model_path, device=self.device, precision="fp32", max_length=max_length)
        # where its layers and projections are; what cannot be found fails here, before any work
        layout = describe(encoder.torch_model())
        require(layout, self.regimes, name=repr(model_path))
        ids = encoder.tokenize(texts).input_ids
        eval_ids = {name: encoder.tokenize(list(t)).input_ids for name, (t, _) in (self.eval_sets or {}).items()}
        config = encoder.torch_model().config
        n_layers = int(config.num_hidden_layers)
        rows_of = variants(self.regimes, n_layers, self.top_k, self.xi)  # cut points, xi values: one row each
        trained = [v for v in rows_of if v.regime != "frozen"]
        self.total = sum(len(seeds_by_size[s]) * (("frozen" in self.regimes) + len(trained) * self.epochs[s])
                         for s in self.sizes)
        feature_seconds = 0.0
        lp_ft = self.head_init == "probe" and bool(trained)
        self.features_dtype = self.storage_dtype if features is not None else "float32"
        if ("frozen" in self.regimes or lp_ft) and features is None:
            started = time.perf_counter()
            features = _mean_features(encoder, ids, self.should_cancel)
            feature_seconds = time.perf_counter() - started
        if features is not None and features.shape[0] != len(texts):
            raise ValueError(f"frozen_features has {features.shape[0]} rows for {len(texts)} texts")
        eval_features = ({name: _mean_features(encoder, e_ids, self.should_cancel)
                          for name, e_ids in eval_ids.items()} if "frozen" in self.regimes else {})
        eval_splits = {name: Split(e_ids, evals_y[name]) for name, e_ids in eval_ids.items()}
        meta = {"model_path": model_path, "model_fingerprint": encoder.fingerprint,
                "classes": classes.tolist()}

        def split(rows: np.ndarray) -> Split:
            return Split([ids[i] for i in rows], y[rows])

        curve = []
        for size in self.sizes:
            runs: dict[str, list[dict[str, Any]]] = {v.key: [] for v in rows_of}
            probes: dict[bytes, dict[str, Any]] = {}
            seeds = seeds_by_size[size]
            for seed in seeds:
                rows = subsample(train, y, size, self.split_seed, seed)
                head = None
                if lp_ft:
                    assert features is not None
                    head = probe_head(features[rows, -1], y[rows], len(classes), self.split_seed)
                stem = f"size{len(rows)}/{{}}/seed{seed}"
                for v in rows_of:
                    regime = v.regime
                    check_cancel(self.should_cancel)
                    if self.stage is not None:
                        self.stage(f"{v.key}, seed {seeds.index(seed) + 1} of {len(seeds)}, "
                                   f"{len(rows)} training texts")
                    if regime == "frozen":
                        assert features is not None
                        if rows.tobytes() not in probes:  # deterministic: fit once per subset
                            probes[rows.tobytes()] = self._probe(
                                features, y, rows, val, test, stem.format("frozen"), meta,
                                {n: (eval_features[n], evals_y[n]) for n in eval_features})
                        runs[regime].append({"seed": seed, **probes[rows.tobytes()]})
                        self._tick(self.done + 1)
                        continue
                    runs[v.key].append(self._finetune(v, seed, size, head, stem.format(_file_safe(v.key)),
                                                      encoder, split(rows), split(val), split(test),
                                                      len(classes), meta, eval_splits))
            table = {v.key: {**table_row(v.regime, runs[v.key], config, _cut(v, n_layers), len(classes),
                                         encoder_params(encoder.torch_model()), feature_seconds, model=encoder.torch_model()),
                             **_what(v, n_layers)} for v in rows_of}
            block: dict[str, Any] = {"train_size": len(rows), "regimes": table, **choose(table)}
            cut = layer_cut(table, n_layers)
            if cut is not None and len(cut["points"]) > 1:
                block["layer_cut"] = cut
            sweep = xi_sweep(table)
            if sweep:
                block["xi_sweep"] = sweep
            curve.append(block)
        result = {"model": {"path": model_path, "fingerprint": encoder.fingerprint,
                            "encoder_params": encoder_params(encoder.torch_model()),
                            "num_layers": int(config.num_hidden_layers),
                            "hidden_size": int(config.hidden_size),
                            "layout": layout_summary(encoder.torch_model())},
                  "split": {"n_train": len(train), "n_val": len(val), "n_test": len(test),
                            "split_seed": self.split_seed, "test_size": test_size, "val_size": val_size},
                  "settings": {"seeds": seeds_by_size[self.sizes[-1]],
                               "seeds_by_size": {str(len(train) if s is None else s): len(v)
                                                 for s, v in seeds_by_size.items()},
                               "seed_rule": None if self.seeds is not None else
                               "ceil(1500 / training texts) seeds, within [2, 10]",
                               "eval_sets": {n: len(v) for n, v in evals_y.items()},
                               "top_k": sorted({v.top_k for v in rows_of if v.top_k is not None}),
                               "xi": self.xi, "xi_default": "gradual: 1/2.6 (ULMFiT); full and top_k: 1 "
                               "(one rate); lr of layer l (1..L) = lr * xi ** (L - l), embeddings xi ** L",
                               "max_epochs": {str(s): e for s, e in self.epochs.items()},
                               "patience": self.patience, "batch_size": self.batch_size,
                               "lr": self.rates, "head_lr": self.head_lr, "head_init": self.head_init,
                               "max_length": max_length,
                               "device": self.device, "lora_rank": LORA_RANK},
                  "classes": classes.tolist(), "score": "test macro-F1", **curve[-1]}
        if self.sizes != [None]:
            result["learning_curve"] = curve
            cross = crossover(curve)
            if cross is not None:
                result["crossover"] = cross
        return result

    def _finetune(self, v: Variant, seed: int, size: int | None,
                  head: tuple[np.ndarray, np.ndarray] | None, stem: str, encoder: Encoder,
                  train: Split, val: Split, test: Split, n_classes: int,
                  meta: dict[str, Any], evals: dict[str, Split]) -> dict[str, Any]:
        regime = v.regime
        n_frozen = _cut(v, int(encoder.torch_model().config.num_hidden_layers))
        settings = TrainSettings(regime=regime, lr=self.rates[regime], head_lr=self.head_lr,
                                 max_epochs=self.epochs[size], patience=self.patience,
                                 batch_size=self.batch_size, top_k=n_frozen, seed=seed,
                                 device=self.device, head_init=head, xi=v.xi)
        base = self.done
        run = finetune(encoder.torch_model(), train, val, test, n_classes,
                       int(encoder.tokenizer.pad_token_id or 0), settings,
                       lambda epoch, _total: self._tick(base + epoch), self.should_cancel, evals)
        self._tick(base + self.epochs[size])  # early stopping skips the rest
        scores = {k: v for k, v in vars(run).items() if k != "state"}
        scores["converged"] = run.best_epoch < self.epochs[size]  # else still improving at the budget's end
        save_artifact(self.out, stem, run.state,
                      {"regime": regime, "variant": v.key, "xi": v.xi, "seed": seed, **meta, "top_k": n_frozen,
                       "lora_rank": LORA_RANK,
                       "lr": self.rates[regime], "head_init": self.head_init,
                       "head": "linear on mean-pooled last hidden state", **scores})
        return {"seed": seed, **scores, "stored_params": sum(t.numel() for t in run.state.values())}

    def _probe(self, features: np.ndarray, y: np.ndarray, rows: np.ndarray, val: np.ndarray,
               test: np.ndarray, stem: str, meta: dict[str, Any],
               evals: dict[str, tuple[np.ndarray, np.ndarray]]) -> dict[str, Any]:
        with PeakMemory("cpu") as memory:  # scikit-learn runs on the CPU whatever the device
            started = time.perf_counter()
            metrics, arrays = probe_layers(features, y, rows, val, test, evals,
                                           storage_dtype=self.features_dtype, random_state=self.split_seed)
            seconds = time.perf_counter() - started
        save_artifact(self.out, stem, arrays, {"regime": "frozen", **meta, "pooling": "mean", **metrics})
        return {**metrics, "seconds_per_epoch": seconds, "peak_memory_bytes": memory.peak_bytes,
                "peak_memory_kind": memory.kind, "epochs": 1}


def _cut(v: Variant, n_layers: int) -> int:
    """Bottom layers frozen: the variant's cut for top_k, half for the rest (unused by them)."""
    return n_layers // 2 if v.top_k is None else v.top_k


def _what(v: Variant, n_layers: int) -> dict[str, Any]:
    """What a row was trained with: its regime, cut (and fine-tuned layers) and rate factor."""
    out: dict[str, Any] = {"regime": v.regime, "xi": v.xi}
    if v.top_k is not None:
        out.update(top_k=v.top_k, fine_tuned_layers=n_layers - v.top_k)
    return out


def _file_safe(key: str) -> str:
    return key.replace(":", "_").replace("=", "")


def _mean_features(encoder: Encoder, ids: list[list[int]],
                   should_cancel: Callable[[], bool] | None) -> np.ndarray:
    """Mean-pooled hidden states ``[n, L + 1, d]``, as extraction stores them."""
    out: np.ndarray | None = None
    for batch in token_budget_batches([len(r) for r in ids], max_tokens=8192):
        check_cancel(should_cancel)
        pooled = encoder.encode(Tokenized([ids[i] for i in batch], [False] * len(batch))).pooled["mean"]
        if out is None:
            out = np.empty((len(ids), *pooled.shape[1:]), dtype=np.float32)
        out[batch] = pooled
    assert out is not None
    return out
