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
from explain.evaluation.evidence import RegionRanks, region_ranks
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


def scene_regions(mask, count):
    """`count` regions of a 32 x 32 photo: the object's `mask` first (where it holds
    pixels), then a block that cuts across patches, then a diagonal band."""
    block = torch.zeros(32, 32, dtype=torch.bool)
    block[19:30, 3:14] = True
    rows, columns = torch.meshgrid(torch.arange(32), torch.arange(32), indexing="ij")
    band = (rows - columns).abs() < 3
    found = [mask] if mask.any() else []
    return torch.stack([*found, block, band][:count])


REGIONS = {0: 3, 1: 1, 2: 3, 3: 2}
"""How many regions each example of `examples` has: scored at the region level (0), one
region only (1), answered wrongly (2), about no object (3)."""


def make_examples(model, processor, questions, wrong=(), empty=(), regions=None):
    """One random photo per question; the answer is the model's own first token (another
    one for the indices in `wrong`); the object is one 8 x 8 patch (none for `empty`);
    the text evidence is the question's last word; `regions[index]` regions
    (`scene_regions`) where `regions` names the index."""
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
            regions=scene_regions(mask, regions[index]) if index in (regions or {}) else None,
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
    return make_examples(model, processor, questions, wrong=(2,), empty=(3,), regions=REGIONS)


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
        **reference_region_records(model, example, patch_map),
        "right": int(top == example.answer[0]),
        "log_probability": clean,
        "positive": [without(most[: removed_count(p, 16)]) for p in FRACTIONS],
        "negative": [without(least[: removed_count(p, 16)]) for p in FRACTIONS],
        "object": int(bool(object_patches)),
        "pointing": sum(p in near for p in best) / len(best) if object_patches else 0.0,
        "intersection": list(counts.intersection),
        "union": list(counts.union),
    }


def reference_region_records(model, example, patch_map):
    """The region numbers of one example, in loops: each region's score is the sum over
    the 8 x 8 patches of the share of the patch's pixels it holds times the patch's
    relevance; each region removed alone is set to the image's mean colour."""
    zero = {"regions": 0, "region_first": 0.0, "region_removal": 0.0, "asked_removal": 0.0}
    if example.regions is None or len(example.regions) < 2 or not example.mask.any():
        return zero
    scores, ablated = [], []
    for region in example.regions:
        score = 0.0
        for row in range(4):
            for column in range(4):
                block = region[
                    row * PATCH : (row + 1) * PATCH, column * PATCH : (column + 1) * PATCH
                ]
                score += float(block.double().mean()) * float(patch_map[row, column])
        scores.append(score)
        pixels = example.pixel_values.clone()
        for channel in range(3):
            pixels[channel][region] = example.pixel_values[channel].mean()
        ablated.append(answer_log_probability(model, example, pixels)[0])

    def lowers_more(removed):
        others = [ablated[r] for r in range(len(ablated)) if r != removed]
        return sum(
            1.0 if o > ablated[removed] else 0.5 * (o == ablated[removed]) for o in others
        ) / len(others)

    top = [r for r, score in enumerate(scores) if score == max(scores)]
    asked = 0  # scene_regions puts the object first
    return {
        "regions": 1,
        "region_first": float(asked in top) / len(top),
        "region_removal": sum(lowers_more(r) for r in top) / len(top),
        "asked_removal": lowers_more(asked),
    }


@pytest.mark.parametrize(("method", "depth"), [("generic", "lm"), ("rollout", "tower")])
def test_records_match_plain_loops(llava, examples, method, depth):
    model, processor = llava
    protocol = VisionLanguageEvidenceTest(model, processor, depth=depth, forward_batch=6)
    records = protocol.evaluate(method, examples)
    assert records_problem(records, VisionLanguageEvidenceTest.fields, len(examples)) is None
    assert records["right"] == [1, 1, 0, 1]
    assert records["object"] == [1, 1, 1, 0]
    assert records["regions"] == [1, 0, 1, 0]
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
        "regions": [1, 0, 1],
        "region_first": [0.5, 0.0, 1.0],
        "region_removal": [0.25, 0.0, 1.0],
        "asked_removal": [1.0, 0.0, 0.0],
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
    # the region numbers: the first example only (the second has no regions)
    assert (summary["on_regions"], summary["region_first"], summary["region_removal"]) == (
        1,
        0.5,
        0.25,
    )
    assert summary["asked_region_removal"] == 1.0 and summary["wrong"]["region_first"] == 1.0


def test_region_ranks_of_a_hand_computed_case():
    # regions 1 and 2 tie at the top; removing region 1 leaves the answer least likely
    ranks = region_ranks(torch.tensor([1.0, 3.0, 3.0]), torch.tensor([-1.0, -2.0, -1.5]), 1)
    assert ranks == RegionRanks(first=0.5, top_removal=(1.0 + 0.5) / 2, asked_removal=1.0)
    # equal log-probabilities count one half
    assert region_ranks(torch.tensor([2.0, 1.0]), torch.tensor([-1.0, -1.0]), 1) == RegionRanks(
        0.0, 0.5, 0.5
    )
    with pytest.raises(InputError, match="R >= 2"):
        region_ranks(torch.tensor([1.0]), torch.tensor([-1.0]), 0)


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
    mask = torch.zeros(8, 8, dtype=torch.bool)
    mask[:2, :2] = True
    other = ~mask
    with pytest.raises(InputError, match="none of the regions"):
        ImageAnswerExample((1,), torch.zeros(3, 8, 8), (2,), mask, regions=other[None])
    with pytest.raises(InputError, match=r"\(R, H, W\)"):
        ImageAnswerExample((1,), torch.zeros(3, 8, 8), (2,), mask, regions=mask)
    with pytest.raises(InputError, match="each hold a pixel"):
        ImageAnswerExample(
            (1,), torch.zeros(3, 8, 8), (2,), mask, regions=torch.stack([mask, mask & False])
        )
    found = ImageAnswerExample(
        (1,), torch.zeros(3, 8, 8), (2,), mask, regions=torch.stack([other, mask])
    )
    assert found.asked_region == 1


def test_the_test_leaves_the_model_as_it_found_it(llava, examples):
    model, processor = llava
    before = ModelState.capture(model)
    VisionLanguageEvidenceTest(model, processor, depth="tower").evaluate("generic", examples[:2])
    assert before.differences(ModelState.capture(model)) == []
