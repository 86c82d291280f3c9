"""trace() returns every layer's attention and hidden states with the right gradients."""

from __future__ import annotations

import pytest
import torch
from tolerances import FLOAT32

import reference_vit as ref
from explain import Explainer


@pytest.mark.parametrize("score", ["logit", "probability", "log_probability"])
def test_trace_matches_autograd(vit, images, score):
    trace = Explainer(vit).trace(images, target=[1, 3], score=score)
    assert len(trace.attentions) == len(trace.attention_grads) == 3
    assert len(trace.hidden_states) == len(trace.hidden_state_grads) == 4
    assert trace.attentions[0].shape == (2, 2, 17, 17)
    assert trace.hidden_states[0].shape == (2, 17, 32)
    for b, cls in enumerate([1, 3]):
        attentions, grads, _ = ref.attentions_and_gradients(vit, images[b], cls, score)
        for layer in range(3):
            torch.testing.assert_close(trace.attentions[layer][b], attentions[layer])
            torch.testing.assert_close(trace.attention_grads[layer][b], grads[layer])


def test_hidden_state_gradients_match_autograd_grad(vit, images):
    """Independent check: autograd.grad over the model's own block outputs."""
    trace = Explainer(vit).trace(images, score="logit", target=2)
    vit.eval()
    hidden = [vit.norm_pre(vit.patch_drop(vit._pos_embed(vit.patch_embed(images))))]
    for block in vit.blocks:
        hidden.append(block(hidden[-1]))
    logits = vit.forward_head(vit.norm(hidden[-1]))
    grads = torch.autograd.grad(logits[:, 2].sum(), hidden)
    # float32: the trace's explicit attention against the blocks' own (fused) one
    for mine, theirs in zip(trace.hidden_state_grads, grads, strict=True):
        torch.testing.assert_close(mine, theirs, **FLOAT32)
    for mine, theirs in zip(trace.hidden_states, hidden, strict=True):
        torch.testing.assert_close(mine, theirs.detach(), **FLOAT32)


def test_trace_rejects_several_targets(vit, images):
    with pytest.raises(Exception, match="one class per input"):
        Explainer(vit).trace(images, target=torch.zeros(2, 2, dtype=torch.long))
