"""Helpers the test suite shares (and users can use to test their own setups).

- `tiny_vit`: small timm Vision Transformers built from a config, no weights needed.
- `ModelState`: a snapshot of everything an explanation promises not to change, and a
  comparison that names what changed.
- `cache_hub_repo`, `fill_hub_cache`: a Hugging Face cache laid out exactly as downloads
  leave it, filled with tiny models under real repo names, so that the hub loading code
  runs offline (`scripts/fill_hub_cache.py` fills one to try the CLI by hand).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

__all__ = [
    "HUB_SPECS",
    "ModelState",
    "cache_hub_repo",
    "fill_hub_cache",
    "hook_counts",
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


# --- a Hugging Face cache filled as downloads fill it ----------------------------------------


def cache_hub_repo(cache: str | os.PathLike[str], repo_id: str, folder: str | os.PathLike[str]):
    """Put every file of `folder` into the hub cache `cache` as repo `repo_id`'s `main`,
    exactly as huggingface_hub's downloads leave them: `models--org--name/blobs/<hash>`,
    `snapshots/<commit>/<file>` linking to its blob, and `refs/main` holding the commit.

    Returns the snapshot folder.
    """
    files = sorted(p for p in Path(folder).rglob("*") if p.is_file())
    digest = hashlib.sha1(repo_id.encode())
    for path in files:
        digest.update(path.relative_to(folder).as_posix().encode() + path.read_bytes())
    commit = digest.hexdigest()
    repo = Path(cache) / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    for path in files:
        content = path.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(content).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(content)
        link = snapshot / path.relative_to(folder)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.unlink(missing_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return snapshot


HUB_SPECS = {
    "timm": "vit_tiny_patch16_224.augreg_in21k_ft_in1k",
    "timm_hub": "hf-hub:timm/deit_tiny_patch16_224.fb_in1k",
    "text": "distilbert/distilbert-base-uncased-finetuned-sst-2-english",
    "image": "google/vit-base-patch16-224",
}
"""The model specs `fill_hub_cache` caches, one of each kind, by kind."""

_TINY_TIMM = dict(embed_dim=32, depth=2, num_heads=2)


def _label_maps(labels) -> dict[str, dict]:
    """A transformers config's class names, both ways."""
    return {
        "id2label": dict(enumerate(labels)),
        "label2id": {label: i for i, label in enumerate(labels)},
    }


def fill_hub_cache(cache: str | os.PathLike[str]) -> dict[str, nn.Module]:
    """Cache a tiny randomly initialised model under each of `HUB_SPECS`' real names, saved
    by the library's own writer with its config (timm's `save_for_hf`: `model_args`,
    pretrained config, 1000 ImageNet classes; transformers' `save_pretrained` with a
    tokenizer, `id2label` and an image processor).

    Returns each spec's model, to compare what loads with what was saved.
    """
    import timm
    import transformers
    from timm.data import ImageNetInfo

    imagenet = ImageNetInfo("imagenet-1k").label_descriptions()
    models: dict[str, nn.Module] = {}
    with torch.random.fork_rng(), tempfile.TemporaryDirectory() as scratch:
        torch.manual_seed(0)
        for kind in ("timm", "timm_hub"):
            spec = HUB_SPECS[kind]
            name = spec.removeprefix("hf-hub:timm/")
            model = timm.create_model(name, pretrained=False, **_TINY_TIMM).eval()
            folder = Path(scratch, kind)
            timm.models.save_for_hf(model, folder, model_args=_TINY_TIMM, safe_serialization=True)
            cache_hub_repo(cache, f"timm/{name}", folder)
            models[spec] = model

        from explain.zoo import minilm_folder

        labels = ("NEGATIVE", "POSITIVE")
        text = transformers.DistilBertForSequenceClassification(
            transformers.DistilBertConfig(
                dim=32,
                hidden_dim=64,
                n_layers=2,
                n_heads=2,
                **_label_maps(labels),
            )
        ).eval()
        folder = Path(scratch, "text")
        text.save_pretrained(folder)
        transformers.AutoTokenizer.from_pretrained(minilm_folder()).save_pretrained(folder)
        cache_hub_repo(cache, HUB_SPECS["text"], folder)
        models[HUB_SPECS["text"]] = text

        image = transformers.ViTForImageClassification(
            transformers.ViTConfig(
                image_size=224,
                patch_size=16,
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=2,
                intermediate_size=64,
                **_label_maps(imagenet),
            )
        ).eval()
        folder = Path(scratch, "image")
        image.save_pretrained(folder)
        transformers.ViTImageProcessor(
            size={"height": 224, "width": 224}, image_mean=[0.5] * 3, image_std=[0.5] * 3
        ).save_pretrained(folder)
        cache_hub_repo(cache, HUB_SPECS["image"], folder)
        models[HUB_SPECS["image"]] = image
    return models
