"""Helpers the test suite shares (and users can use to test their own setups).

- `tiny_vit`: small timm Vision Transformers built from a config, no weights needed.
- one tiny builder per vision backbone family (`tiny_eva`, `tiny_beit`, `tiny_hf_vision`,
  `tiny_siglip`) and two hand-written transformers with their `TransformerSpec`
  (`tiny_custom_vit`, `tiny_custom_text`), all random and built from configs.
- `ModelState`: a snapshot of everything an explanation promises not to change, and a
  comparison that names what changed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from explain.architectures.custom import TransformerSpec

__all__ = [
    "HandWrittenTextEncoder",
    "HandWrittenViT",
    "ModelState",
    "hook_counts",
    "tiny_beit",
    "tiny_custom_text",
    "tiny_custom_vit",
    "tiny_eva",
    "tiny_hf_vision",
    "tiny_siglip",
    "tiny_vit",
]


def tiny_vit(
    *,
    img_size: int | tuple[int, int] = 32,
    patch_size: int = 8,
    embed_dim: int = 32,
    depth: int = 3,
    num_heads: int = 2,
    num_classes: int = 5,
    distilled: bool = False,
    seed: int = 0,
    **kwargs: Any,
) -> nn.Module:
    """A small randomly initialised timm ViT (or distilled DeiT) from a config.

    Extra keyword arguments go to timm's constructor: `reg_tokens`, `class_token`,
    `global_pool`, `dynamic_img_size`, `drop_rate`, `attn_drop_rate`, ...
    """
    from timm.models.deit import VisionTransformerDistilled
    from timm.models.vision_transformer import VisionTransformer

    cls = VisionTransformerDistilled if distilled else VisionTransformer
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = cls(
            img_size=img_size,
            patch_size=patch_size,
            embed_dim=embed_dim,
            depth=depth,
            num_heads=num_heads,
            num_classes=num_classes,
            **kwargs,
        )
        # timm initialises tokens and embeddings with tiny values; scale them up so that
        # attention maps are far from uniform and the tests can tell methods apart.
        for name, parameter in model.named_parameters():
            if name.endswith(("cls_token", "dist_token", "reg_token", "pos_embed")):
                nn.init.normal_(parameter, std=0.5)
    return model


_HOOK_DICTS = (
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_backward_hooks",
    "_backward_pre_hooks",
    "_state_dict_hooks",
    "_state_dict_pre_hooks",
    "_load_state_dict_pre_hooks",
    "_load_state_dict_post_hooks",
)


def hook_counts(model: nn.Module) -> dict[str, int]:
    """Number of hooks of every kind on every module, by 'module name/hook kind'."""
    counts = {}
    for name, module in model.named_modules():
        for kind in _HOOK_DICTS:
            hooks = getattr(module, kind, None)
            if hooks:
                counts[f"{name or '<root>'}/{kind}"] = len(hooks)
    return counts


def _global_hook_count() -> int:
    from torch.nn.modules import module as module_globals

    names = [n for n in dir(module_globals) if n.startswith("_global_") and n.endswith("hooks")]
    return sum(len(getattr(module_globals, n)) for n in names)


def _plain_attributes(model: nn.Module) -> Iterator[tuple[str, Any]]:
    """Boolean and string flags on modules (fused_attn, grad_checkpointing, ...)."""
    for name, module in model.named_modules():
        for key, value in vars(module).items():
            if not key.startswith("_") and isinstance(value, bool | str | int | float):
                yield f"{name or '<root>'}.{key}", value
        config = getattr(module, "config", None)
        if config is not None:
            for key in ("_attn_implementation", "attn_implementation"):
                if hasattr(config, key):
                    yield f"{name or '<root>'}.config.{key}", getattr(config, key)


@dataclass
class ModelState:
    """Everything an explanation call promises to leave unchanged."""

    parameters: dict[str, Tensor]
    grads: dict[str, Tensor | None]
    requires_grad: dict[str, bool]
    training: dict[str, bool]
    hooks: dict[str, int]
    global_hooks: int
    attributes: dict[str, Any]
    cpu_rng: Tensor
    cuda_rng: list[Tensor]

    @classmethod
    def capture(cls, model: nn.Module) -> ModelState:
        return cls(
            parameters={n: p.detach().clone() for n, p in model.named_parameters()},
            grads={
                n: None if p.grad is None else p.grad.detach().clone()
                for n, p in model.named_parameters()
            },
            requires_grad={n: p.requires_grad for n, p in model.named_parameters()},
            training={n: m.training for n, m in model.named_modules()},
            hooks=hook_counts(model),
            global_hooks=_global_hook_count(),
            attributes=dict(_plain_attributes(model)),
            cpu_rng=torch.get_rng_state(),
            cuda_rng=torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        )

    def differences(self, other: ModelState) -> list[str]:
        """Human-readable list of what differs between two snapshots (empty if nothing)."""
        found = []
        for name, value in self.parameters.items():
            if not torch.equal(value, other.parameters[name]):
                found.append(f"parameter {name} changed")
        for name, grad in self.grads.items():
            new = other.grads[name]
            if (grad is None) != (new is None) or (grad is not None and not torch.equal(grad, new)):
                found.append(f".grad of {name} changed")
        for label, mine, theirs in (
            ("requires_grad", self.requires_grad, other.requires_grad),
            ("training mode", self.training, other.training),
            ("hooks", self.hooks, other.hooks),
            ("attribute", self.attributes, other.attributes),
        ):
            for key in sorted(set(mine) | set(theirs)):
                if mine.get(key) != theirs.get(key):
                    found.append(f"{label} {key}: {mine.get(key)!r} -> {theirs.get(key)!r}")
        if self.global_hooks != other.global_hooks:
            found.append(f"global module hooks: {self.global_hooks} -> {other.global_hooks}")
        if not torch.equal(self.cpu_rng, other.cpu_rng):
            found.append("CPU RNG state changed")
        if len(self.cuda_rng) != len(other.cuda_rng) or any(
            not torch.equal(a, b) for a, b in zip(self.cuda_rng, other.cuda_rng, strict=False)
        ):
            found.append("CUDA RNG state changed")
        return found


# -- vision backbone families (issue 14): one tiny builder per family, from configs --------


def _spread_embeddings(model: nn.Module, names: tuple[str, ...]) -> nn.Module:
    """Random weights give near-uniform attention; spread the token and position
    embeddings (and the named weights) so that attention maps differ from token to token
    and the tests can tell methods, and mistakes, apart."""
    for name, parameter in model.named_parameters():
        if name.endswith(names):
            nn.init.normal_(parameter, std=0.5)
    return model


def tiny_eva(*, seed: int = 0, **kwargs: Any) -> nn.Module:
    """A small random timm `Eva` with EVA-02's pieces (rotary embeddings, SwiGLU MLP,
    sub-LN); kwargs override, e.g. DINOv3's `num_reg_tokens=4, use_abs_pos_emb=False,
    rope_type="dinov3", init_values=1e-5`."""
    from timm.models.eva import Eva

    config: dict[str, Any] = dict(
        img_size=32,
        patch_size=8,
        embed_dim=32,
        depth=3,
        num_heads=2,
        num_classes=5,
        mlp_ratio=4 * 2 / 3,
        swiglu_mlp=True,
        scale_mlp=True,
        use_rot_pos_emb=True,
        ref_feat_shape=(4, 4),
        head_init_scale=1.0,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Eva(**{**config, **kwargs})
        return _spread_embeddings(model, ("cls_token", "reg_token", "pos_embed", "qkv.weight"))


def tiny_beit(*, seed: int = 0, **kwargs: Any) -> nn.Module:
    """A small random timm `Beit` with a relative position bias in every block."""
    from timm.models.beit import Beit

    config: dict[str, Any] = dict(
        img_size=32,
        patch_size=8,
        embed_dim=32,
        depth=3,
        num_heads=2,
        num_classes=5,
        use_abs_pos_emb=False,
        use_rel_pos_bias=True,
        init_values=1.0,
        head_init_scale=1.0,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Beit(**{**config, **kwargs})
        return _spread_embeddings(
            model, ("cls_token", "pos_embed", "relative_position_bias_table", "qkv.weight")
        )


def _hf_vision_config(**overrides: Any) -> dict[str, Any]:
    """A tiny transformers vision config (32x32 images, 8x8 patches, 3 blocks)."""
    config: dict[str, Any] = dict(
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=2,
        intermediate_size=48,
        image_size=32,
        patch_size=8,
        num_labels=5,
        initializer_range=0.3,
        attn_implementation="sdpa",
    )
    return {**config, **overrides}


_SIGLIP_TEXT = dict(
    vocab_size=50,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=2,
    max_position_embeddings=16,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)


def tiny_hf_vision(family: str, *, seed: int = 0, **overrides: Any) -> nn.Module:
    """A small random Hugging Face image classifier of `family`: "dinov2",
    "dinov2_with_registers" (2 registers), "beit" (relative position bias) or "siglip";
    overrides go to the config (e.g. `use_mean_pooling=False` for BEiT)."""
    import transformers as tf

    builders = {
        "dinov2": lambda: tf.Dinov2ForImageClassification(
            tf.Dinov2Config(**_hf_vision_config(mlp_ratio=2, **overrides))
        ),
        "dinov2_with_registers": lambda: tf.Dinov2WithRegistersForImageClassification(
            tf.Dinov2WithRegistersConfig(
                **_hf_vision_config(mlp_ratio=2, num_register_tokens=2, **overrides)
            )
        ),
        "beit": lambda: tf.BeitForImageClassification(
            tf.BeitConfig(
                **_hf_vision_config(
                    use_relative_position_bias=True, layer_scale_init_value=1.0, **overrides
                )
            )
        ),
        "siglip": lambda: tf.SiglipForImageClassification(
            tf.SiglipConfig(
                vision_config=_hf_vision_config(**overrides),
                text_config=_SIGLIP_TEXT,
                num_labels=5,
            )
        ),
    }
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = builders[family]()
        return _spread_embeddings(
            model,
            (
                "cls_token",
                "register_tokens",
                "position_embeddings",
                "position_embedding.weight",
                "relative_position_bias_table",
            ),
        ).eval()


def tiny_siglip(*, seed: int = 0) -> nn.Module:
    """A small random Hugging Face `SiglipModel` (image-text similarity) with its vision
    attention pooling head; texts are ids < 50 of at most 16 tokens."""
    import transformers as tf

    config = tf.SiglipConfig(
        vision_config=_hf_vision_config(num_hidden_layers=2), text_config=_SIGLIP_TEXT
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = tf.SiglipModel(config)
        return _spread_embeddings(
            model, ("position_embedding.weight", "token_embedding.weight", "probe")
        ).eval()


# -- hand-written transformers for the custom-model spec (issue 14) ------------------------


class _AttentionTimesValues(nn.Module):
    """A @ V as a module, whose first input is the probabilities."""

    def forward(self, probabilities: Tensor, values: Tensor) -> Tensor:
        return probabilities @ values


class _SelfAttention(nn.Module):
    """Multi-head self-attention written out: softmax(q k^T / sqrt(d) + mask) v. The
    probabilities pass through `self.probs` (an identity or dropout) and then enter
    `self.mix` (A @ V), the two places a TransformerSpec's `attention` can point to;
    `fused=True` computes the same with F.scaled_dot_product_attention instead, which
    never shows them."""

    def __init__(self, dim: int, heads: int, *, fused: bool = False, dropout: float = 0.0):
        super().__init__()
        self.heads, self.fused = heads, fused
        self.query, self.key, self.value = (nn.Linear(dim, dim) for _ in range(3))
        self.probs = nn.Dropout(dropout) if dropout else nn.Identity()
        self.mix = _AttentionTimesValues()
        self.out = nn.Linear(dim, dim)

    def forward(self, x: Tensor, bias: Tensor | None = None) -> Tensor:
        batch, tokens, dim = x.shape

        def split(t: Tensor) -> Tensor:
            return t.reshape(batch, tokens, self.heads, dim // self.heads).transpose(1, 2)

        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        if self.fused:
            mixed = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        else:
            scores = q @ k.transpose(-2, -1) / (dim // self.heads) ** 0.5
            if bias is not None:
                scores = scores + bias
            mixed = self.mix(self.probs(scores.softmax(dim=-1)), v)
        return self.out(mixed.transpose(1, 2).reshape(batch, tokens, dim))


class HandWrittenViT(nn.Module):
    """A small pre-norm ViT written from scratch: patches from a strided convolution, a
    class token, learned positions, blocks `self.layers[i]` with attention
    `.mixer.probs`, a linear head on the class token."""

    def __init__(
        self,
        *,
        image_size: int = 32,
        patch: int = 8,
        dim: int = 32,
        depth: int = 3,
        heads: int = 4,
        classes: int = 5,
        fused: bool = False,
    ):
        super().__init__()
        self.patchify = nn.Conv2d(3, dim, kernel_size=patch, stride=patch)
        self.cls = nn.Parameter(torch.randn(1, 1, dim))
        self.positions = nn.Parameter(torch.randn(1, 1 + (image_size // patch) ** 2, dim))
        self.layers = nn.ModuleList(_ViTBlock(dim, heads, fused) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, images: Tensor) -> Tensor:
        x = self.patchify(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.positions
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x)[:, 0])


class _ViTBlock(nn.Module):
    def __init__(self, dim: int, heads: int, fused: bool):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.mixer = _SelfAttention(dim, heads, fused=fused)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.mixer(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class HandWrittenTextEncoder(nn.Module):
    """A small post-norm text encoder written from scratch: token and position embeddings,
    blocks `self.encoder.blocks[i]` whose attention dropout `.attention.probs` sees the
    probabilities, padding masked out of the keys, a classifier on the mean of the real
    tokens. Called as `model(input_ids=..., attention_mask=...)`."""

    def __init__(
        self,
        *,
        vocab: int = 40,
        max_tokens: int = 16,
        dim: int = 32,
        depth: int = 2,
        heads: int = 2,
        classes: int = 3,
    ):
        super().__init__()
        self.tokens = nn.Embedding(vocab, dim)
        self.positions = nn.Embedding(max_tokens, dim)
        self.encoder = nn.Module()
        self.encoder.blocks = nn.Sequential(*(_TextBlock(dim, heads) for _ in range(depth)))
        self.classifier = nn.Linear(dim, classes)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.tokens(input_ids) + self.positions(positions)
        bias = torch.zeros(mask.shape, dtype=x.dtype, device=x.device)
        bias = bias.masked_fill(mask == 0, float("-inf"))[:, None, None, :]
        for block in self.encoder.blocks:
            x = block(x, bias)
        weights = mask.to(x.dtype)[..., None]
        return self.classifier((x * weights).sum(dim=1) / weights.sum(dim=1))


class _TextBlock(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.attention = _SelfAttention(dim, heads, dropout=0.1)
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.feed_forward = nn.Sequential(
            nn.Linear(dim, 2 * dim), nn.ReLU(), nn.Linear(2 * dim, dim)
        )

    def forward(self, x: Tensor, bias: Tensor) -> Tensor:
        x = self.norm1(x + self.attention(x, bias))
        return self.norm2(x + self.feed_forward(x))


def tiny_custom_vit(*, seed: int = 0, fused: bool = False) -> tuple[nn.Module, TransformerSpec]:
    """The hand-written ViT and its TransformerSpec (class-token readout, 8x8 patches)."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = HandWrittenViT(fused=fused).eval()
    spec = TransformerSpec(
        blocks="layers.*", attention="mixer.probs", readout=0, patch_size=8, prefix_tokens=1
    )
    return model, spec


def tiny_custom_text(*, seed: int = 0) -> tuple[nn.Module, TransformerSpec]:
    """The hand-written text encoder and its TransformerSpec (mean over real tokens)."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = HandWrittenTextEncoder().eval()
        nn.init.normal_(model.positions.weight, std=1.0)
    spec = TransformerSpec(blocks="encoder.blocks", attention="attention.probs", readout="mean")
    return model, spec
