"""Relevance propagation through timm's VisionTransformer, on the stock modules.

`TimmVitTape` names the forward activations the rules need (each nn.Linear's input, the
attention products' operands q, k, A, v, the residual operands, the readout tokens and,
for full LRP, the image and the patch embedding), which the recorder captures with forward
hooks. `propagate` then walks them from the classifier down, block by block, in the order
of timm's `Block.forward` and `Attention.forward` (explicit path), applying the rule bound
to each module type. The walk mirrors timm's code; it never re-runs or copies it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from explain.architectures.timm_vit import TimmVisionTransformer
from explain.errors import UnsupportedModelError
from explain.layout import ModuleHook
from explain.lrp import rules as rule
from explain.lrp.rules import RuleSet
from explain.lrp.structure import (
    keep,
    logit_relevance,
    require_forward,
    require_linear,
    require_pass,
    type_name,
)
from explain.rules.fold import compute_dtype

__all__ = ["TimmVitTape"]

# The forward methods the walk mirrors, as (module, qualified name).
_BLOCK = ("timm.models.vision_transformer", "Block.forward")
_ATTENTION = ("timm.layers.attention", "Attention.forward")
_MLP = ("timm.layers.mlp", "Mlp.forward")
_PATCH_EMBED = ("timm.layers.patch_embed", "PatchEmbed.forward")

_BLOCK_PASS = ("norm1", "ls1", "drop_path1", "norm2", "ls2", "drop_path2")
_ATTENTION_PASS = ("q_norm", "k_norm", "attn_drop", "norm", "proj_drop")
_MLP_PASS = ("act", "drop1", "norm", "drop2")


class TimmVitTape:
    """The activations of one forward pass of a timm ViT, and the LRP walk over them
    (`TimmVisionTransformer.lrp_walk`); full LRP reaches the pixels.

    Args:
        adapter: the model's adapter (class token, register tokens, global average
            pooling and distilled DeiT are covered).
        to_input: also capture what full LRP needs to reach the pixels.
    Raises:
        UnsupportedModelError naming the first module that no rule covers.
    """

    in_input_space = True

    def __init__(self, adapter: TimmVisionTransformer, *, to_input: bool) -> None:
        model = adapter.model
        self.model = model
        self._distilled = adapter.distilled
        self._check(model, to_input)
        self.blocks: list[dict[str, Tensor]] = [{} for _ in model.blocks]
        self.head: dict[str, Tensor] = {}
        self.embedding: dict[str, Tensor] = {}
        self.hooks: list[tuple[nn.Module, ModuleHook]] = []
        for store, block in zip(self.blocks, model.blocks, strict=True):
            attn, mlp = block.attn, block.mlp
            self.hooks += [
                (block.norm1, keep(store, "x", "input")),
                (attn.qkv, keep(store, "h", "input")),
                (attn.qkv, keep(store, "qkv")),
                (attn.attn_drop, keep(store, "attention")),
                (attn.proj, keep(store, "o", "input")),
                (block.drop_path1, keep(store, "b1")),
                (block.norm2, keep(store, "x_mid", "input")),
                (mlp.fc1, keep(store, "fc1", "input")),
                (mlp.fc2, keep(store, "fc2", "input")),
                (block.drop_path2, keep(store, "b2")),
            ]
            # q and k are read from qkv, unless a norm (qk_norm) changes them after it
            if not isinstance(attn.q_norm, nn.Identity) or not isinstance(attn.k_norm, nn.Identity):
                self.hooks += [(attn.q_norm, keep(store, "q")), (attn.k_norm, keep(store, "k"))]
        self.hooks += [
            (model.norm, keep(self.head, "tokens")),
            (model.head, keep(self.head, "head_in", "input")),
            (model.head, keep(self.head, "head_out")),
        ]
        if self._distilled:
            self.hooks += [
                (model.head_dist, keep(self.head, "dist_in", "input")),
                (model.head_dist, keep(self.head, "dist_out")),
            ]
        if to_input:
            self.hooks += [
                (model.patch_embed, keep(self.embedding, "input", "input")),
                (model.patch_embed.proj, keep(self.embedding, "image", "input")),
                (model.patch_embed, keep(self.embedding, "patches")),
                (model.pos_drop, keep(self.embedding, "embedded")),
            ]

    def _check(self, model: nn.Module, to_input: bool) -> None:
        if getattr(model, "attn_pool", None) is not None:
            raise UnsupportedModelError(
                "no LRP rule for attention pooling (global_pool='map'); the attention "
                "methods (generic, rollout, ...) read it out through its probe attention"
            )
        for index, block in enumerate(model.blocks):
            where = f"blocks.{index}"
            require_forward(block, _BLOCK, where)
            require_forward(block.attn, _ATTENTION, f"{where}.attn")
            if getattr(block.attn, "gate", None) is not None:
                raise UnsupportedModelError(
                    f"no LRP rule for the gated attention at {where}.attn (a product with a "
                    "sigmoid gate); the rules cover ungated timm Attention"
                )
            require_forward(block.mlp, _MLP, f"{where}.mlp")
            for name in _BLOCK_PASS:
                require_pass(getattr(block, name), f"{where}.{name}")
            for name in _ATTENTION_PASS:
                require_pass(getattr(block.attn, name), f"{where}.attn.{name}")
            for name in _MLP_PASS:
                require_pass(getattr(block.mlp, name), f"{where}.mlp.{name}")
            for owner, name in (("attn", "qkv"), ("attn", "proj"), ("mlp", "fc1"), ("mlp", "fc2")):
                require_linear(getattr(getattr(block, owner), name), f"{where}.{owner}.{name}")
        for name in ("norm", "fc_norm", "head_drop"):
            require_pass(getattr(model, name), name)
        for name in ("head", "head_dist") if self._distilled else ("head",):
            require_linear(getattr(model, name), name, may_pass=True)
        if to_input:
            embed = model.patch_embed
            require_forward(embed, _PATCH_EMBED, "patch_embed")
            if type(embed.proj) is not nn.Conv2d:
                raise UnsupportedModelError(
                    f"no LRP rule for {type_name(embed.proj)} at patch_embed.proj: the z^B "
                    "rule covers torch.nn.Conv2d"
                )
            for name in ("pos_drop", "patch_drop", "norm_pre"):
                require_pass(getattr(model, name), name)
            require_pass(embed.norm, "patch_embed.norm")

    # -- the walk ----------------------------------------------------------------------------

    def propagate(
        self,
        classes: Tensor,
        rules: RuleSet,
        on_attention: Callable[[int, Tensor], None],
        *,
        stop_layer: int = 0,
        to_input: bool = False,
        to_tokens: bool = False,
    ) -> Tensor | None:
        """Relevance from 1.0 at each sample's class logit down to block `stop_layer`.

        `on_attention(layer, relevance)` receives each block's attention relevance RA_l
        (B, H, N, N), last block first. With `to_input` the walk continues to the pixels
        and returns their relevance summed over channels, (B, H, W); with `to_tokens` it
        returns the relevance of block `stop_layer`'s input tokens (B, N, D); otherwise it
        ends once block `stop_layer`'s RA is delivered and returns None. All samples walk
        together; the walk runs in `rules.dtype` and hands back the model's dtype (at
        least float32).
        """
        with torch.no_grad():
            tokens = self.head["tokens"]
            result_dtype = compute_dtype(tokens)
            dtype = rules.dtype(tokens)

            def report(layer: int, relevance: Tensor) -> None:
                on_attention(layer, relevance.to(result_dtype))

            relevance = logit_relevance(self.head["head_out"], classes, dtype)
            relevance = self._readout(relevance, rules, dtype)
            samples, count, width = relevance.shape
            relevance = relevance.reshape(samples * count, width)
            output_denominator = None
            for layer in range(len(self.blocks) - 1, stop_layer - 1, -1):
                last = layer == stop_layer and not (to_input or to_tokens)
                step = self._block(
                    layer, relevance, output_denominator, rules, report, dtype, samples, last=last
                )
                if step is None:
                    return None
                relevance, output_denominator = step
            relevance = relevance.reshape(samples, count, width)
            below = self._to_pixels(relevance, dtype) if to_input else relevance
            return below.to(result_dtype)

    @staticmethod
    def _linear(module: nn.Module, x: Tensor, relevance: Tensor, rules: RuleSet) -> Tensor:
        """The rule set's linear rule over rows; a pass-through head (checked) passes."""
        if isinstance(module, nn.Linear):
            return rules.linear(x.flatten(0, -2), module.weight, relevance)
        return relevance

    def _readout(self, relevance: Tensor, rules: RuleSet, dtype: torch.dtype) -> Tensor:
        """Classifier, pooling and final norms: logit relevance -> (B, N, D) tokens."""
        model, head = self.model, self.head
        tokens = head["tokens"].to(dtype)
        if self._distilled:
            # eval-mode head: (head(x[:, 0]) + head_dist(x[:, 1])) / 2; the halving is a
            # constant and passes, the add of the two heads' logits is LRP-0.
            logits, distilled = head["head_out"].to(dtype), head["dist_out"]
            from_head, from_dist = rule.residual_plain(
                logits,
                distilled,
                relevance,
                rule.safe_denominator(logits + distilled),
                relevance.shape[0],
            )
            class_token = self._linear(model.head, head["head_in"], from_head, rules)
            dist_token = self._linear(model.head_dist, head["dist_in"], from_dist, rules)
            # The tokens are read twice (x[:, 0], x[:, 1]): a branch point.
            return rule.branch(
                tokens,
                [
                    rule.select_tokens(tokens, 0, class_token),
                    rule.select_tokens(tokens, 1, dist_token),
                ],
                rule.safe_denominator(tokens),
            )
        pooled = self._linear(model.head, head["head_in"], relevance, rules)
        if model.global_pool == "token":
            return rule.select_tokens(tokens, 0, pooled)
        first = 0 if model.pool_include_prefix else model.num_prefix_tokens
        return rule.mean_tokens(tokens, first, pooled)

    def _block(
        self,
        layer: int,
        relevance: Tensor,
        output_denominator: Tensor | None,
        rules: RuleSet,
        report: Callable[[int, Tensor], None],
        dtype: torch.dtype,
        samples: int,
        *,
        last: bool = False,
    ) -> tuple[Tensor, Tensor | None] | None:
        """Relevance of block `layer`'s output rows -> of its input rows, in timm's Block
        order: x_mid = x + attn branch; out = x_mid + mlp branch. The `last` block of a
        walk only delivers its RA and returns None (nothing below it is wanted).

        Each residual sum is also a branch point (x_mid; the output is the next block's
        input x), so one safe denominator serves both, handed down from the block above
        as `output_denominator`. That holds where the walk's dtype is the model's: the
        stored sums are then the walk's own, bit for bit. A float64 walk over float32
        activations recomputes each sum in float64 (the residual rule's denominator) and
        divides the branch by the tensor as the model stored it.
        """
        block, store = self.model.blocks[layer], self.blocks[layer]
        x, x_mid, b1, b2 = (store[name].flatten(0, -2) for name in ("x", "x_mid", "b1", "b2"))
        shared = x.dtype == dtype
        if output_denominator is None:  # the last block, or sums not shared
            output_denominator = rule.safe_denominator(x_mid.to(dtype) + b2)

        # out = x_mid + drop_path2(ls2(mlp(norm2(x_mid))))
        from_mid, from_mlp = rules.residual(x_mid, b2, relevance, output_denominator, samples)
        hidden = self._linear(block.mlp.fc2, store["fc2"], from_mlp, rules)
        into_mlp = self._linear(block.mlp.fc1, store["fc1"], hidden, rules)
        mid = rule.safe_denominator(x_mid.to(dtype))
        relevance = rule.branch(x_mid, [from_mid, into_mlp], mid)

        # x_mid = x + drop_path1(ls1(attn(norm1(x))))
        sum_denominator = mid if shared else rule.safe_denominator(x.to(dtype) + b1)
        from_x, from_attn = rules.residual(x, b1, relevance, sum_denominator, samples)
        into_attn = self._attention(
            layer, block.attn, store, from_attn, rules, report, dtype, last=last
        )
        if into_attn is None:
            return None
        below = rule.safe_denominator(x.to(dtype))
        return rule.branch(x, [from_x, into_attn], below), below if shared else None

    def _attention(
        self,
        layer: int,
        attn: nn.Module,
        store: dict[str, Tensor],
        relevance: Tensor,
        rules: RuleSet,
        report: Callable[[int, Tensor], None],
        dtype: torch.dtype,
        *,
        last: bool = False,
    ) -> Tensor | None:
        """timm Attention: proj, A @ v, softmax(q k^T * scale), qkv; returns the relevance
        of the attention's input rows (None for the `last` block, which stops at RA).
        Heads run as one batch of (B * H) matrices."""
        batch, heads, tokens, _ = store["attention"].shape
        head_dim = attn.head_dim
        groups = batch * heads

        def by_head(t: Tensor) -> Tensor:  # (B, H, N, d) -> (B * H, N, d) in the walk's dtype
            return t.to(dtype).reshape(groups, tokens, t.shape[-1])

        relevance = self._linear(attn.proj, store["o"], relevance, rules)
        relevance = relevance.view(batch, tokens, heads, head_dim).transpose(1, 2)
        # timm: qkv(x).reshape(B, N, 3, H, d).permute(2, 0, 3, 1, 4), then q, k, v
        qkv = store["qkv"].view(batch, tokens, 3, heads, head_dim).permute(2, 0, 3, 1, 4)
        qkv = qkv.to(dtype).reshape(3, groups, tokens, head_dim)
        if last:
            of_attention, _ = rule.attention_probabilities(
                by_head(store["attention"]), qkv[2], by_head(relevance)
            )
            report(layer, of_attention.view(batch, heads, tokens, tokens))
            return None
        if "q" in store:  # normalised after qkv (qk_norm)
            qkv = torch.stack([by_head(store["q"]), by_head(store["k"]), qkv[2]])

        of_attention, of_heads = rule.attention(
            qkv, by_head(store["attention"]), by_head(relevance), rules.residual, samples=batch
        )
        report(layer, of_attention.view(batch, heads, tokens, tokens))
        # (3, B * H, N, d) -> (B * N, 3 * H * d): the inverse of timm's reshape and permute.
        of_qkv = of_heads.view(3, batch, heads, tokens, head_dim).permute(1, 3, 0, 2, 4)
        of_qkv = of_qkv.reshape(batch * tokens, 3 * heads * head_dim)
        return self._linear(attn.qkv, store["h"], of_qkv, rules)

    def _to_pixels(self, relevance: Tensor, dtype: torch.dtype) -> Tensor:
        """Block 0's input -> pixels: prefix tokens dropped, the position-embedding add
        (LRP-0), the patch-embedding convolution (z^B), summed over channels."""
        model, store = self.model, self.embedding
        prefix = model.num_prefix_tokens
        image = store["image"].to(dtype)
        batch = image.shape[0]
        patches = store["patches"].to(dtype).reshape(batch, -1, relevance.shape[-1])
        relevance = relevance[:, prefix:]
        if model.pos_embed is not None:
            # x = cat(prefix, patches) + pos, or cat(prefix, patches + pos) (no_embed_class):
            # either way the patch tokens' sum is patches + their position embedding.
            embedded = store["embedded"].to(dtype)[:, prefix:]
            relevance = patches * rule.sdiv(relevance, embedded)
        channels = model.patch_embed.proj.out_channels
        relevance = relevance.transpose(1, 2).reshape(batch, channels, *self._grid(image))
        pixels = rule.conv_input_zb(image, model.patch_embed.proj, relevance).sum(dim=1)
        height, width = store["input"].shape[-2:]  # crop dynamic padding, if any
        return pixels[:, :height, :width]

    def _grid(self, image: Tensor) -> tuple[int, int]:
        proj = self.model.patch_embed.proj
        size = []
        for axis, extent in enumerate(image.shape[-2:]):
            span = proj.dilation[axis] * (proj.kernel_size[axis] - 1) + 1
            size.append((extent + 2 * proj.padding[axis] - span) // proj.stride[axis] + 1)
        return size[0], size[1]
