"""Train the zoo's `digits-vit`: a small ViT reading scikit-learn's handwritten digits.

Trains on the "train" split of explain.data.digits (1397 images; 150 of them held back for
monitoring), never on the 400 "heldout" images. Images are shifted by up to 2 pixels
during training.

    .venv/bin/python scripts/train_digits_vit.py            # writes models/digits-vit/
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor
from vit_training import Recipe, train

from explain.data import digits
from explain.zoo import build_model, save_zoo_model

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
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=ROOT / "models" / "digits-vit")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--embed-dim", type=int, default=64)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    # One thread: on a busy 2-core machine two threads ran six times slower than one.
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    started = time.time()
    images, labels = digits.load("train")
    images = digits.normalise(images)
    settings = {
        "family": "timm_vit",
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
    settings["training"] = {
        "script": "scripts/train_digits_vit.py",
        "seed": args.seed,
        "train_images": f"train split minus its first {MONITOR} images (used for monitoring)",
        "recipe": vars(recipe),
        "augmentation": "random shift by up to 2 pixels",
        "final_validation_accuracy": history[-1]["validation_accuracy"],
        "minutes": round((time.time() - started) / 60, 1),
    }
    path = save_zoo_model(args.out, model, settings)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
