"""layerbank.app.probes.spans against seqeval's default (conlleval-compatible) mode."""

from __future__ import annotations

import warnings

import pytest
import seqeval.metrics
from hypothesis import given, settings
from hypothesis import strategies as st

from layerbank.app.probes.spans import (
    Entity,
    TagSchemeError,
    check_bio,
    extract_entities,
    span_scores,
    word_accuracy,
)

seqeval = seqeval.metrics


def seqeval_scores(gold, pred):
    with warnings.catch_warnings():
        # seqeval warns on zero division and returns 0.0, which is what we return.
        warnings.simplefilter("ignore")
        return (
            seqeval.precision_score(gold, pred),
            seqeval.recall_score(gold, pred),
            seqeval.f1_score(gold, pred),
            seqeval.classification_report(gold, pred, output_dict=True, zero_division=0),
        )


def assert_same_as_seqeval(gold, pred):
    p, r, f, report = seqeval_scores(gold, pred)
    ours = span_scores(gold, pred)
    assert ours.precision == pytest.approx(p)
    assert ours.recall == pytest.approx(r)
    assert ours.f1 == pytest.approx(f)
    types = {k for k in report if k not in ("micro avg", "macro avg", "weighted avg")}
    assert set(ours.per_type) == types
    for kind, scores in ours.per_type.items():
        assert scores.precision == pytest.approx(report[kind]["precision"])
        assert scores.recall == pytest.approx(report[kind]["recall"])
        assert scores.f1 == pytest.approx(report[kind]["f1-score"])
        assert scores.support == report[kind]["support"]


@pytest.mark.parametrize(
    "tags, entities",
    [
        (["B-PER", "I-PER", "O", "B-LOC"], [("PER", 0, 2), ("LOC", 3, 4)]),
        # I- after O starts an entity (conlleval), not an error and not dropped
        (["O", "I-PER", "I-PER"], [("PER", 1, 3)]),
        # I- of another type closes the open entity and starts a new one
        (["B-PER", "I-LOC", "I-LOC"], [("PER", 0, 1), ("LOC", 1, 3)]),
        # B- right after B- of the same type: two entities
        (["B-PER", "B-PER", "I-PER"], [("PER", 0, 1), ("PER", 1, 3)]),
        # an entity running to the end of the sentence
        (["O", "B-ORG", "I-ORG"], [("ORG", 1, 3)]),
        (["I-MISC"], [("MISC", 0, 1)]),
        # types may contain hyphens
        (["B-WORK-OF-ART", "I-WORK-OF-ART"], [("WORK-OF-ART", 0, 2)]),
        ([], []),
    ],
)
def test_extract_entities_follows_conll_semantics(tags, entities):
    assert extract_entities(tags) == [Entity(*e) for e in entities]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from seqeval.metrics.sequence_labeling import get_entities
    # seqeval's end index is inclusive; ours is exclusive
    assert [(t, s, e + 1) for t, s, e in get_entities(list(tags))] == entities


FIXED = [
    # exact match
    ([["B-PER", "I-PER", "O"]], [["B-PER", "I-PER", "O"]]),
    # boundary errors count as both a false positive and a false negative
    ([["B-PER", "I-PER", "O"]], [["B-PER", "O", "O"]]),
    # right span, wrong type
    ([["B-LOC", "I-LOC"]], [["B-ORG", "I-ORG"]]),
    # I- after O in the prediction matches a gold B- span of the same extent
    ([["O", "B-PER", "I-PER"]], [["O", "I-PER", "I-PER"]]),
    # type switch inside a run splits it into two predicted entities
    ([["B-PER", "I-PER", "I-PER"]], [["B-PER", "I-PER", "I-LOC"]]),
    # sentence boundaries close entities: no entity spans two sentences
    ([["O", "B-PER"], ["I-PER", "O"]], [["O", "B-PER"], ["B-PER", "O"]]),
    # no predicted entities at all, and no gold entities at all
    ([["B-MISC", "O"]], [["O", "O"]]),
    ([["O", "O"]], [["B-MISC", "O"]]),
    ([["O", "O"]], [["O", "O"]]),
    # several types
    (
        [["B-PER", "O", "B-LOC", "I-LOC", "O", "B-ORG"], ["B-MISC", "I-MISC"]],
        [["B-PER", "O", "B-LOC", "O", "O", "B-ORG"], ["B-MISC", "I-MISC"]],
    ),
]


@pytest.mark.parametrize("gold, pred", FIXED)
def test_span_scores_equal_seqeval_on_fixed_examples(gold, pred):
    assert_same_as_seqeval(gold, pred)


def test_span_scores_numbers_by_hand():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG"]]
    pred = [["B-PER", "I-PER", "O", "B-ORG"], ["B-ORG"]]
    s = span_scores(gold, pred)
    assert (s.n_gold, s.n_predicted, s.n_correct) == (3, 3, 2)
    assert s.f1 == pytest.approx(2 / 3)
    assert s.word_accuracy == pytest.approx(4 / 5)
    assert s.per_type["LOC"].recall == 0.0 and s.per_type["ORG"].precision == 0.5
    assert s.to_dict()["per_type"]["PER"] == {"precision": 1.0, "recall": 1.0, "f1": 1.0, "support": 1}


TAGS = st.sampled_from(["O", "O", "O", "B-PER", "I-PER", "B-LOC", "I-LOC", "I-ORG"])


@st.composite
def gold_and_pred(draw):
    lengths = draw(st.lists(st.integers(0, 8), min_size=1, max_size=6))
    gold = [draw(st.lists(TAGS, min_size=n, max_size=n)) for n in lengths]
    # Predictions: mostly the gold tags, with some replaced, so matches happen.
    pred = [[t if draw(st.booleans()) else draw(TAGS) for t in sentence] for sentence in gold]
    return gold, pred


@settings(max_examples=200, deadline=None)
@given(gold_and_pred())
def test_span_scores_equal_seqeval_on_random_bio_sequences(case):
    assert_same_as_seqeval(*case)


def test_check_bio_names_the_sentence_and_the_tag():
    check_bio([["O", "B-PER", "I-PER"], ["I-LOC"]])
    with pytest.raises(TagSchemeError, match=r"valid sentence 1, word 2: tag 'S-PER' is not BIO"):
        check_bio([["O"], ["O", "B-PER", "S-PER"]], what="valid sentence")
    for bad in ("B-", "PER", "b-PER", "", None):
        with pytest.raises(TagSchemeError):
            check_bio([[bad]])


def test_span_scores_refuse_non_bio_tags_and_mismatched_lengths():
    with pytest.raises(TagSchemeError, match="predicted sentence 0, word 0: tag 'E-PER'"):
        span_scores([["B-PER"]], [["E-PER"]])
    with pytest.raises(ValueError, match="sentence 1: 2 gold tags but 1 predicted"):
        span_scores([["O"], ["O", "O"]], [["O"], ["O"]])
    with pytest.raises(ValueError, match="2 gold sentences but 1 predicted"):
        word_accuracy([["O"], ["O"]], [["O"]])
