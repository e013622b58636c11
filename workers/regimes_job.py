"""Freeze or fine-tune, measured: every regime on one stratified split.

``run_regimes`` splits the labelled texts once (stratified train/validation/
test, ``split_seed``), then for each training size and seed trains every
requested regime (``workers.regimes``) and scores it on the same test split.

* ``frozen`` is the probe on cached features: mean-pooled hidden states
  ``[n, L + 1, d]`` (``frozen_features``, as the store holds them; computed
  with the encoder in inference mode, float32, when not given). For every
  hidden state a StandardScaler + LogisticRegression (C=1, lbfgs) is fit on
  train; the state with the best validation macro-F1 (first on ties) is
  scored on test. It is deterministic, so its spread over seeds comes only
  from the training subsample (zero when the whole train split is used).
* the other regimes fine-tune a copy of the encoder (``workers.finetune``).

With ``train_sizes``, seed ``s`` draws a stratified subsample of the train
split that every regime shares (paired comparison); validation and test stay
fixed. The headline (``regimes``, ``best``, ...) is the largest size.

Selection uses test macro-F1: ``best`` has the highest mean; ``within_noise``
lists the regimes whose mean is within one standard deviation (ddof=1 over
seeds) of the best's; ``cheapest_within_one_std`` is the one of those with
the fewest bytes to store per task (float32: head, plus biases, adapters,
layers or the whole encoder). Shares are trainable / (encoder + head), the
unused pooler excluded. With ``out_dir``, each run's trained tensors go to
``out_dir/size<n>/<regime>/seed<s>.safetensors`` with a JSON sidecar; the
model directory is never written.

Example::

    >>> result = run_regimes(texts, labels, regimes=("frozen", "lora"), seeds=3)
    >>> result["best"], result["cheapest_within_one_std"]
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import accuracy_score, f1_score
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler
from threadpoolctl import threadpool_limits

from cache.fingerprint import default_model_path
from workers.batching import token_budget_batches
from workers.encoder import Encoder, Tokenized
from workers.finetune import Split, TrainSettings, finetune
from workers.regimes import LORA_RANK, REGIMES, default_top_k, encoder_params, expected_trainable, head_params
from workers.resources import PeakMemory, check_cancel, freeing_on_cancel

__all__ = ["DEFAULT_LR", "choose", "probe_layers", "run_regimes", "stratified_split"]

# Encoder learning rates (the head always uses head_lr): few parameters need
# large steps (BitFit, LoRA), whole layers need small ones.
DEFAULT_LR = {"bitfit": 1e-3, "lora": 5e-4, "top_k": 5e-5, "gradual": 5e-5, "full": 5e-5}
Progress = Callable[[int, int], None] | None


def stratified_split(labels: np.ndarray, test_size: float, val_size: float,
                     seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Indices of train, validation and test, each stratified by label."""
    idx = np.arange(len(labels))
    rest, test = train_test_split(idx, test_size=test_size, stratify=labels, random_state=seed)
    train, val = train_test_split(rest, test_size=val_size / (1 - test_size),
                                  stratify=labels[rest], random_state=seed)
    return np.sort(train), np.sort(val), np.sort(test)


def _subsample(train: np.ndarray, labels: np.ndarray, size: int | None, split_seed: int,
               seed: int) -> np.ndarray:
    if size is None or size >= len(train):
        return train
    state = int(np.random.SeedSequence([split_seed, seed, size]).generate_state(1)[0])
    part, _ = train_test_split(train, train_size=size, stratify=labels[train], random_state=state)
    return np.sort(part)


def probe_layers(features: np.ndarray, y: np.ndarray, train: np.ndarray, val: np.ndarray,
                 test: np.ndarray) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Scaler + logistic regression per hidden state; pick by validation macro-F1."""
    # One BLAS thread: each fit is small (n x d), and on a busy machine waking
    # BLAS threads cost 100x the fit itself (measured: 0.35 s against 3 ms).
    with threadpool_limits(limits=1):
        return _probe_layers(features, y, train, val, test)


def _probe_layers(features: np.ndarray, y: np.ndarray, train: np.ndarray, val: np.ndarray,
                  test: np.ndarray) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    best: tuple[float, int, StandardScaler, LogisticRegression] | None = None
    val_f1s = []
    for layer in range(features.shape[1]):
        scaler = StandardScaler().fit(features[train, layer])
        clf = LogisticRegression(C=1.0, max_iter=2000)
        clf.fit(scaler.transform(features[train, layer]), y[train])
        f1 = float(f1_score(y[val], clf.predict(scaler.transform(features[val, layer])), average="macro"))
        val_f1s.append(f1)
        if best is None or f1 > best[0]:
            best = (f1, layer, scaler, clf)
    assert best is not None
    f1, layer, scaler, clf = best
    pred = clf.predict(scaler.transform(features[test, layer]))
    arrays = {"scaler_mean": scaler.mean_, "scaler_scale": scaler.scale_, "coef": clf.coef_,
              "intercept": clf.intercept_}
    metrics = {"layer": layer, "val_macro_f1": f1, "val_macro_f1_by_layer": val_f1s,
               "test_accuracy": float(accuracy_score(y[test], pred)),
               "test_macro_f1": float(f1_score(y[test], pred, average="macro")),
               "trainable": int(clf.coef_.size + clf.intercept_.size)}
    stored = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in arrays.items()}
    metrics["stored_params"] = sum(int(v.size) for v in stored.values())
    return metrics, stored


def choose(regimes: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Best regime by mean macro-F1, those within one std of it, the cheapest of those."""
    best = max(regimes, key=lambda r: regimes[r]["macro_f1_mean"])
    floor = regimes[best]["macro_f1_mean"] - regimes[best]["macro_f1_std"]
    near = [r for r in regimes if regimes[r]["macro_f1_mean"] >= floor]
    cheapest = min(near, key=lambda r: (regimes[r]["bytes_per_task"], regimes[r]["trainable_params"]))
    return {"best": best, "within_noise": near, "cheapest_within_one_std": cheapest}


def _save(out_dir: Path | None, stem: str, tensors: Mapping[str, Any], meta: dict[str, Any]) -> None:
    """Write ``stem.safetensors`` + ``stem.json`` atomically (no pickle anywhere)."""
    if out_dir is None:
        return
    path = out_dir / stem
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".safetensors.tmp")
    first = next(iter(tensors.values()))
    if isinstance(first, np.ndarray):
        from safetensors.numpy import save_file as save_numpy
        save_numpy(dict(tensors), str(tmp))
    else:
        from safetensors.torch import save_file as save_torch
        save_torch({k: v.contiguous() for k, v in tensors.items()}, str(tmp))
    os.replace(tmp, path.with_suffix(".safetensors"))
    path.with_suffix(".json").write_text(json.dumps(meta, indent=1))


def _summary(runs: list[dict[str, Any]], **fixed: Any) -> dict[str, Any]:
    out = dict(fixed)
    for key, name in (("test_accuracy", "accuracy"), ("test_macro_f1", "macro_f1")):
        vals = np.array([r[key] for r in runs], dtype=float)
        out[f"{name}_mean"] = float(vals.mean())
        out[f"{name}_std"] = float(vals.std(ddof=1)) if len(vals) > 1 else 0.0
    out["seconds_per_epoch"] = float(np.mean([r["seconds_per_epoch"] for r in runs]))
    out["peak_memory_bytes"] = int(max(r["peak_memory_bytes"] for r in runs))
    out["runs"] = runs
    return out


def run_regimes(texts: Sequence[str], labels: Sequence[Any], *, model_path: str | None = None,
                regimes: Sequence[str] = REGIMES, seeds: int | Sequence[int] = 3,
                top_k: int | None = None, train_sizes: Sequence[int] | None = None,
                split_seed: int = 0, test_size: float = 0.2, val_size: float = 0.1,
                max_epochs: int | Mapping[int, int] = 10, patience: int = 2, batch_size: int = 16,
                lr: float | Mapping[str, float] | None = None, head_lr: float = 1e-3,
                max_length: int = 128, device: str = "auto",
                frozen_features: np.ndarray | None = None, out_dir: str | os.PathLike[str] | None = None,
                progress: Progress = None,
                should_cancel: Callable[[], bool] | None = None) -> dict[str, Any]:
    """Train and score every regime; return a JSON-serialisable result (module docstring).

    ``top_k`` is how many bottom layers the ``top_k`` regime freezes (default half);
    ``max_epochs`` may map each train size to its epoch budget; ``lr`` overrides
    ``DEFAULT_LR`` for all regimes (a float) or some (a mapping). Raises
    ``Cancelled`` (memory already freed) when ``should_cancel()`` turns true, and
    ``ValueError`` for inconsistent input.
    """
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
    rates = dict(DEFAULT_LR)
    rates.update(lr if isinstance(lr, Mapping) else dict.fromkeys(rates, lr) if lr else {})
    dev = device if device != "auto" else ("cuda" if _cuda() else "cpu")
    job = _Job(regimes=tuple(regimes), seeds=[*range(seeds)] if isinstance(seeds, int) else [*seeds],
               sizes=sizes, epochs={s: _epochs(max_epochs, s) for s in sizes},
               split_seed=split_seed, top_k=top_k, patience=patience, batch_size=batch_size,
               rates=rates, head_lr=head_lr, device=dev, out=out, progress=progress,
               should_cancel=should_cancel)
    return freeing_on_cancel(dev, job.run, list(texts), labels, model_path, test_size, val_size,
                             max_length, frozen_features)


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
    seeds: list[int]
    sizes: list[int | None]
    epochs: dict[int | None, int]
    split_seed: int
    top_k: int | None
    patience: int
    batch_size: int
    rates: dict[str, float]
    head_lr: float
    device: str
    out: Path | None
    progress: Progress
    should_cancel: Callable[[], bool] | None
    done: int = 0
    total: int = 0

    def _tick(self, done: int) -> None:
        self.done = done
        if self.progress is not None:
            self.progress(done, self.total)

    def run(self, texts: list[str], labels: Sequence[Any], model_path: str, test_size: float,
            val_size: float, max_length: int, features: np.ndarray | None) -> dict[str, Any]:
        classes, y = np.unique(np.asarray(labels), return_inverse=True)
        train, val, test = stratified_split(y, test_size, val_size, self.split_seed)
        encoder = Encoder.load(model_path, device=self.device, precision="fp32", max_length=max_length)
        ids = encoder.tokenize(texts).input_ids
        config = encoder.model.config
        n_frozen = default_top_k(config) if self.top_k is None else self.top_k
        trained = [r for r in self.regimes if r != "frozen"]
        self.total = sum(len(self.seeds) * (("frozen" in self.regimes) + len(trained) * self.epochs[s])
                         for s in self.sizes)
        feature_seconds = 0.0
        if "frozen" in self.regimes and features is None:
            started = time.perf_counter()
            features = _mean_features(encoder, ids, self.should_cancel)
            feature_seconds = time.perf_counter() - started
        if features is not None and features.shape[0] != len(texts):
            raise ValueError(f"frozen_features has {features.shape[0]} rows for {len(texts)} texts")
        meta = {"model_path": model_path, "model_fingerprint": encoder.fingerprint,
                "classes": classes.tolist()}

        def split(rows: np.ndarray) -> Split:
            return Split([ids[i] for i in rows], y[rows])

        curve = []
        for size in self.sizes:
            runs: dict[str, list[dict[str, Any]]] = {r: [] for r in self.regimes}
            probes: dict[bytes, dict[str, Any]] = {}
            for seed in self.seeds:
                rows = _subsample(train, y, size, self.split_seed, seed)
                stem = f"size{len(rows)}/{{}}/seed{seed}"
                for regime in self.regimes:
                    check_cancel(self.should_cancel)
                    if regime == "frozen":
                        assert features is not None
                        if rows.tobytes() not in probes:  # deterministic: fit once per subset
                            probes[rows.tobytes()] = self._probe(features, y, rows, val, test,
                                                                 stem.format("frozen"), meta)
                        runs[regime].append({"seed": seed, **probes[rows.tobytes()]})
                        self._tick(self.done + 1)
                        continue
                    settings = TrainSettings(regime=regime, lr=self.rates[regime], head_lr=self.head_lr,
                                             max_epochs=self.epochs[size], patience=self.patience,
                                             batch_size=self.batch_size, top_k=n_frozen, seed=seed,
                                             device=self.device)
                    base = self.done

                    def tick(epoch: int, _n: int, base: int = base) -> None:
                        self._tick(base + epoch)
                    run = finetune(encoder.model, split(rows), split(val), split(test), len(classes),
                                   int(encoder.tokenizer.pad_token_id or 0), settings, tick,
                                   self.should_cancel)
                    self._tick(base + self.epochs[size])  # early stopping skips the rest
                    scores = {k: v for k, v in vars(run).items() if k != "state"}
                    _save(self.out, stem.format(regime), run.state,
                          {"regime": regime, "seed": seed, **meta, "top_k": n_frozen,
                           "lora_rank": LORA_RANK, "lr": self.rates[regime],
                           "head": "linear on mean-pooled last hidden state", **scores})
                    runs[regime].append({"seed": seed, **scores,
                                         "stored_params": sum(t.numel() for t in run.state.values())})
            table = {r: _table_row(r, rs, config, n_frozen, len(classes), encoder_params(encoder.model),
                                   feature_seconds) for r, rs in runs.items()}
            curve.append({"train_size": len(rows), "regimes": table, **choose(table)})
        result = {"model": {"path": model_path, "fingerprint": encoder.fingerprint,
                            "encoder_params": encoder_params(encoder.model),
                            "num_layers": int(config.num_hidden_layers),
                            "hidden_size": int(config.hidden_size)},
                  "split": {"n_train": len(train), "n_val": len(val), "n_test": len(test),
                            "split_seed": self.split_seed, "test_size": test_size, "val_size": val_size},
                  "settings": {"seeds": self.seeds, "top_k": n_frozen,
                               "max_epochs": {str(s): e for s, e in self.epochs.items()},
                               "patience": self.patience, "batch_size": self.batch_size,
                               "lr": self.rates, "head_lr": self.head_lr, "max_length": max_length,
                               "device": self.device, "lora_rank": LORA_RANK},
                  "classes": classes.tolist(), "score": "test macro-F1", **curve[-1]}
        if self.sizes != [None]:
            result["learning_curve"] = curve
        return result

    def _probe(self, features: np.ndarray, y: np.ndarray, rows: np.ndarray, val: np.ndarray,
               test: np.ndarray, stem: str, meta: dict[str, Any]) -> dict[str, Any]:
        with PeakMemory("cpu") as memory:  # scikit-learn runs on the CPU whatever the device
            started = time.perf_counter()
            metrics, arrays = probe_layers(features.astype(np.float32, copy=False), y, rows, val, test)
            seconds = time.perf_counter() - started
        _save(self.out, stem, arrays, {"regime": "frozen", **meta, "pooling": "mean", **metrics})
        return {**metrics, "seconds_per_epoch": seconds, "peak_memory_bytes": memory.peak_bytes,
                "peak_memory_kind": memory.kind, "epochs": 1}


def _table_row(regime: str, runs: list[dict[str, Any]], config: Any, n_frozen: int, n_classes: int,
               base_params: int, feature_seconds: float) -> dict[str, Any]:
    """One regime's line: scores over seeds, what trains, and what a task stores."""
    heads = head_params(int(config.hidden_size), n_classes)
    first = runs[0]
    if regime == "frozen":
        trainable = head = first["trainable"]  # logistic regression: coef + intercept
        fixed: dict[str, Any] = {"encoder_trainable": 0, "expected_encoder_trainable": 0,
                                 "matches_formula": True, "feature_seconds": feature_seconds}
    else:
        expected = expected_trainable(regime, config, top_k=n_frozen)
        trainable, head = first["encoder_trainable"] + heads, heads
        fixed = {"encoder_trainable": first["encoder_trainable"], "expected_encoder_trainable": expected,
                 "matches_formula": first["encoder_trainable"] == expected}
    # float32: what trained (LoRA adapters, biases, layers...) + the head (+ the probe's scaler)
    return _summary(runs, trainable_params=int(trainable), head_params=int(head),
                    bytes_per_task=4 * int(first["stored_params"]),
                    trainable_share=trainable / (base_params + head),
                    peak_memory_kind=first["peak_memory_kind"], **fixed)


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
