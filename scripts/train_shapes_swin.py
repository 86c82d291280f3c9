"""Train the zoo's `shapes-swin`: a small Swin Transformer naming the kinds of shape in
synthetic scenes, the hierarchical counterpart of `shapes-vit` (same task, data, split,
augmentation and loss; see scripts/train_shapes_vit.py).

A timm `SwinTransformer` on 64 x 64 scenes: 4 x 4 patches (a 16 x 16 token grid, twice
as fine as shapes-vit's), windows of 4 x 4 tokens shifted every other block, three
stages of two blocks on grids of 16, 8 and 4 tokens a side (patch merging between), read
out by the mean of the last stage's tokens. Multi-label: one logit per kind (binary
cross-entropy on the scene labels only).

    .venv/bin/python scripts/train_shapes_swin.py            # writes models/shapes-swin/
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from train_shapes_vit import dihedral, render
from vit_training import Recipe, arguments, save, train

from explain.data import shapes
from explain.zoo import build_model

ROOT = Path(__file__).resolve().parents[1]


def config(embed_dim: int, heads: tuple[int, ...], depths: tuple[int, ...]) -> dict:
    return {
        "family": "timm_swin",
        "modality": "image",
        "multi_label": True,
        "classes": list(shapes.KINDS),
        "timm": {
            "img_size": 64,
            "patch_size": 4,
            "window_size": 4,
            "embed_dim": embed_dim,
            "depths": list(depths),
            "num_heads": list(heads),
            "mlp_ratio": 2.0,
            "num_classes": len(shapes.KINDS),
        },
        "preprocessing": {"image_size": [64, 64], "mean": shapes.MEAN, "std": shapes.STD},
    }


def scene_loss(model: nn.Module, batch: tuple[Tensor, ...]) -> Tensor:
    """Binary cross-entropy of the scene logits (the patch labels are not used)."""
    images, labels, _ = batch
    return F.binary_cross_entropy_with_logits(model(images), labels)


def main() -> None:
    parser = arguments(__doc__, ROOT / "models" / "shapes-swin", epochs=6, lr=1e-3)
    parser.add_argument("--train-scenes", type=int, default=6000)
    parser.add_argument("--validation-scenes", type=int, default=500)
    parser.add_argument("--render-workers", type=int, default=1)
    parser.set_defaults(embed_dim=32)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    started = time.time()
    # The same rendered scenes (and cache) as shapes-vit: 8 x 8 patch labels, unused here.
    data = render("train", 0, args.train_scenes, 64, 8, args.render_workers)
    validation = render(
        "train", args.train_scenes, args.validation_scenes, 64, 8, args.render_workers
    )
    settings = config(args.embed_dim, (2, 4, 8), (2, 2, 2))
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
        loss=scene_loss,
        seed=args.seed,
    )
    training = {
        "script": "scripts/train_shapes_swin.py",
        "seed": args.seed,
        "train_scenes": f"train split, scenes 0..{args.train_scenes - 1}",
        "validation_scenes": f"train split, the {args.validation_scenes} after those",
        "recipe": vars(recipe),
        "augmentation": "random flip and rotation by a multiple of 90 degrees",
    }
    save(args.out, model, settings, training, history, started)


if __name__ == "__main__":
    main()
