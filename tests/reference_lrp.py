"""Independent layer-by-layer LRP reference for timm ViTs, written from docs/methods.md
("LRP-based methods (CVPR 2021)").

Nothing here uses `explain`: one image at a time, the forward pass is written out op by op
from the model's leaf modules and keeps every activation it needs; the relevance pass then
applies one function per operation, each LRP-0 step taken as the spec reads it, with
`torch.autograd.grad(Z, X, S)` for the vector-Jacobian product, sums over the whole
(batch 1) tensor, and full N x N matrices for the aggregation.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def sdiv(a: Tensor, b: Tensor) -> Tensor:
    d = b.clamp(min=1e-9) + b.clamp(max=1e-9)
    d = d + (d == 0).to(d.dtype) * 1e-9
    return a / d * (b != 0).to(b.dtype)


def lrp0(function, inputs: list[Tensor], relevance: Tensor) -> list[Tensor]:
    """LRP-0 for Z = f(X_1..X_k): R_j = X_j * (J^T S), S = sdiv(R, Z), by autograd."""
    leaves = [x.detach().clone().requires_grad_(True) for x in inputs]
    with torch.enable_grad():
        z = function(*leaves)
        s = sdiv(relevance, z.detach())
        grads = torch.autograd.grad(z, leaves, s)
    return [x.detach() * g for x, g in zip(leaves, grads, strict=True)]


def linear(x: Tensor, weight: Tensor, relevance: Tensor, shared: bool) -> Tensor:
    """Alpha-beta (1, 0), bias ignored; one shared or two separate denominators."""
    xp = x.clamp(min=0).detach().requires_grad_(True)
    xn = x.clamp(max=0).detach().requires_grad_(True)
    wp, wn = weight.clamp(min=0), weight.clamp(max=0)
    with torch.enable_grad():
        z1, z2 = F.linear(xp, wp), F.linear(xn, wn)
        if shared:
            s1 = s2 = sdiv(relevance, (z1 + z2).detach())
        else:
            s1, s2 = sdiv(relevance, z1.detach()), sdiv(relevance, z2.detach())
        g1 = torch.autograd.grad(z1, xp, s1)[0]
        g2 = torch.autograd.grad(z2, xn, s2)[0]
    return xp.detach() * g1 + xn.detach() * g2


def residual(a: Tensor, b: Tensor, relevance: Tensor, rescale: bool) -> tuple[Tensor, Tensor]:
    ra, rb = lrp0(lambda p, q: p + q, [a, b], relevance)
    if not rescale:
        return ra, rb
    sa, sb, total = ra.sum(), rb.sum(), relevance.sum()
    fa = sdiv(sa.abs(), sa.abs() + sb.abs()) * total
    fb = sdiv(sb.abs(), sa.abs() + sb.abs()) * total
    return ra * sdiv(fa, sa), rb * sdiv(fb, sb)


def branch(x: Tensor, relevances: list[Tensor]) -> Tensor:
    return x * sum(sdiv(r, x) for r in relevances)


def forward(model: nn.Module, image: Tensor) -> dict:
    """Logits and every activation of a timm ViT, one image (1, C, H, W), explicit attention."""
    record: dict = {"image": image, "blocks": []}
    pe = model.patch_embed
    patches = pe.proj(image)
    grid = patches.shape[-2:]
    patches = pe.norm(patches.flatten(2).transpose(1, 2))
    record["patches"], record["grid"] = patches, grid
    dist_token = getattr(model, "dist_token", None)
    prefix = [t for t in (model.cls_token, dist_token, model.reg_token) if t is not None]
    pos = model.pos_embed
    if pos is not None and model.dynamic_img_size:
        from timm.layers import resample_abs_pos_embed

        pos = resample_abs_pos_embed(
            pos,
            new_size=tuple(grid),
            old_size=pe.grid_size,
            num_prefix_tokens=0 if model.no_embed_class else model.num_prefix_tokens,
        )
    record["pos"] = pos
    if pos is None:
        x = torch.cat([*prefix, patches], dim=1)
    elif model.no_embed_class:
        x = torch.cat([*prefix, patches + pos], dim=1)
    else:
        x = torch.cat([*prefix, patches], dim=1) + pos
    x = model.norm_pre(x)
    for block in model.blocks:
        attn = block.attn
        rec = {"x": x}
        h = block.norm1(x)
        heads, d = attn.num_heads, attn.head_dim
        qkv = attn.qkv(h)
        q = torch.stack([qkv[0, :, h_ * d : (h_ + 1) * d] for h_ in range(heads)])[None]
        k = torch.stack([qkv[0, :, (heads + h_) * d : (heads + h_ + 1) * d] for h_ in range(heads)])
        v = torch.stack(
            [qkv[0, :, (2 * heads + h_) * d : (2 * heads + h_ + 1) * d] for h_ in range(heads)]
        )
        q, k, v = attn.q_norm(q), attn.k_norm(k[None]), v[None]
        a = ((q * attn.scale) @ k.transpose(-2, -1)).softmax(dim=-1)
        o = torch.cat([(a @ v)[0, h_] for h_ in range(heads)], dim=-1)[None]
        o = attn.norm(o)
        b1 = block.ls1(attn.proj(o))
        x_mid = x + b1
        fc1_in = block.norm2(x_mid)
        fc2_in = block.mlp.norm(block.mlp.act(block.mlp.fc1(fc1_in)))
        b2 = block.ls2(block.mlp.fc2(fc2_in))
        x = x_mid + b2
        rec.update(h=h, q=q, k=k, v=v, a=a, o=o, b1=b1, x_mid=x_mid, fc1_in=fc1_in)
        rec.update(fc2_in=fc2_in, b2=b2)
        record["blocks"].append(rec)
    tokens = model.norm(x)
    record["tokens"] = tokens
    if hasattr(model, "head_dist"):
        record["head_in"], record["dist_in"] = tokens[:, 0], tokens[:, 1]
        record["head_out"] = model.head(tokens[:, 0])
        record["dist_out"] = model.head_dist(tokens[:, 1])
        record["logits"] = (record["head_out"] + record["dist_out"]) / 2
    else:
        if model.global_pool == "token":
            pooled = tokens[:, 0]
        else:
            first = 0 if model.pool_include_prefix else model.num_prefix_tokens
            pooled = tokens[:, first:].mean(dim=1)
        record["head_in"] = model.fc_norm(pooled)
        record["logits"] = model.head(record["head_in"])
    return record


def relevance_pass(
    model: nn.Module, record: dict, target: int, *, chefer: bool, to_pixels: bool = False
) -> tuple[list[Tensor], Tensor | None]:
    """Per-block attention relevance RA_l (H, N, N) and, with `to_pixels`, (H, W) pixels."""
    logits = record["logits"]
    relevance = torch.zeros_like(logits)
    relevance[0, target] = 1.0
    tokens = record["tokens"]
    if hasattr(model, "head_dist"):
        r_head, r_dist = lrp0(
            lambda p, q: p + q, [record["head_out"], record["dist_out"]], relevance
        )
        r0 = linear(record["head_in"], model.head.weight, r_head, chefer)
        r1 = linear(record["dist_in"], model.head_dist.weight, r_dist, chefer)
        sel0 = lrp0(lambda t: t.index_select(1, torch.tensor([0])), [tokens], r0[:, None])[0]
        sel1 = lrp0(lambda t: t.index_select(1, torch.tensor([1])), [tokens], r1[:, None])[0]
        relevance = branch(tokens, [sel0, sel1])
    else:
        relevance = linear(record["head_in"], model.head.weight, relevance, chefer)
        if model.global_pool == "token":
            relevance = lrp0(
                lambda t: t.index_select(1, torch.tensor([0])), [tokens], relevance[:, None]
            )[0]
        else:
            first = 0 if model.pool_include_prefix else model.num_prefix_tokens
            relevance = lrp0(lambda t: t[:, first:].mean(dim=1), [tokens], relevance)[0]
    attention_relevance = [None] * len(model.blocks)
    for layer in reversed(range(len(model.blocks))):
        rec, block = record["blocks"][layer], model.blocks[layer]
        attn = block.attn
        r_mid, r_b2 = residual(rec["x_mid"], rec["b2"], relevance, chefer)
        r = linear(rec["fc2_in"], block.mlp.fc2.weight, r_b2, chefer)
        r = linear(rec["fc1_in"], block.mlp.fc1.weight, r, chefer)
        relevance = branch(rec["x_mid"], [r_mid, r])
        r_x, r_b1 = residual(rec["x"], rec["b1"], relevance, chefer)
        r = linear(rec["o"], attn.proj.weight, r_b1, chefer)
        heads, d = attn.num_heads, attn.head_dim
        r_out = torch.stack([r[0, :, h * d : (h + 1) * d] for h in range(heads)])[None]
        r_a, r_v = lrp0(lambda p, q: p @ q, [rec["a"], rec["v"]], r_out)
        r_a, r_v = r_a / 2, r_v / 2
        attention_relevance[layer] = r_a[0]
        r_q, r_k = lrp0(lambda p, q: p @ q.transpose(-2, -1), [rec["q"], rec["k"]], r_a)
        r_q, r_k = r_q / 2, r_k / 2
        r_qkv = torch.zeros(1, r.shape[1], 3 * heads * d, dtype=r.dtype)
        for part, r_part in enumerate((r_q, r_k, r_v)):
            for h in range(heads):
                start = (part * heads + h) * d
                r_qkv[0, :, start : start + d] = r_part[0, h]
        r = linear(rec["h"], attn.qkv.weight, r_qkv, chefer)
        relevance = branch(rec["x"], [r_x, r])
    if not to_pixels:
        return attention_relevance, None
    prefix = model.num_prefix_tokens
    patches, pos = record["patches"], record["pos"]
    relevance = relevance[:, prefix:]
    if pos is not None:
        pos_patches = pos if model.no_embed_class else pos[:, prefix:]
        relevance = lrp0(lambda p: p + pos_patches, [patches], relevance)[0]
    gh, gw = record["grid"]
    relevance = relevance.transpose(1, 2).reshape(1, -1, gh, gw)
    return attention_relevance, zb_conv(record["image"], model.patch_embed.proj, relevance)


def zb_conv(x: Tensor, conv: nn.Conv2d, relevance: Tensor) -> Tensor:
    """z^B on the input convolution, summed over channels: (H, W)."""
    w = conv.weight
    wp, wn = w.clamp(min=0), w.clamp(max=0)
    lo = torch.full_like(x, x.min().item())
    hi = torch.full_like(x, x.max().item())
    geometry = dict(stride=conv.stride, padding=conv.padding)
    leaves = [t.detach().clone().requires_grad_(True) for t in (x, lo, hi)]
    with torch.enable_grad():
        zx = F.conv2d(leaves[0], w, **geometry)
        zl = F.conv2d(leaves[1], wp, **geometry)
        zh = F.conv2d(leaves[2], wn, **geometry)
        s = relevance / (zx - zl - zh + 1e-9).detach()
        gx = torch.autograd.grad(zx, leaves[0], s)[0]
        gl = torch.autograd.grad(zl, leaves[1], s)[0]
        gh = torch.autograd.grad(zh, leaves[2], s)[0]
    return (x * gx - lo * gl - hi * gh)[0].sum(dim=0)


def transformer_attribution(
    relevances: list[Tensor], grads: list[Tensor], row: Tensor, start: int, normalise: bool
) -> Tensor:
    n = row.shape[0]
    eye = torch.eye(n, dtype=row.dtype)
    joint = eye
    for layer in range(start, len(relevances)):
        abar = (grads[layer] * relevances[layer]).clamp(min=0).mean(0) + eye
        if normalise:
            abar = abar / abar.sum(dim=-1, keepdim=True)
        joint = abar @ joint
    return row @ joint


def partial_lrp(relevances: list[Tensor], row: Tensor) -> Tensor:
    return row @ relevances[-1].clamp(min=0).mean(0)


# -- Hugging Face BertForSequenceClassification ----------------------------------------------


def _heads(t: Tensor, heads: int) -> Tensor:
    """(1, N, H * d) -> (1, H, N, d) by explicit slicing."""
    d = t.shape[-1] // heads
    return torch.stack([t[0, :, h * d : (h + 1) * d] for h in range(heads)])[None]


def _merge(t: Tensor) -> Tensor:
    """(1, H, N, d) -> (1, N, H * d)."""
    return torch.cat([t[0, h] for h in range(t.shape[1])], dim=-1)[None]


def bert_forward(model: nn.Module, input_ids: Tensor) -> dict:
    """Logits and activations of a BERT classifier for ONE unpadded text (1, N)."""
    bert = model.bert
    x = bert.embeddings(input_ids=input_ids, token_type_ids=torch.zeros_like(input_ids))
    record: dict = {"layers": []}
    for layer in bert.encoder.layer:
        sa, so = layer.attention.self, layer.attention.output
        heads = sa.num_attention_heads
        q, k, v = (_heads(p(x), heads) for p in (sa.query, sa.key, sa.value))
        scores = (q @ k.transpose(-2, -1)) * sa.scaling
        a = scores.softmax(dim=-1)
        ctx = _merge(a @ v)
        a1 = so.dense(ctx)
        ao = so.LayerNorm(a1 + x)
        inter = layer.intermediate.intermediate_act_fn(layer.intermediate.dense(ao))
        a2 = layer.output.dense(inter)
        rec = dict(x=x, q=q, k=k, v=v, scores=scores, a=a, ctx=ctx, a1=a1, ao=ao)
        record["layers"].append({**rec, "inter": inter, "a2": a2})
        x = layer.output.LayerNorm(a2 + ao)
    record["tokens"] = x
    record["first"] = x[:, 0]
    record["pooled"] = bert.pooler.activation(bert.pooler.dense(record["first"]))
    record["logits"] = model.classifier(record["pooled"])
    return record


def bert_relevance_pass(
    model: nn.Module, record: dict, target: int, *, chefer: bool
) -> tuple[list[Tensor], Tensor]:
    """Per-layer attention relevance RA_l (H, N, N) and the token relevance of full LRP."""
    relevance = torch.zeros_like(record["logits"])
    relevance[0, target] = 1.0
    relevance = linear(record["pooled"], model.classifier.weight, relevance, chefer)
    relevance = linear(record["first"], model.bert.pooler.dense.weight, relevance, chefer)
    relevance = lrp0(
        lambda t: t.index_select(1, torch.tensor([0])), [record["tokens"]], relevance[:, None]
    )[0]
    layers = model.bert.encoder.layer
    attention_relevance = [None] * len(layers)
    for index in reversed(range(len(layers))):
        rec, layer = record["layers"][index], layers[index]
        sa = layer.attention.self
        r_a2, r_ao = residual(rec["a2"], rec["ao"], relevance, chefer)
        r = linear(rec["inter"], layer.output.dense.weight, r_a2, chefer)
        r = linear(rec["ao"], layer.intermediate.dense.weight, r, chefer)
        relevance = branch(rec["ao"], [r, r_ao])
        r_a1, r_x = residual(rec["a1"], rec["x"], relevance, chefer)
        r = linear(rec["ctx"], layer.attention.output.dense.weight, r_a1, chefer)
        r_a, r_v = lrp0(lambda p, q: p @ q, [rec["a"], rec["v"]], _heads(r, sa.num_attention_heads))
        r_a, r_v = r_a / 2, r_v / 2
        attention_relevance[index] = r_a[0]
        # the attention mask add (scores + mask; all zeros for one unpadded text)
        r_scores, _ = residual(rec["scores"], torch.zeros_like(rec["scores"]), r_a, chefer)
        r_q, r_k = lrp0(lambda p, q: p @ q.transpose(-2, -1), [rec["q"], rec["k"]], r_scores)
        r_q, r_k = r_q / 2, r_k / 2
        x = rec["x"]
        parts = [
            linear(x, sa.query.weight, _merge(r_q), chefer),
            linear(x, sa.key.weight, _merge(r_k), chefer),
            linear(x, sa.value.weight, _merge(r_v), chefer),
        ]
        relevance = branch(x, [branch(x, parts), r_x])
    return attention_relevance, relevance[0].sum(dim=-1)
