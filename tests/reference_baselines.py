"""Independent float64 computations of the input-embedding baselines: Gradient x Input,
integrated gradients, occlusion and SmoothGrad, written from their definitions for ONE
input at a time (no padding, no batching), with nothing of `explain`:

- the model is run from its embeddings by its own code: transformers' `inputs_embeds`,
  or a timm ViT's `forward_features` after its `patch_embed`;
- integrated gradients loops over the Gauss-Legendre (or Riemann) points one at a time,
  the nodes and weights taken from numpy and mapped from [-1, 1] to [0, 1] here;
- occlusion loops over the tokens, one forward each;
- SmoothGrad loops over its noisy copies, the noise drawn here from its seed, entry by
  entry in unsigned 32-bit Python integers (`counter_noise`).

Each function takes `scores`, embeddings (1, P, D) -> logits (1, C), the input's
embeddings `e` (1, P, D), the baseline's `e0` and the explained class; it returns (P,)
relevance.
"""

from __future__ import annotations

import copy
import statistics
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor, nn

Scores = Callable[[Tensor], Tensor]


def gradient_x_input(scores: Scores, e: Tensor, target: int) -> Tensor:
    e = e.detach().requires_grad_(True)
    (gradient,) = torch.autograd.grad(scores(e)[0, target], e)
    return (e * gradient).sum(dim=-1)[0].detach()


def points(steps: int, rule: str) -> list[tuple[float, float]]:
    """(a, w) pairs: Gauss-Legendre on [0, 1] or the right Riemann sum."""
    if rule == "gausslegendre":
        nodes, weights = np.polynomial.legendre.leggauss(steps)
        return [(0.5 * (1 + x), 0.5 * v) for x, v in zip(nodes, weights, strict=True)]
    assert rule == "riemann_right"
    return [(k / steps, 1 / steps) for k in range(1, steps + 1)]


def integrated_gradients(
    scores: Scores, e: Tensor, e0: Tensor, target: int, steps: int, rule: str = "gausslegendre"
) -> Tensor:
    total = torch.zeros_like(e)
    for alpha, weight in points(steps, rule):
        point = (e0 + alpha * (e - e0)).detach().requires_grad_(True)
        (gradient,) = torch.autograd.grad(scores(point)[0, target], point)
        total = total + weight * gradient
    return ((e - e0) * total).sum(dim=-1)[0].detach()


def occlusion(scores: Scores, e: Tensor, e0: Tensor, target: int) -> Tensor:
    with torch.no_grad():
        full = scores(e)[0, target]
        drops = []
        for n in range(e.shape[1]):
            occluded = e.clone()
            occluded[:, n] = e0[:, n]
            drops.append(full - scores(occluded)[0, target])
    return torch.stack(drops)


def counter_noise(seed: int, copy: int, count: int) -> Tensor:
    """SmoothGrad's `count` standard normals of copy `copy` under `seed`, for the entries
    numbered 1 to `count`, one at a time in unsigned 32-bit arithmetic as docs/methods.md
    ("SmoothGrad") writes the generator: lowbias32, the key of the seed and copy, the
    entry's word, its top 24 bits a uniform, the standard normal quantile of it."""

    def mix(x: int) -> int:
        x ^= x >> 16
        x = x * 0x7FEB352D % 2**32
        x ^= x >> 15
        x = x * 0x846CA68B % 2**32
        return x ^ (x >> 16)

    seed %= 2**64
    key = mix(copy ^ mix(mix(seed % 2**32) ^ (seed >> 32)))
    words = [mix(mix(j) ^ key) for j in range(1, count + 1)]
    quantile = statistics.NormalDist().inv_cdf
    return torch.tensor([quantile((w // 2**8 + 0.5) / 2**24) for w in words], dtype=torch.float64)


def smoothgrad(
    scores: Scores,
    e: Tensor,
    target: int,
    samples: int,
    sigma: float,
    seed: int,
    *,
    squared: bool = False,
    times_input: bool = False,
) -> Tensor:
    """SmoothGrad as the paper writes it, one noisy copy at a time: noise of standard
    deviation sigma * (max - min) of e, copy s's `counter_noise(seed, s, ...)` over e's
    entries in row-major order; the copy's |gradient| (or noisy input times gradient),
    squared where asked, averaged over the copies and summed over D."""
    stdev = sigma * float(e.max() - e.min())
    total = torch.zeros_like(e)
    for s in range(samples):
        noise = counter_noise(seed, s, e.numel()).reshape(e.shape).to(e.dtype)
        noisy = (e + stdev * noise).detach().requires_grad_(True)
        (gradient,) = torch.autograd.grad(scores(noisy)[0, target], noisy)
        attribution = noisy * gradient if times_input else gradient.abs()
        total = total + (attribution**2 if squared else attribution)
    return (total / samples).sum(dim=-1)[0].detach()


# -- the models, run from their embeddings -------------------------------------------------


def timm_vit(model: nn.Module, image: Tensor) -> tuple[Scores, Tensor, Tensor]:
    """A timm ViT on one image (1, 3, H, W): scores from the patch embeddings, the
    image's patch embeddings, and those of zero pixels."""

    def scores(patches: Tensor) -> Tensor:
        x = model.norm_pre(model.patch_drop(model._pos_embed(patches)))
        return model.forward_head(model.norm(model.blocks(x)))

    with torch.no_grad():
        return scores, model.patch_embed(image), model.patch_embed(torch.zeros_like(image))


def hf_text(model: nn.Module, ids: list[int], *, last: bool) -> tuple[Scores, Tensor]:
    """A transformers text model on one unpadded text: scores from its word embeddings
    (`inputs_embeds`; a language model's next-token logits after the text with `last`),
    and the text's word embeddings."""

    def scores(embeddings: Tensor) -> Tensor:
        logits = model(inputs_embeds=embeddings).logits
        return logits[:, -1] if last else logits

    with torch.no_grad():
        return scores, model.get_input_embeddings()(torch.tensor([ids]))


def vision_language_at_inputs(
    model: nn.Module, one: dict, position: int, target: int, method: str, steps: int
) -> tuple[Tensor, Tensor]:
    """Integrated gradients or occlusion of a vision-language model's next-token logit
    `target` read out at `position` of one text, at the tensor its language model is
    called with (`inputs_embeds`: the word embeddings with the image features scattered
    in), from zero embeddings: (T,) relevance, and zeros shaped as the relevance at the
    tower's patch embedding would be (the photo's layout; nothing is read there). The
    model's own float64 forward (a copy), the language model's input replaced by a
    pre-hook for each point of the path or each occluded token, one at a time."""
    from reference_vlm_attnlrp import parts

    copied = copy.deepcopy(model).double()
    language, patches = parts(copied)
    seen: dict[str, Tensor] = {}
    replacement: dict[str, Tensor] = {}

    def swap(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        seen.setdefault("text", kwargs["inputs_embeds"].detach())
        if "value" not in replacement:
            return None
        return args, {**kwargs, "inputs_embeds": replacement["value"]}

    language.register_forward_pre_hook(swap, with_kwargs=True)
    patches.register_forward_hook(lambda module, args, out: seen.setdefault("tower", out))
    arguments = {k: v for k, v in one.items() if k not in ("rows", "cols")}

    def scores(embeddings: Tensor) -> Tensor:
        replacement["value"] = embeddings
        return copied(**arguments, use_cache=False).logits[:, position]

    with torch.no_grad():
        copied(**arguments, use_cache=False)
    e = seen["text"]
    if method == "integrated_gradients":
        relevance = integrated_gradients(scores, e, torch.zeros_like(e), target, steps)
    else:
        relevance = occlusion(scores, e, torch.zeros_like(e), target)
    axis = 1 if isinstance(patches, nn.Conv2d) else -1
    return relevance, torch.zeros_like(seen["tower"].sum(dim=axis)).detach()
