"""What `explain` says about a model no adapter takes: vision transformers whose tokens
mix outside attention maps (CvT, PVT, MaxViT, deformable attention) are out of scope, each
with why; anything else can be described with a TransformerSpec."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

__all__ = ["refused_family", "unsupported_model_message"]

_WHY: tuple[tuple[tuple[str, ...], str], ...] = (
    (
        ("cvt",),
        "its attention projects queries, keys and values with depthwise convolutions, so "
        "each attention row mixes a neighbourhood of tokens that no rule on the attention "
        "map alone accounts for",
    ),
    (
        ("pvt", "pyramidvisiontransformer"),
        "its spatial-reduction attention reads keys from a pooled (or convolved) grid "
        "coarser than the queries, so its maps are not square and no token-to-token fold "
        "runs through them",
    ),
    (
        ("maxvit", "maxxvit"),
        "its blocks interleave convolutions (MBConv) with window and grid attention, and "
        "the convolutions mix tokens outside any attention map",
    ),
    (
        ("deformable",),  # transformers' DeformableDetr*
        "its deformable attention samples a few learned offsets per query instead of a "
        "softmax over keys, so it has no attention map to fold",
    ),
    (
        (
            "swintransformerv2cr",
            "twins",
            "hiera",
            "levit",
            "mobilevit",
            "focalnet",
            "dinat",
            "efficientformer",
            "poolformer",
            "multiscalevit",
            "nest",
        ),
        "its stages pool, convolve or attend across tokens in ways no explain rule folds "
        "(explain folds windowed attention only as Swin does it)",
    ),
)
"""Class-name prefixes (lowercase) of timm and transformers models that explain refuses,
with why: each mixes tokens in a way that the attention rules cannot see."""


def refused_family(model: nn.Module) -> tuple[str, str] | None:
    """(class name, why it is refused) when `model` is a timm or transformers model whose
    tokens mix outside plain or Swin-windowed attention (`_WHY`), or None."""
    for cls in type(model).__mro__:
        library = cls.__module__.split(".")[0]
        if library not in ("timm", "transformers"):
            continue
        name = cls.__name__.lower()
        for prefixes, why in _WHY:
            if name.startswith(prefixes):
                return cls.__name__, why
    return None


def unsupported_model_message(model: nn.Module, families: Sequence[str]) -> str:
    """The UnsupportedModelError message for `model`: why, the supported families, and the
    way to explain a transformer of one's own."""
    name = f"{type(model).__module__}.{type(model).__qualname__}"
    refused = refused_family(model)
    if refused is not None:
        reason = f"{name} is out of scope ({refused[0]}): {refused[1]}."
    else:
        reason = f"{name} is not a supported model."
    # What to do first, the long list of families last (one line: the CLI prints errors so).
    return (
        f"{reason} A plain transformer of your own (one token sequence through every block) "
        "can be explained by naming its blocks, attention probabilities and readout: "
        "Explainer(model, spec=explain.TransformerSpec(...)) (README, Supported models). "
        "Supported families (`explain models` lists them): " + " | ".join(families) + "."
    )
