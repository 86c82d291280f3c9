"""`make demo`: explain a Vision Transformer on the shipped example images.

Writes one heatmap overlay per image and method under --out and prints the paths.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from explain import METHODS, Explainer
from explain.io import load_images
from explain.testing import tiny_vit
from explain.viz import overlay, save_image

ROOT = Path(__file__).resolve().parents[1]
IMAGES = sorted((ROOT / "examples" / "images").glob("*.jpg"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "demo")
    args = parser.parse_args()

    # A ViT-Tiny-shaped model built from a config with seeded random weights.
    model = tiny_vit(
        img_size=224, patch_size=16, embed_dim=192, depth=4, num_heads=3, num_classes=10
    )
    images, raw = load_images(IMAGES, size=(224, 224))
    explainer = Explainer(model)
    written = []
    for method in sorted(METHODS):
        result = explainer.explain(images, method=method)
        heatmaps = result.heatmap()
        for path, image, heat in zip(IMAGES, raw, heatmaps, strict=True):
            out = args.out / f"{path.stem}_{method}.png"
            save_image(overlay(image, heat), out)
            written.append(out)
    for out in written:
        print(out)


if __name__ == "__main__":
    main()
