"""Independent re-derivations of AttnLRP and CP-LRP (Gradient x Input form) for the tiny
test models: each model's forward pass written out by hand from its weights, with the
rules placed where the papers state them, not where explain hooks them:

- identity rule on normalisations: the standard deviation is detached;
- identity rule on element-wise non-linearities: a custom autograd function whose
  backward multiplies by f(x) / x;
- uniform rule on the attention products: the gradient is halved after q k^T (at the
  scores) and after A v (at the attention output), as LXT does for BERT;
- CP-LRP: the scores are detached (no gradient reaches q and k through the softmax).

Relevance = sum over the hidden size of (embedding x its gradient), one text or image at a
time (batch 1, no padding).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class _Identity(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, fn):
        y = fn(x)
        ctx.save_for_backward(y / (x + 1e-10))
        return y

    @staticmethod
    def backward(ctx, grad):
        (ratio,) = ctx.saved_tensors
        return grad * ratio, None


class _Halve(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad / 2


def halve(x: Tensor) -> Tensor:
    """`x`, its gradient halved: the uniform rule's share for one factor of a product."""
    return _Halve.apply(x)


def identity(x: Tensor, fn) -> Tensor:
    return _Identity.apply(x, fn)


def layer_norm(x: Tensor, module: nn.LayerNorm) -> Tensor:
    mean = x.mean(dim=-1, keepdim=True)
    std = ((x - mean) ** 2).mean(dim=-1, keepdim=True).add(module.eps).sqrt()
    return (x - mean) / std.detach() * module.weight + module.bias


def attention(q: Tensor, k: Tensor, v: Tensor, scale: float, mask: Tensor | None, variant: str):
    """(1, H, N, d) q, k, v -> (1, H, N, d), with the variant's rules on both products."""
    scores = (q @ k.transpose(-2, -1)) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    scores = halve(scores) if variant == "attnlrp" else scores.detach()
    output = scores.softmax(dim=-1) @ v
    return halve(output) if variant == "attnlrp" else output


def _heads(x: Tensor, heads: int) -> Tensor:
    return x.reshape(x.shape[0], x.shape[1], heads, -1).transpose(1, 2)


def _merge(x: Tensor) -> Tensor:
    return x.transpose(1, 2).reshape(x.shape[0], x.shape[2], -1)


def relevance(embeddings: Tensor, score: Tensor) -> Tensor:
    (grad,) = torch.autograd.grad(score, embeddings)
    return (embeddings * grad).sum(dim=-1)[0]


def vit(model: nn.Module, image: Tensor, target: int, variant: str) -> Tensor:
    """(gh, gw) relevance of a timm ViT with a class token, token pooling, no layer scale."""
    proj = model.patch_embed.proj
    patches = F.conv2d(image, proj.weight, proj.bias, stride=proj.stride)
    grid = patches.shape[-2:]
    patches = patches.flatten(2).transpose(1, 2).detach().requires_grad_(True)
    x = torch.cat([model.cls_token, patches], dim=1) + model.pos_embed
    for block in model.blocks:
        attn = block.attn
        qkv = F.linear(layer_norm(x, block.norm1), attn.qkv.weight, attn.qkv.bias)
        q, k, v = (_heads(t, attn.num_heads) for t in qkv.chunk(3, dim=-1))
        out = attention(q, k, v, attn.head_dim**-0.5, None, variant)
        x = x + F.linear(_merge(out), attn.proj.weight, attn.proj.bias)
        mlp = block.mlp
        hidden = identity(
            F.linear(layer_norm(x, block.norm2), mlp.fc1.weight, mlp.fc1.bias), F.gelu
        )
        x = x + F.linear(hidden, mlp.fc2.weight, mlp.fc2.bias)
    logits = model.head(layer_norm(x, model.norm)[:, 0])
    return relevance(patches, logits[0, target]).reshape(grid)


def bert(model: nn.Module, ids: list[int], target: int, variant: str) -> Tensor:
    """(T,) relevance of a BertForSequenceClassification on one unpadded text."""
    bert = model.bert
    config = model.config
    emb = bert.embeddings
    tokens = torch.tensor([ids])
    words = emb.word_embeddings(tokens).detach().requires_grad_(True)
    positions = emb.position_embeddings(torch.arange(len(ids)))[None]
    x = layer_norm(words + positions + emb.token_type_embeddings.weight[0], emb.LayerNorm)
    heads = config.num_attention_heads
    for layer in bert.encoder.layer:
        self_attention = layer.attention.self
        q, k, v = (
            _heads(module(x), heads)
            for module in (self_attention.query, self_attention.key, self_attention.value)
        )
        out = attention(q, k, v, 1 / math.sqrt(q.shape[-1]), None, variant)
        x = layer_norm(
            x + layer.attention.output.dense(_merge(out)), layer.attention.output.LayerNorm
        )
        hidden = identity(layer.intermediate.dense(x), F.gelu)
        x = layer_norm(x + layer.output.dense(hidden), layer.output.LayerNorm)
    pooled = identity(bert.pooler.dense(x[:, 0]), torch.tanh)
    logits = model.classifier(pooled)
    return relevance(words, logits[0, target])


def _gelu_new(x: Tensor) -> Tensor:
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


def gpt2(model: nn.Module, ids: list[int], target: int, variant: str) -> Tensor:
    """(T,) relevance of GPT2LMHeadModel's next-token logit `target` after one text."""
    transformer = model.transformer
    tokens = torch.tensor([ids])
    words = transformer.wte(tokens).detach().requires_grad_(True)
    x = words + transformer.wpe(torch.arange(len(ids)))[None]
    causal = torch.ones(len(ids), len(ids), dtype=torch.bool).tril()
    for block in transformer.h:
        attn = block.attn
        qkv = attn.c_attn(layer_norm(x, block.ln_1))
        q, k, v = (_heads(t, attn.num_heads) for t in qkv.split(attn.split_size, dim=-1))
        out = attention(q, k, v, 1 / math.sqrt(q.shape[-1]), causal, variant)
        x = x + attn.c_proj(_merge(out))
        hidden = identity(block.mlp.c_fc(layer_norm(x, block.ln_2)), _gelu_new)
        x = x + block.mlp.c_proj(hidden)
    logits = model.lm_head(layer_norm(x, transformer.ln_f))
    return relevance(words, logits[0, -1, target])
