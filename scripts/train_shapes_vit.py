"""Train the zoo's `shapes-vit`: a small ViT naming the kinds of shape in synthetic scenes.

Multi-label: one logit per kind (sigmoid, binary cross-entropy), so a scene with a star
and a ring has two high logits and each can be explained on its own. The head reads the
mean of the patch tokens. `--patch-weight W` adds W times a dense loss: the same head
applied to every patch token, trained on which kinds cover that patch (from the masks);
the zoo's model uses W = 0 (scene labels only), see its card.

Trains on scenes 0..N-1 of the "train" split, monitors scenes N..N+V-1 of the same split,
and never sees the "heldout" split. Scenes are flipped and rotated by multiples of 90
degrees during training (kinds and masks do not change under these).

    .venv/bin/python scripts/train_shapes_vit.py            # writes models/shapes-vit/
"""

from __future__ import annotations

import argparse
import hashlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm import tqdm
from vit_training import Recipe, arguments, save, train

from explain.data import shapes
from explain.export import atomic_write
from explain.loading.zoo import build_model

ROOT = Path(__file__).resolve().parents[1]


def config(size: int, embed_dim: int, depth: int, heads: int, patch: int, mlp_ratio: float) -> dict:
    return {
        "builder": "timm_vit",
        "summary": (
            "ViT (4 blocks) naming the kinds of shape in synthetic cluttered scenes (multi-label)"
        ),
        "modality": "image",
        "multi_label": True,
        "classes": list(shapes.KINDS),
        "timm": {
            "img_size": size,
            "patch_size": patch,
            "embed_dim": embed_dim,
            "depth": depth,
            "num_heads": heads,
            "mlp_ratio": mlp_ratio,
            "num_classes": len(shapes.KINDS),
            # The head reads the mean of the patch tokens (no class token), so that the same
            # head can also be trained on each patch token (scene_and_patch_loss).
            "class_token": False,
            "global_pool": "avg",
        },
        "preprocessing": {"image_size": [size, size], "mean": shapes.MEAN, "std": shapes.STD},
    }


class PatchLabelledScenes(shapes.ShapesDataset):
    """Scenes with, besides the image labels, the kinds present in each patch.

    A kind is present in a patch when its objects cover at least a quarter of it.
    """

    def __init__(self, split: str, length: int, *, start: int, size: int, patch: int):
        super().__init__(split, length, start=start, size=size)
        self.patch = patch

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor, Tensor]:
        scene = self.scene(index)
        masks = np.stack([scene.class_mask(kind) for kind in range(len(shapes.KINDS))])
        cover = F.avg_pool2d(torch.from_numpy(masks).float()[None], self.patch)[0]
        return (
            shapes.normalise(scene.image),
            torch.from_numpy(scene.labels),
            (cover >= 0.25).float(),
        )


def render(split: str, start: int, count: int, size: int, patch: int, workers: int):
    """Normalised images (N, 3, H, W), labels (N, kinds) and patch labels (N, kinds, gh, gw).

    Rendered in parallel, and kept under outputs/cache/ (git-ignored): reruns skip rendering.
    The cache name carries a digest of the generator's source, so a changed generator
    never trains on stale scenes.
    """
    generator = hashlib.sha256(Path(shapes.__file__).read_bytes()).hexdigest()[:12]
    name = f"shapes-{generator}-{split}-{start}-{count}-{size}-{patch}.pt"
    cache = ROOT / "outputs" / "cache" / name
    if cache.is_file():
        return torch.load(cache)
    dataset = PatchLabelledScenes(split, count, start=start, size=size, patch=patch)
    loader = torch.utils.data.DataLoader(dataset, batch_size=256, num_workers=workers)
    parts = list(tqdm(loader, desc=f"rendering {split} scenes", unit="batch"))
    rendered = tuple(torch.cat(tensors) for tensors in zip(*parts, strict=True))
    with atomic_write(cache) as handle:
        torch.save(rendered, handle)
    return rendered


def dihedral(batch: tuple[Tensor, ...], generator: torch.Generator) -> tuple[Tensor, ...]:
    """One of the 8 flips/rotations per scene, applied alike to its image and patch labels:
    shapes keep their kind under each."""
    images, labels, patches = batch
    turns = torch.randint(0, 4, (len(images),), generator=generator)
    flips = torch.randint(0, 2, (len(images),), generator=generator).bool()

    def apply(grids: Tensor) -> Tensor:
        grids = torch.where(flips[:, None, None, None], grids.flip(-1), grids)
        out = torch.empty_like(grids)
        for k in range(4):
            chosen = turns == k
            out[chosen] = torch.rot90(grids[chosen], k, dims=(-2, -1))
        return out

    return apply(images), labels, apply(patches)


def scene_and_patch_loss(patch_weight: float):
    """Binary cross-entropy of the scene logits, plus `patch_weight` times that of the same
    head applied to every patch token against the patch labels (dense supervision)."""

    def loss(model: nn.Module, batch: tuple[Tensor, ...]) -> Tensor:
        images, labels, patches = batch
        tokens = model.forward_features(images)  # (B, N, D); no prefix tokens with "avg"
        value = F.binary_cross_entropy_with_logits(model.forward_head(tokens), labels)
        if patch_weight:
            patch_logits = model.head(model.fc_norm(tokens))  # (B, gh * gw, kinds)
            patch_logits = patch_logits.transpose(1, 2).reshape(patches.shape)
            value = value + patch_weight * F.binary_cross_entropy_with_logits(patch_logits, patches)
        return value

    return loss


def train_on_scenes(
    args: argparse.Namespace, settings: dict, loss: Callable, script: str, **record: Any
) -> None:
    """Train the zoo model `settings` describes on scenes 0..N-1 of the "train" split,
    flipped and rotated, monitoring the V after them (64 x 64, with 8 x 8 patch labels),
    and save it to `args.out` with its training record (`record` adds to it)."""
    started = time.time()
    data = render("train", 0, args.train_scenes, 64, 8, args.render_workers)
    validation = render(
        "train", args.train_scenes, args.validation_scenes, 64, 8, args.render_workers
    )
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    model = build_model(settings)
    recipe = Recipe(epochs=args.epochs, batch_size=args.batch_size, learning_rate=args.lr)
    history = train(
        model,
        data,
        validation[:2],
        recipe,
        multi_label=True,
        augment=dihedral,
        loss=loss,
        seed=args.seed,
    )
    training = {
        "script": f"scripts/{Path(script).name}",
        "seed": args.seed,
        "train_scenes": f"train split, scenes 0..{args.train_scenes - 1}",
        "validation_scenes": f"train split, the {args.validation_scenes} after those",
        "recipe": vars(recipe),
        "augmentation": "random flip and rotation by a multiple of 90 degrees",
        **record,
    }
    save(args.out, model, settings, training, history, started)


def main() -> None:
    parser = arguments(__doc__, ROOT / "models" / "shapes-vit", epochs=8, lr=1e-3)
    parser.add_argument("--train-scenes", type=int, default=6000)
    parser.add_argument("--validation-scenes", type=int, default=500)
    parser.add_argument("--mlp-ratio", type=float, default=2.0)
    # Dense per-patch supervision from the masks; 0 (the zoo's model) trains on scene labels
    # only, which the kinds' signature hues make enough (see the card).
    parser.add_argument("--patch-weight", type=float, default=0.0)
    parser.add_argument("--render-workers", type=int, default=2)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    settings = config(64, args.embed_dim, args.depth, args.heads, 8, args.mlp_ratio)
    loss = scene_and_patch_loss(args.patch_weight)
    train_on_scenes(args, settings, loss, __file__, patch_weight=args.patch_weight)


if __name__ == "__main__":
    main()
