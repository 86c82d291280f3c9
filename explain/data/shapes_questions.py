"""Templated questions about the shapes scenes, with their answers and their evidence.

The zoo's vision-language model is trained and measured on them. Every example is a
free-colour scene of `explain.data.shapes` (the objects' hues independent of their kinds,
distinct within a scene) with one question of four templates (`TEMPLATES`):

- "colour":   "what colour is the star?"    -> a colour, or "none" without a star
- "presence": "is there a ring?"            -> "yes" or "no"
- "shape":    "what shape is the red object?" -> a kind, or "none" without a red object
- "left":     "what is left of the circle?" -> the kind of the nearest object to the
  circle's left (centres compared), or "nothing"

Each example records the object its answer is about (`target`, an index into the scene's
objects): the asked kind's object ("colour", "presence"), the object of the asked colour
("shape"), the nearest object to the left ("left"). Its `mask` is that object's pixels,
and is empty when no object is meant: "no", "none", "nothing". The protocols count such
examples apart (their evidence is an absence).

The answer is a function of the scene's layout (`answer`), so the known-evidence checks
edit a layout (`evidence_edits`: remove, recolour or reshape the target; `control_edits`:
change or remove an object the question does not involve) and read the new answer off
the same function.

Examples are a pure function of the scene's seed and the question's number, on the
scenes' seed splits (`shapes.SPLITS`): `example(seed, number)`, or `examples(split, ...)`.
`explain.evaluation.datasets.zoo.ShapesAnswers` gives the held-out ones in a model's own
tokens, as the vision-language-evidence test takes them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from explain.data.shapes import (
    COLOURS,
    KINDS,
    Layout,
    Scene,
    render_layout,
    scene_layout,
    scene_seed,
)

if TYPE_CHECKING:  # transformers is imported only when a tokenizer is built
    from transformers import PreTrainedTokenizerFast

__all__ = [
    "ANSWERS",
    "CHAT_TEMPLATE",
    "LEFT_MARGIN",
    "TEMPLATES",
    "VOCABULARY",
    "Example",
    "Question",
    "answer",
    "ask",
    "build_tokenizer",
    "control_edits",
    "evidence_edits",
    "example",
    "examples",
    "is_separated",
]

TEMPLATES: dict[str, str] = {
    "colour": "what colour is the {kind}?",
    "presence": "is there a {kind}?",
    "shape": "what shape is the {colour} object?",
    "left": "what is left of the {kind}?",
}
"""The question templates by name; "shape" names a colour, the others a kind."""

ANSWERS: tuple[str, ...] = (*COLOURS, *KINDS, "yes", "no", "none", "nothing")
"""Every answer word."""

LEFT_MARGIN = 8 / 64
""""left" is asked only of scenes whose objects' centres are all at least this fraction
of the width apart horizontally (one 8-pixel patch at 64 x 64): which is left of which is
then plain to see."""

VOCABULARY: tuple[str, ...] = (
    "<pad>",
    "<s>",
    "</s>",
    "<unk>",
    "user",
    "assistant",
    *("what", "colour", "is", "the", "there", "a", "shape", "object", "left", "of", "?"),
    *ANSWERS,
    "<image>",
)
"""Every token, in id order: the image placeholder last."""

CHAT_TEMPLATE = (
    "{% for m in messages %}<s> {{ m['role'] }} "
    "{% if m['content'] is string %}{{ m['content'] }} "
    "{% else %}{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}<image> {% else %}{{ c['text'] }} {% endif %}"
    "{% endfor %}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<s> assistant {% endif %}"
)
"""The chat template: "<s> user <image> what colour is the star? <s> assistant", then
the answer and "</s>"; messages hold text, or lists of {"type": "image"} and {"type":
"text", "text": ...} entries, as the processors of LLaVA and its kin take them (the tiny
test VLMs of explain.testing.tiny_vlm share it)."""

_ABSENT_ASKED = 0.25  # "colour" and "shape" ask about an absent kind or colour this often
_LEFT_OF_LEFTMOST = 0.25  # "left" asks about the leftmost object at most this often


@dataclass(frozen=True)
class Question:
    """A question: its template and what it names (a kind, or a colour for "shape")."""

    template: str
    subject: int

    @property
    def text(self) -> str:
        """The question as words, e.g. "what colour is the star?"."""
        if self.template == "shape":
            return TEMPLATES["shape"].format(colour=COLOURS[self.subject])
        return TEMPLATES[self.template].format(kind=KINDS[self.subject])


def _find(layout: Layout, template: str, subject: int) -> int | None:
    """The index of the object the question names: of the asked colour for "shape",
    else of the asked kind; None when the scene has none."""
    attribute = "colour" if template == "shape" else "kind"
    for index, item in enumerate(layout.objects):
        if getattr(item, attribute) == subject:
            return index
    return None


def answer(layout: Layout, question: Question) -> tuple[str, int | None]:
    """The answer to `question` on the scene `layout` describes, and the index of the
    object it is about (None for "no", "none" and "nothing")."""
    named = _find(layout, question.template, question.subject)
    if question.template == "presence":
        return ("no", None) if named is None else ("yes", named)
    if named is None:
        return "none", None
    objects = layout.objects
    if question.template == "colour":
        return COLOURS[objects[named].colour], named
    if question.template == "shape":
        return KINDS[objects[named].kind], named
    if question.template == "left":
        x = objects[named].centre[0]
        left = [i for i, item in enumerate(objects) if item.centre[0] < x]
        if not left:
            return "nothing", None
        nearest = max(left, key=lambda i: objects[i].centre[0])
        return KINDS[objects[nearest].kind], nearest
    raise ValueError(f"unknown template {question.template!r}; choose one of {list(TEMPLATES)}")


def is_separated(layout: Layout) -> bool:
    """Whether every two objects' centres are at least LEFT_MARGIN of the width apart
    horizontally (the scenes "left" is asked of)."""
    xs = np.sort([item.centre[0] for item in layout.objects])
    return bool(np.all(np.diff(xs) >= LEFT_MARGIN * layout.backdrop.shape[1]))


def _draw(layout: Layout, number: int) -> Question:
    """Question `number` of the scene: a template uniformly ("left" only where the scene
    is separated, else one of the other three), then what it names."""
    rng = np.random.default_rng([layout.seed, 2, number])
    templates = [t for t in TEMPLATES if t != "left" or is_separated(layout)]
    template = templates[int(rng.integers(len(templates)))]
    kinds = [item.kind for item in layout.objects]
    if template == "shape":
        colours = [item.colour for item in layout.objects]
        absent = [c for c in range(len(COLOURS)) if c not in colours]
        pool = absent if rng.random() < _ABSENT_ASKED else colours
        return Question(template, int(rng.choice(pool)))
    absent = [k for k in range(len(KINDS)) if k not in kinds]
    if template == "presence":
        pool = absent if rng.random() < 0.5 else kinds
    elif template == "colour":
        pool = absent if rng.random() < _ABSENT_ASKED else kinds
    else:  # "left": mostly of an object with something to its left
        leftmost = min(layout.objects, key=lambda item: item.centre[0]).kind
        others = [k for k in kinds if k != leftmost]
        pool = others if others and rng.random() >= _LEFT_OF_LEFTMOST else kinds
    return Question(template, int(rng.choice(pool)))


@dataclass(frozen=True)
class Example:
    """A scene, a question about it, the answer, and the object the answer is about.

    Attributes:
        seed: the scene's seed (its split is the range of `shapes.SPLITS` it lies in).
        number: which question of that scene (its own random stream).
        question: the template and what it names.
        layout: the scene before painting (free colours).
        answer: the answer word.
        target: index into the scene's objects of the one the answer is about; None when
            it is about none ("no", "none", "nothing").
    """

    seed: int
    number: int
    question: Question
    layout: Layout
    answer: str
    target: int | None

    @property
    def text(self) -> str:
        """The question as words."""
        return self.question.text

    @cached_property
    def scene(self) -> Scene:
        """The rendered scene: image in [0, 1], each object's mask, kinds and colours."""
        return render_layout(self.layout)

    @property
    def image(self) -> np.ndarray:
        """(H, W, 3) float32 RGB in [0, 1]."""
        return self.scene.image

    @property
    def mask(self) -> np.ndarray:
        """(H, W) bool: the pixels of the object the answer is about; all False when the
        answer is about none."""
        if self.target is None:
            return np.zeros(self.layout.backdrop.shape[:2], dtype=bool)
        return self.scene.masks[self.target]

    @property
    def reference(self) -> int | None:
        """The index of the object the question names (the asked kind's, or the asked
        colour's), or None when the scene has none."""
        return _find(self.layout, self.question.template, self.question.subject)


def ask(layout: Layout, number: int = 0) -> Example:
    """Question `number` about the scene of `layout` (its own random stream, seeded by
    the layout's seed and `number`), with its answer."""
    question = _draw(layout, number)
    word, target = answer(layout, question)
    return Example(layout.seed, number, question, layout, word, target)


def example(seed: int, number: int = 0, size: int = 64) -> Example:
    """Question `number` about the free-colour scene of `seed` at `size` x `size`."""
    return ask(scene_layout(seed, size, colours="free"), number)


def examples(
    split: str, count: int, *, start: int = 0, per_scene: int = 1, size: int = 64
) -> list[Example]:
    """`count` examples of `split`: scenes `start`, `start + 1`, ... of the split, with
    questions 0 .. per_scene - 1 of each (example i: scene start + i // per_scene,
    question i % per_scene)."""
    if per_scene < 1:
        raise ValueError(f"per_scene must be at least 1, got {per_scene}")
    return [
        example(scene_seed(split, start + i // per_scene), i % per_scene, size)
        for i in range(count)
    ]


def _unused(values: list[int], choices: int, rng: np.random.Generator, avoid: int | None) -> int:
    """A value in range(choices) neither in `values` nor `avoid`, drawn by `rng`."""
    free = [v for v in range(choices) if v not in values and v != avoid]
    return int(rng.choice(free))


def _changed(layout: Layout, index: int, *, kind: int | None = None, colour: int | None = None):
    objects = list(layout.objects)
    fields = {k: v for k, v in (("kind", kind), ("colour", colour)) if v is not None}
    objects[index] = dataclasses.replace(objects[index], **fields)
    return dataclasses.replace(layout, objects=tuple(objects))


def _removed(layout: Layout, index: int) -> Layout:
    objects = layout.objects[:index] + layout.objects[index + 1 :]
    return dataclasses.replace(layout, objects=objects)


def evidence_edits(item: Example) -> Mapping[str, Layout]:
    """The scene with the object the answer is about changed, by each edit that changes
    the true answer: "remove" it; "reshape" it (to a kind the scene does not hold);
    "recolour" it (to a colour the scene does not hold; "colour" and "shape" questions
    only: the others' answers do not rest on colour). Empty when the answer is about no
    object."""
    if item.target is None:
        return {}
    rng = np.random.default_rng([item.seed, 3, item.number])
    kinds = [o.kind for o in item.layout.objects]
    colours = [o.colour for o in item.layout.objects]
    edits = {
        "remove": _removed(item.layout, item.target),
        "reshape": _changed(item.layout, item.target, kind=_unused(kinds, len(KINDS), rng, None)),
    }
    if item.question.template in ("colour", "shape"):
        colour = _unused(colours, len(COLOURS), rng, None)
        edits["recolour"] = _changed(item.layout, item.target, colour=colour)
    return edits


def control_edits(item: Example) -> Mapping[str, Layout]:
    """The scene with one object the question does not involve (neither the one the
    answer is about nor the one the question names) changed: "change" gives it a kind
    and a colour the scene does not hold and the question does not name, "remove" takes
    it away. Keyed "change k" and "remove k" by the object's index; empty when every
    object is involved."""
    rng = np.random.default_rng([item.seed, 4, item.number])
    involved = {item.target, item.reference}
    kinds = [o.kind for o in item.layout.objects]
    colours = [o.colour for o in item.layout.objects]
    template, subject = item.question.template, item.question.subject
    edits: dict[str, Layout] = {}
    for index in range(len(item.layout.objects)):
        if index in involved:
            continue
        kind = _unused(kinds, len(KINDS), rng, None if template == "shape" else subject)
        colour = _unused(colours, len(COLOURS), rng, subject if template == "shape" else None)
        edits[f"change {index}"] = _changed(item.layout, index, kind=kind, colour=colour)
        edits[f"remove {index}"] = _removed(item.layout, index)
    return edits


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer over VOCABULARY: lower-cased, split at spaces and
    punctuation, left-padded with "<pad>", "<s>" and "</s>" its start and end tokens,
    "<image>" the image placeholder (a special token, so that a processor's runs of
    placeholders split), with CHAT_TEMPLATE. Any other word is "<unk>"."""
    from tokenizers import Tokenizer, normalizers, pre_tokenizers
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    vocabulary = {token: index for index, token in enumerate(VOCABULARY)}
    core = Tokenizer(WordLevel(vocabulary, unk_token="<unk>"))
    core.normalizer = normalizers.Lowercase()
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        padding_side="left",
        extra_special_tokens={"image_token": "<image>"},
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer
