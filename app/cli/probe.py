"""``layerbank probe``: which layer, which pooling, frozen or fine-tune? In-process.

Sentence task (labelled texts)::

    layerbank probe FILE --text-column sentence --label-column label \\
        [--views each_layer,scalar_mix] [--poolings mean,cls] [--head logistic] [--cv 5] \\
        [--plot DIR] [--json OUT]

extracts the texts the store lacks (layerbank.workers.local.LocalExtractor, the data
directory held meanwhile), runs layerbank.app.probes.sweep.run_probe on the stored states and
prints one row per (view, pooling): accuracy mean ± std over the folds,
macro-F1, the control task's accuracy and the selectivity (best pooling),
seconds per fold; then the best, the scalar mix, the learning curve and the
recommendation (layerbank.app.probes.advice). ``--plot DIR`` writes ``probe.png`` and
``learning_curve.png`` (the same pictures as the HTTP API), ``--json OUT``
the whole result.

Token task (words with tags: CoNLL, JSON or JSONL word sets)::

    layerbank probe --task token --train train.conll --valid valid.conll [--views each_layer]

prints one row per view: entity F1 (BIO tags) or word accuracy, the control
task and selectivity (layerbank.app.probes.token_probe). ``FILE --valid-fraction 0.2``
instead of ``--train/--valid`` splits one file (seeded). ``--plot DIR``
writes ``token_probe.png``.

``--url URL`` (``LAYERBANK_URL``) runs the sentence probe on a running server
instead (the file uploaded as a dataset, then ``/v1/probes``, as
``Bank(url=...).probe`` does) and prints the same report: the way to use a data
directory that server holds.

Every flag has a ``LAYERBANK_*`` twin; list flags take commas.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from layerbank.app.cli.common import (
    ProgressBar,
    add_common_flags,
    add_flag,
    add_url_flag,
    fail,
    load_table,
    open_extractor,
    settings_from,
)
from layerbank.app.cli.store_first import StoreFirst, locate
from layerbank.app.probes.head_names import PROBE_HEADS, describe
from layerbank.cache.poolings import POOLING_NAMES

__all__ = ["register", "run"]

_DEFAULT_VIEWS = "each_layer,concat_last_4,sum_last_4,mean_all,scalar_mix"


def register(sub: Any) -> None:
    p = sub.add_parser("probe", help="which layer and pooling separate the labels (cross-validated "
                       "probes on cached features)")
    p.add_argument("file", nargs="?", help="texts with labels (.tsv, .csv, .jsonl); for --task token, "
                   "a word set to split with --valid-fraction")
    add_flag(p, "--task", choices=["sentence", "token"], default="sentence", help="sentence labels, or "
             "one tag per word")
    add_flag(p, "--text-column", help="column (or JSON field) holding the text")
    add_flag(p, "--label-column", help="column (or JSON field) holding the label")
    add_flag(p, "--format", help="file format (default: from the suffix)")
    add_flag(p, "--no-header", action="store_true", help="the CSV/TSV file has no header row")
    add_common_flags(p)
    add_flag(p, "--views", help=f"comma-separated views (default {_DEFAULT_VIEWS}; token task: each_layer)")
    # dest: not the Settings field of the same name (what is stored), which run() widens to these
    add_flag(p, "--poolings", dest="probe_poolings", default="mean,cls",
             help=f"comma-separated poolings to probe ({', '.join(POOLING_NAMES)})")
    add_flag(p, "--head", default="logistic", help=describe(PROBE_HEADS))
    add_flag(p, "--cv", type=int, default=5, help="cross-validation folds")
    add_flag(p, "--seed", type=int, default=0, help="seed of folds, control labels and heads")
    add_flag(p, "--no-control-task", action="store_true", help="skip the shuffled-label control task")
    add_flag(p, "--no-mdl", action="store_true",
             help="skip the online codelength (MDL) of every view (about two folds' worth of fits)")
    add_flag(p, "--no-learning-curve", action="store_true", help="skip the learning curve")
    add_flag(p, "--train-sizes", default="50,100,200,500,1000", help="learning-curve training sizes")
    add_flag(p, "--train", help="token task: word set to train on (CoNLL, .json, .jsonl)")
    add_flag(p, "--valid", help="token task: word set to score on")
    add_flag(p, "--valid-fraction", type=float, default=0.2, help="token task without --valid: the "
             "share of sentences held out")
    add_flag(p, "--tag-column", type=int, default=1, help="CoNLL column of the tag (-1 = last)")
    add_flag(p, "--word-mode", choices=["first", "mean"], default="first", help="a word's first sub-token "
             "or the mean of its sub-tokens")
    add_flag(p, "--plot", help="directory to write the plots (PNG) into")
    add_flag(p, "--json", help="file to write the whole result into (JSON)")
    add_url_flag(p)
    p.set_defaults(run=run)


def _list(value: str | None, default: str) -> list[str]:
    return [v.strip() for v in (value or default).split(",") if v.strip()]


def run(args: argparse.Namespace) -> int:
    return _run_token(args) if args.task == "token" else _run_sentence(args)


def _run_sentence(args: argparse.Namespace) -> int:
    from layerbank.app.probes.inputs import ProbeInputError, check_labels, check_options

    if args.file is None:
        fail("give the FILE of labelled texts")
    if args.label_column is None:
        fail("--label-column is required: the column (or JSON field) holding each text's label")
    views, poolings = _list(args.views, _DEFAULT_VIEWS), _list(args.probe_poolings, "mean,cls")
    try:
        sizes = [int(s) for s in _list(args.train_sizes, "")]
    except ValueError:
        fail(f"--train-sizes must be comma-separated integers, got {args.train_sizes!r}")
        raise
    settings = settings_from(args)
    if unknown := [p for p in poolings if p not in POOLING_NAMES]:
        fail(f"unknown pooling {unknown[0]!r}; known: {', '.join(POOLING_NAMES)}")
    # the texts are stored with the poolings probed, besides those the setting names
    settings = settings.model_copy(update={"poolings": ",".join(dict.fromkeys(
        [*settings.pooling_names, *poolings]))})
    table = load_table(args, label_column=args.label_column)
    try:  # everything that can be wrong with the input, before the model loads
        check_options(cv=args.cv, head=args.head, views=views, poolings=poolings)
    except ProbeInputError as e:
        fail(str(e))
    try:
        check_labels(table.labels, args.cv)
    except ProbeInputError as e:
        fail(f"{args.file}, label column {args.label_column!r}: {e}")
    if args.url:
        return _report(args, _probe_through(args, settings, table, views, poolings, sizes))
    states, model = _states(settings, table.texts, views, poolings, progress=not args.no_progress)
    return _probe_and_report(args, states, table.labels, views, poolings, sizes, model)


def _states(settings: Any, texts: list[str], views: list[str], poolings: list[str], *,
            progress: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every text's pooled states and the model summary (layerbank.app.features_service:
    the store's rows, the misses extracted in-process; when every text is stored, torch
    and the weights stay unloaded, app/cli/store_first.py). A view the model cannot give
    is refused first, before anything loads."""
    from layerbank.app.features_service import TextsLost, features_for
    from layerbank.app.probes.common import model_summary
    from layerbank.app.probes.inputs import ProbeInputError, expand_views

    with StoreFirst.open(settings, locate(settings), url_flag=True) as sf:
        try:
            if (h := sf.n_hidden_states) is not None:
                expand_views(views, h)
        except ProbeInputError as e:
            fail(str(e))
        read = sf.text_source(lambda keys: [sf.store.read_pooled(keys, p) for p in poolings], progress=progress)
        try:
            got = features_for(texts, read)
        except TextsLost as e:
            fail(f"{e.lost} texts could not be read back from the store; run again")
        if sf.loaded is not None:  # the encoder ran: its own description of the model
            model = _model(sf.loaded)
        else:
            assert sf.model is not None
            model = model_summary(sf.model.info, sf.model.fingerprint)
        return dict(zip(poolings, (r.data for r in got.results))), model


def _model(ex: Any) -> dict[str, Any]:
    from layerbank.app.probes.common import model_summary

    return model_summary(ex.encoder.info, ex.encoder.fingerprint)


def _probe_and_report(args: argparse.Namespace, states: dict[str, Any], labels: Any, views: list[str],
                      poolings: list[str], sizes: list[int], model: dict[str, Any]) -> int:
    from layerbank.app.probes.sentence_probe import probe_sentences
    from layerbank.app.probes.sweep import ProbeInputError

    bar = ProgressBar(not args.no_progress, "fit")
    try:
        result = probe_sentences(states.__getitem__, labels, views=views, poolings=poolings,
                                 head=args.head, cv=args.cv, seed=args.seed,
                                 control_task=not args.no_control_task, mdl=not args.no_mdl,
                                 learning_curve=not args.no_learning_curve, train_sizes=sizes,
                                 model=model, progress=bar)
    except ProbeInputError as e:  # e.g. a view this model does not have
        bar.close()
        fail(str(e))
        raise
    bar.close()
    return _report(args, result)


def _probe_through(args: argparse.Namespace, settings: Any, table: Any, views: list[str],
                   poolings: list[str], sizes: list[int]) -> dict[str, Any]:
    """The probe's result from the server at ``--url``: the file's rows uploaded as a
    dataset (extracted there, once), then ``/v1/probes`` with this command's options."""
    from layerbank.app.client import ApiError, Client

    try:
        with Client(args.url, api_key=settings.api_key) as client:
            ds = client.upload_dataset(f"layerbank probe {Path(args.file).name}", table.texts,
                                       labels=list(table.labels), model=args.model,
                                       precision=args.precision)
            return client.probe(ds, progress=not args.no_progress, views=views, poolings=poolings,
                                head=args.head, cv=args.cv, seed=args.seed,
                                control_task=not args.no_control_task, mdl=not args.no_mdl,
                                learning_curve=not args.no_learning_curve, train_sizes=sizes)
    except ApiError as e:
        fail(f"{args.url}: {e}")
        raise


def _report(args: argparse.Namespace, result: dict[str, Any]) -> int:
    print(_sentence_table(result))
    if args.plot:
        from layerbank.app.probes.plots import learning_curve_png, probe_plot_png

        _write_plots(args.plot, {"probe.png": probe_plot_png(result)} | (
            {"learning_curve.png": learning_curve_png(result)} if result["learning_curve"] else {}))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


def _write_plots(directory: str, pngs: dict[str, bytes]) -> None:
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    for name, png in pngs.items():
        (d / name).write_bytes(png)
        print(f"wrote {d / name}", file=sys.stderr)


def _sentence_table(r: dict[str, Any]) -> str:
    control = {c["view"]: c for c in (r["control_task"] or {}).get("results", [])}
    control_pooling = (r["control_task"] or {}).get("pooling")
    width = max(len("view"), *(len(x["view"]) for x in r["results"]))
    # selectivity on accuracy and on macro-F1 (the control is the same labels, shuffled);
    # compression: MDL, uniform / online codelength (1.0: nothing learnt)
    lines = [(f"{'view':<{width}}  pooling  accuracy        macro-F1  control  selectivity  sel. F1  "
              "compression  fit s/fold")]
    for x in r["results"]:
        c = control.get(x["view"]) if x["pooling"] == control_pooling else None
        acc = f"{x['accuracy']['mean']:.3f} ± {x['accuracy']['std']:.3f}"
        mdl = x.get("mdl")
        lines.append(f"{x['view']:<{width}}  {x['pooling']:<7}  {acc:<14}  {x['macro_f1']['mean']:<8.3f}  "
                     f"{_num(c and c['control_accuracy']):<7}  {_num(c and c['selectivity']):<11}  "
                     f"{_num(c and c.get('selectivity_macro_f1')):<7}  "
                     f"{'-' if not mdl else format(mdl['compression'], '.2f'):<11}  "
                     f"{x['fit_seconds']['mean']:.3f}")
    t, b = r["task"], r["best"]
    selectivity = "" if b["selectivity"] is None else f", selectivity {b['selectivity']:.3f}"
    lines += ["", (f"{t['n_examples']:,} examples, {len(t['classes'])} classes, {t['cv']}-fold CV, "
                   f"{t['head']} head; always answering the most frequent class scores "
                   f"{t['chance_accuracy']:.3f}"),
              (f"best: {b['view']}, {b['pooling']} pooling: accuracy {b['accuracy']:.3f} ± "
               f"{b['accuracy_std']:.3f}, macro-F1 {b['macro_f1']:.3f}{selectivity}")]
    for pooling, mix in (r["scalar_mix"] or {}).items():
        weights = " ".join(f"{w:.2f}" for w in mix["layer_weights"])
        lines.append(f"scalar mix ({pooling}): accuracy {mix['accuracy']['mean']:.3f} ± "
                     f"{mix['accuracy']['std']:.3f}; layer weights h0..h{len(mix['layer_weights']) - 1}: {weights}")
    if r["learning_curve"]:
        lc = r["learning_curve"]
        points = "  ".join(f"{p['train_size']:,}{' (all)' if p['label'] == 'all' else ''}: "
                           f"{p['accuracy']['mean']:.3f}" for p in lc["points"])
        lines.append(f"learning curve ({lc['view']}, {lc['pooling']}): {points}")
    if r.get("mdl_seconds") is not None:
        lines.append(f"MDL (online codelength, Voita & Titov 2020): {r['mdl_seconds']:.1f} s of fitting")
    lines += [f"warning: {w}" for w in r["warnings"]]
    lines += ["", "recommendation:", textwrap.fill(r["recommendation"]["text"], 100, initial_indent="  ",
                                                   subsequent_indent="  ")]
    return "\n".join(lines)


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def _run_token(args: argparse.Namespace) -> int:
    from layerbank.app.probes.common import JobInputError, split_sentences
    from layerbank.app.probes.word_features import sentence_texts
    from layerbank.app.probes.wordsets import WordSetError, read_wordset

    if (args.train is None) == (args.file is None):
        fail("give --train FILE (and --valid FILE), or one FILE to split with --valid-fraction")
    fmt = args.format if args.format in ("conll", "json", "jsonl") else None
    try:
        train = read_wordset(args.train or args.file, fmt, tag_column=args.tag_column)
        valid = read_wordset(args.valid, fmt, tag_column=args.tag_column) if args.valid else None
        if valid is None:
            tr, va = split_sentences(len(train), args.valid_fraction, args.seed)
            train, valid = [train[i] for i in tr], [train[i] for i in va]
        texts = sentence_texts(train + valid)
    except (WordSetError, JobInputError, ValueError, OSError) as e:
        fail(str(e))
        raise
    settings = settings_from(args)
    if args.url:
        fail("--url runs the sentence task through a server; a token probe runs in-process "
             "(or POST /v1/probes with words and tags, docs/probes.md)")

    def fit(train_states: Any, valid_states: Any, model: dict[str, Any]) -> int:
        return _fit_token_probe(args, train, valid, train_states, valid_states, model)

    # every sentence stored: no torch, no weights; else the encoder extracts what is missing
    if (done := _on_stored_word_states(settings, texts, train, valid, args.word_mode, fit)) is not None:
        return done
    return _on_encoded_word_states(args, settings, texts, train, valid, fit)


def _fit_token_probe(args: argparse.Namespace, train: list[Any], valid: list[Any], train_states: Any,
                     valid_states: Any, model: dict[str, Any]) -> int:
    """The token probe on word states the store still holds open, its table, plot and JSON."""
    from layerbank.app.probes.spans import is_bio_tag
    from layerbank.app.probes.token_probe import run_token_probe

    bio = all(is_bio_tag(t) for s in train + valid for t in s.tags)
    from threadpoolctl import threadpool_limits

    # one bar tick per fit (a view's tagger, then its control head): on a large set each
    # takes a minute, and without it the command was silent for minutes
    bar = ProgressBar(not args.no_progress, "fit", desc="token probe: fitting taggers")
    try:
        # one BLAS thread, as run_probe does: small fits on shared cores only lose with more
        with threadpool_limits(limits=1):
            result = run_token_probe(train_states, valid_states, views=_list(args.views, "each_layer"),
                                     seed=args.seed, control_task=not args.no_control_task, span_f1=bio,
                                     mdl=not args.no_mdl, progress=bar)
    except ValueError as e:  # a view this model lacks, a single tag ...
        bar.close()
        fail(str(e))
        raise
    bar.close()
    result.update(task={"name": "token_classification"}, model=model, word_mode=args.word_mode,
                  n_sentences={"train": len(train), "valid": len(valid)})
    print(_token_table(result))
    if args.plot:
        from layerbank.app.probes.token_plot import token_probe_png

        _write_plots(args.plot, {"token_probe.png": token_probe_png(result)})
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


def _on_encoded_word_states(args: argparse.Namespace, settings: Any, texts: list[str], train: list[Any],
                            valid: list[Any], fit: Callable[[Any, Any, dict[str, Any]], int]) -> int:
    """``fit`` on the word states after extracting what the store lacks (the encoder loads,
    extracts, and is closed before the fits start)."""
    import gc

    with open_extractor(settings) as ex:
        from layerbank.app.cli.cost import announce

        announce(ex, texts, want_tokens=True)  # a large set: texts, tokens, bytes on disk, time
        ex.extract(texts, job_id="cli-" + uuid.uuid4().hex[:10], want_tokens=True,
                   progress_bar=not args.no_progress, max_tokens=settings.max_tokens_per_batch,
                   part_size=settings.part_size)
    # The fits read the stored states view by view (word_views), as a rerun does, without the
    # weights and the extraction's buffers: with them still held, the probe's peak sat on top
    # of the extraction's (about 1 GB) on the full CoNLL-2003 training set.
    del ex
    gc.collect()
    from layerbank.workers.extract import return_freed_heap  # torch is loaded already

    return_freed_heap()
    done = _on_stored_word_states(settings, texts, train, valid, args.word_mode, fit)
    if done is None:  # the store lost what was just extracted (deleted meanwhile)
        fail("the extracted token states are not in the store any more; run the command again")
    return done


def _on_stored_word_states(settings: Any, texts: list[str], train: list[Any], valid: list[Any],
                           word_mode: str, fit: Callable[[Any, Any, dict[str, Any]], int]) -> int | None:
    """``fit`` on word states read from the store when every sentence's token states are
    there, else None."""
    from layerbank.app.cli.cost import memory_line
    from layerbank.app.probes.common import model_summary
    from layerbank.app.probes.word_views import word_views

    with StoreFirst.open(settings, locate(settings), url_flag=True) as sf:
        if sf.model is None or sf.all_stored(texts, want_tokens=True) is None:
            return None
        fp, config = sf.model.fingerprint, sf.model.config
        if line := memory_line(sf.model.info, sum(len(s.words) for s in train + valid)):
            print(line, file=sys.stderr, flush=True)
        return fit(word_views(sf.store, fp, config, train, mode=word_mode),
                   word_views(sf.store, fp, config, valid, mode=word_mode),
                   model_summary(sf.model.info, fp))


def _token_table(r: dict[str, Any]) -> str:
    width = max(len("view"), *(len(x["view"]) for x in r["rows"]))
    # control and selectivity on the task's metric (entity F1, or macro-F1 for other tags);
    # compression: MDL of the tags (uniform / online codelength), then of the control tags
    lines = [(f"{'view':<{width}}  F1     precision  recall  word acc  control  selectivity  compression  "
              "fit s   converged")]
    for x in r["rows"]:
        control = x.get("control_f1", x.get("control_macro_f1"))
        mdl = x.get("mdl")
        compression = "-" if not mdl else (f"{mdl['compression']:.2f}" + (
            "" if mdl["control_compression"] is None else f" / {mdl['control_compression']:.2f}"))
        lines.append(f"{x['view']:<{width}}  {_num(x['f1']):<5}  {_num(x['precision']):<9}  "
                     f"{_num(x['recall']):<6}  {x['word_accuracy']:<8.3f}  {_num(control):<7}  "
                     f"{_num(x['selectivity']):<11}  {compression:<11}  {x['fit_seconds']:<6.2f}  "
                     f"{'yes' if x['converged'] else 'NO (see warnings)'}")
    n, s = r["n_words"], r["n_sentences"]
    lines += ["", (f"{s['train']:,} training sentences ({n['train']:,} words), {s['valid']:,} validation "
                   f"sentences ({n['valid']:,} words), {len(r['tags'])} tags; {r['word_mode']} sub-token "
                   "per word"),
              f"best by {r['metric'].replace('_', ' ')}: {r['best']}"]
    if r["n_uncovered"]["train"] or r["n_uncovered"]["valid"]:
        lines.append(f"words cut off by max_length: {r['n_uncovered']} ({r['uncovered_policy']})")
    lines += [f"warning: {w}" for w in r.get("warnings", [])]
    return "\n".join(lines)
