"""What every Hugging Face vision-language model shares: a vision tower whose patch
tokens become image tokens of a decoder-only language model, which answers in text.

The model runs as one stack of blocks for the recorder: the tower's blocks that feed the
language model (layers 0..V-1, stack "image") and then the language model's (V..V+L-1,
stack "text"), so that one backward reaches both, the language model's blocks first.

What differs per family is said by `ImageTokens`: how many image tokens each image puts
into the text, and `sources`, which tower tokens each of them was made from (LLaVA: one
tower token each; a pooling or merging projector: several). A relevance over the image
tokens maps back onto the tower's tokens through `sources` (each image token's relevance
shared out equally over the tower tokens it was made from), and onto the tower's patch grid by
dropping its prefix tokens (and putting the patches in row-major order, for a tower that
runs them in an order of its own: `ImageTokens.order`). The engine's plan for these
models is explain.engine.plans.image_text.
"""

from __future__ import annotations

import contextlib
import dataclasses
from abc import abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from explain.architectures.base import ImageTextModel, validate_image_batch
from explain.architectures.hf_attention_probe import dispatches_attention, probed_fused_path
from explain.architectures.hf_common import (
    attention_in,
    attnlrp_sites_of,
    eager_attention_flags,
    find_blocks,
    last_real_token,
    positions_from_mask,
    prepare_text,
    probabilities_at,
    recorded_output,
    sliced_logits,
)
from explain.architectures.hf_registries import finite_eager_masks
from explain.errors import ExplainError, InputError, UnsupportedModelError
from explain.finite import nonfinite_error
from explain.inputs import encode_image_prompt, is_image_prompt, token_strings
from explain.layout import (
    AttentionSite,
    FlagSetting,
    FusedPath,
    ImagePrepared,
    ImageTokens,
    Prepared,
    TokenLayout,
    TokenSet,
)
from explain.lrp.attnlrp import AttnLrpSites, Embedding

__all__ = ["DeviceCheck", "VisionLanguageModel", "block_sources"]


@dataclass(frozen=True)
class DeviceCheck:
    """A check of the inputs whose answer lies on the device: `holds` (a 0-d bool
    tensor), and the error to raise where it does not (made only then, so that its
    message may read the device). `VisionLanguageModel.prepare` reads every check of a
    call at once: one wait for the device instead of one per check."""

    holds: Tensor
    error: Callable[[], ExplainError]


def _heads(config: Any) -> int:
    """The attention heads a tower's or language model's `config` names."""
    heads = getattr(config, "num_attention_heads", None) or getattr(config, "num_heads", 1)
    return int(heads)


def block_sources(grid: tuple[int, int], block: int, device: torch.device) -> Tensor:
    """`ImageTokens.sources` of a projector that makes one image token of each block x
    block square of patches of a (gh, gw) patch grid, the tokens in raster order of the
    blocks (Qwen2-VL's merger, Gemma 3's pooling, Idefics3's pixel shuffle): row j holds
    the block^2 patches (row-major on the grid) of block j."""
    gw = grid[1]
    corners = torch.arange(grid[0] // block)[:, None] * block * gw
    corners = (corners + torch.arange(gw // block)[None, :] * block).flatten()
    inside = (torch.arange(block)[:, None] * gw + torch.arange(block)[None, :]).flatten()
    return (corners[:, None] + inside[None, :]).to(device)


class VisionLanguageModel(ImageTextModel):
    """The adapter contract of a vision-language model (module docstring).

    Subclasses give the tower and language-model stacks, the tower blocks the language
    model reads, the image token id and the `ImageTokens` of their projector; a family
    whose image inputs or positions differ (Qwen2-VL: flattened patches with their grids,
    multimodal rotary positions) says so in `image_arguments` and `position_ids`. Inputs
    are the processor's output: `input_ids` with each image's run of image tokens,
    `attention_mask` (left or right padding) and `pixel_values` (one row per image, in
    the order the images appear); or, with the processor as the Explainer's tokenizer, an
    image prompt (`is_image_prompt`).
    """

    reads_images: ClassVar[bool] = True
    token_types: ClassVar[bool] = False
    """Whether the model takes `token_type_ids` (PaliGemma: 0 for the image-and-prompt
    prefix, attended bidirectionally; 1 for the answer)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        tower, language = self.tower, self.language_model
        record = recorded_output(language, "attentions")
        vision_record = recorded_output(tower, "attentions")
        if record is None or vision_record is None:
            raise UnsupportedModelError(
                f"{type(model).__name__}: its tower or language model does not name its "
                "attention modules (_can_record_outputs)"
            )
        tower_blocks = find_blocks(tower)
        self._tower_blocks = tower_blocks[: self.tower_depth(len(tower_blocks))]
        self._lm_blocks = find_blocks(language)
        self._sites: list[AttentionSite] = []
        for stack, blocks, rec in (
            ("image", self._tower_blocks, vision_record),
            ("text", self._lm_blocks, record),
        ):
            for block in blocks:
                module = attention_in(block, rec)
                if module is None:
                    raise UnsupportedModelError(f"{type(block).__name__} has no attention module")
                self._sites.append(
                    AttentionSite(len(self._sites), module, probabilities_at(rec[1]), stack=stack)
                )
        self.vocab_size = language.get_input_embeddings().num_embeddings

    # -- what a family says -------------------------------------------------------------

    # The defaults are where transformers' vision-language classes keep these (LLaVA,
    # PaliGemma, Gemma 3, Qwen2-VL's language model); a family overrides what differs.

    @property
    def tower(self) -> nn.Module:
        """The vision tower (a transformers vision model that records its outputs)."""
        return self.model.model.vision_tower

    @property
    def language_model(self) -> nn.Module:
        """The decoder stack (a transformers text model that records its outputs)."""
        return self.model.model.language_model

    def tower_depth(self, num_blocks: int) -> int:
        """How many of the tower's `num_blocks` blocks feed the language model (a tower
        read at an inner layer leaves the blocks after it out of the graph); by default
        all of them: the projector reads the tower's last hidden state."""
        return num_blocks

    @property
    def tower_embedding(self) -> nn.Module:
        """The tower's patch embedding: the module whose output holds each image's patches
        as they enter the tower, before any position or class token is added (a
        convolution's (images, D, gh, gw), or flattened patches (patches, D) in the
        tower's order); by default the tower's input embeddings."""
        return self.tower.get_input_embeddings()

    @property
    def image_token_id(self) -> int:
        """The token id that stands for one image token in the text."""
        return int(self.model.config.image_token_id)

    @abstractmethod
    def image_tokens(self, arguments: Mapping[str, Tensor]) -> ImageTokens:
        """How each image of the prepared model `arguments` (their `image_arguments`)
        becomes image tokens (the same for all)."""

    def image_arguments(
        self, inputs: Mapping[str, Any]
    ) -> tuple[dict[str, Tensor], int, list[DeviceCheck]]:
        """The model's image inputs from the processor's output, validated, how many images
        they hold, and the checks whose answers lie on the device, which `prepare` reads
        with its own at once: here `pixel_values`, one (3, H, W) row per image, and no
        such check. A family leaves the finiteness of `pixel_values` to `prepare` too."""
        pixels = validate_image_batch(inputs["pixel_values"], 3, self.parameter, check_values=False)
        return {"pixel_values": pixels}, pixels.shape[0], []

    def position_ids(self, arguments: Mapping[str, Tensor], tokens: ImageTokens) -> Tensor:
        """The language model's positions, for the prepared `arguments` whose images become
        image tokens as `tokens` says: each text's real tokens counted from 0 (left
        padding skipped)."""
        return positions_from_mask(arguments["attention_mask"])

    # -- the stacks ---------------------------------------------------------------------

    @property
    def blocks(self) -> Sequence[nn.Module]:
        return [*self._tower_blocks, *self._lm_blocks]

    @property
    def tower_layers(self) -> range:
        """The model-wide layer numbers of the tower's blocks."""
        return range(len(self._tower_blocks))

    @property
    def text_layers(self) -> range:
        """The model-wide layer numbers of the language model's blocks."""
        return range(len(self._tower_blocks), len(self._tower_blocks) + len(self._lm_blocks))

    def attention_sites(self) -> Sequence[AttentionSite]:
        return self._sites

    def path_flags(self) -> Sequence[FlagSetting]:
        return eager_attention_flags(self.model)

    def attnlrp_sites(self) -> AttnLrpSites:
        """Where AttnLRP and CP-LRP attach: every block's rules, the tower's and the
        language model's, found as in any transformers model (`attnlrp_sites_of`); the
        relevance read at the language model's `inputs_embeds` (the image features
        scattered in among the word embeddings) and, at depth "tower", on at the tower's
        patch embeddings (`tower_embedding`)."""
        patches = self.tower_embedding
        return attnlrp_sites_of(
            self.model,
            [site.module for site in self._sites],
            embedding=self.language_model,
            embedding_argument="inputs_embeds",
            tower=Embedding(patches, axis=1 if isinstance(patches, nn.Conv2d) else -1),
        )

    def path_context(self) -> AbstractContextManager[Any]:
        """The eager masks of a float64 model kept finite (hf_registries): a left-padded
        prompt's pads would otherwise make every token's logits NaN."""
        return finite_eager_masks()

    def fused_path(self) -> FusedPath | None:
        """sdpa for the tower and the language model alike, q, k, v seen through the
        attention interface (hf_attention_probe), where every attention module
        dispatches through it: long image-token sequences then fold by chunks of rows."""
        modules = [site.module for site in self._sites]
        if not dispatches_attention(self.model, modules):
            return None
        path = probed_fused_path(modules, self.path_flags())
        if not self.token_types:
            return path
        # Token types open bidirectional blocks (an image, a prefix) inside the causal
        # text: the kernel then gets the whole mask, causality included, and the
        # recomputation must add none of its own.
        sites = [dataclasses.replace(site, causal=False) for site in path.sites]
        return dataclasses.replace(path, sites=sites)

    # -- inputs -------------------------------------------------------------------------

    def encode(self, inputs: object, tokenizer: Any) -> object:
        """An image prompt (explain.inputs) put through the processor (the
        Explainer's tokenizer) and its chat template, left-padded; anything else as given."""
        if not is_image_prompt(inputs):
            return inputs
        return encode_image_prompt(inputs, tokenizer)

    def prepare(self, inputs: object) -> ImagePrepared:
        """The inputs validated (`prepare_text`, `image_arguments`), and where each text's
        image tokens lie. Every check of the pixels and the image tokens is read from the
        device at once (one wait), each refusal then said precisely."""
        if isinstance(inputs, Mapping) and "pixel_values" not in inputs:
            raise InputError(
                "a vision-language model is explained with its image: give pixel_values "
                "(the processor's output), or an image prompt with the processor as the "
                "Explainer's tokenizer"
            )
        if self.token_types and isinstance(inputs, Mapping) and "token_type_ids" not in inputs:
            raise InputError(
                f"{type(self.model).__name__} takes token_type_ids (which tokens attend "
                "both ways): give the processor's whole output"
            )
        arguments = prepare_text(
            inputs,
            max_tokens=1 << 62,
            vocab_size=self.vocab_size,
            device=self.parameter.device,
            token_types=self.token_types,
            type_vocab_size=2,
        )
        assert isinstance(inputs, Mapping)
        images, count, checks = self.image_arguments(inputs)
        arguments.update(images)
        ids, mask = arguments["input_ids"], arguments["attention_mask"]
        tokens = self.image_tokens(arguments)
        is_image = (ids == self.image_token_id) & mask.bool()
        counts = is_image.sum(dim=1)
        pixels = arguments["pixel_values"]

        def not_finite() -> ExplainError:
            found = nonfinite_error(
                pixels,
                f"the pixel values (as the model's {self.parameter.dtype})",
                "give normalised images, finite and within the range of the model's dtype",
            )
            assert found is not None  # the device said so
            return found

        def uneven() -> ExplainError:
            return InputError(
                f"every text must hold the same number of images, each a run of "
                f"{tokens.per_image} image tokens (id {self.image_token_id}); got "
                f"{counts.tolist()} image tokens: use the model's processor"
            )

        checks = [
            DeviceCheck(pixels.isfinite().all(), not_finite),
            *checks,
            DeviceCheck(((counts % tokens.per_image == 0) & (counts == counts[0])).all(), uneven),
        ]
        # One wait for the device: every check's flag and the first text's count, packed
        # into one integer; the first failing check then says what it found.
        flags = sum(check.holds.long() << bit for bit, check in enumerate(checks))
        state = int(flags + (counts[0] << len(checks)))
        for bit, check in enumerate(checks):
            if not state >> bit & 1:
                raise check.error()
        held = state >> len(checks)
        if held == 0:
            raise InputError("the texts hold no image token: put the image in the prompt")
        if held // tokens.per_image * ids.shape[0] != count:
            raise InputError(
                f"the texts hold {held // tokens.per_image * ids.shape[0]} images but "
                f"pixel_values {count}: one row of pixel_values per image"
            )
        arguments["position_ids"] = self.position_ids(arguments, tokens)
        order = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
        # real image positions first, in order (a stable sort keeps their order)
        image_at = torch.sort(torch.where(is_image, order, ids.shape[1] + order), dim=1).values
        return ImagePrepared(
            batch_size=ids.shape[0],
            layout=TokenLayout.text(mask),
            arguments=arguments,
            tokens=tokens,
            image_at=image_at[:, :held],
        )

    def repeated(self, prepared: Prepared, copies: int) -> ImagePrepared:
        """`Adapter.repeated`, and where each copy's image tokens lie."""
        assert isinstance(prepared, ImagePrepared)
        repeated = super().repeated(prepared, copies)
        return dataclasses.replace(
            repeated,
            image_at=prepared.image_at.repeat(copies, 1),  # type: ignore[call-arg]
        )

    def continued(self, extra: Mapping[str, Tensor], count: int) -> dict[str, Tensor]:
        """The model's other per-prompt inputs (`extra`: pixel values, token types) for the
        prompts followed by `count` generated tokens; a family whose extra inputs run
        along the tokens extends them as its generation does."""
        return dict(extra)

    @contextlib.contextmanager
    def generating(self) -> Iterator[None]:
        """Around the model's own `generate`: what it leaves on the model, put back as
        found (nothing here; a family whose generation caches state on the model says)."""
        yield

    def attention_maps(self, prepared: Prepared) -> list[tuple[int, int, int]]:
        """The tower's blocks over each image of its batch (a photo's tiles each one),
        and the language model's over the texts: a photo's tower maps are often the
        larger (Qwen2-VL's thousands of patches against its hundreds of image tokens)."""
        assert isinstance(prepared, ImagePrepared)
        tokens = prepared.tokens
        batch = prepared.batch_size
        images = batch * prepared.image_at.shape[1] // tokens.per_image
        tower_maps = images * _heads(self.tower.config)
        text_maps = batch * _heads(self.language_model.config)
        return [
            (len(self._tower_blocks), tower_maps, tokens.tower_tokens),
            (len(self._lm_blocks), text_maps, prepared.layout.num_tokens),
        ]

    def image_layout(self, prepared: Prepared) -> TokenLayout:
        """The layout of the image set: the photo's patch grid (the tower's, or its tiles'
        side by side) on the processed photo."""
        assert isinstance(prepared, ImagePrepared)
        tokens = prepared.tokens
        return TokenLayout.image(tokens.photo_grid, tokens.input_size, num_prefix_tokens=0)

    def sets(self, prepared: Prepared) -> Sequence[TokenSet]:
        """The image set ("image", over the tower's blocks; its readout comes from the
        language model's fold) and the text set ("text", read out at the last token)."""
        image = TokenSet(
            "image",
            self.tower_layers,
            self.image_layout(prepared),
            torch.zeros(0, device=self.parameter.device),
        )
        text = TokenSet("text", self.text_layers, prepared.layout, self.readout(prepared))
        return [image, text]

    def to_input_space(self, token_relevance: Tensor, layout: TokenLayout) -> Tensor:
        """Text: pads 0. Image: (..., k, tokens) -> (..., gh, gw), or (..., k, gh, gw) with
        several images per text (the plan hands the image set over each photo's tokens,
        `ImageTokens.to_photo`, the patch grid last)."""
        if layout.modality == "text":
            return layout.unpadded(token_relevance)
        assert layout.grid is not None
        gh, gw = layout.grid
        patches = token_relevance[..., -gh * gw :]
        grid = patches.reshape(*patches.shape[:-1], gh, gw)
        return grid[..., 0, :, :] if grid.shape[-3] == 1 else grid

    def token_strings(self, prepared: Prepared, tokenizer: Any) -> list[list[str]] | None:
        text = getattr(tokenizer, "tokenizer", tokenizer)  # a processor holds its tokenizer
        return token_strings(text, prepared.arguments["input_ids"])

    # -- running ------------------------------------------------------------------------

    def model_arguments(self, arguments: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """The prepared `arguments` that the model's forward (and its `generate`) takes:
        all of them, unless a family keeps what describes its inputs among them (Idefics3:
        the photos' tile layout), which travels with a generation but is not the model's."""
        return dict(arguments)

    def logits_at(self, prepared: Prepared, positions: Tensor | slice) -> Tensor:
        arguments = self.model_arguments(prepared.arguments)
        if isinstance(positions, slice):
            return sliced_logits(self.model, arguments, positions, keeps_logits=True)
        keep = positions.unique()
        logits = self.model(**arguments, use_cache=False, logits_to_keep=keep).logits
        index = torch.searchsorted(keep, positions.contiguous())
        rows = torch.arange(positions.shape[0], device=positions.device)[:, None]
        return logits[rows, index]

    def forward(self, prepared: Prepared) -> Tensor:
        last = last_real_token(prepared.arguments["attention_mask"])
        return self.logits_at(prepared, last[:, None])[:, 0]

    def readout(self, prepared: Prepared) -> Tensor:
        return self.readout_at(prepared, last_real_token(prepared.arguments["attention_mask"]))
