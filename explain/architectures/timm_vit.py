"""timm's VisionTransformer family: ViT, DeiT, DeiT III, register and GAP variants, distilled DeiT,
attention pooling (`global_pool="map"`, see explain.architectures.attention_pool).

The attention probabilities are the output of `block.attn.attn_drop` on timm's explicit
attention path (`fused_attn = False`): the very tensor that multiplies the values, so a
tensor hook on it receives dy/dA. The token grid and the prefix count come from the model
and the input, never from constants. The family's LRP walk (`TimmVitWalk`) and where
AttnLRP and CP-LRP attach (`timm_attnlrp_sites`, shared with Eva) live here too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import torch
from torch import Tensor, nn

from explain.architectures.attention_pool import check_timm_latent_pool, timm_latent_pool_row
from explain.architectures.base import (
    Adapter,
    mean_rows,
    validate_image_batch,
    whole_output,
)
from explain.errors import InputError, UnsupportedModelError
from explain.layout import (
    AttentionSite,
    FlagSetting,
    FusedAttentionSite,
    FusedPath,
    ModuleHook,
    Prepared,
    TokenLayout,
)
from explain.lrp import propagation as lrp
from explain.lrp.attnlrp import AttnLrpSites, Gate, Projection
from explain.lrp.propagation import RuleSet
from explain.lrp.walk import (
    keep,
    lacks,
    logit_relevance,
    require_forward,
    require_linear,
    require_pass,
    type_name,
)
from explain.lrp.weights import acts_as, base_layer, used_weight
from explain.rules.fold import compute_dtype

__all__ = [
    "TimmBlocks",
    "TimmVisionTransformer",
    "TimmVitWalk",
    "is_timm_class",
    "timm_attnlrp_sites",
    "validate_image_batch",
]

_POOLS = ("token", "avg")


def is_timm_class(model: nn.Module, name: str) -> bool:
    """Whether `model` is (a subclass of) timm's class `name`, without importing timm."""
    return any(
        cls.__name__ == name and cls.__module__.startswith("timm.") for cls in type(model).__mro__
    )


def headless_timm_model(model: nn.Module) -> str | None:
    """Why a timm model loaded without its classifier (num_classes=0) has no predicted
    class and what to do instead (`Adapter.feature_output`); None when it has a head."""
    if model.num_classes > 0:
        return None
    return (
        "this timm model has no classifier (num_classes=0): its output is the pooled "
        "features, so there is no predicted class; give the target explicitly (a "
        "feature index, or a callable that returns one score per image, e.g. lambda "
        "features: features @ direction), or load the model with its head"
    )


def timm_attention_sites(blocks: Sequence[nn.Module]) -> list[AttentionSite]:
    """One site per timm block, in order: the output of its `attn.attn_drop`, which on
    timm's explicit path is the post-softmax probabilities (ViT and Swin blocks alike)."""
    return [
        AttentionSite(layer=index, module=block.attn.attn_drop, probabilities=whole_output)
        for index, block in enumerate(blocks)
    ]


class TimmBlocks(Adapter):
    """timm vision models built from timm's ViT blocks (`model.blocks`, each block's
    `attn.attn_drop` seeing the probabilities on the explicit path, `fused_attn` the
    switch): how VisionTransformer, Eva and Beit are read. The capabilities that depend
    on more than the blocks (the fused path, the LRP walk, the AttnLRP sites) are each
    family's own."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        pool = getattr(model, "global_pool", None)
        self._attention_pool = getattr(model, "attn_pool", None)
        if self._attention_pool is not None:  # global_pool="map"
            check_timm_latent_pool(self._attention_pool)
        elif pool not in _POOLS:
            raise UnsupportedModelError(
                f"timm {type(model).__name__} with global_pool={pool!r} is not supported: the "
                f"readout must be the class token, the patch mean ({', '.join(_POOLS)}) or "
                "attention pooling (map)"
            )
        for index, block in enumerate(model.blocks):
            attn = getattr(block, "attn", None)
            if attn is None or not isinstance(getattr(attn, "attn_drop", None), nn.Module):
                raise UnsupportedModelError(
                    f"block {index} ({type(block).__name__}) has no timm Attention with an "
                    "attn_drop module; supported blocks: timm Block, ResPostBlock and "
                    "LayerScale blocks with timm.layers.Attention"
                )
        self.distilled = is_timm_class(model, "VisionTransformerDistilled")
        """A distilled DeiT: its eval-mode head averages the class and distillation heads."""
        self._channels = base_layer(model.patch_embed.proj).in_channels  # also under LoRA

    @property
    def blocks(self) -> Sequence[nn.Module]:
        return list(self.model.blocks)

    @property
    def feature_output(self) -> str | None:
        return headless_timm_model(self.model)

    def attention_sites(self) -> Sequence[AttentionSite]:
        return timm_attention_sites(self.model.blocks)

    def path_flags(self) -> Sequence[FlagSetting]:
        flags = [FlagSetting(block.attn, "fused_attn", False) for block in self.model.blocks]
        if hasattr(self.model, "grad_checkpointing"):
            # Checkpointing would rerun every block in the backward and fire the hooks twice.
            flags.append(FlagSetting(self.model, "grad_checkpointing", False))
        return flags

    def prepare(self, inputs: object) -> Prepared:
        images = validate_image_batch(inputs, self._channels, self.parameter)
        height, width = images.shape[-2:]
        grid = self._grid(height, width)
        prefix = self.model.num_prefix_tokens
        layout = TokenLayout.image(grid, (height, width), prefix)
        return Prepared(batch_size=images.shape[0], layout=layout, arguments={"x": images})

    def _grid(self, height: int, width: int) -> tuple[int, int]:
        patch_embed = self.model.patch_embed
        patch = tuple(patch_embed.patch_size)
        expected = tuple(patch_embed.img_size) if patch_embed.img_size is not None else None
        dynamic = getattr(self.model, "dynamic_img_size", False)
        if expected is not None and not dynamic and (height, width) != expected:
            raise InputError(
                f"this model takes {expected[0]}x{expected[1]} images, got {height}x{width}; "
                f"resize the input, or build the model with dynamic_img_size=True"
            )
        if not patch_embed.dynamic_img_pad and (height % patch[0] or width % patch[1]):
            raise InputError(
                f"image size {height}x{width} is not a multiple of the patch size "
                f"{patch[0]}x{patch[1]}"
            )
        return tuple(patch_embed.dynamic_feat_size((height, width)))

    def forward(self, prepared: Prepared) -> Tensor:
        return self.model(prepared.arguments["x"])

    def readout(self, prepared: Prepared) -> Tensor:
        layout = prepared.layout
        if self._attention_pool is not None:  # the pooling head's probe attention
            # Eva pools every token; VisionTransformer the patches unless told otherwise.
            include_prefix = getattr(self.model, "pool_include_prefix", True)
            images = prepared.arguments["x"]
            return timm_latent_pool_row(self.model, images, include_prefix).to(self.parameter.dtype)
        if self.distilled:  # the eval-mode head averages the class and distillation heads
            tokens = range(2)
        elif self.model.global_pool == "token":
            tokens = range(1)
        else:  # the mean of the patches (and of the prefix tokens, where timm includes them)
            include = getattr(self.model, "pool_include_prefix", False)
            tokens = range(0 if include else layout.num_prefix_tokens, layout.num_tokens)
        return mean_rows(prepared.batch_size, layout.num_tokens, tokens, self.parameter)


class TimmVisionTransformer(TimmBlocks):
    family = (
        "timm VisionTransformer (ViT, DeiT, DeiT III, augreg, register tokens as in the "
        "DINOv2 checkpoints, global-average pooling, attention pooling as in the SigLIP "
        "checkpoints) and VisionTransformerDistilled"
    )

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        return is_timm_class(model, "VisionTransformer")

    def lrp_walk(self, *, to_input: bool) -> TimmVitWalk:
        return TimmVitWalk(self, to_input=to_input)

    def lrp_missing(self) -> str | None:
        return lacks(lambda: TimmVitWalk.check(self.model, self.distilled, to_input=False))

    def attnlrp_sites(self) -> AttnLrpSites:
        return timm_attnlrp_sites(self)

    def fused_path(self) -> FusedPath:
        # timm's Attention: q, k = q_norm(q), k_norm(k); v is the third slice of qkv's
        # output; the kernel's output (B, H, N, d) -> (B, N, H * d) enters attn.norm.
        # The Explainer calls the model without an attention mask, so none is needed here.
        sites = [
            FusedAttentionSite(
                layer=index,
                query=block.attn.q_norm,
                key=block.attn.k_norm,
                value=block.attn.qkv,
                values=partial(_timm_values, block.attn.num_heads, block.attn.head_dim),
                output=block.attn.norm,
                heads=partial(_timm_heads, block.attn.num_heads, block.attn.head_dim),
                scale=float(block.attn.scale),
            )
            for index, block in enumerate(self.model.blocks)
        ]
        flags = [FlagSetting(block.attn, "fused_attn", True) for block in self.model.blocks]
        if hasattr(self.model, "grad_checkpointing"):
            flags.append(FlagSetting(self.model, "grad_checkpointing", False))
        return FusedPath(sites=sites, flags=flags)


def _timm_values(num_heads: int, head_dim: int, qkv: Tensor) -> Tensor:
    """v (B, H, N, d) from the output (B, N, 3 * H * d) of timm's qkv projection."""
    batch, tokens, _ = qkv.shape
    return qkv.reshape(batch, tokens, 3, num_heads, head_dim)[:, :, 2].transpose(1, 2)


def _timm_heads(num_heads: int, head_dim: int, output: Tensor) -> Tensor:
    """(B, N, H * d) attention output -> (B, H, N, d), undoing timm's transpose + reshape."""
    batch, tokens, _ = output.shape
    return output.reshape(batch, tokens, num_heads, head_dim).transpose(1, 2)


# -- the LRP walk -------------------------------------------------------------------------

# The forward methods the walk mirrors, as (module, qualified name).
_BLOCK = ("timm.models.vision_transformer", "Block.forward")
_ATTENTION = ("timm.layers.attention", "Attention.forward")
_MLP = ("timm.layers.mlp", "Mlp.forward")
_PATCH_EMBED = ("timm.layers.patch_embed", "PatchEmbed.forward")

_BLOCK_PASS = ("norm1", "ls1", "drop_path1", "norm2", "ls2", "drop_path2")
_ATTENTION_PASS = ("q_norm", "k_norm", "attn_drop", "norm", "proj_drop")
_MLP_PASS = ("act", "drop1", "norm", "drop2")


class TimmVitWalk:
    """The LRP walk through timm's VisionTransformer, on the stock modules
    (`TimmVisionTransformer.lrp_walk`); full LRP reaches the pixels.

    It names the forward activations the rules need (each nn.Linear's input, the attention
    products' operands q, k, A, v, the residual operands, the readout tokens and, for full
    LRP, the image and the patch embedding), which the recorder captures with forward
    hooks. `propagate` then walks them from the classifier down, block by block, in the
    order of timm's `Block.forward` and `Attention.forward` (explicit path), applying the
    rule bound to each module type. The walk mirrors timm's code; it never re-runs or
    copies it.

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
        self.check(model, self._distilled, to_input=to_input)
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

    @staticmethod
    def check(model: nn.Module, distilled: bool, *, to_input: bool) -> None:
        """Raise UnsupportedModelError naming the first module on the path (with
        `to_input`, on full LRP's path to the pixels too) that no rule covers
        (`TimmVisionTransformer.lrp_missing`)."""
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
        for name in ("head", "head_dist") if distilled else ("head",):
            require_linear(getattr(model, name), name, may_pass=True)
        if to_input:
            embed = model.patch_embed
            require_forward(embed, _PATCH_EMBED, "patch_embed")
            if acts_as(embed.proj) is not nn.Conv2d:
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
        if acts_as(module) is nn.Linear:  # also a LoRA or quantised linear (lrp.weights)
            return rules.linear(x.flatten(0, -2), used_weight(module), relevance)
        return relevance

    def _readout(self, relevance: Tensor, rules: RuleSet, dtype: torch.dtype) -> Tensor:
        """Classifier, pooling and final norms: logit relevance -> (B, N, D) tokens."""
        model, head = self.model, self.head
        tokens = head["tokens"].to(dtype)
        if self._distilled:
            # eval-mode head: (head(x[:, 0]) + head_dist(x[:, 1])) / 2; the halving is a
            # constant and passes, the add of the two heads' logits is LRP-0.
            logits, distilled = head["head_out"].to(dtype), head["dist_out"]
            from_head, from_dist = lrp.residual_plain(
                logits,
                distilled,
                relevance,
                lrp.safe_denominator(logits + distilled),
                relevance.shape[0],
            )
            class_token = self._linear(model.head, head["head_in"], from_head, rules)
            dist_token = self._linear(model.head_dist, head["dist_in"], from_dist, rules)
            # The tokens are read twice (x[:, 0], x[:, 1]): a branch point.
            return lrp.branch(
                tokens,
                [
                    lrp.select_tokens(tokens, 0, class_token),
                    lrp.select_tokens(tokens, 1, dist_token),
                ],
                lrp.safe_denominator(tokens),
            )
        pooled = self._linear(model.head, head["head_in"], relevance, rules)
        if model.global_pool == "token":
            return lrp.select_tokens(tokens, 0, pooled)
        first = 0 if model.pool_include_prefix else model.num_prefix_tokens
        return lrp.mean_tokens(tokens, first, pooled)

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
            output_denominator = lrp.safe_denominator(x_mid.to(dtype) + b2)

        # out = x_mid + drop_path2(ls2(mlp(norm2(x_mid))))
        from_mid, from_mlp = rules.residual(x_mid, b2, relevance, output_denominator, samples)
        hidden = self._linear(block.mlp.fc2, store["fc2"], from_mlp, rules)
        into_mlp = self._linear(block.mlp.fc1, store["fc1"], hidden, rules)
        mid = lrp.safe_denominator(x_mid.to(dtype))
        relevance = lrp.branch(x_mid, [from_mid, into_mlp], mid)

        # x_mid = x + drop_path1(ls1(attn(norm1(x))))
        sum_denominator = mid if shared else lrp.safe_denominator(x.to(dtype) + b1)
        from_x, from_attn = rules.residual(x, b1, relevance, sum_denominator, samples)
        into_attn = self._attention(
            layer, block.attn, store, from_attn, rules, report, dtype, last=last
        )
        if into_attn is None:
            return None
        below = lrp.safe_denominator(x.to(dtype))
        return lrp.branch(x, [from_x, into_attn], below), below if shared else None

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
            of_attention, _ = lrp.attention_probabilities(
                by_head(store["attention"]), qkv[2], by_head(relevance)
            )
            report(layer, of_attention.view(batch, heads, tokens, tokens))
            return None
        if "q" in store:  # normalised after qkv (qk_norm)
            qkv = torch.stack([by_head(store["q"]), by_head(store["k"]), qkv[2]])

        of_attention, of_heads = lrp.attention(
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
            relevance = patches * lrp.sdiv(relevance, embedded)
        channels = base_layer(model.patch_embed.proj).out_channels
        relevance = relevance.transpose(1, 2).reshape(batch, channels, *self._grid(image))
        pixels = lrp.conv_input_zb(image, model.patch_embed.proj, relevance).sum(dim=1)
        height, width = store["input"].shape[-2:]  # crop dynamic padding, if any
        return pixels[:, :height, :width]

    def _grid(self, image: Tensor) -> tuple[int, int]:
        proj = base_layer(self.model.patch_embed.proj)  # a LoRA Conv2d keeps it there
        size = []
        for axis, extent in enumerate(image.shape[-2:]):
            span = proj.dilation[axis] * (proj.kernel_size[axis] - 1) + 1
            size.append((extent + 2 * proj.padding[axis] - span) // proj.stride[axis] + 1)
        return size[0], size[1]


# -- where AttnLRP and CP-LRP attach ------------------------------------------------------

_TIMM_ATTENTION = ("q_norm", "k_norm", "norm")


def timm_attnlrp_sites(adapter: TimmBlocks) -> AttnLrpSites:
    """Where AttnLRP and CP-LRP attach in timm's VisionTransformer and Eva
    (`TimmVisionTransformer.attnlrp_sites`, `TimmEva.attnlrp_sites`): q and k are the
    outputs of `q_norm` and `k_norm`, A v enters `norm` (all modules of every timm
    Attention, identities unless configured), so the rules hold however q, k and v are
    projected (a fused qkv, Eva's separate projections or its F.linear with q and v
    biases); relevance at the patch-embedding output; Mlp (act), SwiGLU (act gates fc1_x)
    and GluMlp (act of fc1's second half gates its first half). Beit uses its qkv weight
    in F.linear and has no q_norm: it declares no sites."""
    queries_keys, outputs, gates = [], [], []
    for index, block in enumerate(adapter.blocks):
        attn = block.attn
        if not all(isinstance(getattr(attn, n, None), nn.Module) for n in _TIMM_ATTENTION):
            raise UnsupportedModelError(
                f"block {index}: attnlrp/cp_lrp need timm attention with q_norm, k_norm and "
                f"norm modules, found {type(attn).__name__}"
            )
        queries_keys += [Projection(attn.q_norm), Projection(attn.k_norm)]
        outputs.append(Projection(attn.norm))
        gates += _timm_gates(index, block.mlp)
    return AttnLrpSites(
        embedding=adapter.model.patch_embed,
        queries_keys=queries_keys,
        attention_outputs=outputs,
        gates=gates,
    )


def _timm_gates(index: int, mlp: nn.Module) -> list[Gate]:
    kind = type(mlp).__name__
    if kind == "Mlp":
        return []  # act is an ordinary element-wise activation
    if kind == "SwiGLU":
        return [Gate(mlp.act, Projection(mlp.fc1_x))]
    if kind == "GluMlp":
        half = mlp.fc1.out_features // 2
        return [Gate(mlp.act, Projection(mlp.fc1, slice(0, half)))]
    raise UnsupportedModelError(
        f"block {index}: attnlrp/cp_lrp know timm's Mlp, SwiGLU and GluMlp, not {kind}"
    )
