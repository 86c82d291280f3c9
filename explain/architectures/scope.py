"""What `explain` says about a model no adapter takes: hierarchical vision transformers
are out of scope, some vision-language families are not explained yet (each with why);
anything else can be described with a TransformerSpec."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

__all__ = ["hierarchical_family", "unsupported_model_message", "vision_language_refusal"]

_HIERARCHICAL = (
    "swin",
    "cvt",
    "pvt",
    "pyramidvisiontransformer",
    "maxvit",
    "maxxvit",
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
)
"""Class-name prefixes (lowercase) of timm and transformers models whose stages pool or
window the tokens."""


def hierarchical_family(model: nn.Module) -> str | None:
    """The name of the timm or transformers hierarchical vision transformer class `model`
    is, or None."""
    for cls in type(model).__mro__:
        library = cls.__module__.split(".")[0]
        if library in ("timm", "transformers") and cls.__name__.lower().startswith(_HIERARCHICAL):
            return cls.__name__
    return None


_VISION_LANGUAGE_NOT_YET = {
    "Qwen2VLForConditionalGeneration": (
        "its vision tower runs every image's patches as one unbatched sequence (cu_seqlens) "
        "whose 2 x 2 merge and multimodal rotary positions explain has no mapping for yet"
    ),
    "Qwen2_5_VLForConditionalGeneration": (
        "its vision tower runs every image's patches as one unbatched sequence with "
        "windowed attention in most blocks, which explain has no mapping for yet"
    ),
    "Idefics3ForConditionalGeneration": (
        "it splits each photo into tiles and a downscaled whole, each its own tower pass, "
        "and pixel-shuffles the tokens; explain does not map tiles back onto the photo yet"
    ),
    "SmolVLMForConditionalGeneration": (
        "like Idefics3, it splits each photo into tiles and pixel-shuffles the tokens; "
        "explain does not map tiles back onto the photo yet"
    ),
}
"""Vision-language models explain refuses for now, by class name, and why."""


def vision_language_refusal(model: nn.Module) -> str | None:
    """Why the transformers vision-language model `model` is not explained yet, or None."""
    for cls in type(model).__mro__:
        if cls.__module__.startswith("transformers.") and cls.__name__ in _VISION_LANGUAGE_NOT_YET:
            return f"{cls.__name__} is not supported yet: {_VISION_LANGUAGE_NOT_YET[cls.__name__]}."
    return None


def unsupported_model_message(model: nn.Module, families: Sequence[str]) -> str:
    """The UnsupportedModelError message for `model`: why, the supported families, and the
    way to explain a transformer of one's own."""
    name = f"{type(model).__module__}.{type(model).__qualname__}"
    hierarchical = hierarchical_family(model)
    if hierarchical is not None:
        reason = (
            f"{name} is a hierarchical vision transformer ({hierarchical}: its stages "
            "window or pool the tokens, so no single token set runs through every block, "
            "which the attention methods need); hierarchical models are out of scope for "
            "now."
        )
    elif (refusal := vision_language_refusal(model)) is not None:
        reason = f"{refusal} The vision-language models explained are LLaVA, PaliGemma and Gemma 3."
    else:
        reason = f"{name} is not a supported model."
    return (
        f"{reason} Supported families: " + "; ".join(families) + ". A plain transformer of "
        "your own (one token sequence through every block) can be explained by naming its "
        "blocks, attention probabilities and readout: Explainer(model, "
        "spec=explain.TransformerSpec(...)), see docs/custom-models.md."
    )
