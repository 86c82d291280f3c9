"""Independent references for the vision backbone families of issue 14.

Nothing here uses `explain`'s recorder, adapters or rules. A deep copy of the model runs
one input on its explicit attention path; the post-softmax probabilities are caught by
plain forward hooks (timm: the output of `attn.attn_drop`; hand-written models: the module
after their softmax) or returned by transformers' own `output_attentions=True`, keep
their gradients with `retain_grad()`, and one backward of the target logit fills them.
The methods then multiply full N x N matrices (reference_vit's functions).
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

import reference_vit as ref


def hooked_attentions_and_gradients(
    model: nn.Module, modules, call, target: int | None = None
) -> tuple[list[Tensor], list[Tensor], Tensor]:
    """(H, N, N) attention and gradient of every block for one input's target logit (None:
    the predicted class), and the logits: `modules(model_copy)` lists the modules whose
    outputs are the probabilities, `call(model_copy)` runs one input and returns (1, C)."""
    model = copy.deepcopy(model).eval()
    caught: list[Tensor] = []

    def keep(module, args, output):
        output.retain_grad()
        caught.append(output)

    for module in modules(model):
        module.register_forward_hook(keep)
    logits = call(model)
    cls = int(logits.argmax()) if target is None else target
    logits[0, cls].backward()
    return [a[0].detach() for a in caught], [a.grad[0].detach() for a in caught], logits.detach()


def timm_attentions_and_gradients(
    model: nn.Module, image: Tensor, target: int | None = None
) -> tuple[list[Tensor], list[Tensor], Tensor]:
    """The same for a timm patch transformer on its explicit path (`attn.attn_drop`)."""

    def modules(copy_):
        for block in copy_.blocks:
            block.attn.fused_attn = False
        return [block.attn.attn_drop for block in copy_.blocks]

    return hooked_attentions_and_gradients(model, modules, lambda m: m(image[None]), target)


def hf_attentions_and_gradients(
    model: nn.Module, call, target: int | None = None
) -> tuple[list[Tensor], list[Tensor], Tensor]:
    """The same for a Hugging Face model: `call(model_copy)` runs it on one input with
    `output_attentions=True` and returns (logits (1, C), attentions)."""
    model = copy.deepcopy(model).eval()
    model.set_attn_implementation("eager")
    logits, attentions = call(model)
    for attention in attentions:
        attention.retain_grad()
    cls = int(logits.argmax()) if target is None else target
    logits[0, cls].backward()
    return (
        [a[0].detach() for a in attentions],
        [a.grad[0].detach() for a in attentions],
        logits.detach(),
    )


def method(name: str, attentions: list[Tensor], grads: list[Tensor], row: Tensor, start=0):
    """Token relevance (N,) of `generic` or `rollout` from full matrices."""
    if name == "generic":
        return ref.generic(attentions, grads, row, start)
    if name == "rollout":
        return ref.rollout(attentions, row, start)
    raise ValueError(name)


def check_no_side_effects_and_batches(model: nn.Module, images: Tensor, **explain_kwargs):
    """Explaining a batch leaves a training-mode model exactly as found and equals
    explaining each input alone, for every attention method."""
    from explain import Explainer
    from explain.testing import ModelState

    model.train()
    explainer = Explainer(model)
    for name in ("generic", "rollout", "raw_attention", "attention_gradcam"):
        before = ModelState.capture(model)
        batch = explainer.explain(images, method=name, target=1, **explain_kwargs)
        assert before.differences(ModelState.capture(model)) == []
        for b in range(images.shape[0]):
            single = explainer.explain(images[b : b + 1], method=name, target=1, **explain_kwargs)
            # float32 sums a batch and one input in different orders: rtol 1e-4
            torch.testing.assert_close(
                batch.relevance[b], single.relevance[0], rtol=1e-4, atol=1e-6
            )
