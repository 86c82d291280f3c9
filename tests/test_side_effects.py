"""No side effects: after any call, successful or failing, the model is as it was."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from explain import METHODS, Explainer, ExplainError, TargetError
from explain.testing import ModelState, tiny_vit


def _model_in_training_state() -> nn.Module:
    """A ViT mid-training: dropout on, mixed modes, some frozen parameters, stale grads."""
    model = tiny_vit(drop_rate=0.1, attn_drop_rate=0.1, proj_drop_rate=0.1, drop_path_rate=0.1)
    model.train()
    model.blocks[1].eval()  # a deliberately mixed state must survive
    model.patch_embed.proj.weight.requires_grad_(False)
    loss = model(torch.randn(2, 3, 32, 32)).sum()
    loss.backward()
    model.head.weight.grad = None  # some grads None, some set
    model.blocks[0].attn.fused_attn = True
    model.blocks[2].attn.fused_attn = False
    return model


class Boom(RuntimeError):
    pass


def _explode(module, args, output):
    raise Boom("forced failure mid-forward")


CALLS = {
    "success": lambda explainer, images, method: explainer.explain(images, method=method),
    "bad-target": lambda explainer, images, method: explainer.explain(
        images, method=method, target=99
    ),
    "mid-forward-failure": None,  # set up in the test
    "trace": lambda explainer, images, method: explainer.trace(images),
}


@pytest.mark.parametrize("outcome", sorted(CALLS))
@pytest.mark.parametrize("method", sorted(METHODS))
def test_state_unchanged(method, outcome):
    model = _model_in_training_state()
    images = torch.randn(2, 3, 32, 32)
    explainer = Explainer(model)
    before = ModelState.capture(model)
    if outcome == "mid-forward-failure":
        handle = model.blocks[1].mlp.register_forward_hook(_explode)
        with pytest.raises(Boom):
            explainer.explain(images, method=method)
        handle.remove()
    elif outcome == "bad-target":
        with pytest.raises(TargetError):
            CALLS[outcome](explainer, images, method)
    else:
        CALLS[outcome](explainer, images, method)
    after = ModelState.capture(model)
    assert before.differences(after) == []


class _FailInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores):
        return scores.clone()

    @staticmethod
    def backward(ctx, grad):
        raise Boom("forced failure mid-backward")


def test_failure_inside_backward_restores_everything():
    model = _model_in_training_state()
    explainer = Explainer(model)
    images = torch.randn(2, 3, 32, 32)
    before = ModelState.capture(model)
    with pytest.raises(Boom):
        explainer.explain(images, target=lambda out: _FailInBackward.apply(out[:, 0]))
    assert before.differences(ModelState.capture(model)) == []


def test_inference_mode_is_refused_cleanly(vit, images):
    before = ModelState.capture(vit)
    with torch.inference_mode(), pytest.raises(ExplainError, match="inference_mode"):
        Explainer(vit).explain(images)
    assert before.differences(ModelState.capture(vit)) == []


def test_inference_tensors_are_explained_like_ordinary_ones(vit, images):
    with torch.inference_mode():
        frozen = images.clone()
    assert frozen.is_inference()
    result = Explainer(vit).explain(frozen)
    expected = Explainer(vit).explain(images)
    torch.testing.assert_close(result.relevance, expected.relevance, rtol=0, atol=0)
    assert result.target.tolist() == expected.target.tolist()


def test_global_rng_untouched_by_random_method(vit, images):
    torch.manual_seed(123)
    expected = torch.rand(5)
    torch.manual_seed(123)
    Explainer(vit).explain(images, method="random", seed=7)
    assert torch.equal(torch.rand(5), expected)


def test_differences_reports_changes(vit):
    """The snapshot comparison itself must catch every kind of change it promises."""
    before = ModelState.capture(vit)
    vit.train(not vit.training)
    vit.blocks[0].attn.fused_attn = not vit.blocks[0].attn.fused_attn
    vit.head.weight.requires_grad_(False)
    handle = vit.head.register_forward_hook(lambda *a: None)
    torch.rand(1)
    with torch.no_grad():
        vit.head.bias.add_(1)
    found = "\n".join(before.differences(ModelState.capture(vit)))
    for expected in ("training mode", "fused_attn", "requires_grad", "hooks", "RNG", "parameter"):
        assert expected in found
    handle.remove()
