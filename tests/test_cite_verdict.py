"""The verdict on a citation (explain.cite.verdict) on hand-built answers whose evidence is
known: the check runs on a target that depends only on which spans are kept (a span that
carries the answer, two spans needed together, none), so every figure and every word is
known in advance; the exact random baseline equals an enumeration of every k-set; ties
at the cut never count; numbers are written with 3 significant digits."""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable

import pytest
import torch

from explain.cite import Check, TopKDrop, check_ranking
from explain.cite import check as check_module
from explain.cite.verdict import LDS_HIGH, LDS_MODERATE, NOISE, clear, lds_band, number, verdict

FULL = -1.0
"""The hand-built target with the whole context."""
DROP = 2.0
"""How far it falls when its evidence is removed."""


def _checked(
    monkeypatch, scores: list[float], falls: Callable[[torch.Tensor], bool], lds: int = 0
) -> Check:
    """check_ranking of `scores` on a target that is FULL, less DROP where `falls(keep)`
    (keep: (S,), span s kept) holds: the model stands in for a hand-built one."""

    def targets(adapter, prompt_ids, token_spans, answers, keep, batch_tokens):
        return torch.tensor([FULL - DROP * falls(row) for row in keep], dtype=torch.float64)

    monkeypatch.setattr(check_module, "ablated_targets", targets)
    count = len(scores)
    return check_ranking(
        None,
        torch.arange(count),
        torch.arange(count),
        [],
        torch.tensor(scores, dtype=torch.float64),
        lds=lds,
    )


def _without(*spans: int) -> Callable[[torch.Tensor], bool]:
    """The target falls when every one of `spans` is removed."""
    return lambda keep: not any(bool(keep[s]) for s in spans)


def test_the_exact_baseline_is_every_k_set_once(monkeypatch):
    check = _checked(monkeypatch, [0.1, 0.2, 3.0, 0.4, 0.5], _without(2))
    assert [d.k for d in check.drops] == [1, 3]
    for drop in check.drops:
        drops = [DROP * (2 in chosen) for chosen in itertools.combinations(range(5), drop.k)]
        assert drop.exact and drop.sets == len(drops)
        assert drop.random == pytest.approx(statistics.fmean(drops), rel=1e-12)
        assert drop.random_std == pytest.approx(statistics.pstdev(drops), rel=1e-12)
        assert drop.top == DROP and not drop.tied
    payload = check.to_dict()
    assert [d["random_exact"] for d in payload["top_k"]] == [True, True]
    assert [d["random_sets"] for d in payload["top_k"]] == [5, 10]
    assert Check.from_dict(payload) == check


def test_many_k_sets_are_sampled(monkeypatch):
    # 10 spans: 10 single spans (exact), 120 sets of 3 and 252 of 5 (16 random draws each).
    check = _checked(monkeypatch, [float(s) for s in range(10)], _without(9))
    assert [(d.k, d.exact, d.sets) for d in check.drops] == [
        (1, True, 10),
        (3, False, 16),
        (5, False, 16),
    ]


def test_a_span_that_carries_the_answer_ranked_first_is_supported(monkeypatch):
    check = _checked(monkeypatch, [0.1, 0.2, 3.0, 0.4, 0.5], _without(2), lds=32)
    # One removal in five takes the evidence: 0.4 +- 0.8, where 16 draws could say 0 +- 0.
    assert (check.drops[0].random, check.drops[0].random_std) == pytest.approx((0.4, 0.8))
    assert check.lds is not None and check.lds >= LDS_HIGH
    said = verdict(check)
    assert said.word == "supported" and said == check.verdict
    assert said.reason.startswith("top-1 drop 2.00 against 0.400 ± 0.800 (all 5 sets)")
    assert check.to_dict()["verdict"] == "supported"
    assert check.to_dict()["verdict_reason"] == said.reason


def test_a_span_that_does_not_carry_the_answer_ranked_first_is_not_supported(monkeypatch):
    check = _checked(monkeypatch, [3.0, 0.2, 0.1, 0.4, 0.5], _without(2))
    assert check.drops[0].top == 0.0
    said = verdict(check)
    assert said.word == "not supported by ablation"
    assert "top-1 drop 0 against 0.400 ± 0.800" in said.reason
    assert "LDS not computed" in said.reason


def test_two_spans_needed_together_are_weak_at_top_1_and_clear_at_top_3(monkeypatch):
    # A chain: the answer falls only without both spans 1 and 3; the ranking has them first.
    check = _checked(monkeypatch, [0.1, 2.0, 0.2, 1.9, 0.3], _without(1, 3))
    first, three = check.drops
    assert first.top == 0.0 and not clear(first)
    assert three.top == DROP and clear(three)  # 3 of the 10 sets hold both: 0.6 +- 0.92
    said = verdict(check)
    assert said.word == "weak"
    assert "the top 3 together are" in said.reason


def test_tied_scores_never_count_even_when_the_order_happens_to_be_right(monkeypatch):
    # Span 0 carries the answer and the stable order puts it first, but the scores say
    # nothing: every span ties.
    check = _checked(monkeypatch, [0.0] * 5, _without(0))
    assert check.drops[0].top == DROP
    assert all(d.tied for d in check.drops)
    said = verdict(check)
    assert said.word == "not supported by ablation"
    assert "the scores tie at the cut" in said.reason


def test_a_tie_below_the_cut_does_not_matter(monkeypatch):
    check = _checked(monkeypatch, [3.0, 1.0, 1.0, 1.0, 1.0], _without(0))
    assert [d.tied for d in check.drops] == [False, True]
    assert verdict(check).word == "supported"


def _drop(top: float, random: float, spread: float, tied: bool = False) -> TopKDrop:
    return TopKDrop(1, top, random, spread, sets=5, exact=True, tied=tied)


def _check(drops: tuple[TopKDrop, ...], lds: float | None, ablations: int) -> Check:
    return Check("log p(answer)", FULL, drops, 16, lds, ablations, 0)


def test_the_rule_at_its_thresholds():
    assert clear(_drop(NOISE + 0.2, 0.2, 0.01))
    assert not clear(_drop(NOISE + 0.19, 0.2, 0.01))  # below the noise floor
    assert clear(_drop(1.5, 0.5, 1.0))
    assert not clear(_drop(1.49, 0.5, 1.0))  # within one spread of the random mean
    assert not clear(_drop(-2.0, 0.0, 0.0))  # removing it raises the answer
    assert not clear(_drop(2.0, 0.0, 0.0, tied=True))
    good = (_drop(2.0, 0.4, 0.8),)
    assert lds_band(_check(good, None, 0)) == "not computed"
    assert lds_band(_check(good, None, 8)) == "low"  # undefined
    assert lds_band(_check(good, LDS_MODERATE - 0.01, 8)) == "low"
    assert lds_band(_check(good, LDS_MODERATE, 8)) == "moderate"
    assert lds_band(_check(good, LDS_HIGH, 8)) == "high"
    assert verdict(_check(good, LDS_MODERATE, 8)).word == "supported"
    low = verdict(_check(good, 0.1, 8))
    assert low.word == "weak" and "do not add up: LDS 0.100 (low, 8 ablations)" in low.reason
    assert verdict(_check((), None, 0)).word == "not checked"


@pytest.mark.parametrize(
    ("value", "signed", "written"),
    [
        (0.0, True, "0"),
        (-0.0, False, "0"),
        (0.8020679468242247, False, "0.802"),
        (2.31492, True, "+2.31"),
        (-2.31492, True, "-2.31"),
        (123.4, False, "123"),
        (0.001, False, "0.00100"),
        (3.1234e-6, True, "+3.12e-06"),
        (12345.6, False, "1.23e+04"),
    ],
)
def test_numbers_have_three_significant_digits(value, signed, written):
    assert number(value, signed=signed) == written
