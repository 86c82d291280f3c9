"""A Hugging Face cache laid out exactly as downloads leave it, filled with tiny models
under real repo names, so that the hub loading code runs offline
(`scripts/fill_hub_cache.py` fills one to try the command line by hand)."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import torch
from torch import nn

__all__ = ["HUB_SPECS", "cache_hub_repo", "fill_hub_cache"]


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

        from explain.loading.zoo import minilm_folder

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
