"""The vision-language-evidence test on a tiny LLaVA with synthetic evidence: its records
against plain loops (one unpadded prompt at a time), both depths, a family with token
types, the summary's weighting, errors and side effects."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from explain import Explainer
from explain.errors import ExplainError, InputError, OptionError
from explain.evaluation import FRACTIONS, VisionLanguageEvidenceTest
from explain.evaluation.datasets import AnswerExample, ImageAnswerExample
from explain.evaluation.perturbation import removed_count
from explain.evaluation.protocol import records_problem
from explain.evaluation.segmentation import segmentation_counts
from explain.generation import Generation, explain_generation
from explain.inputs import encode_image_prompt
from explain.normalize import normalize_per_sample
from explain.testing import ModelState
from explain.testing.tiny_vlm import (
    tiny_llava,
    tiny_llava_processor,
    tiny_paligemma,
    tiny_paligemma_processor,
)

BLACK = -1.0  # the tiny processors normalise with mean 0.5 and std 0.5
PATCH = 8


@pytest.fixture(scope="module")
def llava():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield tiny_llava(), tiny_llava_processor()
    torch.set_num_threads(threads)


def first_answer(model, example):
    with torch.no_grad():
        logits = model(
            input_ids=torch.tensor([example.input_ids]),
            pixel_values=example.pixel_values[None],
        ).logits
    return int(logits[0, -1].argmax())


def make_examples(model, processor, questions, wrong=(), empty=()):
    """One random photo per question; the answer is the model's own first token (another
    one for the indices in `wrong`); the object is one 8 x 8 patch (none for `empty`);
    the text evidence is the question's last word."""
    rng = np.random.default_rng(7)
    made = []
    for index, question in enumerate(questions):
        photo = (rng.random((32, 32, 3)) * 255).astype(np.uint8)
        encoded = encode_image_prompt({"image": photo, "text": question}, processor)
        ids = tuple(encoded["input_ids"][0].tolist())
        types = encoded.get("token_type_ids")
        mask = torch.zeros(32, 32, dtype=torch.bool)
        if index not in empty:
            row, column = divmod(index * 5 % 16, 4)
            mask[row * PATCH : (row + 1) * PATCH, column * PATCH : (column + 1) * PATCH] = True
        last_word = processor.tokenizer.convert_tokens_to_ids(question.split()[-1])
        word = max(p for p, token in enumerate(ids) if token == last_word)
        example = ImageAnswerExample(
            ids,
            encoded["pixel_values"][0],
            (0,),
            mask,
            text_evidence=(word,),
            token_type_ids=None if types is None else tuple(types[0].tolist()),
        )
        answer = first_answer(model, example)
        if index in wrong:
            answer = 10 + (answer - 9) % 45
        made.append(ImageAnswerExample(**{**example.__dict__, "answer": (answer,)}))
    return made


@pytest.fixture(scope="module")
def examples(llava):
    model, processor = llava
    questions = ["w12 w13", "w14", "w15 w16 w17", "w20 w21"]
    return make_examples(model, processor, questions, wrong=(2,), empty=(3,))


def maps_of(model, processor, examples, method, depth):
    """The answer's image and text maps as the docs define them (left-padded batch)."""
    width = max(len(e.input_ids) for e in examples)
    ids = [[0] * (width - len(e.input_ids)) + list(e.input_ids) + list(e.answer) for e in examples]
    mask = [[0] * (width - len(e.input_ids)) + [1] * (len(e.input_ids) + 1) for e in examples]
    extra = {"pixel_values": torch.stack([e.pixel_values for e in examples])}
    generation = Generation(torch.tensor(ids), torch.tensor(mask), width, extra)
    explainer = Explainer(model, tokenizer=processor)
    explanation = explain_generation(explainer, generation, method=method, depth=depth)
    image = explanation.explanation.relevances["image"][:, 0].double()
    text = explanation.explanation.relevances["text"][:, 0].double()
    texts = [text[b, width - len(e.input_ids) : width] for b, e in enumerate(examples)]
    return image, texts


def answer_log_probability(model, example, pixels):
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([example.input_ids]), pixel_values=pixels[None])
    log_probabilities = logits.logits[0, -1].double().log_softmax(dim=-1)
    return float(log_probabilities[example.answer[0]]), int(log_probabilities.argmax())


def reference_records(model, example, patch_map):
    """Patch removal, pointing game and segmentation counts for one example, in loops."""
    grid = patch_map.shape
    values = patch_map.flatten().tolist()
    patches = list(range(len(values)))
    most = sorted(patches, key=lambda p: (-values[p], p))
    least = sorted(patches, key=lambda p: (values[p], p))

    def without(removed):
        pixels = example.pixel_values.clone()
        for patch in removed:
            row, column = divmod(patch, grid[1])
            pixels[:, row * PATCH : (row + 1) * PATCH, column * PATCH : (column + 1) * PATCH] = (
                BLACK
            )
        return answer_log_probability(model, example, pixels)[0]

    clean, top = answer_log_probability(model, example, example.pixel_values)
    object_patches = {
        p for p in patches if example.mask.view(4, PATCH, 4, PATCH)[p // 4, :, p % 4].any()
    }
    near = {
        p
        for p in patches
        for q in object_patches
        if abs(p // 4 - q // 4) <= 1 and abs(p % 4 - q % 4) <= 1
    }
    best = [p for p in patches if values[p] == max(values)]
    heatmap = F.interpolate(patch_map[None, None], size=(32, 32), mode="bilinear")[0, 0]
    counts = segmentation_counts(normalize_per_sample(heatmap, 2), example.mask.long())
    return {
        "right": int(top == example.answer[0]),
        "log_probability": clean,
        "positive": [without(most[: removed_count(p, 16)]) for p in FRACTIONS],
        "negative": [without(least[: removed_count(p, 16)]) for p in FRACTIONS],
        "object": int(bool(object_patches)),
        "pointing": sum(p in near for p in best) / len(best) if object_patches else 0.0,
        "intersection": list(counts.intersection),
        "union": list(counts.union),
    }


@pytest.mark.parametrize(("method", "depth"), [("generic", "lm"), ("rollout", "tower")])
def test_records_match_plain_loops(llava, examples, method, depth):
    model, processor = llava
    protocol = VisionLanguageEvidenceTest(model, processor, depth=depth, forward_batch=6)
    records = protocol.evaluate(method, examples)
    assert records_problem(records, VisionLanguageEvidenceTest.fields, len(examples)) is None
    assert records["right"] == [1, 1, 0, 1]
    assert records["object"] == [1, 1, 1, 0]
    image, texts = maps_of(model, processor, examples, method, depth)
    for b, example in enumerate(examples):
        for key, value in reference_records(model, example, image[b]).items():
            assert records[key][b] == pytest.approx(value, rel=1e-4, abs=1e-6), key
        scores = texts[b].tolist()
        word = example.text_evidence[0]
        image_token = model.config.image_token_id
        special = set(processor.tokenizer.all_special_ids) | {image_token}
        ids = example.input_ids
        others = [p for p in range(len(ids) - 1) if ids[p] not in special and p != word]
        assert records["rank"][b] == 1 + sum(scores[p] > scores[word] for p in others)


def test_the_depths_differ_on_the_image_and_agree_on_the_text(llava, examples):
    model, processor = llava
    lm = VisionLanguageEvidenceTest(model, processor, depth="lm").evaluate("generic", examples)
    tower = VisionLanguageEvidenceTest(model, processor, depth="tower")
    deeper = tower.evaluate("generic", examples)
    assert (lm["hits"], lm["rank"]) == (deeper["hits"], deeper["rank"])
    assert lm["positive"] != deeper["positive"] or lm["intersection"] != deeper["intersection"]
    with pytest.raises(ExplainError, match="fixed block"):
        tower.evaluate("raw_attention", examples)


def test_a_family_with_token_types_runs(llava):
    model, processor = tiny_paligemma(), tiny_paligemma_processor()
    examples = make_examples(model, processor, ["w12 w13", "w14"])
    assert examples[0].token_type_ids is not None
    records = VisionLanguageEvidenceTest(model, processor).evaluate("rollout", examples)
    assert records_problem(records, VisionLanguageEvidenceTest.fields, 2) is None
    assert records["right"] == [1, 1]


def _records():
    """Right with an object; right about no object; wrong with an object."""
    return {
        "right": [1, 1, 0],
        "log_probability": [-1.0, -2.0, -5.0],
        "positive": [[-3.0] * 9, [-2.0] * 9, [-5.0] * 9],
        "negative": [[-1.0] * 9, [-2.0] * 9, [-5.0] * 9],
        "object": [1, 0, 1],
        "pointing": [0.5, 0.0, 1.0],
        "correct": [90, 80, 70],
        "labelled": [100, 100, 100],
        "intersection": [[60, 10], [80, 0], [50, 20]],
        "union": [[70, 30], [100, 20], [60, 40]],
        "average_precision": [0.9, 0.5, 0.7],
        "evidence": [1, 1, 0],
        "hits": [[0.0, 1.0, 1.0], [1.0, 1.0, 1.0], [0.0] * 3],
        "rank": [2.0, 1.0, 0.0],
    }


def test_summary_of_a_hand_computed_case():
    protocol = object.__new__(VisionLanguageEvidenceTest)
    summary = protocol.summarize(_records())
    assert (summary["accuracy"], summary["right"], summary["on_object"]) == (2 / 3, 2, 1)
    # pointing and mIoU: the first example only (the second is about no object)
    assert summary["pointing"] == 0.5
    assert summary["miou"] == pytest.approx((60 / 70 + 10 / 30) / 2)
    assert summary["text_hit@1"] == 0.5 and summary["text_rank"] == 1.5
    assert summary["curves"]["positive"] == pytest.approx([-1.5] + [-2.5] * 9)
    assert summary["positive_auc"] == pytest.approx(100 * (0.1 * (-1.5 - 2.5) / 2 + 0.8 * -2.5))
    assert summary["wrong"]["count"] == 1 and summary["wrong"]["pointing"] == 1.0


def test_bad_examples_and_options_are_refused(llava, examples):
    model, processor = llava
    with pytest.raises(OptionError, match="depth"):
        VisionLanguageEvidenceTest(model, processor, depth="projector")
    with pytest.raises(OptionError, match="tolerance"):
        VisionLanguageEvidenceTest(model, processor, tolerance=-1)
    protocol = VisionLanguageEvidenceTest(model, processor)
    with pytest.raises(InputError, match="ImageAnswerExample"):
        protocol.evaluate("generic", [AnswerExample((1, 2), (3,))])
    with pytest.raises(InputError, match="differ in size"):
        ImageAnswerExample((1,), torch.zeros(3, 8, 8), (2,), torch.zeros(4, 4, dtype=torch.bool))


def test_the_test_leaves_the_model_as_it_found_it(llava, examples):
    model, processor = llava
    before = ModelState.capture(model)
    VisionLanguageEvidenceTest(model, processor, depth="tower").evaluate("generic", examples[:2])
    assert before.differences(ModelState.capture(model)) == []
