"""Long CLI runs say what they will cost before they start, and show progress
while they fit; ``--no-progress`` silences the bars, not the cost line.

Tiny random encoder; the "large" threshold is lowered so a few hundred tokens
count as large (the rule is the same, the wait is not)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import layerbank.app.cli.cost as cost
from layerbank.app.cli.main import main
from layerbank.workers.local import LocalExtractor

WORDS = ["EU", "rejects", "German", "call", "to", "boycott", "British", "lamb", "Peter", "Blackburn"]
TAGS = ["B-ORG", "O", "B-MISC", "O", "O", "O", "B-MISC", "O", "B-PER", "I-PER"]


def _conll(path: Path, n: int) -> Path:
    lines = []
    for i in range(n):
        k = 3 + i % 7
        lines += [f"{w}{i % 5 if j == 1 else ''} {t}" for j, (w, t) in enumerate(zip(WORDS[:k], TAGS[:k]))]
        lines.append("")
    path.write_text("\n".join(lines))
    return path


def test_extraction_cost_counts_only_missing_texts_and_their_token_bytes(tiny_model_dir: str, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    texts = [f"text number {i} with a few more words" for i in range(40)]
    with LocalExtractor.open(tmp_path / "d", model=tiny_model_dir) as ex:
        assert cost.extraction_cost(ex, texts, want_tokens=True) is None  # small: nothing measured
        monkeypatch.setattr(cost, "LARGE_TOKENS", 10)
        ex.extract(texts[:10], job_id="first")
        c = cost.extraction_cost(ex, texts + texts[10:20], want_tokens=False)  # repeats count once
        assert c is not None and c.texts == 30 and c.token_bytes is None
        lengths = ex.encoder.tokenize(texts[10:]).lengths
        assert c.tokens == sum(lengths)
        with_tokens = cost.extraction_cost(ex, texts, want_tokens=True)  # pooled-only rows lack tokens
        assert with_tokens is not None and with_tokens.texts == 40
        h, d = ex.encoder.info["n_hidden_states"], ex.encoder.info["hidden_size"]
        assert with_tokens.token_bytes == sum(ex.encoder.tokenize(texts).lengths) * (h * d * 2 + 16)
        assert with_tokens.tokens_per_second > 0 and with_tokens.sample_texts == 32
        assert with_tokens.pooled_bytes == 40 * h * 3 * d * 2  # mean, cls, max at float16
        assert c.pooled_bytes == 30 * h * 3 * d * 2
    line = cost.describe(with_tokens)
    assert line.startswith(f"cost: about to encode 40 texts ({with_tokens.tokens:,} tokens); token states ")
    assert f"({h} hidden states x {d} x float16 per token), pooled vectors " in line
    assert "; pooled vectors " in cost.describe(c) and " on disk; " in cost.describe(c)
    assert re.search(r"; ~\d+ s at [\d,]+ tokens/s \(timed on 32 of these texts\)$", line), line


def test_token_probe_announces_the_cost_and_shows_fitting_progress(tiny_model_dir: str, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(cost, "LARGE_TOKENS", 10)
    for var in ("TQDM_DISABLE", "HF_HUB_DISABLE_PROGRESS_BARS"):  # --no-progress sets them: undone after
        monkeypatch.setenv(var, "")  # records the variable's state before the test...
        monkeypatch.delenv(var)  # ...and starts the test without it
    data = _conll(tmp_path / "train.conll", 60)  # 35 distinct sentences
    args = ["probe", "--task", "token", str(data), "--valid-fraction", "0.25", "--views", "layer:0,layer:1",
            "--data-dir", str(tmp_path / "d"), "--model", tiny_model_dir]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert re.search(r"^cost: about to encode 35 texts \([\d,]+ tokens\); token states [\d.,]+ [KMG]?B on disk",
                     err, re.M), err
    assert "token probe: fitting taggers" in err and "6/6" in err  # 2 views x (tagger, control, MDL)
    # the second run finds every text stored: no cost line; --no-progress: no bar either
    assert main(args + ["--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "cost:" not in err and "fitting taggers" not in err
    assert "Loading weights" not in err and "%|" not in err  # no bar at all, the model loader's included


def test_every_subcommand_takes_no_progress_with_its_environment_twin() -> None:
    from layerbank.app.cli.main import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    assert {"extract", "features", "serve", "worker", "probe", "regimes"} <= set(commands)
    for name, sub in commands.items():
        flag = next((a for a in sub._actions if "--no-progress" in a.option_strings), None)
        assert flag is not None, name
        assert "LAYERBANK_NO_PROGRESS" in flag.help, name


def test_extract_with_tokens_announces_bytes_on_disk(tiny_model_dir: str, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(cost, "LARGE_TOKENS", 10)
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(f"sentence {i} of the sample file" for i in range(50)) + "\n")
    args = ["extract", str(texts), "--tokens", "--data-dir", str(tmp_path / "d"), "--model", tiny_model_dir]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert re.search(r"^cost: about to encode 50 texts \([\d,]+ tokens\); token states [\d.,]+ KB on disk "
                     r"\(3 hidden states x 32 x float16 per token\), pooled vectors [\d.,]+ KB; ~\d+ s at", err, re.M), err
    assert main(args) == 0  # all stored now: nothing to announce
    assert "cost:" not in capsys.readouterr().err


def test_features_shows_its_extraction_and_checks_the_view_before_encoding(
        tiny_model_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(f"line {i} to encode" for i in range(30)) + "\n")
    base = ["features", str(texts), "--data-dir", str(tmp_path / "d"), "--model", tiny_model_dir]
    with pytest.raises(SystemExit) as e:  # the tiny model has hidden states 0..2
        main(base + ["--view", "layer:9", "--out", str(tmp_path / "x.npy")])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "layer 9 does not exist" in err and "text/s" not in err  # refused before any encoding
    assert main(base + ["--view", "layer:-1", "--out", str(tmp_path / "x.npy")]) == 0
    err = capsys.readouterr().err
    assert "30/30" in err and "text/s" in err  # the extraction's bar
    assert (tmp_path / "x.npy").exists()


def test_sentence_probe_announces_its_extraction(tiny_model_dir: str, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(cost, "LARGE_TOKENS", 10)
    for var in ("TQDM_DISABLE", "HF_HUB_DISABLE_PROGRESS_BARS"):  # --no-progress sets them: undone after
        monkeypatch.setenv(var, "")
        monkeypatch.delenv(var)
    data = tmp_path / "s.tsv"
    data.write_text("sentence\tlabel\n" + "".join(f"review {i} was {'good' if i % 2 else 'bad'}\t{i % 2}\n"
                                                   for i in range(40)))
    args = ["probe", str(data), "--text-column", "sentence", "--label-column", "label", "--cv", "2",
            "--views", "layer:0", "--no-learning-curve", "--no-control-task", "--no-progress",
            "--data-dir", str(tmp_path / "d"), "--model", tiny_model_dir]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert re.search(r"^cost: about to encode 40 texts \([\d,]+ tokens\); pooled vectors [\d.,]+ KB on disk; ",
                     err, re.M), err


def test_the_memory_line_says_the_probe_reads_one_view_at_a_time():
    from layerbank.app.cli.cost import memory_line

    # CoNLL-2003 train + valid on MiniLM: the whole [words, 7, 384] is never held
    line = memory_line({"n_hidden_states": 7, "hidden_size": 384}, 254_983)
    assert line == ("memory: 254,983 words x 7 hidden states x 384 = 2.7 GB of word states in float32, "
                    "read one view at a time: 391.7 MB for a one-layer view, 783.3 MB for concat_last_4 (float16)")
    assert memory_line({"n_hidden_states": 7, "hidden_size": 384}, 1_000) is None  # small: nothing said
