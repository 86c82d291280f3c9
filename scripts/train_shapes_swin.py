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

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from train_shapes_vit import train_on_scenes
from vit_training import arguments

from explain.data import shapes

ROOT = Path(__file__).resolve().parents[1]


def config(embed_dim: int, heads: tuple[int, ...], depths: tuple[int, ...]) -> dict:
    return {
        "builder": "timm_swin",
        "summary": (
            "Swin Transformer (3 stages, windowed attention) naming the kinds of shape in "
            "synthetic cluttered scenes (multi-label)"
        ),
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
    # The same rendered scenes (and cache) as shapes-vit: 8 x 8 patch labels, unused here.
    train_on_scenes(args, config(args.embed_dim, (2, 4, 8), (2, 2, 2)), scene_loss, __file__)


if __name__ == "__main__":
    main()
