"""trace() on Hugging Face models: attention maps, hidden states and their gradients equal
those autograd gives on the model's own output_attentions / output_hidden_states."""

from __future__ import annotations

import functools

import pytest
import reference_hf as ref
import torch
from tolerances import FLOAT32

from explain import Explainer

TEXTS = [[2, 14, 7, 33, 9, 3], [2, 41, 17, 3]]
TARGETS = [2, 1]
CASES = ["bert-classifier", "distilbert-classifier", "albert-classifier", "gpt2", "vit"]


@functools.cache
def _model(name: str):
    return ref.tiny_image_model(name) if name == "vit" else ref.tiny_text_model(name)


def _inputs(name: str):
    """(batched inputs, per-sample unpadded inputs, per-sample real positions, readout)."""
    if name == "vit":
        images = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(5))
        everything = torch.arange(17)
        return images, [{"pixel_values": images[b : b + 1]} for b in range(2)], [everything] * 2
    batch = ref.padded_batch(TEXTS, "left" if name == "gpt2" else "right")
    real = [ref.real_positions(row) for row in batch["attention_mask"]]
    return batch, [{"input_ids": torch.tensor([text])} for text in TEXTS], real


def _assert_gradients_close(mine, theirs):
    # Padding changes the order of float32 sums: allow 1e-4 of the largest gradient.
    scale = theirs.abs().max().item()
    torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-4 * scale)


@pytest.mark.parametrize("score", ["logit", "probability", "log_probability"])
@pytest.mark.parametrize("name", CASES)
def test_trace_matches_hugging_face_autograd(name, score):
    model = _model(name)
    batch, alone, real = _inputs(name)
    kind = ref.TEXT_MODELS[name][2] if name != "vit" else "image"
    trace = Explainer(model).trace(batch, target=TARGETS, score=score)
    layers = len(trace.attentions)
    assert len(trace.attention_grads) == layers and len(trace.hidden_states) == layers + 1
    assert trace.score == score and trace.target.tolist() == TARGETS
    for b, target in enumerate(TARGETS):
        found = ref.reference(model, alone[b], kind, target, score)
        keep = real[b]
        assert len(found.attentions) == layers
        for layer in range(layers):
            grid = (slice(None), keep[:, None], keep[None, :])
            torch.testing.assert_close(
                trace.attentions[layer][b][grid], found.attentions[layer], **FLOAT32
            )  # float32, a padded batch against each text alone
            _assert_gradients_close(
                trace.attention_grads[layer][b][grid], found.attention_grads[layer]
            )
        for index in range(layers + 1):
            torch.testing.assert_close(
                trace.hidden_states[index][b, keep],
                found.hidden_states[index],
                atol=1e-5,
                rtol=1e-4,
            )
            _assert_gradients_close(
                trace.hidden_state_grads[index][b, keep], found.hidden_state_grads[index]
            )


def test_padding_gets_no_attention_and_no_gradient():
    model = _model("bert-classifier")
    batch, _, _ = _inputs("bert-classifier")
    trace = Explainer(model).trace(batch, target=TARGETS, score="logit")
    pads = ~batch["attention_mask"].bool()
    for attention in trace.attentions:
        assert (attention.permute(0, 3, 1, 2)[pads] == 0).all()  # no query looks at a pad
    for grad in trace.hidden_state_grads:
        assert (grad[pads] == 0).all()


def test_probability_gradients_differ_from_logit_gradients():
    """The softmax couples the classes: the two scores give different attention gradients,
    not a rescaled copy (the point docs/gradients.md makes)."""
    model = _model("bert-classifier")
    batch, _, _ = _inputs("bert-classifier")
    explainer = Explainer(model)
    logit = explainer.trace(batch, target=TARGETS, score="logit")
    probability = explainer.trace(batch, target=TARGETS, score="probability")
    for a, b in zip(logit.attention_grads, probability.attention_grads, strict=True):
        ratio = b[0][a[0] != 0] / a[0][a[0] != 0]
        assert ratio.std() > 1e-3 * ratio.abs().mean()
