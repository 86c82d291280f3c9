"""No side effects on a Hugging Face BERT classifier with dropout, loaded with sdpa
attention: after any call, successful or failing, the model is exactly as it was
(attention implementation included), and explaining between training steps leaves the
loss curve bit-identical."""

from __future__ import annotations

import pytest
import reference_hf as ref
import torch

from explain import Explainer, TargetError
from explain.testing import ModelState

METHODS = ["raw_attention", "rollout", "generic", "attention_gradcam", "random"]
BATCH = ref.padded_batch([[2, 14, 7, 33, 9, 3], [2, 41, 3]])


def _bert_in_training_state():
    """A BERT classifier mid-training: dropout on, mixed modes, frozen embeddings, stale
    grads, sdpa attention."""
    model = ref.tiny_text_model(
        "bert-classifier", hidden_dropout_prob=0.2, attention_probs_dropout_prob=0.2
    )
    model.train()
    model.bert.encoder.layer[1].eval()  # a deliberately mixed state must survive
    model.bert.embeddings.word_embeddings.weight.requires_grad_(False)
    model(**BATCH).logits.sum().backward()
    model.classifier.weight.grad = None
    assert model.config._attn_implementation == "sdpa"
    return model


class Boom(RuntimeError):
    pass


def _explode(module, args, output):
    raise Boom("forced failure mid-forward")


@pytest.mark.parametrize("outcome", ["success", "bad-target", "mid-forward-failure", "trace"])
@pytest.mark.parametrize("method", METHODS)
def test_bert_state_unchanged(method, outcome):
    model = _bert_in_training_state()
    explainer = Explainer(model)
    before = ModelState.capture(model)
    if outcome == "success":
        explainer.explain(BATCH, method=method)
    elif outcome == "bad-target":
        with pytest.raises(TargetError):
            explainer.explain(BATCH, method=method, target=99)
    elif outcome == "trace":
        explainer.trace(BATCH, score="log_probability")
    else:
        handle = model.bert.encoder.layer[1].intermediate.register_forward_hook(_explode)
        with pytest.raises(Boom):
            explainer.explain(BATCH, method=method)
        handle.remove()
    assert before.differences(ModelState.capture(model)) == []
    assert model.config._attn_implementation == "sdpa"


def _train(explain_between_steps: bool) -> list[float]:
    torch.manual_seed(0)
    model = ref.tiny_text_model(
        "bert-classifier", hidden_dropout_prob=0.2, attention_probs_dropout_prob=0.2
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(4, ref.VOCAB, (5, 4, 8), generator=generator)
    labels = torch.randint(0, 3, (5, 4), generator=generator)
    explainer = Explainer(model)
    losses = []
    model.train()
    for step in range(5):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(input_ids=ids[step]).logits, labels[step])
        batch = {"input_ids": ids[step][:2]}
        if explain_between_steps:  # between forward and backward: the graph must survive
            explainer.explain(batch, method="generic")
        loss.backward()
        if explain_between_steps:  # between backward and step: grads must survive
            for method in METHODS:
                explainer.explain(batch, method=method, target=1)
            explainer.trace(batch)
        optimizer.step()
        losses.append(loss.item())
    return losses


def test_bert_loss_curve_is_bit_identical():
    plain = _train(explain_between_steps=False)
    interleaved = _train(explain_between_steps=True)
    assert plain == interleaved
    assert len(set(plain)) > 1  # the model did train
