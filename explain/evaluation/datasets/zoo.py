"""The zoo models' own held-out sets, as evaluation examples with ground truth.

- `shapes-vit`: held-out scenes (never a training seed) that hold exactly ONE object, so
  that top-1 accuracy against one label and one foreground mask are defined as on
  ImageNet and ImageNet-segmentation. The label is that object's kind, the mask its pixels.
- `digits-vit`: the 400 held-out scikit-learn digits. They come without masks; the mask
  used here is DERIVED from the strokes: the pixels whose upsampled ink is at least 0.5.
- `minilm-sentiment`: held-out sentences; the rationale is the words that decide the
  label (the sentiment words and a negation), known by construction.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from explain.errors import OptionError
from explain.evaluation.datasets.base import EvaluationDataset, ImageExample, TextExample

__all__ = ["HELDOUT", "DigitsHeldout", "SentimentHeldout", "ShapesHeldout", "heldout_dataset"]


class ShapesHeldout:
    """The first `length` single-object scenes among the held-out seeds, at `size` pixels."""

    name = "shapes-heldout-single-object"

    def __init__(self, length: int = 2000, size: int = 64) -> None:
        self.length, self.size = length, size
        self._seeds: list[int] = []  # found so far, in seed order
        self._next = 0  # held-out index of the next seed to look at

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> ImageExample:
        from explain.data import shapes

        if not 0 <= index < self.length:
            raise IndexError(f"index {index} out of range for {self.length} scenes")
        scene = None
        while len(self._seeds) <= index:  # scenes are pure functions of their seeds
            seed = shapes.scene_seed("heldout", self._next)
            self._next += 1
            candidate = shapes.render_scene(seed, self.size)
            if len(candidate.kinds) == 1:
                self._seeds.append(seed)
                scene = candidate
        if scene is None or scene.seed != self._seeds[index]:
            scene = shapes.render_scene(self._seeds[index], self.size)
        image = torch.from_numpy(scene.image).permute(2, 0, 1).contiguous()
        return ImageExample(
            image=image, label=scene.kinds[0], mask=torch.from_numpy(scene.masks[0]).long()
        )


class DigitsHeldout:
    """The held-out digits at `size` pixels, with masks derived from their strokes."""

    name = "digits-heldout"

    def __init__(self, size: int = 32) -> None:
        from explain.data import digits

        self.images, self.labels = digits.load("heldout", size=size)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> ImageExample:
        image = self.images[index]
        return ImageExample(
            image=image, label=int(self.labels[index]), mask=(image[0] >= 0.5).long()
        )


class SentimentHeldout:
    """The first `length` held-out sentences with their known rationales."""

    name = "sentiment-heldout"

    def __init__(self, length: int = 1000) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> TextExample:
        from explain.data import sentiment

        if not 0 <= index < self.length:
            raise IndexError(f"index {index} out of range for {self.length} sentences")
        sentence = sentiment.make_sentence(sentiment.SPLITS["heldout"][index])
        return TextExample(words=sentence.words, label=sentence.label, rationale=sentence.rationale)


HELDOUT: dict[str, Callable[[tuple[int, int] | None], EvaluationDataset]] = {
    "shapes-vit": lambda size: ShapesHeldout(size=size[0] if size else 64),
    "digits-vit": lambda size: DigitsHeldout(size=size[0] if size else 32),
    "minilm-sentiment": lambda size: SentimentHeldout(),
}
"""Zoo model name -> its held-out evaluation set, given the model's image size."""


def heldout_dataset(name: str, image_size: tuple[int, int] | None = None) -> EvaluationDataset:
    """The held-out evaluation set of zoo model `name` (with or without the `zoo:` prefix)."""
    name = name.removeprefix("zoo:")
    if name not in HELDOUT:
        raise OptionError(
            f"{name!r} has no built-in evaluation set (zoo models: {', '.join(HELDOUT)}); "
            "pass --data"
        )
    return HELDOUT[name](image_size)
