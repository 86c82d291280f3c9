"""The zoo's held-out sets, as evaluation examples with ground truth (each zoo model's
module in `explain.evaluation.zoo` says which are its own).

- `ShapesHeldout`: held-out scenes (never a training seed) that hold exactly ONE object,
  so that top-1 accuracy against one label and one foreground mask are defined as on
  ImageNet and ImageNet-segmentation. The label is that object's kind, the mask its
  pixels. `ShapesPairs`, for the class-specific test: the held-out scenes that hold
  exactly TWO objects, each scene once per object.
- `DigitsHeldout`: the 400 held-out scikit-learn digits. They come without masks; the
  mask used here is DERIVED from the strokes: the pixels whose upsampled ink is at least
  0.5.
- `SentimentHeldout`: held-out sentences; the rationale is the words that decide the
  label (the sentiment words and a negation), known by construction.
- `RecallHeldout` and `ShapesAnswers`, for the models with known evidence (a language
  model, a vision-language model): held-out prompts with their answers and evidence, in
  the model's own tokens.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from explain.errors import OptionError
from explain.evaluation.datasets.base import (
    AnswerExample,
    ImageAnswerExample,
    ImageExample,
    TextExample,
    TwoObjectExample,
)

if TYPE_CHECKING:
    from explain.data.shapes import Scene
    from explain.data.shapes_questions import Example

__all__ = [
    "DigitsHeldout",
    "RecallHeldout",
    "SentimentHeldout",
    "ShapesAnswers",
    "ShapesHeldout",
    "ShapesPairs",
]


class _HeldoutScenes:
    """The held-out scenes that hold exactly `objects` objects, found lazily in seed order
    (scenes are pure functions of their seeds, so index i is always the same scene)."""

    def __init__(self, objects: int, size: int) -> None:
        self.objects, self.size = objects, size
        self._seeds: list[int] = []  # found so far, in seed order
        self._next = 0  # held-out index of the next seed to look at

    def __getitem__(self, index: int) -> Scene:
        from explain.data import shapes

        scene = None
        while len(self._seeds) <= index:
            seed = shapes.scene_seed("heldout", self._next)
            self._next += 1
            candidate = shapes.render_scene(seed, self.size)
            if len(candidate.kinds) == self.objects:
                self._seeds.append(seed)
                scene = candidate
        if scene is None or scene.seed != self._seeds[index]:
            scene = shapes.render_scene(self._seeds[index], self.size)
        return scene


def _pixels(scene: Scene) -> torch.Tensor:
    return torch.from_numpy(scene.image).permute(2, 0, 1).contiguous()


class ShapesHeldout:
    """The first `length` single-object scenes among the held-out seeds, at `size` pixels."""

    name = "shapes-heldout-single-object"

    def __init__(self, length: int = 2000, size: int = 64) -> None:
        self.length = length
        self._scenes = _HeldoutScenes(objects=1, size=size)

    def __len__(self) -> int:
        return self.length

    def seed(self, index: int) -> int:
        """The seed of example `index`'s scene (`explain.data.shapes.render_scene`)."""
        return self._scenes[index].seed

    def __getitem__(self, index: int) -> ImageExample:
        if not 0 <= index < self.length:
            raise IndexError(f"index {index} out of range for {self.length} scenes")
        scene = self._scenes[index]
        return ImageExample(
            image=_pixels(scene), label=scene.kinds[0], mask=torch.from_numpy(scene.masks[0]).long()
        )


class ShapesPairs:
    """The first `length` // 2 two-object scenes among the held-out seeds, each twice:
    example 2i explains scene i's first object, example 2i + 1 its second."""

    name = "shapes-heldout-two-objects"

    def __init__(self, length: int = 2000, size: int = 64) -> None:
        if length % 2:
            raise OptionError(f"length must be even (two examples per scene), got {length}")
        self.length = length
        self._scenes = _HeldoutScenes(objects=2, size=size)

    def __len__(self) -> int:
        return self.length

    def seed(self, index: int) -> int:
        """The seed of example `index`'s scene (`explain.data.shapes.render_scene`)."""
        return self._scenes[index // 2].seed

    def __getitem__(self, index: int) -> TwoObjectExample:
        if not 0 <= index < self.length:
            raise IndexError(f"index {index} out of range for {self.length} examples")
        scene = self._scenes[index // 2]
        target, other = (0, 1) if index % 2 == 0 else (1, 0)
        masks = torch.from_numpy(scene.masks).long()
        return TwoObjectExample(
            image=_pixels(scene),
            label=scene.kinds[target],
            mask=masks[target],
            other_label=scene.kinds[other],
            other_mask=masks[other],
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


class RecallHeldout:
    """The first `count` held-out prompts of `length` tokens of `explain.data.recall` with
    `hops` hops (the task of the zoo's recall language models): each prompt's answer is the
    asked value, its evidence the asked fact's key and value tokens (two hops: those of
    both facts of the asked chain), and `<s>` and the question are kept. Removed tokens
    are replaced by the filler word `recall.REPLACEMENT`."""

    def __init__(self, length: int, count: int = 1000, hops: int = 1) -> None:
        from explain.data import recall

        self.length, self.count, self.hops = length, count, hops
        self.name = f"recall-heldout-{length}-tokens" + ("-two-hops" if hops == 2 else "")
        self.replacement = recall.VOCABULARY.index(recall.REPLACEMENT)

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> AnswerExample:
        from explain.data import recall

        if not 0 <= index < self.count:
            raise IndexError(f"index {index} out of range for {self.count} prompts")
        example = recall.make_example(recall.SPLITS["heldout"][index], self.length, hops=self.hops)
        return AnswerExample(
            input_ids=example.input_ids,
            answer=example.answer,
            evidence=example.evidence_positions,
            kept=(0, *example.question_positions),
        )


class ShapesAnswers:
    """The held-out shapes questions (`explain.data.shapes_questions`) of the zoo's
    vision-language model: the first `length` examples (question 0 of held-out scenes 0,
    1, ...: the examples its card counts) as `ImageAnswerExample`s, made by `processor` (a
    vision-language model's, whose tokenizer holds VOCABULARY's words) as a user's
    prompt goes through it (`explain.inputs.encode_image_prompt`: the chat template, the
    image placeholder expanded to the image tokens).

    Each example's answer is the answer word's token alone (the end token after it says
    nothing about the scene); its mask is `Example.mask` (the pixels of the object the
    answer is about), on the grid of its pixel values because the scenes are drawn at the
    processor's size (`size`); its regions are the masks of the scene's objects (the
    answer's object among them); its text evidence is the position of the word the question
    names (the asked kind, or the asked colour for "shape"). How the test counts them
    (explain.evaluation.vision_language): an example whose answer is about no object
    ("no", "none", "nothing": an empty mask) is left out of the pointing game and the
    mIoU and counted apart; an example the model answers wrongly (its greedy answer word
    is not `answer`) is left out of every ranking number, as its evidence is not known,
    and counted with the share answered right.
    """

    name = "shapes-questions-heldout"

    def __init__(self, processor: Any, length: int = 1000, size: int = 64) -> None:
        self.processor, self.length, self.size = processor, length, size

    def __len__(self) -> int:
        return self.length

    def item(self, index: int) -> Example:
        """Example `index` as the data makes it (scene, question, answer, target)."""
        from explain.data.shapes import scene_seed
        from explain.data.shapes_questions import example

        if not 0 <= index < self.length:
            raise IndexError(f"index {index} out of range for {self.length} examples")
        return example(scene_seed("heldout", index), 0, self.size)

    def __getitem__(self, index: int) -> ImageAnswerExample:
        from explain.data.shapes import COLOURS, KINDS
        from explain.inputs import encode_image_prompt

        item = self.item(index)
        encoded = encode_image_prompt({"image": item.image, "text": item.text}, self.processor)
        ids = tuple(encoded["input_ids"][0].tolist())
        named = (COLOURS if item.question.template == "shape" else KINDS)[item.question.subject]
        tokens = self.processor.tokenizer.convert_tokens_to_ids([named, item.answer])
        return ImageAnswerExample(
            input_ids=ids,
            pixel_values=encoded["pixel_values"][0],
            answer=(tokens[1],),
            mask=torch.from_numpy(item.mask),
            text_evidence=(ids.index(tokens[0]),),  # the question names it once
            regions=torch.from_numpy(item.scene.masks),
        )
