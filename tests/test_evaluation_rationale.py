"""The rationale test on the real pretrained MiniLM encoder (with a seeded random head),
against a reference that maps tokens to words by tokenizing word by word."""

from __future__ import annotations

import pytest
import torch

from explain import Explainer
from explain.evaluation import TOP_K, RationaleTest
from explain.evaluation.datasets.zoo import SentimentHeldout
from explain.evaluation.protocol import records_problem
from explain.testing import ModelState


@pytest.fixture(scope="module")
def minilm():
    from transformers import AutoTokenizer, BertForSequenceClassification
    from transformers.utils import logging

    from explain.loading.zoo import minilm_folder

    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        with torch.random.fork_rng():
            torch.manual_seed(0)
            model = BertForSequenceClassification.from_pretrained(minilm_folder(), num_labels=2)
    finally:
        logging.set_verbosity(verbosity)
    return model.eval(), AutoTokenizer.from_pretrained(minilm_folder())


def reference_f1(model, tokenizer, example, method):
    """Word scores from spans of word-by-word tokenization (after [CLS]), then top-k."""
    encoding = tokenizer(" ".join(example.words), return_tensors="pt")
    relevance = Explainer(model).explain(dict(encoding), method=method).relevance[0]
    scores, position = [], 1
    for word in example.words:
        width = len(tokenizer.tokenize(word))
        scores.append(max(relevance[position : position + width].tolist()))
        position += width
    ranked = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    relevant = sum(example.rationale)
    f1 = []
    for k in TOP_K:
        hits = sum(example.rationale[i] for i in ranked[:k])
        precision, recall = hits / min(k, len(scores)), hits / relevant
        f1.append(2 * precision * recall / (precision + recall) if hits else 0.0)
    return f1


@pytest.mark.parametrize("method", ["generic", "raw_attention"])
def test_token_f1_matches_a_word_by_word_reference(minilm, method):
    model, tokenizer = minilm
    protocol = RationaleTest(model, tokenizer)
    examples = [SentimentHeldout(length=3)[i] for i in range(3)]
    records = protocol.evaluate(method, examples)  # a padded batch of three
    assert records_problem(records, RationaleTest.fields, len(examples)) is None
    for row, example in zip(records["f1"], examples, strict=True):
        assert row == pytest.approx(reference_f1(model, tokenizer, example, method), abs=1e-6)
    summary = protocol.summarize(records)
    assert summary["token_f1"]["5"] == pytest.approx(sum(r[0] for r in records["f1"]) / 3)
    assert set(summary["token_f1"]) == {str(k) for k in TOP_K}


def test_the_rationale_test_leaves_the_model_as_it_found_it(minilm):
    model, tokenizer = minilm
    before = ModelState.capture(model)
    RationaleTest(model, tokenizer).evaluate("generic", [SentimentHeldout(length=1)[0]])
    assert before.differences(ModelState.capture(model)) == []
