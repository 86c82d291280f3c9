"""The default method of each kind of model: one table, chosen from the zoo's
known-evidence tables (docs/results.md), with the numbers in docs/methods.md ("Default
method per model kind"). Every `method=None` (`Explainer.explain`, explain.generation,
explain.text, explain.cite, the commands, the viewer) resolves through `default_method`;
nothing else names a default. The engine names no method, so the table sits above it."""

from __future__ import annotations

from dataclasses import dataclass

from explain.architectures.base import (
    Adapter,
    Detector,
    EncoderDecoder,
    ImageTextModel,
    LanguageModel,
)
from explain.architectures.dual_encoder import DualEncoder
from explain.engine import Request, refusals

__all__ = [
    "DEFAULTS",
    "FALLBACK_METHOD",
    "DefaultMethod",
    "KindDefault",
    "default_method",
    "in_words",
]


@dataclass(frozen=True)
class KindDefault:
    """One row of the table: a kind of model, its default method and the evidence."""

    kind: str
    """What the kind is called where the default is shown (`explain methods`)."""
    serves: type[Adapter]
    """The adapter contract of the kind (explain.architectures.base)."""
    method: str
    why: str
    """One line: the measurement that chose `method`."""
    reads_text: bool | None = None
    """For the one-stack kinds (`serves` is `Adapter`): whether the model reads text;
    None: either."""

    def takes(self, adapter: Adapter | type[Adapter]) -> bool:
        """Whether `adapter`'s model is of this kind."""
        adapter_class = adapter if isinstance(adapter, type) else type(adapter)
        return issubclass(adapter_class, self.serves) and (
            self.reads_text is None or adapter.reads_text == self.reads_text
        )


DEFAULTS: tuple[KindDefault, ...] = (
    KindDefault(
        kind="vision-language model",
        serves=ImageTextModel,
        method="attnlrp",
        why="on zoo:shapes-llava it points at the answer's object on 100% of answers "
        "(generic 87%), mIoU 0.631 (generic 0.514), and ranks the question's named word "
        "first on 43% (cp_lrp 23%, generic 13%)",
    ),
    KindDefault(
        kind="decoder-only language model",
        serves=LanguageModel,
        method="cp_lrp",
        why="on zoo:recall-llama it ranks an evidence token first on 100% of prompts at "
        "512, 1,024 and 2,048 tokens (generic 6-9%), as attnlrp does, with the asked "
        "fact's span first on 30 of 30 prompts (attnlrp 29), the same LDS (0.766 against "
        "0.768) and 0.83x attnlrp's time",
    ),
    KindDefault(
        kind="encoder-decoder",
        serves=EncoderDecoder,
        method="generic",
        why="the only method whose rules fold a source and a target set together "
        "(explain.rules.coattention); no zoo model of this kind has known evidence",
    ),
    KindDefault(
        kind="dual encoder (CLIP)",
        serves=DualEncoder,
        method="generic",
        why="no zoo model of this kind has known evidence; the LRP methods are not "
        "available for the towers",
    ),
    KindDefault(
        kind="object detector",
        serves=Detector,
        method="generic",
        why="the only method a detector's queries are explained with",
    ),
    KindDefault(
        kind="text encoder (classifier, sentence encoder)",
        serves=Adapter,
        reads_text=True,
        method="generic",
        why="on zoo:minilm-sentiment its rationale F1@5 is 0.429, within 0.008 of the "
        "best (raw_attention 0.437; attnlrp 0.410, cp_lrp 0.415), tied with it from F1@10",
    ),
    KindDefault(
        kind="image classifier (or another one-stack transformer)",
        serves=Adapter,
        reads_text=False,
        method="generic",
        why="on zoo:shapes-vit it ties the best on perturbation (positive AUC 18.59, cp_lrp "
        "17.75) and SaCo (0.966), and every image family takes it (Swin and timm BEiT take "
        "no cp_lrp)",
    ),
)
"""The default method of every kind of model, the most specific kind first (a
vision-language model is also a language model; the one-stack kinds come last)."""

FALLBACK_METHOD = "generic"
"""What a model runs when its family does not take its kind's default: the method every
family takes."""


@dataclass(frozen=True)
class DefaultMethod:
    """The method a call on one model runs when it names none, and why."""

    method: str
    kind: str
    why: str
    """One line: the evidence, or why the kind's default gave way to `FALLBACK_METHOD`."""


def default_method(
    adapter: Adapter | type[Adapter], request: Request | None = None
) -> DefaultMethod:
    """The default method of `adapter`'s model, in calls of `request`'s kind (a generation,
    when it has a `prompt_length`; default: any other): its kind's (`DEFAULTS`), or
    `FALLBACK_METHOD` where its family does not take that one (said in `why`)."""
    row = next(row for row in DEFAULTS if row.takes(adapter))
    refused = refusals(adapter, request).get(row.method)
    if refused is None:
        return DefaultMethod(method=row.method, kind=row.kind, why=row.why)
    return DefaultMethod(
        method=FALLBACK_METHOD,
        kind=row.kind,
        why=f"{row.method} (the default of its kind) is not available for {adapter.family} "
        f"({refused}); {FALLBACK_METHOD} is, for every family",
    )


def in_words() -> str:
    """The table in one line, for help texts: the kinds whose default is not the fallback,
    then the fallback for the rest."""
    chosen = [f"{row.method} ({row.kind})" for row in DEFAULTS if row.method != FALLBACK_METHOD]
    return ", ".join([*chosen, f"{FALLBACK_METHOD} (every other kind)"])
