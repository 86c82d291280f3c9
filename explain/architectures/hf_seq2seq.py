"""Hugging Face encoder-decoders: BART, Marian, T5 and VisionEncoderDecoderModel.

Two stacks: "source" (the encoder, over text tokens or image patches) and "target" (the
decoder). Every encoder block has one self-attention site; every decoder block has a
self-attention site and then a cross-attention site (queries from the decoder, keys from
the encoder), numbered over the whole model in forward order: encoder blocks first. The
explanation applies the two-set rules of explain.rules.coattention to them.

Blocks and attention modules are found as transformers finds them for
`output_attentions` / `output_cross_attentions`: each stack's class names its block class
and its attention recorders (class, output index, module name) in `_can_record_outputs`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import Tensor, nn

from explain.architectures.base import EncoderDecoder, one_hot_rows, validate_image_batch
from explain.architectures.hf_common import (
    attention_in,
    eager_attention_flags,
    find_blocks,
    is_transformers_class,
    num_prefix_tokens,
    prepare_text,
    probabilities_at,
    recorded_output,
)
from explain.errors import InputError, UnsupportedModelError
from explain.layout import AttentionSite, FlagSetting, Prepared, TokenLayout, TokenSet

__all__ = ["HFEncoderDecoder"]

# transformers package -> the classes with a language-modelling head over the decoder.
_CLASSES = {
    "bart": ("BartForConditionalGeneration",),
    "marian": ("MarianMTModel",),
    "t5": ("T5ForConditionalGeneration",),
    "vision_encoder_decoder": ("VisionEncoderDecoderModel",),
}


class HFEncoderDecoder(EncoderDecoder):
    family = (
        "Hugging Face encoder-decoders: BART, Marian, T5 (text to text) and "
        "VisionEncoderDecoderModel with a ViT encoder (image to text); source and target "
        "relevance"
    )

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        encoder, decoder = model.get_encoder(), model.get_decoder()
        self._image_source = is_transformers_class(
            model, "vision_encoder_decoder", _CLASSES["vision_encoder_decoder"]
        )
        # Explanation.tokens names the source tokens: an image source has none.
        self.reads_text = not self._image_source
        if self._image_source and not (
            is_transformers_class(encoder, "vit", ("ViTModel",))
            or is_transformers_class(encoder, "deit", ("DeiTModel",))
        ):
            raise UnsupportedModelError(
                f"VisionEncoderDecoderModel with a {type(encoder).__name__} encoder is not "
                "supported: the image relevance needs a ViT or DeiT encoder (class token and "
                "a patch grid)"
            )
        self._encoder_blocks = find_blocks(encoder)
        self._decoder_blocks = find_blocks(decoder)
        self._sites: list[AttentionSite] = []
        encoder_self = recorded_output(encoder, "attentions")
        decoder_self = recorded_output(decoder, "attentions")
        decoder_cross = recorded_output(decoder, "cross_attentions")
        if None in (encoder_self, decoder_self, decoder_cross):
            raise UnsupportedModelError(
                f"{type(model).__name__}: its encoder or decoder does not name its "
                "self- and cross-attention modules (_can_record_outputs)"
            )
        plan = [("source", "self", block, encoder_self) for block in self._encoder_blocks]
        for block in self._decoder_blocks:
            plan += [("target", "self", block, decoder_self)]
            plan += [("target", "cross", block, decoder_cross)]
        for stack, kind, block, spec in plan:
            module = attention_in(block, spec)
            if module is None:
                raise UnsupportedModelError(
                    f"a {stack} block ({type(block).__name__}) has no {kind}-attention "
                    f"{spec[0].__name__}; is the decoder built with cross-attention?"
                )
            self._sites.append(
                AttentionSite(
                    len(self._sites), module, probabilities_at(spec[1]), stack=stack, kind=kind
                )
            )

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        return any(
            is_transformers_class(model, package, names) for package, names in _CLASSES.items()
        )

    @property
    def blocks(self) -> Sequence[nn.Module]:
        return self._encoder_blocks + self._decoder_blocks

    @property
    def entry_blocks(self) -> Sequence[nn.Module]:
        return [self._encoder_blocks[0], self._decoder_blocks[0]]

    def attention_sites(self) -> Sequence[AttentionSite]:
        return list(self._sites)

    def path_flags(self) -> Sequence[FlagSetting]:
        return eager_attention_flags(self.model)

    # -- inputs ---------------------------------------------------------------------------

    def prepare(self, inputs: object) -> Prepared:
        if not isinstance(inputs, Mapping):
            raise InputError(
                "encoder-decoders take a mapping with the source (input_ids and "
                "attention_mask, or pixel_values) and decoder_input_ids (optionally "
                f"decoder_attention_mask), got {type(inputs).__name__}"
            )
        if "decoder_input_ids" not in inputs:
            raise InputError(
                "give the decoder's tokens as decoder_input_ids (the target text after the "
                "decoder start token), or generate them: explain.generation.generate_target"
            )
        parameter = self.parameter
        device = parameter.device
        decoder_config = self.model.get_decoder().config
        decoder = prepare_text(
            {
                "input_ids": inputs["decoder_input_ids"],
                "attention_mask": inputs.get("decoder_attention_mask"),
            },
            max_tokens=_max_tokens(decoder_config),
            vocab_size=decoder_config.vocab_size,
            device=device,
            token_types=False,
        )
        mask = decoder["attention_mask"]
        if bool((mask[:, 1:] > mask[:, :-1]).any()):
            raise InputError("decoder_attention_mask must be right-padded (ones, then zeros)")
        arguments = {
            "decoder_input_ids": decoder["input_ids"],
            "decoder_attention_mask": mask,
        }
        if self._image_source:
            layout, arguments["pixel_values"] = self._prepare_image(inputs, parameter)
            batch = arguments["pixel_values"].shape[0]
        else:
            config = self.model.get_encoder().config
            source = prepare_text(
                inputs,
                max_tokens=_max_tokens(config),
                vocab_size=config.vocab_size,
                device=device,
                token_types=False,
            )
            arguments.update(source)
            layout = TokenLayout.text(source["attention_mask"])
            batch = source["input_ids"].shape[0]
        if mask.shape[0] != batch:
            raise InputError(
                f"{batch} sources but {mask.shape[0]} decoder sequences; give one each"
            )
        return Prepared(batch_size=batch, layout=layout, arguments=arguments)

    def _prepare_image(self, inputs: Mapping, parameter: Tensor) -> tuple[TokenLayout, Tensor]:
        config = self.model.get_encoder().config
        if "pixel_values" not in inputs:
            raise InputError("a VisionEncoderDecoderModel takes pixel_values (B, 3, H, W)")
        images = validate_image_batch(inputs["pixel_values"], config.num_channels, parameter)
        side = config.image_size
        if tuple(images.shape[-2:]) != (side, side):
            raise InputError(
                f"this model takes {side}x{side} images, got "
                f"{images.shape[-2]}x{images.shape[-1]}; resize them (its image processor does)"
            )
        grid = side // config.patch_size
        prefix = num_prefix_tokens(self.model.get_encoder())
        return TokenLayout.image((grid, grid), (side, side), prefix), images

    def sets(self, prepared: Prepared) -> list[TokenSet]:
        """ "source": the encoder's tokens (text or image patches) and sites; "target": the
        decoder's tokens and sites. The two-set rules read both out at the explained
        decoder position, which the engine chooses per column."""
        encoder = len(self._encoder_blocks)
        readout = self.readout(prepared)
        target = TokenLayout.text(prepared.arguments["decoder_attention_mask"])
        return [
            TokenSet("source", range(encoder), prepared.layout, readout),
            TokenSet("target", range(encoder, len(self._sites)), target, readout),
        ]

    # -- model ----------------------------------------------------------------------------

    def forward(self, prepared: Prepared) -> Tensor:
        """Next-token logits at every decoder position, (B, T_target, vocabulary)."""
        return self.model(**prepared.arguments, use_cache=False).logits

    def readout(self, prepared: Prepared) -> Tensor:
        """One-hot at each sample's last real decoder position (the default explained one)."""
        mask = prepared.arguments["decoder_attention_mask"]
        return one_hot_rows(mask.shape[0], mask.shape[1], mask.sum(dim=1) - 1, self.parameter)


def _max_tokens(config: Any) -> int:
    """The longest sequence a stack takes (T5's relative positions have no limit)."""
    for key in ("max_position_embeddings", "n_positions"):
        value = getattr(config, key, None)
        if isinstance(value, int):
            return value
    return 1 << 30
