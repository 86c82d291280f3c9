"""The zoo's shapes-llava: it loads offline with its processor, answers held-out questions
far above what a model blind to the scene can, its answers rest on the objects its
examples record (edits of those objects change them, edits of others do not), and the
explainer and `explain generate --image` explain its answers at depths "lm" and "tower"."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

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
    torch.testing.assert_close(alone.relevances["image"][0], image[0, 0])


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
