"""The default method of each kind of model: one table, chosen from the zoo's
known-evidence tables (docs/results.md), with the numbers in docs/methods.md ("Default
method per model kind"). Every `method=None` (`Explainer.explain`, explain.generation,
explain.text, explain.cite, the commands, the viewer) resolves through `default_method`;
nothing else names a default. The engine names no method, so the table sits above it.

The measurement that chose a kind's default is its zoo model's to state (its config's
`default_evidence`, `explain.loading.zoo.DefaultEvidence`), so no zoo model is named
here; it is read from the zoo when it is shown (`why`), never on a call's path."""

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
    reason: str | None = None
    """One line: why `method`, for a kind no zoo model measured; None: zoo models did, and
    state it (`why`)."""
    reads_text: bool | None = None
    """For the one-stack kinds (`serves` is `Adapter`): whether the model reads text;
    None: either."""

    @property
    def why(self) -> str:
        """One line: `reason`, or the measurement that chose `method`, as the zoo's models
        state it for this kind (read from their configs now, where it is shown)."""
        if self.reason is not None:
            return self.reason
        from explain.loading.zoo import ZOO, zoo_root

        stated = [
            f"on zoo:{name} {entry.evidence.measured}"
            for name, entry in ZOO.items()
            if entry.evidence
            and (entry.evidence.kind, entry.evidence.method) == (self.kind, self.method)
        ]
        return "; ".join(stated) or (
            f'measured on the zoo (docs/methods.md, "Default method per model kind"); no '
            f"model of the zoo read from {zoo_root()} states the measurement"
        )

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
    ),
    KindDefault(
        kind="decoder-only language model",
        serves=LanguageModel,
        method="cp_lrp",
    ),
    KindDefault(
        kind="encoder-decoder",
        serves=EncoderDecoder,
        method="generic",
        reason="the only method whose rules fold a source and a target set together "
        "(explain.rules.coattention); no zoo model of this kind has known evidence",
    ),
    KindDefault(
        kind="dual encoder (CLIP)",
        serves=DualEncoder,
        method="generic",
        reason="no zoo model of this kind has known evidence; the LRP methods are not "
        "available for the towers",
    ),
    KindDefault(
        kind="object detector",
        serves=Detector,
        method="generic",
        reason="the only method a detector's queries are explained with",
    ),
    KindDefault(
        kind="text encoder (classifier, sentence encoder)",
        serves=Adapter,
        reads_text=True,
        method="generic",
    ),
    KindDefault(
        kind="image classifier (or another one-stack transformer)",
        serves=Adapter,
        reads_text=False,
        method="generic",
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
    of_kind: KindDefault
    """The row of `DEFAULTS` of the model's kind."""
    gave_way: str | None = None
    """Why the kind's default gave way to `FALLBACK_METHOD`; None: `method` is the kind's."""

    @property
    def kind(self) -> str:
        """What the model's kind is called (`KindDefault.kind`)."""
        return self.of_kind.kind

    @property
    def why(self) -> str:
        """One line: the evidence (`KindDefault.why`, read when asked), or why the kind's
        default gave way to `FALLBACK_METHOD`."""
        return self.of_kind.why if self.gave_way is None else self.gave_way


def default_method(
    adapter: Adapter | type[Adapter], request: Request | None = None
) -> DefaultMethod:
    """The default method of `adapter`'s model, in calls of `request`'s kind (a generation,
    when it has a `prompt_length`; default: any other): its kind's (`DEFAULTS`), or
    `FALLBACK_METHOD` where its family does not take that one (said in `why`)."""
    row = next(row for row in DEFAULTS if row.takes(adapter))
    refused = refusals(adapter, request).get(row.method)
    if refused is None:
        return DefaultMethod(method=row.method, of_kind=row)
    return DefaultMethod(
        method=FALLBACK_METHOD,
        of_kind=row,
        gave_way=f"{row.method} (the default of its kind) is not available for "
        f"{adapter.family} ({refused}); {FALLBACK_METHOD} is, for every family",
    )


def in_words() -> str:
    """The table in one line, for help texts: the kinds whose default is not the fallback,
    then the fallback for the rest."""
    chosen = [f"{row.method} ({row.kind})" for row in DEFAULTS if row.method != FALLBACK_METHOD]
    return ", ".join([*chosen, f"{FALLBACK_METHOD} (every other kind)"])
