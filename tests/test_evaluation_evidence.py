"""Evidence recall, the pointing game and the removal bookkeeping, against hand
computations and brute force over the orders of tied scores."""

from __future__ import annotations

import itertools

import pytest
import torch

from explain.errors import InputError
from explain.evaluation.answers import removal_copies
from explain.evaluation.evidence import (
    evidence_recall,
    object_patches,
    pointing_hit,
    recall_records,
)
from explain.evaluation.perturbation import removal_ranks


def bools(length, *positions):
    mask = torch.zeros(length, dtype=torch.bool)
    mask[list(positions)] = True
    return mask


def test_recall_of_a_hand_computed_case_without_ties():
    scores = torch.tensor([0.1, 0.9, 0.5, 0.7, 0.3])
    # position 3 (0.7) is the readout and not a candidate; the evidence is 2 and 4
    found = evidence_recall(scores, bools(5, 2, 4), ~bools(5, 3))
    assert found.rank == 2.0  # only 0.9 beats the best evidence token (0.5)
    assert found.hits == (0.0, 1.0, 1.0)


def test_recall_with_ties_is_the_expectation_over_random_tie_orders():
    scores = torch.tensor([1.0, 1.0, 1.0, 0.0])
    found = evidence_recall(scores, bools(4, 2), torch.ones(4, dtype=torch.bool))
    # three tokens tie at the top, one of them evidence: it comes first, second or third
    assert found.rank == pytest.approx(2.0)
    assert found.hits == pytest.approx((1 / 3, 2 / 3, 1.0))


def brute_force(scores, evidence, candidates, ks):
    """Every order of the candidates consistent with the scores (ties permuted), equally
    likely: the mean rank of the first evidence token and the share of hits."""
    chosen = [i for i in range(len(scores)) if candidates[i]]
    levels = sorted({float(scores[i]) for i in chosen}, reverse=True)
    groups = [[i for i in chosen if float(scores[i]) == level] for level in levels]
    ranks = []
    for orders in itertools.product(*(itertools.permutations(g) for g in groups)):
        ranking = [i for order in orders for i in order]
        ranks.append(next(r for r, i in enumerate(ranking, 1) if evidence[i]))
    return sum(ranks) / len(ranks), tuple(sum(r <= k for r in ranks) / len(ranks) for k in ks)


@pytest.mark.parametrize("seed", range(12))
def test_recall_equals_brute_force_on_random_tied_cases(seed):
    generator = torch.Generator().manual_seed(seed)
    scores = torch.randint(0, 3, (8,), generator=generator).double()
    evidence = torch.rand(8, generator=generator) < 0.3
    evidence[int(torch.randint(8, (1,), generator=generator))] = True
    candidates = torch.rand(8, generator=generator) < 0.85
    candidates |= evidence & (torch.arange(8) == int(evidence.nonzero()[0]))
    found = evidence_recall(scores, evidence, candidates, ks=(1, 2, 3, 5))
    rank, hits = brute_force(scores.tolist(), evidence.tolist(), candidates.tolist(), (1, 2, 3, 5))
    assert found.rank == pytest.approx(rank, rel=1e-12)
    assert found.hits == pytest.approx(hits, rel=1e-12)


def test_a_constant_map_lands_at_chance():
    found = evidence_recall(torch.zeros(10), bools(10, 7), torch.ones(10, dtype=torch.bool))
    assert found.rank == pytest.approx(5.5)
    assert found.hits == pytest.approx((0.1, 0.2, 0.5))


def test_no_evidence_among_the_candidates_is_not_scored():
    everything = torch.ones(6, dtype=torch.bool)
    assert evidence_recall(torch.rand(6), bools(6), everything) is None
    # the only evidence token is the readout position, which is no candidate
    assert evidence_recall(torch.rand(6), bools(6, 5), ~bools(6, 5)) is None
    records = recall_records(
        torch.tensor([[0.0, 1.0, 0.5], [0.0, 1.0, 0.5]]),
        torch.tensor([[False, False, True], [False, False, False]]),
        torch.ones(2, 3, dtype=torch.bool),
    )
    assert records == {"evidence": [1, 0], "hits": [[0.0, 1.0, 1.0], [0.0] * 3], "rank": [2.0, 0.0]}


def test_object_patches_and_the_pointing_game_with_its_tolerance():
    mask = torch.zeros(8, 8, dtype=torch.bool)
    mask[2, 3] = True  # one pixel: patch (1, 1) of a 4 x 4 grid of 2 x 2 patches
    patches = object_patches(mask, (4, 4))
    assert patches.nonzero().tolist() == [[1, 1]]
    patch_map = torch.zeros(4, 4)
    patch_map[2, 2] = 1.0  # diagonal neighbour of the object's patch
    assert pointing_hit(patch_map, patches, tolerance=1) == 1.0
    assert pointing_hit(patch_map, patches, tolerance=0) == 0.0
    patch_map[3, 3] = 1.0  # a tie with a patch two away: half the maxima hit
    assert pointing_hit(patch_map, patches, tolerance=1) == 0.5
    assert pointing_hit(torch.zeros(4, 4), patches) == pytest.approx(9 / 16)


def test_pointing_needs_an_object_and_a_grid_that_fits():
    with pytest.raises(InputError, match="mask is empty"):
        pointing_hit(torch.rand(4, 4), torch.zeros(4, 4, dtype=torch.bool))
    with pytest.raises(InputError, match="does not split"):
        object_patches(torch.zeros(10, 8, dtype=torch.bool), (4, 4))


def test_removal_ranks_keep_the_position_order_of_ties_and_skip_what_is_kept():
    scores = torch.tensor([[0.5, 0.9, 0.5, 0.1, 0.9]])
    allowed = torch.tensor([[True, True, True, True, False]])
    assert removal_ranks(scores, allowed, positive=True).tolist() == [[1, 0, 2, 3, 5]]
    assert removal_ranks(scores, allowed, positive=False).tolist() == [[1, 3, 2, 0, 5]]


def test_removal_copies_share_the_copies_that_remove_the_same_tokens():
    # example 0 has 4 removable tokens, example 1 has 2; requests in orders 0, 0, 2, 1, 0;
    # removing nothing or everything is one copy whatever the order
    counts = torch.tensor([[0, 2, 2, 4, 4], [0, 1, 1, 2, 0]])
    orders = torch.tensor([0, 0, 2, 1, 0])
    rows, copy_orders, copy_counts, inverse = removal_copies(counts, orders, torch.tensor([4, 2]))
    copies = list(zip(rows.tolist(), copy_orders.tolist(), copy_counts.tolist(), strict=True))
    assert len(copies) == len(set(copies))
    assert set(copies) == {(0, 0, 0), (0, 0, 2), (0, 2, 2), (0, 0, 4), (1, 0, 0), (1, 0, 1),
                           (1, 2, 1), (1, 0, 2)}  # fmt: skip
    for b, total in enumerate((4, 2)):
        for r in range(5):
            row, order, count = copies[int(inverse[b, r])]
            assert (row, count) == (b, int(counts[b, r]))
            assert order == (0 if count in (0, total) else int(orders[r]))
    assert inverse[0, 3] == inverse[0, 4]  # all four tokens, in order 1 and in order 0
