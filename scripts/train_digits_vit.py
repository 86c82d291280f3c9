"""Train the zoo's `digits-vit`: a small ViT reading scikit-learn's handwritten digits.

Trains on the "train" split of explain.data.digits (1397 images; 150 of them held back for
monitoring), never on the 400 "heldout" images. Images are shifted by up to 2 pixels
during training.

    .venv/bin/python scripts/train_digits_vit.py            # writes models/digits-vit/
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor
from vit_training import Recipe, arguments, save, train

from explain.data import digits
from explain.loading.zoo import build_model

ROOT = Path(__file__).resolve().parents[1]
MONITOR = 150


def shift(batch: tuple[Tensor, ...], generator: torch.Generator, reach: int = 2):
    """Each image moved by a random whole-pixel offset in [-reach, reach], zero-filled."""
    images = batch[0]
    padded = F.pad(images, (reach, reach, reach, reach), value=float(images.min()))
    offsets = torch.randint(0, 2 * reach + 1, (len(images), 2), generator=generator).tolist()
    size = images.shape[-1]
    moved = [
        image[:, y : y + size, x : x + size] for image, (y, x) in zip(padded, offsets, strict=True)
    ]
    return (torch.stack(moved), *batch[1:])


def main() -> None:
    parser = arguments(__doc__, ROOT / "models" / "digits-vit", epochs=30, lr=2e-3)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    started = time.time()
    images, labels = digits.load("train")
    images = digits.normalise(images)
    settings = {
        "builder": "timm_vit",
        "summary": "ViT (4 blocks) reading scikit-learn's handwritten digits, upsampled to 32x32",
        "modality": "image",
        "multi_label": False,
        "classes": list(digits.CLASSES),
        "timm": {
            "img_size": digits.IMAGE_SIZE,
            "patch_size": 4,
            "embed_dim": args.embed_dim,
            "depth": args.depth,
            "num_heads": args.heads,
            "mlp_ratio": 2.0,
            "num_classes": len(digits.CLASSES),
        },
        "preprocessing": {
            "image_size": [digits.IMAGE_SIZE, digits.IMAGE_SIZE],
            "mean": digits.MEAN,
            "std": digits.STD,
        },
    }
    torch.manual_seed(args.seed)
    model = build_model(settings)
    recipe = Recipe(
        epochs=args.epochs, batch_size=args.batch_size, learning_rate=args.lr, label_smoothing=0.1
    )
    history = train(
        model,
        (images[MONITOR:], labels[MONITOR:]),
        (images[:MONITOR], labels[:MONITOR]),
        recipe,
        multi_label=False,
        augment=shift,
        seed=args.seed,
    )
    training = {
        "script": "scripts/train_digits_vit.py",
        "seed": args.seed,
        "train_images": f"train split minus its first {MONITOR} images (used for monitoring)",
        "recipe": vars(recipe),
        "augmentation": "random shift by up to 2 pixels",
    }
    save(args.out, model, settings, training, history, started)


if __name__ == "__main__":
    main()
