"""Tiny image models and data sets shared by the evaluation tests and their torchrun worker."""

from __future__ import annotations

import torch

from explain.evaluation.datasets import ImageExample, TwoObjectExample
from explain.testing import tiny_vit

MEAN = (0.5, 0.5, 0.5)
STD = (0.25, 0.25, 0.25)


class SquaresDataset:
    """Random images whose label is the quadrant of a bright square (its mask is known)."""

    name = "squares"

    def __init__(self, length: int, size: int = 32, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.examples = []
        for _ in range(length):
            image = torch.rand(3, size, size, generator=generator) * 0.5
            quadrant = int(torch.randint(4, (1,), generator=generator))
            mask = torch.zeros(size, size, dtype=torch.long)
            half = size // 2
            top, left = (quadrant // 2) * half, (quadrant % 2) * half
            mask[top + 4 : top + half - 4, left + 4 : left + half - 4] = 1
            image[:, mask.bool()] = 1.0
            self.examples.append(ImageExample(image=image, label=quadrant, mask=mask))

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int) -> ImageExample:
        return self.examples[index]


def squares_model() -> torch.nn.Module:
    """An untrained tiny ViT for SquaresDataset (4 classes, 32 x 32)."""
    return tiny_vit(img_size=32, patch_size=8, num_classes=4, seed=0)


def train_squares_model(steps: int = 20) -> torch.nn.Module:
    """squares_model() trained briefly on SquaresDataset, so its predictions depend on the
    square and perturbing the image changes them (deterministic for a fixed thread count)."""
    model = squares_model()
    data = SquaresDataset(256, seed=1)
    images = torch.stack([example.image for example in data.examples])
    images = (images - torch.tensor(MEAN)[:, None, None]) / torch.tensor(STD)[:, None, None]
    labels = torch.tensor([example.label for example in data.examples])
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(2)
    model.train()
    for _ in range(steps):
        batch = torch.randint(len(labels), (32,), generator=generator)
        loss = torch.nn.functional.cross_entropy(model(images[batch]), labels[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


class TwoSquaresDataset:
    """Random images with bright squares in two different quadrants; each image appears
    twice, explained once for each square (label = its quadrant, multi-label model)."""

    name = "two-squares"

    def __init__(self, scenes: int, size: int = 32, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.examples = []
        self.multi_hot = []
        for _ in range(scenes):
            image = torch.rand(3, size, size, generator=generator) * 0.5
            quadrants = torch.randperm(4, generator=generator)[:2].tolist()
            masks = []
            for quadrant in quadrants:
                mask = torch.zeros(size, size, dtype=torch.long)
                half = size // 2
                top, left = (quadrant // 2) * half, (quadrant % 2) * half
                mask[top + 4 : top + half - 4, left + 4 : left + half - 4] = 1
                image[:, mask.bool()] = 1.0
                masks.append(mask)
            for target, other in ((0, 1), (1, 0)):
                self.examples.append(
                    TwoObjectExample(
                        image=image,
                        label=quadrants[target],
                        mask=masks[target],
                        other_label=quadrants[other],
                        other_mask=masks[other],
                    )
                )
            self.multi_hot.append(torch.zeros(4).index_fill_(0, torch.tensor(quadrants), 1.0))

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int) -> TwoObjectExample:
        return self.examples[index]


def train_two_squares_model(steps: int = 40) -> torch.nn.Module:
    """A tiny multi-label ViT (one sigmoid per quadrant) trained briefly on
    TwoSquaresDataset, so that each square raises its own quadrant's logit."""
    model = squares_model()
    data = TwoSquaresDataset(128, seed=1)
    images = torch.stack([example.image for example in data.examples[::2]])
    images = (images - torch.tensor(MEAN)[:, None, None]) / torch.tensor(STD)[:, None, None]
    labels = torch.stack(data.multi_hot)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(2)
    model.train()
    for _ in range(steps):
        batch = torch.randint(len(labels), (32,), generator=generator)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(
            model(images[batch]), labels[batch]
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()
