"""ROAD's noisy linear imputation and SaCo against hand computations and plain loops on a
small trained image model."""

from __future__ import annotations

import pytest
import torch
from evaluation_fixtures import MEAN, STD, SquaresDataset, train_squares_model

from explain import Explainer
from explain.errors import InputError
from explain.evaluation import FRACTIONS, ROADTest, SaCoTest, linear_imputation, saco
from explain.evaluation.datasets import ImageExample
from explain.evaluation.perturbation import removed_count
from explain.evaluation.protocol import records_problem
from explain.evaluation.saco import salience_groups
from explain.testing import ModelState

WEIGHTS = {
    (-1, -1): 1 / 12,
    (-1, 0): 1 / 6,
    (-1, 1): 1 / 12,
    (0, -1): 1 / 6,
    (0, 1): 1 / 6,
    (1, -1): 1 / 12,
    (1, 0): 1 / 6,
    (1, 1): 1 / 12,
}


def dense_imputation(image, removed):
    """The reference's system written out densely: for each removed pixel i,
    sum_j w_ij x_i - sum_{j removed} w_ij x_j = sum_{j kept} w_ij v_j over the neighbours
    j inside the image, solved with a dense solver."""
    channels, height, width = image.shape
    unknown = [(i, j) for i in range(height) for j in range(width) if removed[i, j]]
    index = {pixel: k for k, pixel in enumerate(unknown)}
    matrix = torch.zeros(len(unknown), len(unknown), dtype=torch.float64)
    right = torch.zeros(len(unknown), channels, dtype=torch.float64)
    for k, (i, j) in enumerate(unknown):
        for (di, dj), weight in WEIGHTS.items():
            a, b = i + di, j + dj
            if 0 <= a < height and 0 <= b < width:
                matrix[k, k] += weight
                if removed[a, b]:
                    matrix[k, index[a, b]] -= weight
                else:
                    right[k] += weight * image[:, a, b].double()
    solution = torch.linalg.solve(matrix, right)
    filled = image.double().clone()
    for k, (i, j) in enumerate(unknown):
        filled[:, i, j] = solution[k]
    return filled


def test_linear_imputation_solves_the_reference_system():
    generator = torch.Generator().manual_seed(0)
    images = torch.rand(3, 2, 6, 7, generator=generator)
    removed = (
        torch.rand(3, 6, 7, generator=generator) < torch.tensor([0.3, 0.6, 0.9])[:, None, None]
    )
    removed[2, 0, 0] = False  # at least one pixel kept
    filled = linear_imputation(images, removed)
    for image, mask, result in zip(images, removed, filled, strict=True):
        torch.testing.assert_close(result, dense_imputation(image, mask), rtol=1e-10, atol=1e-10)
        assert torch.equal(result[:, ~mask], image[:, ~mask].double())


def test_a_flat_image_stays_flat_and_nothing_removed_is_nothing_changed():
    flat = torch.full((1, 3, 5, 5), 0.25)
    removed = torch.rand(1, 5, 5, generator=torch.Generator().manual_seed(1)) < 0.7
    torch.testing.assert_close(linear_imputation(flat, removed), flat.double())
    image = torch.rand(1, 3, 4, 4)
    assert torch.equal(
        linear_imputation(image, torch.zeros(1, 4, 4, dtype=torch.bool)), image.double()
    )
    with pytest.raises(InputError, match="at least one pixel"):
        linear_imputation(image, torch.ones(1, 4, 4, dtype=torch.bool))


@pytest.fixture(scope="module")
def model():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield train_squares_model(steps=30)
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def squares():
    return list(SquaresDataset(6, seed=5))


def normalise(pixels):
    return (pixels - torch.tensor(MEAN)[:, None, None]) / torch.tensor(STD)[:, None, None]


def heatmap_of(model, example, method="generic"):
    explanation = Explainer(model).explain(normalise(example.image)[None], method=method)
    return explanation.heatmap()[0], int(explanation.logits.argmax())


def test_road_without_noise_matches_a_plain_loop(model, squares):
    protocol = ROADTest(model, MEAN, STD, noise=0.0, forward_batch=7)
    # the third example's label is wrong: it starts as a miss, as in the perturbation test
    wrong = ImageExample(image=squares[2].image, label=(squares[2].label + 1) % 4)
    examples = [squares[0], squares[1], wrong]
    records = protocol.evaluate("generic", examples)
    assert records_problem(records, ROADTest.fields, 3) is None
    assert records["correct"] == [1, 1, 0]
    for row, example in enumerate(examples):
        heatmap, _ = heatmap_of(model, example)
        values = heatmap.flatten().tolist()
        for key, sign in (("morf", -1.0), ("lerf", 1.0)):
            ranked = sorted(range(len(values)), key=lambda i: (sign * values[i], i))
            hits = []
            for fraction in FRACTIONS:
                removed = torch.zeros(32 * 32, dtype=torch.bool)
                removed[ranked[: int(round(fraction * 32 * 32, 6))]] = True
                filled = dense_imputation(example.image, removed.view(32, 32)).float()
                with torch.no_grad():
                    predicted = int(model(normalise(filled)[None]).argmax())
                hits.append(int(predicted == example.label))
            assert records[key][row] == hits, key


def test_road_noise_is_drawn_on_the_removed_pixels_at_the_stated_scale(model, squares):
    protocol = ROADTest(model, MEAN, STD)
    pixels = torch.stack([example.image for example in squares])
    heatmaps = torch.rand(len(squares), 32, 32, generator=torch.Generator().manual_seed(2))
    order = heatmaps.flatten(1).argsort(dim=1, descending=True)
    noisy = protocol.imputed(seed=3)(pixels, order, FRACTIONS)
    clean = ROADTest(model, MEAN, STD, noise=0.0).imputed(seed=3)(pixels, order, FRACTIONS)
    difference = (noisy - clean).double()
    assert torch.equal(noisy, protocol.imputed(seed=3)(pixels, order, FRACTIONS))
    removed = difference.abs().amax(dim=2) > 0
    for index, fraction in enumerate(FRACTIONS):  # each copy's removed pixels, no others
        assert removed[index].sum(dim=(1, 2)).tolist() == [removed_count(fraction, 1024)] * 6
    spread = difference.permute(0, 1, 3, 4, 2)[removed] / (0.01 * torch.tensor(STD))
    assert spread.mean().abs() < 0.02 and abs(float(spread.std()) - 1.0) < 0.02


def test_road_summary_is_the_perturbation_auc_of_its_curves(model, squares):
    protocol = ROADTest(model, MEAN, STD)
    summary = protocol.summarize(protocol.evaluate("rollout", squares))
    for key in ("morf", "lerf"):
        curve = summary["curves"][key]
        expected = 100 * sum(0.1 * (curve[i] + curve[i + 1]) / 2 for i in range(9))
        assert summary[f"{key}_auc"] == pytest.approx(expected)


def test_saco_of_hand_computed_cases():
    # pairs (0,1): w 1, agree; (0,2): w 2, agree; (1,2): w 1, 0.1 < 0.2 disagrees
    assert float(saco(torch.tensor([[3.0, 2.0, 1.0]]), torch.tensor([[0.3, 0.1, 0.2]]))[0]) == 0.5
    # equal drops agree (>=); equal saliences weigh nothing; all equal saliences: 0
    salience = torch.tensor([[2.0, 2.0, 1.0], [1.0, 1.0, 1.0], [3.0, 2.0, 1.0]])
    drops = torch.tensor([[0.0, 0.5, 0.5], [0.3, 0.1, 0.2], [0.1, 0.2, 0.3]])
    assert saco(salience, drops).tolist() == pytest.approx([0.0, 0.0, -1.0])


def test_salience_groups_split_the_pixels_into_equal_tenths_ties_in_raster_order():
    heatmap = torch.zeros(1, 4, 5)
    heatmap[0, 3, 4] = 1.0  # 20 pixels: two per group
    groups = salience_groups(heatmap, groups=10)[0].flatten().tolist()
    # the maximum (the last pixel) first, then the tie in raster order, two per group
    assert groups == [0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 0]
    # 1024 pixels: group k holds ranks floor(102.4 k) .. floor(102.4 (k + 1)) - 1
    ranks = salience_groups(-torch.arange(1024.0).view(1, 32, 32))[0].flatten()
    sizes = torch.bincount(ranks).tolist()
    assert sizes == [102, 102, 103, 102, 103, 102, 102, 103, 102, 103]
    assert ranks.tolist() == sorted(ranks.tolist())


def test_saco_records_match_a_plain_loop(model, squares):
    protocol = SaCoTest(model, MEAN, STD, multi_label=False, forward_batch=11)
    records = protocol.evaluate("generic", squares[:3])
    assert records_problem(records, SaCoTest.fields, 3) is None
    for row, example in enumerate(squares[:3]):
        heatmap, predicted = heatmap_of(model, example)
        values = heatmap.double().flatten()
        ranked = sorted(range(1024), key=lambda i: (-float(values[i]), i))
        with torch.no_grad():
            clean = model(normalise(example.image)[None]).double().softmax(-1)[0, predicted]
        salience, drops = [], []
        for k in range(10):
            members = ranked[k * 1024 // 10 : (k + 1) * 1024 // 10]
            salience.append(float(values[members].sum()))
            perturbed = example.image.clone().view(3, -1)
            perturbed[:, members] = example.image.mean(dim=(1, 2))[:, None]
            with torch.no_grad():
                logits = model(normalise(perturbed.view(3, 32, 32))[None]).double()
            drops.append(float(clean - logits.softmax(-1)[0, predicted]))
        # The model's fused and explicit attention paths differ by float32 rounding (1e-5
        # here): the drops agree to that, and SaCo is checked on the recorded drops, whose
        # order near-equal drops could otherwise swap.
        assert records["drops"][row] == pytest.approx(drops, abs=1e-4)
        drops = records["drops"][row]
        score, total = 0.0, 0.0
        for i in range(10):
            for j in range(i + 1, 10):
                weight = salience[i] - salience[j]
                score += weight if drops[i] >= drops[j] else -weight
                total += abs(weight)
        assert records["saco"][row] == pytest.approx(score / total, rel=1e-6)


def test_saco_needs_no_label_and_separates_a_map_from_noise(model, squares):
    protocol = SaCoTest(model, MEAN, STD, multi_label=False)
    relabelled = [ImageExample(image=e.image, label=(e.label + 1) % 4) for e in squares]
    wrong = protocol.evaluate("generic", relabelled)
    assert protocol.summarize(wrong)["accuracy"] == 0.0
    assert wrong["saco"] == protocol.evaluate("generic", squares)["saco"]
    generic = protocol.summarize(protocol.evaluate("generic", squares))
    noise = protocol.summarize(protocol.evaluate("random", squares))
    assert generic["saco"] > noise["saco"] + 0.3
    assert generic["drops"][0] > max(generic["drops"][5:])


def test_the_image_tests_leave_the_model_as_they_found_it(model, squares):
    before = ModelState.capture(model)
    ROADTest(model, MEAN, STD).evaluate("generic", squares[:2])
    SaCoTest(model, MEAN, STD, multi_label=True).evaluate("generic", squares[:2])
    assert before.differences(ModelState.capture(model)) == []
