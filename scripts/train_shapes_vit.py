"""Train the zoo's `shapes-vit`: a small ViT naming the kinds of shape in synthetic scenes.

Multi-label: one logit per kind (sigmoid, binary cross-entropy), so a scene with a star
and a ring has two high logits and each can be explained on its own. Trains on scenes
0..N-1 of the "train" split, monitors scenes N..N+V-1 of the same split, and never sees
the "heldout" split. Scenes are flipped and rotated by multiples of 90 degrees during
training (kinds and masks do not change under these).

    .venv/bin/python scripts/train_shapes_vit.py            # writes models/shapes-vit/
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from tqdm import tqdm
from vit_training import Recipe, train

from explain.data import shapes
from explain.io import atomic_write
from explain.zoo import build_model, save_zoo_model

ROOT = Path(__file__).resolve().parents[1]


def config(size: int, embed_dim: int, depth: int, heads: int, patch: int, mlp_ratio: float):
    return {
        "family": "timm_vit",
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
        },
        "preprocessing": {"image_size": [size, size], "mean": shapes.MEAN, "std": shapes.STD},
    }


def render(split: str, start: int, count: int, size: int, workers: int) -> tuple[Tensor, Tensor]:
    """(N, 3, H, W) normalised float32 images and (N, kinds) labels, rendered in parallel.

    Rendered scenes are kept under outputs/cache/ (git-ignored): reruns skip rendering.
    """
    cache = ROOT / "outputs" / "cache" / f"shapes-{split}-{start}-{count}-{size}.pt"
    if cache.is_file():
        return torch.load(cache)
    dataset = shapes.ShapesDataset(split, count, start=start, size=size)
    loader = torch.utils.data.DataLoader(dataset, batch_size=256, num_workers=workers)
    images, labels = [], []
    for batch_images, batch_labels in tqdm(loader, desc=f"rendering {split} scenes", unit="batch"):
        images.append(batch_images)
        labels.append(batch_labels)
    rendered = torch.cat(images), torch.cat(labels)
    with atomic_write(cache) as handle:
        torch.save(rendered, handle)
    return rendered


def dihedral(images: Tensor, generator: torch.Generator) -> Tensor:
    """One of the 8 flips/rotations per image: shapes keep their kind under each."""
    turns = torch.randint(0, 4, (len(images),), generator=generator)
    flips = torch.randint(0, 2, (len(images),), generator=generator).bool()
    images = torch.where(flips[:, None, None, None], images.flip(-1), images)
    out = torch.empty_like(images)
    for k in range(4):
        chosen = turns == k
        out[chosen] = torch.rot90(images[chosen], k, dims=(-2, -1))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=ROOT / "models" / "shapes-vit")
    parser.add_argument("--train-scenes", type=int, default=12000)
    parser.add_argument("--validation-scenes", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--embed-dim", type=int, default=96)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--mlp-ratio", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=0)
    # One thread: on a busy 2-core machine two threads ran six times slower than one.
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--render-workers", type=int, default=2)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    started = time.time()
    images, labels = render("train", 0, args.train_scenes, 64, args.render_workers)
    validation = render("train", args.train_scenes, args.validation_scenes, 64, args.render_workers)
    settings = config(64, args.embed_dim, args.depth, args.heads, 8, args.mlp_ratio)
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    model = build_model(settings)
    recipe = Recipe(epochs=args.epochs, batch_size=args.batch_size, learning_rate=args.lr)
    history = train(
        model,
        images,
        labels,
        validation,
        recipe,
        multi_label=True,
        augment=dihedral,
        seed=args.seed,
    )
    settings["training"] = {
        "script": "scripts/train_shapes_vit.py",
        "seed": args.seed,
        "train_scenes": f"train split, scenes 0..{args.train_scenes - 1}",
        "validation_scenes": f"train split, the {args.validation_scenes} after those",
        "recipe": vars(recipe),
        "augmentation": "random flip and rotation by a multiple of 90 degrees",
        "final_validation_accuracy": history[-1]["validation_accuracy"],
        "minutes": round((time.time() - started) / 60, 1),
    }
    path = save_zoo_model(args.out, model, settings)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
