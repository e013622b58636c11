"""layerbank.app.probes.token_probe on synthetic word states where one layer carries the tag."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from layerbank.app.probes.spans import TagSchemeError, span_scores
from layerbank.app.probes.token_probe import WordStates, control_tags, run_token_probe

TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
H, D, CARRIER = 4, 16, 2


def random_sentence(rng: np.random.Generator) -> list[str]:
    tags: list[str] = []
    while len(tags) < 6:
        if rng.random() < 0.6:
            tags.append("O")
        else:
            kind = rng.choice(["PER", "LOC"])
            tags += [f"B-{kind}"] + [f"I-{kind}"] * int(rng.integers(0, 2))
    return tags


def make_split(rng, tag_vectors, n_sentences: int, *, signal: float = 4.0) -> WordStates:
    tags = [random_sentence(rng) for _ in range(n_sentences)]
    # Words are drawn independently of the tags, so the only way to know a
    # word's control tag is to recognise the word, which no layer allows.
    words = [[f"w{rng.integers(0, 150)}" for _ in s] for s in tags]
    flat = [TAGS.index(t) for s in tags for t in s]
    states = rng.normal(size=(len(flat), H, D)).astype(np.float32)
    states[:, CARRIER] += signal * tag_vectors[flat]
    return WordStates(states, words, tags)


@pytest.fixture(scope="module")
def splits():
    rng = np.random.default_rng(0)
    tag_vectors = rng.normal(size=(len(TAGS), D)).astype(np.float32)
    return make_split(rng, tag_vectors, 250), make_split(rng, tag_vectors, 100)


def test_the_layer_carrying_the_tag_wins_and_the_control_task_stays_near_chance(splits):
    train, valid = splits
    result = run_token_probe(train, valid, views=["each_layer"], seed=0)
    json.dumps(result)  # must be JSON-serializable as is
    rows = {r["view"]: r for r in result["rows"]}
    assert list(rows) == [f"layer:{i}" for i in range(H)]
    assert result["best"] == f"layer:{CARRIER}"
    best = rows[f"layer:{CARRIER}"]
    assert best["f1"] > 0.95 and best["word_accuracy"] > 0.95
    assert best["per_type"]["PER"]["f1"] > 0.9
    for name, row in rows.items():
        if name != f"layer:{CARRIER}":
            assert row["f1"] < 0.3, row
    # Chance for the control task is predicting its most frequent tag.
    valid_control = control_tags(
        [w for s in valid.words for w in s], Counter(t for s in train.tags for t in s), seed=0
    )
    chance = max(Counter(valid_control).values()) / len(valid_control)
    for row in rows.values():
        assert row["control_accuracy"] <= chance + 0.1, row
        # selectivity on the task's metric (entity F1), and on word accuracy beside it
        assert row["selectivity"] == pytest.approx(row["f1"] - row["control_f1"])
        assert row["selectivity_accuracy"] == pytest.approx(row["word_accuracy"] - row["control_accuracy"])
        assert 0.0 <= row["control_f1"] < 0.3, row
    assert best["selectivity"] > 0.6
    # MDL: only the carrier compresses the tags; no layer compresses the word-type control tags
    for name, row in rows.items():
        assert row["mdl"]["uniform_kbits"] > row["mdl"]["online_kbits"] > 0, row
        assert row["mdl"]["control_compression"] < 1.2, row
        if name != f"layer:{CARRIER}":
            assert row["mdl"]["compression"] < 1.3, row
    assert best["mdl"]["compression"] > 2.0
    assert result["n_uncovered"] == {"train": 0, "valid": 0}
    assert result["tags"] == sorted(TAGS)


def test_views_from_the_view_grammar_and_no_control(splits):
    train, valid = splits
    views = ["layer:-2", "concat_last_4", "weighted:0,0,1,0", "all_layers", "layer:-2"]
    result = run_token_probe(train, valid, views=views, control_task=False)
    names = [r["view"] for r in result["rows"]]
    assert names == ["layer:-2", "concat_last_4", "weighted:0,0,1,0", "all_layers"]
    for row in result["rows"]:
        assert row["f1"] > 0.9  # each of these contains the carrier layer
        assert row["control_accuracy"] is None and row["selectivity"] is None
        assert row["fit_seconds"] >= 0


def test_uncovered_words_are_counted_and_scored_as_o():
    rng = np.random.default_rng(1)
    tag_vectors = rng.normal(size=(len(TAGS), D)).astype(np.float32)
    # A strong signal so the head is perfect on every word it sees.
    train = make_split(rng, tag_vectors, 150, signal=20.0)
    valid = make_split(rng, tag_vectors, 40, signal=20.0)
    covered = np.ones(valid.states.shape[0], dtype=bool)
    covered[-15:] = False  # the tail of the set, as if truncated
    valid.states[~covered] = np.nan  # never read
    valid.covered = covered
    train.covered = np.ones(train.states.shape[0], dtype=bool)
    train.covered[:3] = False
    train.states[:3] = np.nan

    result = run_token_probe(train, valid, views=[f"layer:{CARRIER}"], control_task=False)
    assert result["n_uncovered"] == {"train": 3, "valid": 15}
    flat = np.array([t for s in valid.tags for t in s], dtype=object)
    flat[~covered] = "O"
    expected, pos = [], 0
    for s in valid.tags:
        expected.append(list(flat[pos : pos + len(s)]))
        pos += len(s)
    want = span_scores(valid.tags, expected)
    row = result["rows"][0]
    assert want.recall < 1.0  # the test would be empty otherwise
    assert row["f1"] == pytest.approx(want.f1)
    assert row["word_accuracy"] == pytest.approx(want.word_accuracy)


def test_non_bio_tags_need_span_f1_off(splits):
    train, valid = splits
    pos_train = WordStates(
        train.states, train.words, [["NN" if t == "O" else "VB" for t in s] for s in train.tags]
    )
    pos_valid = WordStates(
        valid.states, valid.words, [["NN" if t == "O" else "VB" for t in s] for s in valid.tags]
    )
    with pytest.raises(TagSchemeError, match=r"train sentence 0, word 0: tag '(NN|VB)'"):
        run_token_probe(pos_train, pos_valid, views=["layer:0"])
    result = run_token_probe(pos_train, pos_valid, views=["each_layer"], span_f1=False, control_task=False)
    assert result["metric"] == "word_accuracy" and result["best"] == f"layer:{CARRIER}"
    assert result["rows"][0]["f1"] is None


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda t, v: (t, WordStates(v.states[:-1], v.words, v.tags)), "state rows"),
        (lambda t, v: (t, WordStates(v.states[:, :2], v.words, v.tags)), "not the same encoder"),
        (lambda t, v: (t, WordStates(v.states, v.words[:-1], v.tags)), "sentences of words"),
        (lambda t, v: (WordStates(t.states[:, 0], t.words, t.tags), v), r"\[n_words, H, d\]"),
        (lambda t, v: (WordStates(t.states, t.words, t.tags, np.ones(3, bool)), v), "covered"),
    ],
)
def test_inconsistent_inputs_are_refused(splits, change, message):
    train, valid = change(*splits)
    with pytest.raises(ValueError, match=message):
        run_token_probe(train, valid, views=["layer:0"])


@pytest.mark.parametrize(
    "views, message",
    [
        (["layer:9"], "does not exist"),
        (["pooled"], "unknown view"),
        ([], "no views"),
    ],
)
def test_bad_views_are_refused(splits, views, message):
    with pytest.raises(ValueError, match=message):
        run_token_probe(*splits, views=views)


def test_control_tags_are_fixed_per_word_type_and_follow_the_tag_distribution():
    counts = {"O": 80, "B-PER": 20}
    words = [f"w{i}" for i in range(2000)]
    first = control_tags(words + ["w1"], counts, seed=3)
    assert first[-1] == first[1]  # same type, same tag, wherever it appears
    assert (control_tags(words, counts, seed=3) == first[:-1]).all()  # reproducible
    assert (control_tags(words, counts, seed=4) != first[:-1]).any()  # the seed matters
    share = np.mean(first[:-1] == "O")
    assert 0.75 < share < 0.85


def test_control_task_is_learned_where_states_identify_the_word():
    # The other side of selectivity: a layer that encodes word identity can
    # memorise the control tags, so its control accuracy is far above chance.
    rng = np.random.default_rng(2)
    vocab, dim = 30, 48
    word_vectors = rng.normal(size=(vocab, dim)).astype(np.float32)

    def split(n_sentences):
        tags = [random_sentence(rng) for _ in range(n_sentences)]
        ids = [rng.integers(0, vocab, size=len(s)) for s in tags]
        flat = np.concatenate(ids)
        states = 0.1 * rng.normal(size=(flat.size, 2, dim)).astype(np.float32)
        states[:, 1] += word_vectors[flat]
        return WordStates(states, [[f"w{i}" for i in s] for s in ids], tags)

    train, valid = split(200), split(60)
    result = run_token_probe(train, valid, views=["each_layer"], seed=5, max_iter=500)
    noise, identity = result["rows"]
    assert identity["control_accuracy"] > 0.9
    assert noise["control_accuracy"] < 0.7
    # scored with the task's metric too: the word-identity layer recovers the control entities
    assert identity["control_f1"] > 0.8 and noise["control_f1"] < 0.5
    assert identity["mdl"]["control_compression"] > 1.5 > noise["mdl"]["control_compression"]


def test_an_mdl_fit_stopped_at_max_iter_is_warned_about(splits):
    train, valid = splits
    result = run_token_probe(train, valid, views=[f"layer:{CARRIER}"], max_iter=2, control_task=False)
    assert result["rows"][0]["mdl"]["converged"] is False
    assert f"layer:{CARRIER}: an MDL block's fit stopped at max_iter (2) before converging" in result["warnings"]


def test_non_bio_tags_are_scored_with_macro_f1(splits):
    train, valid = splits
    relabel = {"O": "NN", "B-PER": "VB", "I-PER": "VB", "B-LOC": "JJ", "I-LOC": "JJ"}
    pos = [WordStates(s.states, s.words, [[relabel.get(t, "NN") for t in x] for x in s.tags])
           for s in (train, valid)]
    result = run_token_probe(*pos, views=["layer:0", f"layer:{CARRIER}"], span_f1=False, mdl=False)
    noise, carrier = result["rows"]
    assert carrier["macro_f1"] > 0.9 > noise["macro_f1"]
    assert carrier["selectivity"] == pytest.approx(carrier["macro_f1"] - carrier["control_macro_f1"])
    assert "control_f1" not in carrier


def test_a_single_control_tag_is_predicted_without_fitting(splits):
    train, valid = splits
    one_word = WordStates(train.states, [["same"] * len(s) for s in train.words], train.tags)
    result = run_token_probe(one_word, valid, views=[f"layer:{CARRIER}"])
    row = result["rows"][0]
    assert row["f1"] > 0.95 and row["control_fit_seconds"] == 0.0


def test_scalar_mix_learns_to_weight_the_layer_carrying_the_tag(splits):
    train, valid = splits
    result = run_token_probe(train, valid, views=["scalar_mix", "mean_all"], control_task=False)
    mix_row, mean_row = result["rows"]
    assert mix_row["view"] == "scalar_mix" and mean_row["mix"] is None
    weights = mix_row["mix"]["layer_weights"]
    assert len(weights) == H and sum(weights) == pytest.approx(1.0)
    assert int(np.argmax(weights)) == CARRIER and weights[CARRIER] > 0.5
    assert mix_row["mix"]["weighted_view"].startswith("weighted:")
    # the uniform mean dilutes the carrier with three noise layers; the mix does not
    assert mix_row["f1"] > 0.95 and mix_row["f1"] >= mean_row["f1"]


def test_fits_stopped_at_max_iter_are_warned_about_in_the_result_and_the_table(splits):
    from layerbank.app.cli.probe import _token_table

    train, valid = splits
    ticks: list[tuple[int, int]] = []
    result = run_token_probe(train, valid, views=["layer:0", f"layer:{CARRIER}"], max_iter=1, mdl=False,
                             progress=lambda done, total: ticks.append((done, total)))
    # a tagger and a control head per view, each a tick, after a (0, total) start
    assert ticks == [(0, 4), (1, 4), (2, 4), (3, 4), (4, 4)]
    # with MDL, its blocks are one more tick per view (a scalar mix has none)
    mdl_ticks: list[tuple[int, int]] = []
    run_token_probe(train, valid, views=["layer:0", "scalar_mix"], control_task=False, mix_rounds=2,
                    progress=lambda done, total: mdl_ticks.append((done, total)))
    assert mdl_ticks == [(0, 3), (1, 3), (2, 3), (3, 3)]
    assert [r["converged"] for r in result["rows"]] == [False, False]
    assert result["warnings"] == [
        "layer:0: the tagger stopped at max_iter (1, grown to 4) before converging",
        "layer:0: the control task's head stopped at max_iter (1, grown to 4) before converging",
        f"layer:{CARRIER}: the tagger stopped at max_iter (1, grown to 4) before converging",
        f"layer:{CARRIER}: the control task's head stopped at max_iter (1, grown to 4) before converging"]
    result.update(word_mode="first", n_sentences={"train": 250, "valid": 100})
    table = _token_table(result).splitlines()
    assert table[0].endswith("converged")
    assert table[1].startswith("layer:0") and table[1].endswith("NO (see warnings)")
    assert table[-1] == f"warning: layer:{CARRIER}: the control task's head stopped at max_iter (1, grown to 4) before converging"

    settled = run_token_probe(train, valid, views=[f"layer:{CARRIER}"], control_task=False)
    assert settled["warnings"] == [] and settled["rows"][0]["converged"] is True
    settled.update(word_mode="first", n_sentences={"train": 250, "valid": 100})
    assert _token_table(settled).splitlines()[1].endswith("yes")
    assert "warning" not in _token_table(settled)


def test_the_iteration_budget_grows_until_the_tagger_converges(splits):
    # 15 iterations are too few for this tagger, 4 x 15 are enough: no warning, converged
    train, valid = splits
    small = run_token_probe(train, valid, views=[f"layer:{CARRIER}"], max_iter=15, control_task=False, mdl=False)
    row = small["rows"][0]
    assert row["converged"] and small["warnings"] == []
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression

    x = train.states[:, CARRIER]
    y = np.array([t for s in train.tags for t in s])
    with pytest.warns(ConvergenceWarning):  # the same fit with a fixed budget of 15 stops short
        LogisticRegression(max_iter=15).fit((x - x.mean(0)) / x.std(0), y)


def test_dimensions_that_are_float16_rounding_noise_are_left_out(splits):
    train, valid = splits
    from layerbank.linear_probe.standardize import NoiseAwareScaler

    noisy = train.states.copy()
    base = np.float16(0.37)
    rng = np.random.default_rng(9)
    noisy[:, :, 0] = np.where(rng.random(noisy.shape[:2]) < 0.5, base, np.nextafter(base, np.float16(1)))
    scaler = NoiseAwareScaler("float16").fit(noisy[:, CARRIER])
    assert scaler.n_dropped_ == 1 and scaler.transform(noisy[:, CARRIER]).shape[1] == D - 1
    result = run_token_probe(WordStates(noisy, train.words, train.tags), valid, views=[f"layer:{CARRIER}"],
                             control_task=False, mdl=False)
    assert result["rows"][0]["dropped_dims"] == 1 and result["rows"][0]["f1"] > 0.9
