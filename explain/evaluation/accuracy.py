"""The zoo models' held-out accuracy: the number each card quotes, measured.

Each zoo model is run on the first examples of its own held-out split (the synthetic
scenes, digits and sentences of explain.data) by the measure its module in
`explain.evaluation.zoo` names: one of the measures here (each the accuracy of a task of
explain.data), `recall_answers.recall_accuracy` or `shapes_answers.question_accuracy`.
scripts/zoo_accuracy.py prints the numbers and writes them into the cards, and
tests/test_zoo.py checks that a model still reaches its card's number. It lives with the
other measurements, not with the zoo's loading, which needs none of it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from explain.evaluation.zoo import zoo_evaluation
from explain.loading.loaded_model import LoadedModel
from explain.loading.zoo import load_zoo_model

__all__ = [
    "Accuracy",
    "digits_accuracy",
    "heldout_accuracy",
    "retrieval_accuracy",
    "sentiment_accuracy",
    "shapes_accuracy",
]


@dataclass(frozen=True)
class Accuracy:
    """Held-out accuracy of a zoo model on its first `count` held-out examples.

    `accuracy` is the headline number: argmax = label for single-label models; for the
    multi-label shapes model, every kind's sigmoid decision right (the exact set of kinds).
    `details` adds secondary numbers (per-kind accuracy, top-1 in the set, ...).
    """

    name: str
    count: int
    accuracy: float
    details: dict[str, float]


def _batches(total: int, size: int):
    from tqdm import tqdm

    for start in tqdm(range(0, total, size), desc="held-out", unit="batch", leave=False):
        yield start, min(size, total - start)


@torch.no_grad()
def shapes_accuracy(loaded: LoadedModel, count: int) -> tuple[float, dict[str, float]]:
    """Multi-label kinds of shape: every kind's sigmoid decision right on the first `count`
    held-out scenes; details: top-1 kind present, per-kind decisions."""
    from explain.data import shapes

    dataset = shapes.ShapesDataset("heldout", count, size=loaded.image_size[0])
    logits, labels = [], []
    for start, size in _batches(count, 100):
        items = [dataset[start + i] for i in range(size)]
        logits.append(loaded.model(torch.stack([image for image, _ in items])))
        labels.append(torch.stack([label for _, label in items]))
    logits, labels = torch.cat(logits), torch.cat(labels) > 0.5
    decisions = (logits > 0) == labels
    top1 = labels.gather(1, logits.argmax(dim=1, keepdim=True)).float().mean().item()
    details = {"top-1 kind present": top1, "per-kind decisions": decisions.float().mean().item()}
    for index, kind in enumerate(shapes.KINDS):
        details[f"{kind} decisions"] = decisions[:, index].float().mean().item()
    return decisions.all(dim=1).float().mean().item(), details


@torch.no_grad()
def digits_accuracy(loaded: LoadedModel, count: int) -> tuple[float, dict[str, float]]:
    """Top-1 on the first `count` held-out digits."""
    from explain.data import digits

    images, labels = digits.load("heldout", size=loaded.image_size[0])
    images, labels = digits.normalise(images[:count]), labels[:count]
    predictions = torch.cat(
        [
            loaded.model(images[start : start + size]).argmax(1)
            for start, size in _batches(count, 100)
        ]
    )
    return (predictions == labels).float().mean().item(), {}


@torch.no_grad()
def sentiment_accuracy(loaded: LoadedModel, count: int) -> tuple[float, dict[str, float]]:
    """Top-1 on the first `count` held-out sentences; details: on the negated ones."""
    from explain.data import sentiment

    examples = sentiment.sentences("heldout", count)
    correct = negated = negated_correct = 0
    for start, size in _batches(count, 100):
        batch = examples[start : start + size]
        encoding, labels, _ = sentiment.encode(batch, loaded.tokenizer)
        hits = loaded.model(**encoding).logits.argmax(1) == labels
        correct += int(hits.sum())
        for example, hit in zip(batch, hits.tolist(), strict=True):
            if "not" in example.words:
                negated += 1
                negated_correct += hit
    details = {"negated sentences": negated_correct / negated} if negated else {}
    return correct / count, details


@torch.no_grad()
def retrieval_accuracy(loaded: LoadedModel, count: int) -> tuple[float, dict[str, float]]:
    """Zero-shot retrieval: each scene's most similar caption among the canonical captions
    of all 41 sets of kinds must name exactly its set; details: the most similar of the
    six one-kind prompts "a {kind}" names a kind in the scene, and the retrieved set has
    as many kinds as the scene."""
    from explain.data import captions, shapes

    sets = captions.kind_sets()
    prompts = [captions.caption(kinds) for kinds in sets]
    prompts += [captions.caption((kind,)) for kind in range(len(shapes.KINDS))]
    texts = loaded.tokenizer(prompts, padding=True, return_tensors="pt")
    text_embeds = loaded.model.get_text_features(**texts).pooler_output
    text_embeds = F.normalize(text_embeds, dim=-1)
    dataset = shapes.ShapesDataset("heldout", count, size=loaded.image_size[0])
    exact = single = size = 0
    for start, length in _batches(count, 100):
        scenes = [dataset.scene(start + i) for i in range(length)]
        images = torch.stack([shapes.normalise(scene.image) for scene in scenes])
        image_embeds = F.normalize(loaded.model.get_image_features(images).pooler_output, dim=-1)
        similarity = image_embeds @ text_embeds.T
        best_set = similarity[:, : len(sets)].argmax(dim=1).tolist()
        best_kind = similarity[:, len(sets) :].argmax(dim=1).tolist()
        for scene, chosen, kind in zip(scenes, best_set, best_kind, strict=True):
            exact += sets[chosen] == tuple(sorted(scene.kinds))
            single += kind in scene.kinds
            size += len(sets[chosen]) == len(scene.kinds)
    details = {"one-kind prompt names a kind present": single / count}
    details["retrieved set has the right number of kinds"] = size / count
    return exact / count, details


def heldout_accuracy(name: str, count: int | None = None, *, secondary: bool = True) -> Accuracy:
    """Measure zoo model `name` on the first `count` examples of its held-out split.

    The default count is what its card quotes (`ZooEvaluation.count`: all 400 held-out
    digits, 2000 scenes, 1000 questions, ...); tests use a few dozen. `secondary=False`
    leaves out the details its evaluation measures on other inputs
    (`ZooEvaluation.secondary`), for a check of the headline number alone.
    """
    evaluation = zoo_evaluation(name)
    count = evaluation.count if count is None else count
    loaded = load_zoo_model(name)
    accuracy, details = evaluation.accuracy(loaded, count)
    if secondary and evaluation.secondary is not None:
        details = {**details, **evaluation.secondary(loaded, count)}
    return Accuracy(name=name, count=count, accuracy=accuracy, details=details)
