"""Independent reference computations for timm ViTs, written from docs/methods.md.

Nothing here uses `explain`'s recorder, adapters or rules: the forward pass is rebuilt
from the blocks' weights with explicit attention, attention maps keep their gradients
with `retain_grad()`, and every method multiplies full N x N matrices, one image at a
time, exactly as the formulas read.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def forward_explicit(model: nn.Module, image: Tensor) -> tuple[Tensor, list[Tensor]]:
    """Logits and the post-softmax attention maps (retain_grad) of a timm ViT."""
    x = model.patch_embed(image)
    x = model._pos_embed(x)
    x = model.norm_pre(model.patch_drop(x))
    attentions = []
    for block in model.blocks:
        attn = block.attn
        h = block.norm1(x)
        batch, tokens, _ = h.shape
        qkv = attn.qkv(h).reshape(batch, tokens, 3, attn.num_heads, attn.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        q, k = attn.q_norm(q), attn.k_norm(k)
        probabilities = ((q * attn.scale) @ k.transpose(-2, -1)).softmax(dim=-1)
        probabilities.retain_grad()
        attentions.append(probabilities)
        out = (probabilities @ v).transpose(1, 2).reshape(batch, tokens, -1)
        x = x + block.ls1(attn.proj(attn.norm(out)))
        x = x + block.ls2(block.mlp(block.norm2(x)))
    logits = model.forward_head(model.norm(x))
    return logits, attentions


def readout_row(model: nn.Module, num_tokens: int, dtype: torch.dtype) -> Tensor:
    """(N,) readout row: CLS one-hot, CLS/distillation average, or the patch mean."""
    row = torch.zeros(num_tokens, dtype=dtype)
    prefix = model.num_prefix_tokens
    if type(model).__name__ == "VisionTransformerDistilled":
        row[:2] = 0.5
    elif model.global_pool == "token":
        row[0] = 1.0
    else:
        row[prefix:] = 1.0 / (num_tokens - prefix)
    return row


def attentions_and_gradients(
    model: nn.Module, image: Tensor, target: int | None, score: str = "logit"
) -> tuple[list[Tensor], list[Tensor], int]:
    """Per-block (H, N, N) attention and gradient of one image's score, and the class."""
    model.eval()
    logits, attentions = forward_explicit(model, image[None])
    cls = int(logits.argmax()) if target is None else target
    if score == "logit":
        value = logits[0, cls]
    elif score == "probability":
        value = logits.softmax(-1)[0, cls]
    else:
        value = logits.log_softmax(-1)[0, cls]
    value.backward()
    grads = [a.grad[0].detach() for a in attentions]
    return [a[0].detach() for a in attentions], grads, cls


def to_grid(model: nn.Module, token_relevance: Tensor, grid: tuple[int, int]) -> Tensor:
    return token_relevance[model.num_prefix_tokens :].reshape(grid)


def raw_attention(attentions: list[Tensor], row: Tensor) -> Tensor:
    return row @ attentions[-1].mean(0)


def rollout(
    attentions: list[Tensor],
    row: Tensor,
    start: int = 0,
    head_fusion: str = "mean",
    discard_ratio: float = 0.0,
) -> Tensor:
    n = row.shape[0]
    eye = torch.eye(n, dtype=row.dtype)
    joint = None
    for layer in range(start, len(attentions)):
        a = attentions[layer]
        fused = {"mean": a.mean(0), "max": a.max(0).values, "min": a.min(0).values}[head_fusion]
        if discard_ratio:
            fused = fused.clone()
            count = int(n * discard_ratio)
            for i in range(n):
                order = sorted(range(n), key=lambda j, i=i: fused[i, j].item())
                dropped = [j for j in order if not (j == i and row[i] > 0)][:count]
                fused[i, dropped] = 0
        hat = (fused + eye) / (fused + eye).sum(dim=-1, keepdim=True)
        joint = hat if joint is None else hat @ joint
    return row @ joint


def generic(attentions: list[Tensor], grads: list[Tensor], row: Tensor, start: int = 0) -> Tensor:
    n = row.shape[0]
    relevance = torch.eye(n, dtype=row.dtype)
    for layer in range(start, len(attentions)):
        abar = (grads[layer] * attentions[layer]).clamp(min=0).mean(0)
        relevance = relevance + abar @ relevance
    return row @ relevance


def attention_gradcam(
    attentions: list[Tensor], grads: list[Tensor], row: Tensor, kept: Tensor
) -> Tensor:
    a, g = attentions[-1], grads[-1]
    heads = a.shape[0]
    cam = torch.zeros(a.shape[-1], dtype=row.dtype)
    for h in range(heads):
        a_row = row @ a[h]
        g_row = row @ g[h]
        weight = g_row[kept].mean()
        cam = cam + weight * a_row
    return (cam / heads).clamp(min=0)
