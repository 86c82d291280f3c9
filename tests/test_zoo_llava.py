"""The zoo's shapes-llava: it loads offline with its processor, answers held-out questions
far above what a model blind to the scene can, its answers rest on the objects its
examples record (edits of those objects change them, edits of others do not), the
explainer and `explain generate --image` explain its answers at depths "lm" and "tower",
and its held-out questions are the vision-language-evidence test's built-in set, run from
the command line."""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest
import torch
from tolerances import FLOAT32

from explain import Explainer
from explain.data import shapes_questions
from explain.evaluation.shapes_answers import answers, evidence_check, question_accuracy
from explain.generation import explain_generation
from explain.loading import load_model
from explain.loading.zoo import CONFIG, WEIGHTS, read_config, zoo_root

pytest.importorskip("transformers")

FLOOR = 0.8
"""Held-out accuracy a model must pass on the test's sample. A model that does not look
at the scene can at best answer each question with its template's commonest answer
(the most likely answer given the words): 51% of these held-out examples."""


@functools.cache
def loaded():
    return load_model("zoo:shapes-llava", offline=True)


def test_it_loads_offline_with_its_processor_and_is_small():
    model = loaded()
    assert model.modality == "vision_language" and not model.model.training
    assert type(model.model).__name__ == "LlavaForConditionalGeneration"
    assert type(model.tokenizer).__name__ == "LlavaProcessor"
    assert model.preprocessing.size == (64, 64)
    folder = zoo_root() / "shapes-llava"
    assert (folder / WEIGHTS).stat().st_size <= 5e6
    for name in read_config(folder)["processor_files"] + [CONFIG]:
        assert (folder / name).is_file(), name


def test_the_floor_is_out_of_reach_without_the_scene():
    """Answering every question with its template and subject's commonest answer over
    many training examples (the best any blind model does) stays below FLOOR."""
    train = shapes_questions.examples("train", 1200, start=50_000, per_scene=4)
    commonest: dict[str, dict[str, int]] = {}
    for item in train:
        counts = commonest.setdefault(item.text, {})
        counts[item.answer] = counts.get(item.answer, 0) + 1
    guess = {text: max(counts, key=counts.get) for text, counts in commonest.items()}
    heldout = shapes_questions.examples("heldout", 200)
    blind = np.mean([guess.get(item.text) == item.answer for item in heldout])
    assert blind < FLOOR - 0.2


def test_heldout_answers_pass_the_floor():
    accuracy, per_template = question_accuracy(loaded(), 80)
    assert accuracy >= FLOOR, per_template


def _pooled(found: dict[str, dict[str, tuple[float, int]]]) -> tuple[float, int]:
    """The share over every template's and edit's cells together, and the edits."""
    cells = [cell for by_edit in found.values() for cell in by_edit.values()]
    count = sum(n for _, n in cells)
    return sum(share * n for share, n in cells) / count, count


def test_answers_rest_on_the_recorded_object():
    """On a sample: removing, reshaping or recolouring the answer's object changes the
    answer; changing or removing an object the question does not involve keeps it."""
    check = evidence_check(loaded(), 40)
    changed, edits = _pooled(check.changed)
    kept, controls = _pooled(check.kept)
    assert edits >= 40 and controls >= 40
    assert changed >= 0.85 and kept >= 0.9, check.table()


def test_a_photo_and_the_scene_get_the_same_answers():
    """Scenes given as people give photos (a PNG's uint8 pixels) and as floats in [0, 1]
    are the same prompts (the processor rounds floats to uint8, as training did)."""
    items = shapes_questions.examples("heldout", 16, start=100)
    photos = [(item.image * 255).round().astype(np.uint8) for item in items]
    texts = [item.text for item in items]
    assert answers(loaded(), photos, texts) == answers(loaded(), [i.image for i in items], texts)


@pytest.mark.parametrize("depth", ["lm", "tower"])
def test_an_answer_is_explained_at_both_depths(depth):
    model = loaded()
    item = shapes_questions.examples("heldout", 4)[0]
    explainer = Explainer(model.model, tokenizer=model.tokenizer)
    prompt = {"image": item.image, "text": item.text}
    found = explain_generation(explainer, prompt, max_new_tokens=2, depth=depth)
    generated = found.generation.input_ids[0, found.generation.prompt_length :]
    words = model.tokenizer.tokenizer.convert_ids_to_tokens(generated.tolist())
    assert words == [*answers(model, [item.image], [item.text]), "</s>"]
    image = found.explanation.relevances["image"]
    assert image.shape[-2:] == (8, 8) and torch.isfinite(image).all() and image.abs().sum() > 0
    # the answer word alone, as the next token: the first row of the generation's maps
    alone = explainer.explain(prompt, depth=depth)
    torch.testing.assert_close(alone.relevances["image"][0], image[0, 0], **FLOAT32)


def test_explain_generate_answers_about_a_photo(tmp_path, capsys):
    from PIL import Image

    from explain.cli import main

    item = shapes_questions.examples("heldout", 4)[1]
    Image.fromarray((item.image * 255).round().astype(np.uint8)).save(tmp_path / "scene.png")
    argv = ["generate", "--image", str(tmp_path / "scene.png"), item.text, "--model"]
    argv += ["zoo:shapes-llava", "--depth", "tower", "--out", str(tmp_path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    # the generated tokens as every view shows them, the end token kept
    assert out.startswith(f"answer: {answers(loaded(), [item.image], [item.text])[0]} </s>\n")
    assert (tmp_path / "generation.html").is_file() and (tmp_path / "generation.png").is_file()


def test_the_evidence_tests_examples_are_the_recorded_questions():
    """answer_dataset("shapes-llava") gives each held-out question (question 0 of held-out
    scene i) as the processor writes it, the answer word's token, the mask of the object
    the answer is about (empty for "no", "none", "nothing"), the scene's objects as its
    regions and the named word's position."""
    from explain.evaluation.zoo import answer_dataset

    model = loaded()
    dataset = answer_dataset("zoo:shapes-llava", model)
    items = shapes_questions.examples("heldout", 12)
    vocabulary = model.tokenizer.tokenizer
    empty = 0
    for index, item in enumerate(items):
        example = dataset[index]
        torch.testing.assert_close(example.mask, torch.from_numpy(item.mask), rtol=0, atol=0)
        assert example.mask.sum() == (0 if item.target is None else item.mask.sum())
        # the regions are the scene's objects, the answer's object among them
        assert torch.equal(example.regions, torch.from_numpy(item.scene.masks))
        assert example.asked_region == item.target
        empty += item.target is None
        words = vocabulary.convert_ids_to_tokens(list(example.input_ids))
        question = item.text.replace("?", " ?").split()
        assert words == ["<s>", "user", *["<image>"] * 64, *question, "<s>", "assistant"]
        assert vocabulary.convert_ids_to_tokens(list(example.answer)) == [item.answer]
        named = item.text.split()[-2 if item.question.template == "shape" else -1].rstrip("?")
        assert [words[p] for p in example.text_evidence] == [named]
        # the scene's pixels as a PNG holds them, normalised by the processor (mean 0.5,
        # std 0.25): the mask lies on the pixel values' grid
        photo = torch.from_numpy((item.image * 255).round()).permute(2, 0, 1) / 255
        torch.testing.assert_close(example.pixel_values, (photo - 0.5) / 0.25, **FLOAT32)
    assert 0 < empty < len(items)  # both kinds of answer are among them


def test_evaluate_vision_language_evidence_on_the_zoo_model(tmp_path):
    """`explain evaluate vision-language-evidence --model zoo:shapes-llava` runs on the
    built-in questions and writes the JSON, the table and the curves; the examples the
    model answers wrongly are counted apart, those about no object are left out of the
    pointing game."""
    from explain.architectures import adapter_for
    from explain.cli import main
    from explain.engine import Request, supported_methods

    output = tmp_path / "vl.json"
    argv = ["evaluate", "vision-language-evidence", "--model", "zoo:shapes-llava", "--limit"]
    argv += ["4", "--batch-size", "2", "--output", str(output), "--quiet"]
    assert main(argv) == 0
    results = json.loads(output.read_text())
    model = loaded()
    assert list(results["results"]) == supported_methods(
        adapter_for(model.model), Request(prompt_length=1)
    )
    assert results["dataset"] == "shapes-questions-heldout" and results["n"] == 4
    items = shapes_questions.examples("heldout", 4)
    said = answers(model, [item.image for item in items], [item.text for item in items])
    right = [word == item.answer for word, item in zip(said, items, strict=True)]
    on_object = sum(r and item.target is not None for r, item in zip(right, items, strict=True))
    assert 0 < sum(right) < 4 and on_object < sum(right)  # both exclusions are exercised
    for summary in results["results"].values():
        assert (summary["right"], summary["wrong"]["count"]) == (sum(right), 4 - sum(right))
        assert summary["on_object"] == on_object and summary["with_text_evidence"] == sum(right)
        assert summary["accuracy"] == sum(right) / 4
    assert "| `generic` |" in output.with_suffix(".md").read_text()
    assert output.with_suffix(".png").stat().st_size > 0


def test_pixels_of_the_wrong_size_name_the_size_the_tower_takes():
    # Issue 46: pixel values of the wrong size reached transformers' shape error.
    from explain.errors import InputError
    from explain.inputs import encode_image_prompt

    model = loaded()
    item = shapes_questions.examples("heldout", 1)[0]
    inputs = encode_image_prompt({"image": item.image, "text": item.text}, model.tokenizer)
    inputs["pixel_values"] = torch.nn.functional.interpolate(inputs["pixel_values"], size=96)
    with pytest.raises(InputError, match="takes 64 x 64 pixels, got 96 x 96"):
        Explainer(model.model).explain(inputs, method="generic")


def test_the_first_explanation_of_a_fresh_model_leaves_no_hooks():
    """Issue 46: transformers installs its output-capturing hooks lazily, the first time the
    vision tower records outputs, and the first explanation of a freshly loaded model left
    those 8 forward hooks (and transformers' mark) behind. A plain forward after it still
    gets them, and a second explanation equals the first."""
    from PIL import Image

    from explain.testing import ModelState

    fresh = load_model("zoo:shapes-llava", offline=True)
    model, tower = fresh.model, fresh.model.model.vision_tower
    photo = {"type": "image", "image": Image.new("RGB", (64, 64), "red")}
    chat = [{"role": "user", "content": [photo, {"type": "text", "text": "what shape?"}]}]
    state = ModelState.capture(model)
    explainer = Explainer(model, tokenizer=fresh.tokenizer)
    first = explainer.explain(chat, method="generic", depth="tower")
    assert state.differences(ModelState.capture(model)) == []
    assert "_output_capturing_hooks_installed" not in tower.__dict__
    again = explainer.explain(chat, method="generic", depth="tower")
    torch.testing.assert_close(again.relevance, first.relevance, rtol=0, atol=0)
    assert state.differences(ModelState.capture(model)) == []
