"""Train one regime once: an encoder plus a linear head, early-stopped.

``finetune`` copies the encoder it is given (the caller's copy and the weights
on disk are never changed), applies a regime from ``layerbank.workers.regimes.trainable``, trains
with AdamW under a warm-up/linear-decay schedule, keeps the state with the
best validation macro-F1 (early stopping with ``patience``), and scores that
state on the test split and on any extra evaluation splits (``evals``: e.g. a
shifted domain), each with the same standing as the test split.

``gradual`` (ULMFiT, Howard & Ruder 2018) unfreezes from the top down, each
lower group at the rate above / 2.6, under the paper's **slanted triangular**
schedule (a short linear rise over ``cut_frac`` = 10% of the steps to the
peak, then a long linear fall to peak / ``ratio`` = 32); the other regimes
warm up over 10% and decay linearly to 0. ``full`` and ``top_k`` take the same
per-layer decay as ``xi`` (Sun et al. 2019): the rate of layer l (1..L, the
embeddings layer 0) is ``lr * xi ** (L - l)``; ``gradual``'s default xi is
1 / 2.6, and ``xi`` = None on ``full`` / ``top_k`` means one rate (xi = 1).

Layerwise updates: a copy of the trainable parameters is kept at the start
(only those: the frozen ones cannot move), and at the end each part of the
model (``embeddings``, ``layer_0`` .. ``layer_{L-1}`` by block, ``top``,
``head``) gets ||theta_after - theta_before|| / ||theta_before|| over all its
parameters, theta_after the kept (best) state; a part that did not train is
exactly 0. LoRA's adapters count in the layer they sit in (its parameters
before are the base weights plus the adapters' init).

It returns the scores, timings, peak memory and the
tensors a task must store (only the parameters that trained, plus the head).

Cancellation: ``should_cancel()`` is polled before every step and every
evaluation batch; when it answers True, ``Cancelled`` is raised after the
training copy, optimizer and activations have been released (see
``layerbank.workers.regimes.resources``, which also measures peak memory).

Example::

    >>> run = finetune(encoder, train, val, test, n_classes=2, pad_id=0,
    ...                settings=TrainSettings(regime="bitfit", lr=1e-3))
    >>> run.test_macro_f1, run.seconds_per_epoch
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from sklearn.metrics import accuracy_score, f1_score
from torch import nn

from layerbank.workers.regimes.families import describe
from layerbank.workers.regimes.resources import Cancelled, PeakMemory, check_cancel, freeing_on_cancel
from layerbank.workers.regimes.trainable import configure, depth_groups, gradual_groups

__all__ = [
    "Cancelled",
    "RunResult",
    "SequenceClassifier",
    "Split",
    "TrainSettings",
    "finetune",
    "layer_updates",
    "make_optimizer",
    "predict",
    "rate_groups",
]

Check = Callable[[], bool] | None


@dataclass
class Split:
    """Token ids (unpadded) and integer labels of one data split."""

    ids: list[list[int]]
    labels: np.ndarray


@dataclass
class TrainSettings:
    regime: str
    lr: float
    head_lr: float = 1e-3  # the head is new: it needs a larger step than the encoder
    max_epochs: int = 10
    patience: int = 2
    batch_size: int = 16
    weight_decay: float = 0.01
    warmup_frac: float = 0.1
    top_k: int | None = None
    seed: int = 0
    device: str = "cpu"
    decay: float = 2.6  # ULMFiT: each lower layer's rate is the one above / 2.6 (gradual, when xi is None)
    xi: float | None = None  # per-layer rate factor: lr * xi ** depth (None: gradual 1 / decay, others 1)
    stlr_ratio: float = 32.0  # ULMFiT's slanted triangular rates: lowest = peak / ratio
    # (weight [C, d], bias [C]) to start the head from, e.g. a linear probe (LP-FT);
    # None: PyTorch's random init.
    head_init: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False)


@dataclass
class RunResult:
    test_accuracy: float
    test_macro_f1: float
    val_macro_f1: float
    epochs: int
    best_epoch: int
    seconds_per_epoch: float
    peak_memory_bytes: int
    peak_memory_kind: str
    encoder_trainable: int
    state: dict[str, torch.Tensor] = field(repr=False)  # what a task stores
    # per extra evaluation split: {"accuracy", "macro_f1"} of the same (best) state
    eval_scores: dict[str, dict[str, float]] = field(default_factory=dict)
    # part -> ||after - before|| / ||before|| (module docstring)
    layer_updates: dict[str, float] = field(default_factory=dict)


class SequenceClassifier(nn.Module):
    """Encoder + dropout + linear head on the mask-aware mean of the last layer.

    Mean pooling, not [CLS]: the frozen regime probes the store's ``mean``
    pooled states, so using the same pooling here makes the regimes differ
    only in what trains; and all-MiniLM-L6-v2 was itself trained with mean
    pooling, so its [CLS]/pooler output carries no trained sentence signal.
    """

    def __init__(self, encoder: nn.Module, n_classes: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.encoder = encoder
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(int(encoder.config.hidden_size), n_classes)  # type: ignore[union-attr,arg-type]  # HF models have .config

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return self.head(self.dropout(mean_pool(hidden, attention_mask)))


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1.0)


def _pad(rows: Sequence[list[int]], pad_id: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, : len(r)] = 1
    return ids.to(device), mask.to(device)


def _train_batches(lengths: np.ndarray, size: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Shuffled batches of similar length: padding is the main CPU cost."""
    order = rng.permutation(len(lengths))
    batches: list[np.ndarray] = []
    pool = size * 20  # sort within pools so batches stay random across the epoch
    for start in range(0, len(order), pool):
        chunk = order[start:start + pool]
        chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
        batches += [chunk[i:i + size] for i in range(0, len(chunk), size)]
    return [batches[i] for i in rng.permutation(len(batches))]


@torch.inference_mode()
def _batched_outputs(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                     ids: list[list[int]], pad_id: int, device: str,
                     should_cancel: Check, batch_size: int = 64) -> np.ndarray:
    order = np.argsort([len(r) for r in ids], kind="stable")
    chunks: list[np.ndarray] = []
    for start in range(0, len(order), batch_size):
        check_cancel(should_cancel)
        input_ids, mask = _pad([ids[i] for i in order[start:start + batch_size]], pad_id, device)
        chunks.append(fn(input_ids, mask).float().cpu().numpy())
    out = np.concatenate(chunks)
    result = np.empty_like(out)
    result[order] = out
    return result


def predict(model: SequenceClassifier, ids: list[list[int]], pad_id: int, device: str,
            should_cancel: Check = None) -> np.ndarray:
    """Predicted class index per text (eval mode, length-sorted batches)."""
    model.eval()
    logits = _batched_outputs(model, ids, pad_id, device, should_cancel)
    return logits.argmax(1)


def finetune(encoder: nn.Module, train: Split, val: Split, test: Split, n_classes: int,
             pad_id: int, settings: TrainSettings,
             progress: Callable[[int, int], None] | None = None,
             should_cancel: Check = None, evals: Mapping[str, Split] | None = None) -> RunResult:
    """Train ``settings.regime`` on a copy of ``encoder``; see the module docstring."""
    return freeing_on_cancel(settings.device, _finetune, encoder, train, val, test, n_classes,
                             pad_id, settings, progress, should_cancel, dict(evals or {}))


def slanted_triangular(total: int, cut_frac: float = 0.1, ratio: float = 32.0) -> Callable[[int], float]:
    """ULMFiT's schedule as a multiplier of the peak rate at step ``t`` (0-based).

    ``cut = floor(total * cut_frac)``; ``p = t / cut`` while rising, else
    ``1 - (t - cut) / (cut * (1 / cut_frac - 1))``; rate = ``(1 + p (ratio - 1)) / ratio``.
    """
    cut = max(1, int(total * cut_frac))

    def rate(t: int) -> float:
        p = t / cut if t < cut else 1.0 - (t - cut) / (cut * (1.0 / cut_frac - 1.0))
        return (1.0 + max(0.0, p) * (ratio - 1.0)) / ratio
    return rate


def rate_factor(s: TrainSettings) -> float:
    """The per-layer factor xi: the settings', else gradual's 1 / decay, else 1 (one rate)."""
    if s.xi is not None:
        return float(s.xi)
    return 1.0 / s.decay if s.regime == "gradual" else 1.0


def make_optimizer(model: SequenceClassifier, s: TrainSettings,
                   groups: list[list[nn.Parameter]] | None = None) -> torch.optim.AdamW:
    """AdamW: the head at ``head_lr``; the encoder at ``lr``, or per ``groups`` (top first):
    group k at ``lr * xi ** k`` (``rate_factor``)."""
    head = {"params": list(model.head.parameters()), "lr": s.head_lr}
    if groups is None:
        body = [p for p in model.encoder.parameters() if p.requires_grad]
        param_groups = [head] + ([{"params": body, "lr": s.lr}] if body else [])
    else:  # discriminative rates: group k (k-th from the top) learns at lr * xi**k
        xi = rate_factor(s)
        param_groups = [head] + [{"params": g, "lr": s.lr * xi**k} for k, g in enumerate(groups) if g]
    return torch.optim.AdamW(param_groups, weight_decay=s.weight_decay)


def rate_groups(body: nn.Module, s: TrainSettings) -> list[list[nn.Parameter]] | None:
    """The encoder's per-depth groups when its rates differ by layer, else None (one rate)."""
    if s.regime == "gradual":
        return gradual_groups(body)
    if s.regime in ("full", "top_k") and s.xi is not None and s.xi != 1.0:
        return [[p for p in g if p.requires_grad] for g in depth_groups(body, s.regime)]
    return None


def _part_names(model: SequenceClassifier) -> dict[str, str]:
    """Parameter name -> its part: embeddings, layer_<block>, top, head (the pooler: none)."""
    layout = describe(model.encoder)
    out = {}
    for name, _ in model.named_parameters():
        if name.startswith("head."):
            out[name] = "head"
            continue
        base = name[len("encoder."):].replace(".base_layer.", ".")  # LoRA wraps the Linear it adapts
        kind, block = layout.place(base)
        if kind == "layer":
            out[name] = f"layer_{block}"
        elif kind in ("embeddings", "top"):
            out[name] = kind
    return out


def layer_updates(model: SequenceClassifier, before: Mapping[str, torch.Tensor],
                  before_sq: Mapping[str, float]) -> dict[str, float]:
    """Per part, ||after - before|| / ||before|| (``before``: the trainable parameters' start;
    ``before_sq``: every parameter's squared norm at the start)."""
    parts = _part_names(model)
    moved: dict[str, float] = {}
    size: dict[str, float] = {}
    with torch.no_grad():
        for name, param in model.named_parameters():
            part = parts.get(name)
            if part is None:
                continue
            size[part] = size.get(part, 0.0) + before_sq[name]
            delta = 0.0 if name not in before else float((param.detach().float().cpu() - before[name]).pow(2).sum())
            moved[part] = moved.get(part, 0.0) + delta
    return {p: (moved[p] ** 0.5 / size[p] ** 0.5 if size[p] > 0 else 0.0) for p in _ordered(moved)}


def _ordered(parts: Mapping[str, float]) -> list[str]:
    def key(p: str) -> tuple[int, int]:
        if p.startswith("layer_"):
            return 1, int(p[len("layer_"):])
        return {"embeddings": 0, "top": 2, "head": 3}[p], 0
    return sorted(parts, key=key)


def _scores(y: np.ndarray, pred: np.ndarray) -> tuple[float, float]:
    return float(accuracy_score(y, pred)), float(f1_score(y, pred, average="macro"))


def _finetune(encoder: nn.Module, train: Split, val: Split, test: Split, n_classes: int,
              pad_id: int, s: TrainSettings, progress: Callable[[int, int], None] | None,
              should_cancel: Check, evals: dict[str, Split]) -> RunResult:
    torch.manual_seed(s.seed)
    rng = np.random.default_rng(s.seed)
    with PeakMemory(s.device) as memory:
        body = copy.deepcopy(encoder)
        encoder_trainable = configure(body, s.regime, top_k=s.top_k)
        model = SequenceClassifier(body, n_classes)
        if s.head_init is not None:
            with torch.no_grad():
                model.head.weight.copy_(torch.as_tensor(s.head_init[0]))
                model.head.bias.copy_(torch.as_tensor(s.head_init[1]))
        model.to(s.device)
        stored = [n for n, p in model.named_parameters() if p.requires_grad]
        # the start of what trains (a CPU copy of those only) and every parameter's size: layer_updates
        before = {n: p.detach().float().cpu().clone() for n, p in model.named_parameters() if p.requires_grad}
        with torch.no_grad():
            before_sq = {n: float(p.detach().float().pow(2).sum()) for n, p in model.named_parameters()}
        groups = rate_groups(body, s)
        optimizer = make_optimizer(model, s, groups)
        thaw = groups if s.regime == "gradual" else None  # only gradual unfreezes along a schedule
        lengths = np.array([len(r) for r in train.ids])
        steps_per_epoch = -(-len(lengths) // s.batch_size)
        total = steps_per_epoch * s.max_epochs
        warmup = max(1, int(s.warmup_frac * total))
        if thaw:  # gradual: ULMFiT's slanted triangular rates, as the paper pairs them
            schedule = torch.optim.lr_scheduler.LambdaLR(
                optimizer, slanted_triangular(total, s.warmup_frac, s.stlr_ratio))
        else:
            schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda t: min(
                (t + 1) / warmup, max(0.0, (total - t) / max(1, total - warmup))))
        # ULMFiT unfreezes one group per epoch; spreading the same order over
        # the first half of the budget completes it under any max_epochs.
        every = max(1, total // (2 * len(thaw))) if thaw else 0
        labels = torch.as_tensor(train.labels, dtype=torch.long)
        best_f1, best_epoch, bad, epoch_seconds, step = -1.0, 0, 0, [], 0
        best_state: dict[str, torch.Tensor] = {}
        for epoch in range(1, s.max_epochs + 1):
            model.train()
            started = time.perf_counter()
            for batch in _train_batches(lengths, s.batch_size, rng):
                check_cancel(should_cancel)
                if thaw:
                    thawed = min(len(thaw), 1 + step // every)
                    for k, group in enumerate(thaw):
                        for p in group:
                            p.requires_grad_(k < thawed)
                ids, mask = _pad([train.ids[i] for i in batch], pad_id, s.device)
                loss = nn.functional.cross_entropy(model(ids, mask), labels[batch].to(s.device))
                loss.backward()
                optimizer.step()
                schedule.step()
                optimizer.zero_grad(set_to_none=True)
                step += 1
            epoch_seconds.append(time.perf_counter() - started)
            _, val_f1 = _scores(val.labels, predict(model, val.ids, pad_id, s.device, should_cancel))
            if val_f1 > best_f1:
                best_f1, best_epoch, bad = val_f1, epoch, 0
                params = dict(model.named_parameters())
                best_state = {n: params[n].detach().to("cpu", copy=True) for n in stored}
            elif not thaw or 1 + step // every >= len(thaw):  # patience starts once all thawed
                bad += 1
            if progress is not None:
                progress(epoch, s.max_epochs)
            if bad >= s.patience:
                break
        model.load_state_dict(best_state, strict=False)
        updates = layer_updates(model, before, before_sq)
        del before
        pred = predict(model, test.ids, pad_id, s.device, should_cancel)
        eval_scores = {}
        for name, split in evals.items():
            acc, f1 = _scores(split.labels, predict(model, split.ids, pad_id, s.device, should_cancel))
            eval_scores[name] = {"accuracy": acc, "macro_f1": f1}
    accuracy, macro_f1 = _scores(test.labels, pred)
    return RunResult(accuracy, macro_f1, best_f1, epoch, best_epoch,
                     float(np.mean(epoch_seconds)), memory.peak_bytes, memory.kind,
                     encoder_trainable, best_state, eval_scores, updates)
