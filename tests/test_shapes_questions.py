"""The shapes questions: a pure function of the seed on the scenes' splits, each answer
right for the scene as rendered (read off its pixels, not off the generator's layout),
each mask the pixels of the object the answer is about, and the evidence edits changing
the true answer where the control edits keep it. Free colours leave the default scenes,
on which the zoo's image models were trained, as they were."""

from __future__ import annotations

import colorsys
import dataclasses

import numpy as np
import pytest

from explain.data import shapes, shapes_questions
from explain.data.shapes_questions import (
    ANSWERS,
    TEMPLATES,
    VOCABULARY,
    control_edits,
    evidence_edits,
    example,
    examples,
)

ITEMS = examples("heldout", 240)


def test_an_example_is_a_pure_function_of_its_seed_and_number():
    first, again = example(1_000_007, 2), example(1_000_007, 2)
    assert (first.text, first.answer, first.target) == (again.text, again.answer, again.target)
    assert np.array_equal(first.image, again.image) and np.array_equal(first.mask, again.mask)
    questions = {example(1_000_007, number).text for number in range(8)}
    assert len(questions) > 1, "the numbers of a scene ask different questions"


def test_examples_walk_the_scenes_of_their_split():
    train = examples("train", 6, start=10, per_scene=3)
    assert [(item.seed, item.number) for item in train] == [
        (10, 0), (10, 1), (10, 2), (11, 0), (11, 1), (11, 2)
    ]  # fmt: skip
    assert all(item.seed in shapes.SPLITS["heldout"] for item in ITEMS)
    assert [item.seed for item in ITEMS[:3]] == [1_000_000, 1_000_001, 1_000_002]
    with pytest.raises(ValueError, match="outside split"):
        examples("heldout", 2, start=len(shapes.SPLITS["heldout"]) - 1)
    with pytest.raises(ValueError, match="per_scene"):
        examples("train", 2, per_scene=0)


def test_every_template_and_answer_kind_occurs():
    templates = {item.question.template for item in ITEMS}
    assert templates == set(TEMPLATES)
    words = {item.answer for item in ITEMS}
    assert {"yes", "no", "none", "nothing"} <= words and words <= set(ANSWERS)
    # The answers are not given away by the template: the commonest answer of each is
    # at most about half of its examples.
    for template in TEMPLATES:
        said = [item.answer for item in ITEMS if item.question.template == template]
        assert max(said.count(word) for word in set(said)) / len(said) < 0.62, template


def _hue_name(image: np.ndarray, mask: np.ndarray) -> str:
    """The colour name of the masked pixels' mean colour: the nearest of the six hues."""
    hue = colorsys.rgb_to_hsv(*image[mask].mean(axis=0))[0]
    distance = [min(abs(hue - h), 1 - abs(hue - h)) for h in shapes.KIND_HUES]
    return shapes.COLOURS[int(np.argmin(distance))]


def _from_pixels(item) -> str:
    """The answer read off the rendered scene: its masks, their pixels' colours, their
    centroids, and the kinds it was rendered with."""
    scene = item.scene
    kinds = [shapes.KINDS[k] for k in scene.kinds]
    colours = [_hue_name(scene.image, mask) for mask in scene.masks]
    template, subject = item.question.template, item.question.subject
    if template == "shape":
        named = shapes.COLOURS[subject]
        return kinds[colours.index(named)] if named in colours else "none"
    named = shapes.KINDS[subject]
    if template == "presence":
        return "yes" if named in kinds else "no"
    if named not in kinds:
        return "none"
    index = kinds.index(named)
    if template == "colour":
        return colours[index]
    xs = [np.nonzero(mask)[1].mean() for mask in scene.masks]
    left = [i for i in range(len(xs)) if xs[i] < xs[index]]
    return kinds[max(left, key=lambda i: xs[i])] if left else "nothing"


def test_each_answer_is_right_for_the_scene_as_rendered():
    for item in ITEMS:
        assert item.answer == _from_pixels(item), (item.seed, item.text)


def _grown(mask: np.ndarray, steps: int) -> np.ndarray:
    """The mask and every pixel within `steps` pixels of it (chessboard distance)."""
    grown = mask.copy()
    for _ in range(steps):
        padded = np.pad(grown, 1)
        grown = np.zeros_like(grown)
        for dy in range(3):
            for dx in range(3):
                grown |= padded[dy : dy + mask.shape[0], dx : dx + mask.shape[1]]
    return grown


def test_the_mask_is_the_pixels_of_the_object_the_answer_is_about():
    """Without that object the scene differs exactly around its mask: every masked pixel
    changes, and no pixel farther than two pixels from the mask (the mask holds the pixels
    at least half covered; a star's spikes end in thinner slivers)."""
    counted = 0
    for item in ITEMS:
        if item.target is None:
            assert not item.mask.any() and item.answer in ("no", "none", "nothing")
            continue
        without = dataclasses.replace(
            item.layout,
            objects=tuple(o for i, o in enumerate(item.layout.objects) if i != item.target),
        )
        changed = np.abs(shapes.render_layout(without).image - item.image).max(axis=-1) > 1e-6
        assert changed[item.mask].all()
        assert not (changed & ~_grown(item.mask, 2)).any()
        assert item.mask.sum() >= 50  # an object, not a speck of clutter
        counted += 1
    assert counted > 100


def test_evidence_edits_change_the_true_answer_and_control_edits_keep_it():
    evidence = controls = 0
    for item in ITEMS:
        edits = evidence_edits(item)
        assert (not edits) == (item.target is None)
        expected = {"remove", "reshape"} | (
            {"recolour"} if item.question.template in ("colour", "shape") else set()
        )
        assert not edits or set(edits) == expected
        for layout in edits.values():
            assert shapes_questions.answer(layout, item.question)[0] != item.answer
            evidence += 1
        for name, layout in control_edits(item).items():
            index = int(name.split()[1])
            assert index not in (item.target, item.reference)
            assert shapes_questions.answer(layout, item.question)[0] == item.answer
            if name.startswith("change"):  # only that object changes, and both of its looks
                before, after = item.layout.objects[index], layout.objects[index]
                assert before.kind != after.kind and before.colour != after.colour
            controls += 1
    assert evidence > 200 and controls > 100


def test_free_colours_leave_the_default_scenes_as_they_were():
    """Free colours repaint the objects only: the same kinds, masks and pixels away from
    the objects; hues distinct within a scene and independent of the kinds."""
    pairs = 0
    for seed in range(40):
        plain = shapes.render_scene(seed)
        free = shapes.render_scene(seed, colours="free")
        assert plain.kinds == free.kinds and np.array_equal(plain.masks, free.masks)
        assert plain.colours == plain.kinds and len(set(free.colours)) == len(free.colours)
        outside = ~_grown(plain.masks.any(axis=0), 2)  # off the objects and their edges
        assert np.array_equal(plain.image[outside], free.image[outside])
        pairs += sum(k != c for k, c in zip(free.kinds, free.colours, strict=True))
    assert pairs > 40
    with pytest.raises(ValueError, match="colours must be one of"):
        shapes.render_scene(0, colours="pastel")


def test_the_tokenizer_reads_every_question_and_answer():
    tokenizer = shapes_questions.build_tokenizer()
    assert len(tokenizer) == len(VOCABULARY)
    chat = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "x"}]}]
    prompt = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    assert prompt == "<s> user <image> x <s> assistant "
    unknown = tokenizer.unk_token_id
    for item in ITEMS[:40]:
        ids = tokenizer(f"{item.text.upper()} {item.answer}")["input_ids"]
        assert unknown not in ids
        assert tokenizer.convert_ids_to_tokens(ids[-1]) == item.answer
    assert tokenizer("what colour is the moon?")["input_ids"][-2] == unknown
