"""The protocols on a small trained model: against plain-loop references, chance levels,
class-agnostic symmetry, and the no-side-effect promise."""

from __future__ import annotations

import pytest
import torch
from evaluation_fixtures import MEAN, STD, SquaresDataset, train_squares_model

from explain import Explainer
from explain.errors import InputError
from explain.evaluation import FRACTIONS, PerturbationTest, SegmentationTest
from explain.evaluation.datasets import ImageExample
from explain.evaluation.protocol import records_problem
from explain.testing import ModelState


@pytest.fixture(scope="module")
def model():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one thread is fastest and deterministic
    yield train_squares_model(steps=30)
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def squares():
    return SquaresDataset(24, seed=5)


def normalise(pixels):
    return (pixels - torch.tensor(MEAN)[:, None, None]) / torch.tensor(STD)[:, None, None]


def reference_hits(model, example, method, target, positive):
    """The perturbation protocol for one image, in plain loops: rank the pixels of the
    upsampled map, zero the first floor(p * H * W) in [0, 1] space, normalise, classify."""
    pixels = example.image
    height, width = pixels.shape[-2:]
    explanation = Explainer(model).explain(normalise(pixels)[None], target=target, method=method)
    heatmap = explanation.heatmap()[0].flatten().tolist()
    sign = -1.0 if positive else 1.0
    ranked = sorted(range(len(heatmap)), key=lambda i: (sign * heatmap[i], i))
    hits = []
    for fraction in FRACTIONS:
        perturbed = pixels.clone()
        for index in ranked[: int(round(fraction * height * width, 6))]:
            perturbed[:, index // width, index % width] = 0.0
        with torch.no_grad():
            predicted = model(normalise(perturbed)[None]).argmax(dim=-1).item()
        hits.append(int(predicted == example.label))
    return hits


@pytest.mark.parametrize("method", ["generic", "attention_gradcam"])
def test_perturbation_records_match_a_plain_loop_reference(model, squares, method):
    protocol = PerturbationTest(model, MEAN, STD, forward_batch=5)
    # The third label is wrong, so its target map differs from its predicted-class map; it
    # is the class of a black image, which heavily perturbed images drift to, so that its
    # target curves hold hits that depend on the map.
    with torch.no_grad():
        black = model(normalise(torch.zeros(1, 3, 32, 32))).argmax().item()
    other = next(example for example in squares if example.label != black)
    wrong = ImageExample(image=other.image, label=black)
    examples = [squares[0], squares[1], wrong]
    records = protocol.evaluate(method, examples)
    assert records_problem(records, PerturbationTest.fields, len(examples)) is None
    for row, example in enumerate(examples):
        for curve in ("positive_predicted", "negative_predicted"):
            expected = reference_hits(model, example, method, None, curve.startswith("positive"))
            assert records[curve][row] == expected
        for curve in ("positive_target", "negative_target"):
            expected = reference_hits(
                model, example, method, example.label, curve.startswith("positive")
            )
            assert records[curve][row] == expected
    assert any(records["positive_target"][2]) or any(records["negative_target"][2])


def test_perturbation_summary_and_the_shape_of_its_records(model, squares):
    protocol = PerturbationTest(model, MEAN, STD)
    records = protocol.evaluate("generic", [squares[i] for i in range(6)])
    assert records["label"] == [squares[i].label for i in range(6)]
    for curve in ("positive_predicted", "negative_target"):
        assert len(records[curve]) == 6 and all(len(row) == 9 for row in records[curve])
    summary = protocol.summarize(records)
    accuracy = sum(records["correct"]) / 6
    curve = [accuracy] + [sum(row[i] for row in records["positive_target"]) / 6 for i in range(9)]
    assert summary["curves"]["positive_target"] == pytest.approx(curve)
    expected_auc = 100 * sum(0.1 * (curve[i] + curve[i + 1]) / 2 for i in range(9))
    assert summary["positive_auc_target"] == pytest.approx(expected_auc)


@pytest.mark.parametrize("method", ["rollout", "raw_attention", "random"])
def test_class_agnostic_methods_give_identical_predicted_and_target_numbers(model, squares, method):
    protocol = PerturbationTest(model, MEAN, STD)
    # Labels that disagree with the model make predicted and target classes differ.
    examples = [
        ImageExample(image=e.image, label=(e.label + i) % 4) for i, e in enumerate(squares)
    ][:8]
    summary = protocol.summarize(protocol.evaluate(method, examples))
    for sign in ("positive", "negative"):
        assert summary[f"{sign}_auc_predicted"] == summary[f"{sign}_auc_target"]
        assert summary["curves"][f"{sign}_predicted"] == summary["curves"][f"{sign}_target"]


def test_generic_beats_random_and_random_sits_at_chance(model, squares):
    perturbation = PerturbationTest(model, MEAN, STD)
    segmentation = SegmentationTest(model, MEAN, STD)
    examples = list(squares)
    generic = perturbation.summarize(perturbation.evaluate("generic", examples))
    random = perturbation.summarize(perturbation.evaluate("random", examples))
    assert generic["positive_auc_predicted"] < random["positive_auc_predicted"] - 10
    assert generic["negative_auc_predicted"] > random["negative_auc_predicted"] + 10
    generic = segmentation.summarize(segmentation.evaluate("generic", examples))
    random = segmentation.summarize(segmentation.evaluate("random", examples))
    assert generic["miou"] > random["miou"] + 0.1
    # A map that knows nothing marks about half the pixels foreground at random: pixel
    # accuracy about 1/2, and the pooled (map, 1 - map) AP about the positive rate, 1/2.
    assert random["pixel_accuracy"] == pytest.approx(0.5, abs=0.06)
    assert random["map"] == pytest.approx(0.5, abs=0.06)


def test_segmentation_records_match_the_explainer_maps(model, squares):
    protocol = SegmentationTest(model, MEAN, STD)
    example = squares[3]
    records = protocol.evaluate("generic", [example])
    assert records_problem(records, SegmentationTest.fields, 1) is None
    heatmap = Explainer(model).explain(normalise(example.image)[None]).heatmap()[0]
    foreground = heatmap > heatmap.mean()
    truth = example.mask.bool()
    assert records["correct"] == [int((foreground == truth).sum())]
    assert records["intersection"] == [
        [int((~foreground & ~truth).sum()), int((foreground & truth).sum())]
    ]
    assert records["union"] == [
        [int((~foreground | ~truth).sum()), int((foreground | truth).sum())]
    ]


def test_segmentation_needs_masks(model, squares):
    protocol = SegmentationTest(model, MEAN, STD)
    with pytest.raises(InputError, match="masks"):
        protocol.evaluate("generic", [ImageExample(image=squares[0].image, label=0)])


def test_the_protocols_leave_the_model_as_they_found_it(model, squares):
    model.train()  # a mode the protocols must put back
    try:
        before = ModelState.capture(model)
        PerturbationTest(model, MEAN, STD).evaluate("generic", [squares[0], squares[1]])
        SegmentationTest(model, MEAN, STD).evaluate("rollout", [squares[0]])
        assert before.differences(ModelState.capture(model)) == []
    finally:
        model.eval()


class KeyPixelTest(PerturbationTest):
    """Classifies as 1 while pixel (13, 21) is intact, else 0: its curves reveal exactly
    which map ordered the removal."""

    def classify(self, pixels):
        return (pixels[:, :, 13, 21].abs().sum(dim=1) > 0).long()


def test_each_curve_removes_pixels_in_the_order_of_its_own_map(model, squares):
    examples = [ImageExample(image=e.image, label=1) for e in squares][:8]
    records = KeyPixelTest(model, MEAN, STD).evaluate("generic", examples)
    pixels = torch.stack([e.image for e in examples])
    explainer = Explainer(model)
    differing = 0
    for whose, target in (("predicted", None), ("target", 1)):
        heatmaps = explainer.explain(normalise(pixels), target=target).heatmap()
        for positive in (True, False):
            for row, heatmap in enumerate(heatmaps):
                values = heatmap.flatten().tolist()
                sign = -1.0 if positive else 1.0
                ranked = sorted(range(len(values)), key=lambda i: (sign * values[i], i))
                rank = ranked.index(13 * 32 + 21)  # the key pixel survives while rank >= cut
                expected = [int(rank >= int(round(p * 32 * 32, 6))) for p in FRACTIONS]
                curve = f"{'positive' if positive else 'negative'}_{whose}"
                assert records[curve][row] == expected
    for row in range(8):
        differing += records["positive_predicted"][row] != records["positive_target"][row]
    assert differing > 0  # some maps of the predicted class and of class 1 order differently
