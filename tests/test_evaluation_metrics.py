"""The evaluation metrics against hand-computed cases and plain-loop references."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score

from explain import explain
from explain.errors import InputError
from explain.evaluation import (
    FRACTIONS,
    average_precision,
    perturbation_auc,
    rationale_scores,
    segmentation_counts,
    segmentation_summary,
    word_scores,
)
from explain.evaluation.perturbation import (
    curve_hits,
    perturbed_copies,
    removal_order,
    removed_count,
)
from explain.testing import tiny_vit

# -- perturbation ------------------------------------------------------------------------


def test_auc_of_a_hand_computed_curve():
    # Trapezoids of width 0.1: (1+.8)/2 + (.8+.6)/2 + .6 + .5 + .4 + .3 + .2 + .1 + 0 = 3.7
    accuracies = [1.0, 0.8, 0.6, 0.6, 0.4, 0.4, 0.2, 0.2, 0.0, 0.0]
    assert perturbation_auc(accuracies) == pytest.approx(37.0)
    assert perturbation_auc([1.0] * 10) == pytest.approx(90.0)  # the maximum
    assert perturbation_auc([0.5] + [0.0] * 9) == pytest.approx(2.5)  # x = 0 counts
    with pytest.raises(ValueError, match="10 accuracies"):
        perturbation_auc([1.0] * 9)


def test_removed_count_is_the_exact_floor():
    assert [removed_count(p, 50) for p in FRACTIONS] == [5, 10, 15, 20, 25, 30, 35, 40, 45]
    assert [removed_count(p, 224 * 224) for p in FRACTIONS] == [
        k * 224 * 224 // 10 for k in range(1, 10)
    ]


def test_removal_order_most_or_least_relevant_first_ties_in_raster_order():
    heatmap = torch.tensor([[[0.1, 0.9], [0.5, 0.5]]])
    assert removal_order(heatmap, positive=True).tolist() == [[1, 2, 3, 0]]
    assert removal_order(heatmap, positive=False).tolist() == [[0, 2, 3, 1]]


def test_perturbed_copies_match_a_plain_loop():
    generator = torch.Generator().manual_seed(0)
    pixels = torch.rand(2, 3, 5, 4, generator=generator) + 0.1  # no zero pixel to begin with
    order = torch.stack([torch.randperm(20, generator=generator) for _ in range(2)])
    fractions = (0.1, 0.35, 0.5, 0.9)
    copies = perturbed_copies(pixels, order, fractions)
    assert copies.shape == (4, 2, 3, 5, 4)
    for f, fraction in enumerate(fractions):
        for b in range(2):
            expected = pixels[b].clone()
            for index in order[b, : math.floor(fraction * 20 + 1e-9)].tolist():
                expected[:, index // 4, index % 4] = 0.0
            assert torch.equal(copies[f, b], expected)


def key_pixel_classifier(row: int, column: int):
    """Class 1 while pixel (row, column) is intact, else 0: a model whose accuracy curve
    is known for any removal order."""
    return lambda images: (images[:, :, row, column].abs().sum(dim=1) > 0).long()


def test_curve_hits_of_a_key_pixel_classifier():
    heatmaps = torch.arange(16.0).reshape(1, 4, 4)  # pixel 15 most relevant, 0 least
    pixels = torch.ones(1, 3, 4, 4)
    labels = torch.tensor([1])
    classify = key_pixel_classifier(3, 3)  # pixel 15
    positive = curve_hits(classify, pixels, labels, heatmaps, positive=True)
    negative = curve_hits(classify, pixels, labels, heatmaps, positive=False)
    # floor(p * 16) pixels removed: 1, 3, 4, 6, 8, 9, 11, 12, 14
    assert positive.tolist() == [[False] * 9]  # the key pixel goes first
    assert negative.tolist() == [[True] * 9]  # ... or last
    assert perturbation_auc([1.0, *positive[0].float().tolist()]) == pytest.approx(5.0)
    assert perturbation_auc([1.0, *negative[0].float().tolist()]) == pytest.approx(90.0)


def test_random_relevance_lands_at_chance_level():
    # With relevance that knows nothing, the key pixel survives removing a fraction p with
    # probability 1 - p, so both curves follow 1 - p: AUC = 100 * (0.9 - 0.9**2 / 2) = 49.5.
    model = tiny_vit(img_size=32, patch_size=8)
    images = torch.rand(256, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    heatmaps = explain(model, images, method="random").heatmap()
    labels = torch.ones(256, dtype=torch.long)
    classify = key_pixel_classifier(13, 21)
    for positive in (True, False):
        hits = curve_hits(classify, images, labels, heatmaps, positive=positive)
        auc = perturbation_auc([1.0, *hits.float().mean(dim=0).tolist()])
        assert auc == pytest.approx(49.5, abs=6.0)  # about 3.5 standard errors


# -- segmentation ------------------------------------------------------------------------


def test_segmentation_counts_of_a_hand_computed_case():
    heatmap = torch.tensor([[0.0, 0.2, 1.0], [0.8, 0.6, 0.0]])  # mean 0.4333
    mask = torch.tensor([[0, 0, 1], [1, 0, -1]])  # -1: unlabelled
    counts = segmentation_counts(heatmap, mask)
    assert counts.labelled == 5
    assert counts.correct == 4  # only (1, 1) is wrong: foreground predicted on background
    assert counts.intersection == (2, 2)
    assert counts.union == (3, 3)
    summary = segmentation_summary([counts])
    assert summary["pixel_accuracy"] == pytest.approx(0.8)
    assert summary["miou"] == pytest.approx(2 / 3)


def test_segmentation_sums_over_the_dataset_before_dividing():
    small = segmentation_counts(torch.tensor([[1.0, 0.0]]), torch.tensor([[0, 1]]))  # all wrong
    large = segmentation_counts(
        torch.tensor([[1.0, 1.0, 0.0, 0.0]] * 2), torch.tensor([[1, 1, 0, 0]] * 2)
    )  # all right
    assert (small.correct, small.labelled) == (0, 2)
    assert (large.correct, large.labelled) == (8, 8)
    summary = segmentation_summary([small, large])
    assert summary["pixel_accuracy"] == pytest.approx(8 / 10)  # not (0 + 1) / 2
    # background: intersections 0 + 4, unions 2 + 4; foreground the same
    assert summary["iou_background"] == pytest.approx(4 / 6)
    assert summary["iou_foreground"] == pytest.approx(4 / 6)
    assert summary["map"] == pytest.approx((small.average_precision + 1.0) / 2)


def test_average_precision_matches_scikit_learn_with_ties():
    rng = np.random.default_rng(0)
    for _ in range(20):
        scores = np.round(rng.random(200), 1)  # many ties
        labels = rng.random(200) < rng.uniform(0.05, 0.9)
        if not labels.any():
            continue
        expected = average_precision_score(labels, scores)
        got = average_precision(torch.from_numpy(scores), torch.from_numpy(labels))
        assert got == pytest.approx(expected, abs=1e-12)
    assert average_precision(torch.rand(5), torch.zeros(5, dtype=torch.bool)) == 0.0


def test_segmentation_average_precision_pools_map_and_inverse_map_like_the_reference():
    rng = np.random.default_rng(1)
    heatmap = torch.from_numpy(rng.random((6, 7)))
    mask = torch.from_numpy((rng.random((6, 7)) < 0.3).astype(np.int64))
    # The reference: scores (1 - map, map) against the one-hot mask (background, foreground).
    scores = np.concatenate([1 - heatmap.numpy().ravel(), heatmap.numpy().ravel()])
    truth = np.concatenate([mask.numpy().ravel() == 0, mask.numpy().ravel() == 1])
    expected = average_precision_score(truth, scores)
    assert segmentation_counts(heatmap, mask).average_precision == pytest.approx(expected)


def test_segmentation_rejects_maps_of_another_size():
    with pytest.raises(InputError, match="differ in size"):
        segmentation_counts(torch.rand(4, 4), torch.zeros(8, 8, dtype=torch.long))


# -- rationale ---------------------------------------------------------------------------


def test_word_scores_take_the_maximum_over_sub_tokens_and_skip_special_tokens():
    relevance = torch.tensor([5.0, 0.1, 0.7, 0.3, 0.2, 9.0, 0.0])
    word_ids = [None, 0, 1, 1, 2, None, None]  # [CLS] w0 w1a w1b w2 [SEP] [PAD]
    scores = word_scores(relevance, word_ids, num_words=4)  # word 3 was truncated away
    assert scores[:3].tolist() == pytest.approx([0.1, 0.7, 0.2])
    assert scores[3] == float("-inf")


def test_rationale_scores_of_a_hand_computed_case():
    scores = torch.tensor([0.9, 0.1, 0.5, 0.7, float("-inf")], dtype=torch.float64)
    rationale = [True, False, False, True, True]  # the last word was truncated away
    result = rationale_scores(scores, rationale, ks=(1, 2, 3, 10))
    # top-1 {0}: P 1, R 1/3; top-2 {0, 3}: P 1, R 2/3; top-3 {0, 3, 2}: P 2/3, R 2/3;
    # top-10: the four scored words: P 2/4, R 2/3
    assert result["precision"] == pytest.approx([1.0, 1.0, 2 / 3, 0.5])
    assert result["recall"] == pytest.approx([1 / 3, 2 / 3, 2 / 3, 2 / 3])
    assert result["f1"] == pytest.approx([0.5, 0.8, 2 / 3, 4 / 7])


def test_rationale_needs_rationale_words():
    with pytest.raises(InputError, match="without rationale"):
        rationale_scores(torch.rand(3, dtype=torch.float64), [False, False, False])


def test_seeded_methods_get_the_chunk_seed_and_the_others_nothing():
    from explain.evaluation.protocol import method_options

    assert method_options("random", 32) == {"seed": 32}
    assert method_options("generic", 32) == {}
