"""AttnLRP and CP-LRP of a vision-language model, re-derived independently: the tiny
model's own forward on a float64 copy, with the rules put where the papers state them,
not where explain hooks them (explain scales the outputs of the q, k and v projections
and of a gated MLP's up projection, and rules the norm and activation modules through
hooks on the model itself):

- the attention of every block, the tower's and the language model's, is the test's own
  function in place of transformers' eager one: softmax(q k^T * scale + mask) v in
  float64, the gradient halved at the scores and at the output (AttnLRP) or the scores
  held constant (CP-LRP);
- every norm and element-wise activation module of the copy is replaced by one that
  returns the module's own output with the identity rule's gradient written out:
  LayerNorm's centring and weight over a constant standard deviation, RMSNorm's weight
  over a constant root mean square (computed in float32 as the models compute it, and
  Gemma's weight as 1 + weight, in float32 as Gemma applies it), f(x) / x for an
  activation (LXT's 1e-10 in the denominator);
- every gated MLP's product down(act(gate(x)) * up(x)) is written out with the product's
  rule: each factor's gradient halved (AttnLRP), or the gate held constant (CP-LRP);
- the relevance is embedding x gradient at the tensor the language model is called with
  (`inputs_embeds`: the word embeddings with the image features scattered in) and at
  the output of the tower's patch embedding, both from one autograd.grad of the score.

One text at a time (batch 1, no padding).
"""

from __future__ import annotations

import contextlib
import copy
import sys
import types
from unittest import mock

import torch
from reference_attnlrp import halve
from torch import Tensor, nn


def _with_gradient(value: Tensor, linear: Tensor) -> Tensor:
    """`value` exactly, with the gradient of `linear` (a function of the input)."""
    return value.detach() + (linear - linear.detach())


class _RuledLayerNorm(nn.Module):
    def __init__(self, norm: nn.LayerNorm) -> None:
        super().__init__()
        self.norm = norm

    def forward(self, x: Tensor) -> Tensor:
        centred = x - x.mean(dim=-1, keepdim=True)
        std = (centred.pow(2).mean(dim=-1, keepdim=True) + self.norm.eps).sqrt()
        return _with_gradient(self.norm(x), centred / std.detach() * self.norm.weight)


class _RuledRMSNorm(nn.Module):
    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.norm = norm

    def forward(self, x: Tensor) -> Tensor:
        norm = self.norm
        eps = getattr(norm, "variance_epsilon", None) or norm.eps
        inverse = torch.rsqrt(x.float().pow(2).mean(dim=-1, keepdim=True) + eps)  # float32
        if type(norm).__name__.startswith("Gemma"):
            factor = (inverse * (1.0 + norm.weight.float())).to(x.dtype)
        else:
            factor = norm.weight * inverse.to(x.dtype)
        return _with_gradient(norm(x), x * factor.detach())


class _RuledActivation(nn.Module):
    def __init__(self, activation: nn.Module) -> None:
        super().__init__()
        self.activation = activation

    def forward(self, x: Tensor) -> Tensor:
        y = self.activation(x)
        return _with_gradient(y, x * (y / (x + 1e-10)).detach())


def _gated_forward(variant: str):
    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.act_fn(self.gate_proj(x)), self.up_proj(x)
        if variant == "attnlrp":
            return self.down_proj(halve(gate) * halve(up))
        return self.down_proj(gate.detach() * up)

    return forward


def _attention(variant: str):
    def attend(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        assert kwargs.get("softcap") is None and not module.training
        key = key.repeat_interleave(query.shape[1] // key.shape[1], dim=1)  # grouped heads
        value = value.repeat_interleave(query.shape[1] // value.shape[1], dim=1)
        scale = query.shape[-1] ** -0.5 if scaling is None else scaling
        scores = query @ key.transpose(2, 3) * scale
        if attention_mask is not None:
            scores = scores + attention_mask[..., : key.shape[2]]
        scores = halve(scores) if variant == "attnlrp" else scores.detach()
        weights = scores.softmax(dim=-1)
        output = weights @ value
        output = halve(output) if variant == "attnlrp" else output
        return output.transpose(1, 2).contiguous(), weights

    return attend


def _is_activation(module: nn.Module) -> bool:
    return isinstance(module, nn.GELU | nn.SiLU | nn.Tanh) or (
        type(module).__module__ == "transformers.activations"
    )


def ruled_copy(model: nn.Module, variant: str) -> nn.Module:
    """A float64 copy of `model` on transformers' eager path with the variant's norms,
    activations and gated products (module docstring); its attention is `_attention`'s
    only inside `ruled_attention`."""
    ruled = copy.deepcopy(model).double()
    ruled.set_attn_implementation("eager")
    for parent in list(ruled.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.LayerNorm):
                setattr(parent, name, _RuledLayerNorm(child))
            elif type(child).__name__.endswith("RMSNorm"):
                setattr(parent, name, _RuledRMSNorm(child))
            elif _is_activation(child):
                setattr(parent, name, _RuledActivation(child))
        if all(hasattr(parent, n) for n in ("gate_proj", "up_proj", "down_proj", "act_fn")):
            parent.forward = types.MethodType(_gated_forward(variant), parent)
    return ruled


@contextlib.contextmanager
def ruled_attention(ruled: nn.Module, variant: str):
    """Every eager attention function `ruled`'s modules call, the variant's instead."""
    modules = {sys.modules[type(module).__module__] for module in ruled.modules()}
    with contextlib.ExitStack() as stack:
        for module in modules:
            if hasattr(module, "eager_attention_forward"):
                patch = mock.patch.object(module, "eager_attention_forward", _attention(variant))
                stack.enter_context(patch)
        yield


def parts(ruled: nn.Module) -> tuple[nn.Module, nn.Module]:
    """The language model and the tower's patch embedding of each family."""
    inner = ruled.model
    if hasattr(inner, "visual"):  # Qwen2-VL, Qwen2.5-VL: flattened patches (N, D)
        return inner.language_model, inner.visual.patch_embed
    if hasattr(inner, "text_model"):  # Idefics3, SmolVLM
        return inner.text_model, inner.vision_model.embeddings.patch_embedding
    return inner.language_model, inner.vision_tower.embeddings.patch_embedding


def relevances(
    model: nn.Module, one: dict, position: int, target: int, variant: str
) -> tuple[Tensor, Tensor]:
    """(relevance (T,) over the text's tokens at the language model's input, the image
    tokens among them; relevance at the tower's patch embeddings: (images, gh, gw) for a
    convolution, (patches,) in the tower's order for flattened patches) of the next-token
    logit `target` read out at `position` of one text, under `variant`'s rules; with
    `variant` "gradient_x_input", under none: the model's own float64 gradient (a copy,
    on the attention path it was loaded with)."""
    plain = variant == "gradient_x_input"
    ruled = copy.deepcopy(model).double() if plain else ruled_copy(model, variant)
    language, patches = parts(ruled)
    seen: dict[str, Tensor] = {}
    language.register_forward_pre_hook(
        lambda module, args, kwargs: seen.__setitem__("text", kwargs["inputs_embeds"]),
        with_kwargs=True,
    )
    patches.register_forward_hook(lambda module, args, out: seen.__setitem__("tower", out))
    arguments = {k: v for k, v in one.items() if k not in ("rows", "cols")}
    with contextlib.nullcontext() if plain else ruled_attention(ruled, variant):
        logits = ruled(**arguments, use_cache=False).logits
    text, tower = seen["text"], seen["tower"]
    text_grad, tower_grad = torch.autograd.grad(logits[0, position, target], [text, tower])
    axis = 1 if isinstance(patches, nn.Conv2d) else -1
    return (text * text_grad).sum(dim=-1)[0], (tower * tower_grad).sum(dim=axis)
