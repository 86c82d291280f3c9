"""Helpers the test suite shares (and users can use to test their own setups).

- `tiny_vit`: small timm Vision Transformers built from a config, no weights needed.
- `ModelState`: a snapshot of everything an explanation promises not to change, and a
  comparison that names what changed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

__all__ = [
    "ModelState",
    "hook_counts",
    "tiny_beit",
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
