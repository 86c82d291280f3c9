"""Helpers the test suite shares (and users can use to test their own setups).

- `tiny_vit`: small timm Vision Transformers built from a config, no weights needed.
- `tiny_case`: for every registered family (explain.architectures.registry), a tiny
  model built from a config with a small batch of inputs, which the conformance suite
  (tests/test_conformance.py) runs every contract on. A new family adds one entry to
  `TINY_MODELS`; a family registered without one fails the suite.
- `ModelState`: a snapshot of everything an explanation promises not to change, and a
  comparison that names what changed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

__all__ = [
    "TINY_MODELS",
    "ModelState",
    "TinyCase",
    "hook_counts",
    "tiny_case",
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


@dataclass(frozen=True)
class TinyCase:
    """A tiny model of one family and a batch of two inputs that differ in what the family
    lets differ (text lengths: the shorter text is right-padded).

    Attributes:
        model: the model, in eval mode.
        batch: the two samples together, as `Explainer.explain` takes them.
        alone: each sample by itself, unpadded.
        lengths: by token set name, the real length of each sample's tokens (text sets,
            right-padded in `batch`); the relevance past it is padding.
    """

    model: nn.Module
    batch: Any
    alone: tuple[Any, ...]
    lengths: Mapping[str, tuple[int, ...]]


def _seeded(build: Callable[[], nn.Module], seed: int = 0) -> nn.Module:
    """`build()` under its own seed, leaving the global RNG as it was; in eval mode."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return build().eval()


def _spread(model: nn.Module, std: float, *names: str) -> None:
    """Random transformer weights give near-uniform attention; wider embeddings make the
    maps differ from token to token, so that comparisons can fail."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if any(part in name for part in names):
                parameter.normal_(0.0, std, generator=torch.Generator().manual_seed(len(name)))


def _texts(lengths: tuple[int, ...], vocab: tuple[int, int], first: int, last: int) -> Tensor:
    """Right-padded (with 0) token ids: `first`, random words from `vocab`, `last`."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    for row, length in enumerate(lengths):
        words = torch.randint(*vocab, (length - 2,), generator=generator)
        ids[row, :length] = torch.cat([torch.tensor([first]), words, torch.tensor([last])])
    return ids


def _text_case(model: nn.Module, lengths: tuple[int, ...], first: int, last: int) -> TinyCase:
    ids = _texts(lengths, (3, 40), first, last)
    mask = (torch.arange(ids.shape[1])[None] < torch.tensor(lengths)[:, None]).long()
    alone = tuple(
        {"input_ids": ids[i : i + 1, :n], "attention_mask": mask[i : i + 1, :n]}
        for i, n in enumerate(lengths)
    )
    return TinyCase(model, {"input_ids": ids, "attention_mask": mask}, alone, {"text": lengths})


def _images(count: int, size: int) -> Tensor:
    return torch.randn(count, 3, size, size, generator=torch.Generator().manual_seed(2))


def _image_case(model: nn.Module, size: int) -> TinyCase:
    images = _images(2, size)
    return TinyCase(model, images, (images[:1], images[1:]), {})


def _timm_vit() -> TinyCase:
    return _image_case(tiny_vit(), 32)


def _hf_text_encoder() -> TinyCase:
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(
        vocab_size=40,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=37,
        max_position_embeddings=16,
        num_labels=3,
        initializer_range=0.3,
        pad_token_id=0,
        attn_implementation="sdpa",
    )
    model = _seeded(lambda: BertForSequenceClassification(config))
    return _text_case(model, (6, 4), first=1, last=2)


def _hf_gpt2() -> TinyCase:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=40,
        n_positions=16,
        n_embd=32,
        n_layer=2,
        n_head=2,
        initializer_range=0.3,
        bos_token_id=1,
        eos_token_id=2,
        attn_implementation="sdpa",
    )
    return _text_case(_seeded(lambda: GPT2LMHeadModel(config)), (6, 4), first=1, last=2)


def _hf_vit() -> TinyCase:
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=37,
        image_size=16,
        patch_size=4,
        num_labels=5,
        initializer_range=0.3,
        attn_implementation="sdpa",
    )
    return _image_case(_seeded(lambda: ViTForImageClassification(config)), 16)


def _hf_clip() -> TinyCase:
    from transformers import CLIPConfig, CLIPModel

    text = dict(
        vocab_size=50,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=16,
        eos_token_id=49,
        bos_token_id=48,
        pad_token_id=0,
    )
    vision = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=32,
        patch_size=8,
    )
    model = _seeded(
        lambda: CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=16))
    )
    _spread(model, 1.0, "position_embedding", "token_embedding")
    lengths = (6, 4)
    ids = _texts(lengths, (1, 40), first=48, last=49)
    mask = (torch.arange(ids.shape[1])[None] < torch.tensor(lengths)[:, None]).long()
    images = _images(2, 32)
    alone = tuple(
        {
            "pixel_values": images[i : i + 1],
            "input_ids": ids[i : i + 1, :n],
            "attention_mask": mask[i : i + 1, :n],
        }
        for i, n in enumerate(lengths)
    )
    batch = {"pixel_values": images, "input_ids": ids, "attention_mask": mask}
    return TinyCase(model, batch, alone, {"text": lengths})


def _open_clip() -> TinyCase:
    from open_clip.model import CLIP, CLIPTextCfg, CLIPVisionCfg

    context, sot, eot = 16, 62, 63

    def build() -> nn.Module:
        return CLIP(
            embed_dim=16,
            vision_cfg=CLIPVisionCfg(
                layers=2, width=32, head_width=16, patch_size=8, image_size=32
            ),
            text_cfg=CLIPTextCfg(
                layers=2, width=32, heads=2, vocab_size=64, context_length=context
            ),
        )

    model = _seeded(build)
    _spread(model, 1.0, "positional_embedding", "token_embedding")
    lengths = (6, 4)
    ids = torch.zeros(2, context, dtype=torch.long)  # open_clip pads to its context length
    ids[:, : max(lengths)] = _texts(lengths, (1, sot), first=sot, last=eot)
    images = _images(2, 32)
    alone = tuple({"image": images[i : i + 1], "text": ids[i : i + 1]} for i in range(2))
    return TinyCase(model, {"image": images, "text": ids}, alone, {"text": lengths})


def _hf_encoder_decoder() -> TinyCase:
    from transformers import BartConfig, BartForConditionalGeneration

    config = BartConfig(
        vocab_size=40,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=32,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=2,
        forced_eos_token_id=None,
    )
    model = _seeded(lambda: BartForConditionalGeneration(config))
    _spread(model, 0.3, "weight")
    source, target = (6, 4), (5, 3)
    ids, decoder = _texts(source, (3, 40), 1, 2), _texts(target, (3, 40), 2, 5)
    mask = (torch.arange(ids.shape[1])[None] < torch.tensor(source)[:, None]).long()
    decoder_mask = (torch.arange(decoder.shape[1])[None] < torch.tensor(target)[:, None]).long()
    batch = {
        "input_ids": ids,
        "attention_mask": mask,
        "decoder_input_ids": decoder,
        "decoder_attention_mask": decoder_mask,
    }
    alone = tuple(
        {
            "input_ids": ids[i : i + 1, :n],
            "attention_mask": mask[i : i + 1, :n],
            "decoder_input_ids": decoder[i : i + 1, :m],
            "decoder_attention_mask": decoder_mask[i : i + 1, :m],
        }
        for i, (n, m) in enumerate(zip(source, target, strict=True))
    )
    return TinyCase(model, batch, alone, {"source": source, "target": target})


TINY_MODELS: dict[str, Callable[[], TinyCase]] = {
    "timm_vit": _timm_vit,
    "hf_text_encoder": _hf_text_encoder,
    "hf_clip": _hf_clip,
    "hf_gpt2": _hf_gpt2,
    "hf_encoder_decoder": _hf_encoder_decoder,
    "hf_vit": _hf_vit,
    "open_clip": _open_clip,
}
"""The tiny model of every registered family, by the family's registry name."""


def tiny_case(family: str) -> TinyCase:
    """The tiny model and inputs of the registered family `family` (a fresh model)."""
    try:
        build = TINY_MODELS[family]
    except KeyError:
        raise KeyError(
            f"family {family!r} has no tiny model: add one to explain.testing.TINY_MODELS"
        ) from None
    return build()


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
