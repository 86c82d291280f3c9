"""AT2-style per-head attention weights for span attribution, measured against CP-LRP
(issue 42, item 3: an experiment, not a method of explain).

AT2 (Cohen-Wang, Chuang and Madry 2025, "Learning to Attribute with Attention") scores a
span s as sum over heads h of w_h * phi_h(s), where phi_h(s) is head h's attention from
the positions that predict the answer's tokens to s's tokens, averaged over the answer's
tokens and summed over the span's tokens, read from one forward of the prompt and the
answer (the explicit attention path the engine records: explain.engine's Session and
Recorder). The weights w (one per head of every block) are learned once per model from
ablations: on --train prompts of explain.data.recall's training split (seeds from
TRAIN_START on: the training distribution, not the model's own training examples), each
with --train-ablations random halves of its spans, and log p(answer) under each
(explain.cite.check.ablated_targets, the check's own ablation). Two fits of w:

- `at2, correlation`: AT2's surrogate objective, the Pearson correlation between each
  ablation's predicted target (the sum of its kept spans' scores) and its measured
  log p(answer), averaged over the training prompts and maximised (Adam);
- `at2, least squares`: the ablation's drop of log p(answer) regressed on the sum of its
  removed spans' features (no intercept).

`attention, mean of heads`: every head weighted alike (AT2's naive baseline).

Scored on the held-out prompts of scripts/bench_cite.py's quality benchmark (the same
examples, spans and answers; the same check and LDS ablations, seed = the prompt's index)
with cp_lrp and cp_lrp with sparse=0.05 beside them: LDS, the Spearman within the LDS
ablations that remove the asked fact (any fact of the chain, with --hops 2), evidence
top-1 and, with --hops 2, both facts in the top 2. ContextCite is not run here (its
package is not a dependency of explain; scripts/bench_cite.py runs it).

    python scripts/bench_at2.py --examples 12
    python scripts/bench_at2.py --model zoo:twohop-llama --hops 2 --examples 6
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from bench_cite import FILLER_WORDS, LENGTH, mean_and_error, recall_case
from torch import Tensor
from tqdm import tqdm

from explain import Explainer
from explain.cite import cite
from explain.cite.check import ablated_targets, check_scores, spearman
from explain.cite.prompt import span_sums
from explain.data import recall
from explain.engine.recorder import Recorder
from explain.engine.session import Session

TRAIN_START = 1_000_000
"""The first training-split seed calibrated on: past every seed the zoo's recall models
trained on (their configs: seeds 0..10,813 and 0..10,335), still the training
distribution."""
SPARSE = 0.05
"""The sparse CP-LRP row's share of the top score (scripts/bench_cite.py's default)."""
STEPS = 400
"""Adam steps of the correlation fit (it has one weight per head: it converges in far
fewer)."""


@dataclass(frozen=True)
class Prompt:
    """One prompt as the rankings see it: ids, each token's span (-1: none), the answer,
    the span count and the evidence spans."""

    prompt_ids: Tensor
    token_spans: Tensor
    answer_ids: Tensor
    count: int
    evidence: tuple[int, ...]


def read_prompt(explainer: Explainer, example: recall.RecallExample, filler_words: int) -> Prompt:
    """`example`'s prompt tokens and spans as `cite` cuts them (scripts/bench_cite.py's
    spans; raw attention, the cheapest method, only to read the tokenization)."""
    case = recall_case(example, filler_words)
    result = cite(explainer, case.context, case.question, case.answer, spans="lines",
                  method="raw_attention", check=False)  # fmt: skip
    return Prompt(
        result.prompt_ids, result.token_spans, result.answer_ids, len(result.spans), case.evidence
    )


def head_features(explainer: Explainer, prompt: Prompt) -> Tensor:
    """(S, L * H): every head's attention from the positions that predict the answer's
    tokens to each span's tokens, averaged over the answer's tokens, summed over the
    span's, from one forward of the prompt and the answer on the explicit path."""
    width, answer = prompt.prompt_ids.shape[0], prompt.answer_ids.shape[0]
    rows: dict[int, Tensor] = {}

    def seen(layer: int, attention: Tensor) -> None:  # (1, H, N, N)
        rows[layer] = attention[0, :, width - 1 : width - 1 + answer, :width].double().mean(1)

    ids = torch.cat([prompt.prompt_ids, prompt.answer_ids])[None]
    adapter = explainer.adapter
    with torch.no_grad(), Session(adapter) as session, Recorder(session, on_attention=seen):
        adapter.model(input_ids=ids.to(adapter.parameter.device))
    per_token = torch.cat([rows[layer].cpu() for layer in sorted(rows)])  # (L * H, P)
    return span_sums(per_token, prompt.token_spans, prompt.count).T


def log_p(explainer: Explainer, prompt: Prompt) -> Callable[[Tensor], Tensor]:
    """The check's target of `prompt` under ablations keep (M, S): log p(answer), (M,)."""

    def targets(keep: Tensor) -> Tensor:
        answers = [(prompt.answer_ids, 1.0)]
        return ablated_targets(
            explainer.adapter, prompt.prompt_ids, prompt.token_spans, answers, keep
        )

    return targets


@dataclass(frozen=True)
class Calibration:
    """The training prompts' features (S, F), ablations keep (R, S) (row 0 keeps every
    span) and log p(answer) under each (R,)."""

    features: list[Tensor]
    keep: list[Tensor]
    values: list[Tensor]
    seconds: float


def calibration(explainer: Explainer, args: argparse.Namespace) -> Calibration:
    """Ablations of --train training-split prompts, --train-ablations halves each."""
    generator = torch.Generator().manual_seed(0)
    started = time.perf_counter()
    features, keeps, values = [], [], []
    train = recall.examples("train", args.train, args.length, hops=args.hops, start=TRAIN_START)
    for example in tqdm(train, desc="calibration", unit="prompt"):
        prompt = read_prompt(explainer, example, args.filler_words)
        halves = torch.rand(args.train_ablations, prompt.count, generator=generator) < 0.5
        keep = torch.cat([torch.ones(1, prompt.count, dtype=torch.bool), halves])
        features.append(head_features(explainer, prompt))
        keeps.append(keep)
        values.append(log_p(explainer, prompt)(keep).double())
    return Calibration(features, keeps, values, time.perf_counter() - started)


def pearson(x: Tensor, y: Tensor) -> Tensor:
    """The Pearson correlation of x and y (differentiable)."""
    x, y = x - x.mean(), y - y.mean()
    return (x * y).sum() / (x.norm() * y.norm()).clamp_min(1e-12)


def mean_correlation(data: Calibration, weights: Tensor) -> Tensor:
    """The mean over the training prompts of the Pearson correlation between each
    ablation's kept spans' summed scores (features @ weights) and its log p(answer)."""
    return torch.stack(
        [
            pearson(keep.double() @ (features @ weights), values)
            for features, keep, values in zip(data.features, data.keep, data.values, strict=True)
        ]
    ).mean()


def correlation_weights(data: Calibration) -> Tensor:
    """AT2's fit: the head weights maximising `mean_correlation`."""
    count = data.features[0].shape[1]
    weights = torch.full((count,), 1.0 / count, dtype=torch.float64, requires_grad=True)
    optimiser = torch.optim.Adam([weights], lr=0.01)
    for _ in range(STEPS):
        optimiser.zero_grad()
        (-mean_correlation(data, weights)).backward()
        optimiser.step()
    return weights.detach()


def least_squares_weights(data: Calibration) -> Tensor:
    """The head weights whose removed spans' summed scores best predict (least squares)
    each ablation's drop of log p(answer) from the full context."""
    design = torch.cat(
        [
            (~keep).double() @ features
            for features, keep in zip(data.features, data.keep, strict=True)
        ]
    )
    drops = torch.cat([values[0] - values for values in data.values])
    return torch.linalg.lstsq(design, drops[:, None]).solution[:, 0]


def recorded_check(scores: Tensor, targets: Callable[[Tensor], Tensor], lds: int, seed: int):
    """explain.cite.check's check of `scores`, with its LDS halves (lds, S) and the
    target under each (lds,)."""
    seen: list[tuple[Tensor, Tensor]] = []

    def recorded(keep: Tensor) -> Tensor:
        values = targets(keep)
        seen.append((keep, values))
        return values

    check = check_scores(scores, recorded, lds=lds, seed=seed)
    ((keep, values),) = seen
    return check, keep[-lds:], values[-lds:].double()


def defined(values: list[float]) -> str:
    """mean_and_error over the defined values (a ranking constant over the ablations
    that remove the fact, as sparse scores often are, has no Spearman there), with
    their count."""
    kept = [value for value in values if value == value]
    return f"{mean_and_error(kept)} ({len(kept)})" if kept else "undefined (0)"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="zoo:recall-llama")
    parser.add_argument("--hops", type=int, choices=(1, 2), default=1)
    parser.add_argument("--examples", type=int, default=12, help="held-out prompts scored")
    parser.add_argument("--length", type=int, default=LENGTH)
    parser.add_argument("--filler-words", type=int, default=FILLER_WORDS)
    parser.add_argument("--lds", type=int, default=64, help="ablations of the LDS")
    parser.add_argument("--train", type=int, default=32, help="training prompts calibrated on")
    parser.add_argument("--train-ablations", type=int, default=64, help="halves per prompt")
    args = parser.parse_args()
    torch.set_num_threads(1)
    from explain.loading import load_model

    explainer = Explainer(load_model(args.model).model, tokenizer=recall.build_tokenizer())
    data = calibration(explainer, args)
    fitted = {
        "at2, correlation": correlation_weights(data),
        "at2, least squares": least_squares_weights(data),
    }
    heads = data.features[0].shape[1]
    fitted["attention, mean of heads"] = torch.ones(heads, dtype=torch.float64)
    for name, weights in fitted.items():
        fit = float(mean_correlation(data, weights))
        print(f"{name}: weights {[round(float(w), 3) for w in weights]}, training fit {fit:.3f}")
    names = [*fitted, "cp_lrp", f"cp_lrp, sparse {SPARSE:g}"]
    keys = ("seconds", "lds", "removed", "hit1", "both")
    rows = {name: {key: [] for key in keys} for name in names}
    held_out = recall.examples("heldout", args.examples, args.length, hops=args.hops)
    for index, example in enumerate(tqdm(held_out, desc="held out", unit="prompt")):
        prompt = read_prompt(explainer, example, args.filler_words)
        scores: dict[str, Tensor] = {}
        started = time.perf_counter()
        features = head_features(explainer, prompt)
        one_forward = time.perf_counter() - started
        for name, weights in fitted.items():
            scores[name] = features @ weights
            rows[name]["seconds"].append(one_forward)
        case = recall_case(example, args.filler_words)
        for name, share in (("cp_lrp", 0.0), (f"cp_lrp, sparse {SPARSE:g}", SPARSE)):
            started = time.perf_counter()
            result = cite(explainer, case.context, case.question, case.answer, spans="lines",
                          method="cp_lrp", sparse=share, ablate=0, check=False)  # fmt: skip
            rows[name]["seconds"].append(time.perf_counter() - started)
            scores[name] = result.scores.double()
        evidence = list(prompt.evidence)
        for name, ranking in scores.items():
            check, halves, values = recorded_check(
                ranking, log_p(explainer, prompt), args.lds, index
            )
            rows[name]["lds"].append(float("nan") if check.lds is None else check.lds)
            removed = ~halves[:, evidence].all(dim=1)
            within = spearman(halves[removed].double() @ ranking, values[removed])
            rows[name]["removed"].append(float("nan") if within is None else within)
            order = ranking.argsort(descending=True, stable=True).tolist()
            rows[name]["hit1"].append(float(order[0] in evidence))
            rows[name]["both"].append(float(set(evidence) <= set(order[: len(evidence)])))
    print(
        f"\n`{args.model}`, {args.hops} hop(s), {args.examples} held-out prompts of "
        f"{args.length} tokens; calibration: {args.train} training prompts x "
        f"{args.train_ablations} ablations (+ the full context), {data.seconds:.1f} s "
        f"(the fits: {STEPS} Adam steps, one least-squares solve)\n"
    )
    print("| ranking | s per example | LDS | Spearman, fact removed | evidence top-1 | facts top |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in names:
        row = rows[name]
        print(
            f"| {name} | {statistics.median(row['seconds']):.3f} | {mean_and_error(row['lds'])} "
            f"| {defined(row['removed'])} "
            f"| {mean_and_error(row['hit1'])} | {mean_and_error(row['both'])} |"
        )
    reference = rows[f"cp_lrp, sparse {SPARSE:g}"]
    for name in fitted:
        pairs = [x - y for x, y in zip(rows[name]["lds"], reference["lds"], strict=True)]
        print(f"- {name} LDS - sparse cp_lrp's, paired: {mean_and_error(pairs)}")


if __name__ == "__main__":
    main()
