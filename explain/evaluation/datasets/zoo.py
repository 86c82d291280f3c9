"""The zoo models' own held-out sets, as evaluation examples with ground truth.

- `shapes-vit` and `shapes-swin`: held-out scenes (never a training seed) that hold
  exactly ONE object, so that top-1 accuracy against one label and one foreground mask
  are defined as on ImageNet and ImageNet-segmentation. The label is that object's
  kind, the mask its pixels. For the class-specific test: the held-out scenes that
  hold exactly TWO objects, each scene once per object (`ShapesPairs`).
- `digits-vit`: the 400 held-out scikit-learn digits. They come without masks; the mask
  used here is DERIVED from the strokes: the pixels whose upsampled ink is at least 0.5.
- `minilm-sentiment`: held-out sentences; the rationale is the words that decide the
  label (the sentiment words and a negation), known by construction.
- the models with known evidence (a language model, a vision-language model): held-out
  prompts with their answers and evidence, in the model's own tokens (`ANSWER_SETS`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from explain.errors import InputError, OptionError
from explain.evaluation.datasets.base import (
    AnswerExample,
    EvaluationDataset,
    ImageAnswerExample,
    ImageExample,
    TextExample,
    TwoObjectExample,
)

if TYPE_CHECKING:
    from explain.data.shapes import Scene
    from explain.data.shapes_questions import Example
    from explain.loading import LoadedModel

__all__ = [
    "ANSWER_SETS",
    "HELDOUT",
    "TWO_OBJECTS",
    "DigitsHeldout",
    "RecallHeldout",
    "SentimentHeldout",
    "ShapesAnswers",
    "ShapesHeldout",
    "ShapesPairs",
    "answer_dataset",
    "heldout_dataset",
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
    """The first `count` held-out prompts of `length` tokens of `explain.data.recall` (the
    task of recall-llama): each prompt's answer is the asked value, its evidence the asked
    fact's key and value tokens, and `<s>` and the question are kept. Removed tokens are
    replaced by the filler word `recall.REPLACEMENT`."""

    def __init__(self, length: int, count: int = 1000) -> None:
        from explain.data import recall

        self.length, self.count = length, count
        self.name = f"recall-heldout-{length}-tokens"
        self.replacement = recall.VOCABULARY.index(recall.REPLACEMENT)

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> AnswerExample:
        from explain.data import recall

        if not 0 <= index < self.count:
            raise IndexError(f"index {index} out of range for {self.count} prompts")
        example = recall.make_example(recall.SPLITS["heldout"][index], self.length)
        return AnswerExample(
            input_ids=example.input_ids,
            answer=example.answer,
            evidence=example.evidence_positions,
            kept=(0, *example.question_positions),
        )


def _recall_answers(loaded: LoadedModel, length: int | None) -> RecallHeldout:
    """recall-llama's held-out prompts, at its trained length unless `length` is given;
    the model's tokenizer must be the data's word-level one (the prompts are token ids)."""
    from explain.data import recall
    from explain.evaluation.recall_answers import trained_length

    vocabulary = list(recall.VOCABULARY)
    if loaded.tokenizer.convert_tokens_to_ids(vocabulary) != list(range(len(vocabulary))):
        raise InputError(
            f"{loaded.name}'s tokenizer is not the word-level one of explain.data.recall "
            "(recall.build_tokenizer()); its held-out prompts are in that tokenizer's ids"
        )
    length = trained_length(loaded) if length is None else length
    positions = getattr(getattr(loaded.model, "config", None), "max_position_embeddings", None)
    if isinstance(positions, int) and length >= positions:  # before a prompt is built
        raise OptionError(
            f"--length {length}: {loaded.name} reads at most {positions} positions, the "
            f"prompt and its answer included; give a length below {positions}"
        )
    try:
        recall.make_example(recall.SPLITS["heldout"][0], length)
    except ValueError as error:
        raise OptionError(f"--length {length}: {error}") from None
    return RecallHeldout(length)


HELDOUT: dict[str, Callable[[tuple[int, int] | None], EvaluationDataset]] = {
    "shapes-vit": lambda size: ShapesHeldout(size=size[0] if size else 64),
    "shapes-swin": lambda size: ShapesHeldout(size=size[0] if size else 64),
    "digits-vit": lambda size: DigitsHeldout(size=size[0] if size else 32),
    "minilm-sentiment": lambda size: SentimentHeldout(),
}
"""Zoo model name -> its held-out evaluation set, given the model's image size."""

TWO_OBJECTS: dict[str, Callable[[tuple[int, int] | None], EvaluationDataset]] = {
    "shapes-vit": lambda size: ShapesPairs(size=size[0] if size else 64),
    "shapes-swin": lambda size: ShapesPairs(size=size[0] if size else 64),
}
"""Zoo model name -> its held-out two-object set (the class-specific test)."""


def heldout_dataset(
    name: str, image_size: tuple[int, int] | None = None, *, two_objects: bool = False
) -> EvaluationDataset:
    """The held-out evaluation set of zoo model `name` (with or without the `zoo:` prefix);
    `two_objects` asks for its two-object scenes (the class-specific test)."""
    name = name.removeprefix("zoo:")
    sets = TWO_OBJECTS if two_objects else HELDOUT
    if name not in sets:
        kind = "two-object evaluation set" if two_objects else "built-in evaluation set"
        hint = "" if two_objects else "; pass --data"
        raise OptionError(f"{name!r} has no {kind} (zoo models with one: {', '.join(sets)}){hint}")
    return sets[name](image_size)


class ShapesAnswers:
    """shapes-llava's held-out questions (`explain.data.shapes_questions`): the first
    `length` examples (question 0 of held-out scenes 0, 1, ...: the
    examples shapes-llava's card counts) as `ImageAnswerExample`s, made by `processor` (a
    vision-language model's, whose tokenizer holds VOCABULARY's words) as a user's
    prompt goes through it (`explain.inputs.encode_image_prompt`: the chat template, the
    image placeholder expanded to the image tokens).

    Each example's answer is the answer word's token alone (the end token after it says
    nothing about the scene); its mask is `Example.mask` (the pixels of the object the
    answer is about), on the grid of its pixel values because the scenes are drawn at the
    processor's size (`size`); its text evidence is the position of the word the question
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
        )


def _shapes_answers(loaded: LoadedModel, length: int | None) -> EvaluationDataset:
    size = loaded.image_size
    return ShapesAnswers(loaded.tokenizer, size=size[0] if size else 64)


ANSWER_SETS: dict[str, Callable[[LoadedModel, int | None], EvaluationDataset]] = {
    "recall-llama": _recall_answers,
    "shapes-llava": _shapes_answers,
}
"""Zoo model name -> its held-out prompts with answers and known evidence (the language-
and vision-language-evidence tests: `AnswerExample`s or `ImageAnswerExample`s), made with
the loaded model's tokenizer or processor; the int is the prompt length in tokens for a
language model (None: its own default), ignored by a vision-language model. A known-
evidence zoo model's examples are made here from its data module; a data set
may name the token that replaces removed tokens as its `replacement`.

- `shapes-llava`: the held-out shapes questions (`ShapesAnswers`): the answer word's
  token, the mask of the object the answer is about (empty for "no", "none", "nothing":
  such examples are left out of the pointing game and the mIoU, and counted), the word
  the question names as text evidence. Examples the model answers wrongly are left out
  of every ranking number and counted (their evidence is not known), as for every
  answer set."""


def answer_dataset(name: str, loaded: LoadedModel, length: int | None = None) -> EvaluationDataset:
    """The held-out answers of zoo model `name` (with or without the `zoo:` prefix)."""
    name = name.removeprefix("zoo:")
    if name not in ANSWER_SETS:
        known = ", ".join(ANSWER_SETS) or "none yet"
        raise OptionError(
            f"{name!r} has no built-in prompts with known evidence (zoo models with them: "
            f"{known}); pass --data with a JSON lines file of answer examples"
        )
    return ANSWER_SETS[name](loaded, length)
