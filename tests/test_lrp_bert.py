"""The LRP methods on Hugging Face BERT classifiers equal the layer-by-layer reference
(reference_lrp.bert_*), padded batches included; other text families get a clear error."""

from __future__ import annotations

import pytest
import reference_lrp as ref
import torch
from reference_hf import padded_batch, reference, tiny_text_model

from explain import Explainer, UnsupportedModelError
from explain.testing import ModelState

LRP_METHODS = ["transformer_attribution", "partial_lrp", "lrp"]
TEXTS = [[2, 17, 5, 33, 8, 41, 3], [2, 9, 28, 3], [2, 50, 11, 6, 3]]


def _bert(dtype=torch.float64):
    return tiny_text_model("bert-classifier").to(dtype)


def _expected(model, text, method, target, start):
    ids = torch.tensor([text])
    record = ref.bert_forward(model, ids)
    relevances, tokens = ref.bert_relevance_pass(
        model, record, target, chefer=method == "transformer_attribution"
    )
    if method == "lrp":
        return tokens
    row = torch.zeros(len(text), dtype=tokens.dtype)
    row[0] = 1.0
    if method == "partial_lrp":
        return ref.partial_lrp(relevances, row)
    found = reference(model, {"input_ids": ids}, "cls", target, "logit")
    grads = [g.to(tokens.dtype) for g in found.attention_grads]
    return ref.transformer_attribution(relevances, grads, row, start, normalise=True)


@pytest.mark.parametrize(
    ("method", "start"),
    [
        ("transformer_attribution", None),  # the text default: the last block only
        ("transformer_attribution", 0),
        ("partial_lrp", None),
        ("lrp", None),
    ],
)
def test_padded_float64_batch_matches_reference(method, start):
    model = _bert()
    before = ModelState.capture(model)
    targets = [0, 2, 1]
    result = Explainer(model).explain(
        padded_batch(TEXTS), method=method, target=targets, start_layer=start
    )
    assert result.relevance.dtype == torch.float64 and result.relevance.shape == (3, 7)
    first = model.config.num_hidden_layers - 1 if start is None else start  # text default
    for b, (text, target) in enumerate(zip(TEXTS, targets, strict=True)):
        expected = _expected(model, text, method, target, first)
        scale = expected.abs().max().item()
        torch.testing.assert_close(
            result.relevance[b, : len(text)], expected, rtol=1e-9, atol=1e-10 * scale
        )
        assert torch.all(result.relevance[b, len(text) :] == 0)  # pads are exactly 0
    assert before.differences(ModelState.capture(model)) == []


@pytest.mark.parametrize(
    ("method", "relative"),
    # The original rules' separate denominators amplify float32 rounding where they are
    # small: measured up to ~1.2e-3 of the map's maximum, against < 5e-6 for the shared one.
    [("transformer_attribution", 1e-5), ("partial_lrp", 5e-3), ("lrp", 5e-3)],
)
def test_float32_close_to_reference(method, relative):
    model = _bert(torch.float32)
    result = Explainer(model).explain(padded_batch(TEXTS), method=method, target=1)
    reference_model = _bert()
    for b, text in enumerate(TEXTS):
        expected = _expected(reference_model, text, method, 1, 2)
        scale = expected.abs().max().item()
        torch.testing.assert_close(
            result.relevance[b, : len(text)].double(), expected, rtol=0, atol=relative * scale
        )


def test_other_text_families_are_named():
    model = tiny_text_model("roberta-classifier")
    with pytest.raises(UnsupportedModelError, match="RobertaForSequenceClassification"):
        Explainer(model).explain(padded_batch(TEXTS[:1]), method="transformer_attribution")
