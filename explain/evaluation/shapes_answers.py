"""A vision-language model's answers to the shapes questions: held-out accuracy per
template, and the check that each answer rests on the object its example records.

`answers` puts scenes and questions through the model's processor (its chat template, as
a user's prompt goes) and reads the greedy first answer word. `question_accuracy` is the
number the zoo's vision-language model's card quotes. `evidence_check` edits the held-out scenes
(explain.data.shapes_questions): the answer must change when the object it is about is
removed, reshaped or recoloured (edits that change the true answer), and must stay when
an object the question does not involve is changed or removed. Both are counted over the
examples the model answers right (the evidence of a wrong answer is not known), per
template; scripts/zoo_accuracy.py writes them into the card.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from explain.architectures.hf_common import positions_from_mask
from explain.data import shapes_questions
from explain.inputs import encode_image_prompt
from explain.loading.loaded_model import LoadedModel

__all__ = ["EvidenceCheck", "answers", "evidence_check", "question_accuracy"]


@torch.no_grad()
def answers(
    loaded: LoadedModel, images: Sequence[np.ndarray], texts: Sequence[str], batch_size: int = 64
) -> list[str]:
    """The model's first answer word (greedy) to each question about each image ((H, W, 3)
    in [0, 1], given as the uint8 photo a user would save)."""
    from tqdm import tqdm

    if len(images) != len(texts):
        raise ValueError(f"{len(images)} images for {len(texts)} questions")
    words: list[str] = []
    processor = loaded.tokenizer
    for start in tqdm(range(0, len(texts), batch_size), desc="answers", leave=False):
        end = start + batch_size
        prompt = {"image": list(images[start:end]), "text": list(texts[start:end])}
        encoded = encode_image_prompt(prompt, processor)
        encoded["pixel_values"] = encoded["pixel_values"].to(loaded.device, loaded.dtype)
        encoded = {name: value.to(loaded.device) for name, value in encoded.items()}
        logits = loaded.model(
            **encoded, position_ids=positions_from_mask(encoded["attention_mask"]), logits_to_keep=1
        ).logits[:, -1]
        words += processor.tokenizer.convert_ids_to_tokens(logits.argmax(dim=-1).tolist())
    return words


def question_accuracy(loaded: LoadedModel, count: int) -> tuple[float, dict[str, float]]:
    """The share of the first `count` held-out examples (question 0 of each held-out
    scene) answered right, and the same per template and per kind of answer."""
    items = shapes_questions.examples("heldout", count)
    said = answers(loaded, [item.image for item in items], [item.text for item in items])
    right = [word == item.answer for word, item in zip(said, items, strict=True)]
    details: dict[str, float] = {}
    for template in shapes_questions.TEMPLATES:
        hits = [
            r for r, item in zip(right, items, strict=True) if item.question.template == template
        ]
        details[f"{template} ({len(hits)} examples)"] = float(np.mean(hits))
    absent = [r for r, item in zip(right, items, strict=True) if item.target is None]
    details[f'answers about no object: "no", "none", "nothing" ({len(absent)})'] = float(
        np.mean(absent)
    )
    return float(np.mean(right)), details


@dataclass(frozen=True)
class EvidenceCheck:
    """Per template, over the held-out examples the model answers right.

    Attributes:
        count: held-out examples looked at (question 0 of the first `count` scenes).
        right: per template, how many of them the model answers right.
        changed: per template and evidence edit ("remove", "reshape", "recolour"), the
            share of edits of the answer's object after which the model's answer changes
            (each edit changes the true answer), and how many edits were made.
        new_answer_right: the same edits, the share after which the model gives the new
            true answer.
        kept: per template and control edit ("change", "remove"), the share of edits of
            an object the question does not involve after which the answer stays, and
            how many.
    """

    count: int
    right: dict[str, int]
    changed: dict[str, dict[str, tuple[float, int]]]
    new_answer_right: dict[str, dict[str, tuple[float, int]]]
    kept: dict[str, dict[str, tuple[float, int]]]

    def table(self) -> str:
        """A markdown table: one row per template."""
        edits = ("remove", "reshape", "recolour")
        lines = [
            "| template | right | answer changes: "
            + " / ".join(edits)
            + " the answer's object | new answer right | answer kept: change / remove "
            "another object |",
            "|---|---|---|---|---|",
        ]

        def cell(found: dict[str, tuple[float, int]], keys: Sequence[str]) -> str:
            shown = [f"{100 * found[k][0]:.1f}% ({found[k][1]})" for k in keys if k in found]
            return " / ".join(shown) if shown else "-"

        for template in shapes_questions.TEMPLATES:
            lines.append(
                f"| {template} | {self.right[template]} | "
                f"{cell(self.changed[template], edits)} | "
                f"{cell(self.new_answer_right[template], edits)} | "
                f"{cell(self.kept[template], ('change', 'remove'))} |"
            )
        return "\n".join(lines)


def evidence_check(loaded: LoadedModel, count: int) -> EvidenceCheck:
    """Edit the first `count` held-out examples' scenes and ask again (module docstring)."""
    from explain.data.shapes import render_layout

    items = shapes_questions.examples("heldout", count)
    said = answers(loaded, [item.image for item in items], [item.text for item in items])
    correct = [item for word, item in zip(said, items, strict=True) if word == item.answer]
    # every edited scene of every correct example, asked the same question, all at once
    edited: list[tuple[str, str, str, str, str]] = []  # template, check, edit, before, truth
    images, texts = [], []
    for item in correct:
        evidence = shapes_questions.evidence_edits(item)
        control = shapes_questions.control_edits(item)
        for check, name, layout in [
            *(("evidence", name, layout) for name, layout in evidence.items()),
            # "change 2" and "remove 2": counted by what is done, whichever object
            *(("control", name.split()[0], layout) for name, layout in control.items()),
        ]:
            truth, _ = shapes_questions.answer(layout, item.question)
            edited.append((item.question.template, check, name, item.answer, truth))
            images.append(render_layout(layout).image)
            texts.append(item.text)
    after = answers(loaded, images, texts)
    changed: dict[tuple[str, str, str], list[bool]] = defaultdict(list)
    new_right: dict[tuple[str, str, str], list[bool]] = defaultdict(list)
    for (template, check, name, before, truth), word in zip(edited, after, strict=True):
        changed[template, check, name].append(word != before)
        new_right[template, check, name].append(word == truth)
    templates = shapes_questions.TEMPLATES
    shares: dict[str, dict[str, dict[str, tuple[float, int]]]] = {
        key: {t: {} for t in templates} for key in ("changed", "new_answer_right", "kept")
    }
    for (template, check, name), outcomes in changed.items():
        if check == "evidence":
            shares["changed"][template][name] = (float(np.mean(outcomes)), len(outcomes))
            right = new_right[template, check, name]
            shares["new_answer_right"][template][name] = (float(np.mean(right)), len(right))
        else:
            shares["kept"][template][name] = (1 - float(np.mean(outcomes)), len(outcomes))
    return EvidenceCheck(
        count=count,
        right={t: sum(item.question.template == t for item in correct) for t in templates},
        **shares,
    )
