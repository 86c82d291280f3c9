"""Hugging Face `Qwen2VLForConditionalGeneration`: a ViT tower over the patches of a photo
resized to whole 2 x 2 blocks, a merger that makes one image token of each block, and a
Qwen2 language model with multimodal rotary positions. The patches arrive flattened,
block by block (`image_grid_thw` per image); an image token's relevance is shared out
over its block's 4 patches onto the patch grid. At depth "tower" its packed tower is
recorded piece by piece (explain.architectures.hf_packed_attention). docs/multimodal.md
("Vision-language models") says how.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import Tensor, nn

from explain.architectures.hf_attention_probe import (
    IMPLEMENTATION,
    dispatches_attention,
    probed_fused_path,
)
from explain.architectures.hf_common import is_transformers_class
from explain.architectures.hf_packed_attention import packed_recording, packed_sites
from explain.architectures.hf_vision_language import DeviceCheck, VisionLanguageModel, block_sources
from explain.errors import ExplainError, InputError
from explain.layout import (
    AttentionSite,
    FlagSetting,
    FusedPath,
    ImagePrepared,
    ImageTokens,
    Prepared,
)

__all__ = ["HFQwen2VL"]


class HFQwen2VL(VisionLanguageModel):
    family = (
        "Hugging Face Qwen2-VL (Qwen2VLForConditionalGeneration: 2 x 2 merged patches, "
        "multimodal rotary positions; the next token and generated answers, over the image "
        "and the prompt; depths 'lm' and 'tower')"
    )

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        sites = super().attention_sites()
        self._tower_attention = [site.module for site in sites if site.stack == "image"]
        packed = iter(packed_sites(self._tower_attention, first_layer=0))
        self._packed_sites = [
            dataclasses.replace(site, recomputed=next(packed)) if site.stack == "image" else site
            for site in sites
        ]

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        return is_transformers_class(model, "qwen2_vl", ("Qwen2VLForConditionalGeneration",))

    @property
    def tower(self) -> nn.Module:
        return self.model.model.visual

    @property
    def _merge_size(self) -> int:
        return int(self.tower.config.spatial_merge_size)

    # -- the packed tower (explain.architectures.hf_packed_attention) ---------------------

    def attention_sites(self) -> Sequence[AttentionSite]:
        """The tower's blocks recomputed from their pieces, the language model's as seen."""
        return self._packed_sites

    def path_flags(self) -> Sequence[FlagSetting]:
        """Eager for the language model; the tower's pieces through the probing wrapper."""
        vision = self.tower.config
        return [
            FlagSetting(flag.owner, flag.name, IMPLEMENTATION) if flag.owner is vision else flag
            for flag in super().path_flags()
        ]

    @contextlib.contextmanager
    def path_context(self) -> Iterator[None]:
        """The language model's finite eager masks, and the tower's packed recording."""
        with super().path_context(), self._packed_recording():
            yield

    def _packed_recording(self) -> AbstractContextManager[Any]:
        projections = [module.proj for module in self._tower_attention]
        return packed_recording(self.tower, self._tower_attention, projections)

    def fused_path(self) -> FusedPath | None:
        """sdpa for the language model, q, k, v seen through the attention interface
        (hf_attention_probe); the tower recorded from its pieces as on the explicit path."""
        text = [site.module for site in self._packed_sites if site.stack == "text"]
        if not dispatches_attention(self.model, [*self._tower_attention, *text]):
            return None
        path = probed_fused_path(text, self.path_flags())
        offset = len(self._tower_attention)
        tower = [site.recomputed for site in self._packed_sites if site.recomputed is not None]
        sites = [*tower, *(dataclasses.replace(s, layer=s.layer + offset) for s in path.sites)]
        return dataclasses.replace(path, sites=sites, context=self._packed_recording)

    def image_arguments(
        self, inputs: Mapping[str, Any]
    ) -> tuple[dict[str, Tensor], int, list[DeviceCheck]]:
        """`pixel_values` (N, 3 * t * p * p) flattened patches and `image_grid_thw` (k, 3),
        every image one frame on one grid of whole 2 x 2 blocks (checked on the host: the
        grids are a few numbers, read once)."""
        if inputs.get("pixel_values_videos") is not None:
            raise InputError(f"{type(self.model).__name__}: videos are not explained, images are")
        grid = inputs.get("image_grid_thw")
        pixels = inputs["pixel_values"]
        if not isinstance(grid, Tensor) or grid.dim() != 2 or grid.shape[1] != 3:
            raise InputError(
                "Qwen2-VL takes image_grid_thw (k, 3) with its pixel_values: give the "
                "processor's whole output"
            )
        config = self.tower.config
        width = config.in_channels * config.temporal_patch_size * config.patch_size**2
        if not isinstance(pixels, Tensor) or pixels.dim() != 2 or pixels.shape[1] != width:
            shape = tuple(pixels.shape) if isinstance(pixels, Tensor) else type(pixels).__name__
            raise InputError(
                f"Qwen2-VL takes pixel_values of flattened patches (N, {width}), got {shape}: "
                "give the processor's output"
            )
        if not pixels.is_floating_point():
            raise InputError(f"pixel_values must be floating point, got {pixels.dtype}")
        grids = grid.long().tolist()  # one read of the few numbers every check needs
        if not grids or any(g[0] != 1 or g != grids[0] for g in grids):
            raise InputError(
                f"every image must be one frame on the same patch grid (one photo size), got "
                f"image_grid_thw {grids}: resize the photos alike"
            )
        patches = len(grids) * grids[0][1] * grids[0][2]
        if patches != pixels.shape[0]:
            raise InputError(
                f"pixel_values holds {pixels.shape[0]} patches but image_grid_thw says {patches}"
            )
        grid = grid.to(device=self.parameter.device, dtype=torch.long)
        pixels = pixels.to(device=self.parameter.device, dtype=self.parameter.dtype)
        checks = self._grid_orientation(pixels, len(grids), grids[0][1], grids[0][2])
        return {"pixel_values": pixels, "image_grid_thw": grid}, len(grid), checks

    def _grid_orientation(
        self, pixels: Tensor, images: int, rows: int, columns: int
    ) -> list[DeviceCheck]:
        """The check that `image_grid_thw` has height and width the right way round, where
        the pixels can tell: its patch count is the same either way, and so are the four
        patches of each merged block, but the blocks' neighbours are not. A photo's blocks
        meet the blocks beside and below them far more smoothly than those they would
        meet were the grid transposed (measured on three photos at several sizes through
        the tiny processor and Qwen2-VL's own: 4.5 to 125 times); refused where the
        transposed grid's seams, across and down pooled, are twice as smooth. Pooling
        both directions checks a grid one block high or wide too (its seams run one way
        only, the transposed grid's the other). Noise (as smooth either way) and a square
        grid (the same either way) pass."""
        m = self._merge_size
        if rows == columns or rows * columns <= m * m:
            return []
        config = self.tower.config
        p, frames = config.patch_size, config.temporal_patch_size
        # (image, block, patch row, patch column, channel, frame, pixel row, pixel column)
        blocks = pixels.reshape(images, -1, m, m, config.in_channels, frames, p, p)
        edges = {
            "bottom": blocks[:, :, m - 1, :, :, :, p - 1],  # each block's last pixel row
            "top": blocks[:, :, 0, :, :, :, 0],  # its first
            "right": blocks[:, :, :, m - 1, :, :, :, p - 1],  # its last pixel column
            "left": blocks[:, :, :, 0, :, :, :, 0],  # its first
        }
        count = blocks.shape[1]

        def seams(per_row: int) -> Tensor:
            """The mean step across the seams of the blocks laid out `per_row` a row."""
            down = edges["bottom"][:, :-per_row] - edges["top"][:, per_row:]
            across = edges["right"][:, :-1] - edges["left"][:, 1:]
            beside = (torch.arange(1, count, device=pixels.device) % per_row) != 0
            steps = torch.cat([down.flatten(), across[:, beside].flatten()])
            return steps.abs().float().mean()

        given, transposed = seams(columns // m), seams(rows // m)

        def transposed_grid() -> ExplainError:
            ratio = float(given / transposed)
            return InputError(
                f"image_grid_thw says each image is {rows} x {columns} patches (height x "
                f"width), but pixel_values' patches join up as {columns} x {rows}: their "
                f"edges meet {ratio:.1f} times more smoothly that way. Give image_grid_thw "
                "as the processor returned it, (1, height, width) per image"
            )

        return [DeviceCheck(given <= 2 * transposed, transposed_grid)]

    def block_order(self, grid: tuple[int, int]) -> Tensor:
        """The merged block (row-major on the merged grid) at each of the tower's block
        positions, for one image of `grid` patches: Qwen2-VL keeps them row-major."""
        m = self._merge_size
        return torch.arange((grid[0] // m) * (grid[1] // m))

    def tower_order(self, grid: tuple[int, int]) -> Tensor:
        """(gh * gw,): the patch (row-major on the grid) at each of the tower's token
        positions, for one image: the m x m patches of a block together, row-major inside
        it, the blocks in `block_order`."""
        m, columns = self._merge_size, grid[1] // self._merge_size
        block = self.block_order(grid).repeat_interleave(m * m)
        inside = torch.arange(m * m).repeat(len(block) // (m * m))
        rows = block // columns * m + inside // m
        return rows * grid[1] + block % columns * m + inside % m

    def image_tokens(self, arguments: Mapping[str, Tensor]) -> ImageTokens:
        _, h, w = arguments["image_grid_thw"][0].tolist()
        device = arguments["image_grid_thw"].device
        patches = block_sources((h, w), self._merge_size, device)
        patch = int(self.tower.config.patch_size)
        size = (h * patch, w * patch)
        order = self.tower_order((h, w)).to(device)
        position = torch.argsort(order)  # where the tower runs each patch
        return ImageTokens(
            grid=(h, w), tower_prefix=0, sources=position[patches], input_size=size, order=order
        )

    def _modalities(self, arguments: Mapping[str, Tensor]) -> Tensor:
        """mm_token_type_ids: 1 at the image tokens, 0 at text."""
        ids, mask = arguments["input_ids"], arguments["attention_mask"]
        return ((ids == self.image_token_id) & mask.bool()).to(torch.int32)

    def position_ids(self, arguments: Mapping[str, Tensor], tokens: ImageTokens) -> Tensor:
        """(3, B, T) multimodal rotary positions as the model computes them
        (`get_rope_index`), given to it so that its forward keeps no rope_deltas of ours,
        but for all texts at once and without reading the device (transformers' own reads
        every image's grid, text by text): each text's real tokens in order (left padding
        skipped, 0 there), a text token one after the token before it, the tokens of an
        image (one frame, its (gh, gw) merged blocks) at the image's start position s
        plus (0, row, column), and the text after an image from s + max(gh, gw) on."""
        ids, mask = arguments["input_ids"], arguments["attention_mask"]
        real = mask.bool()
        image = (ids == self.image_token_id) & real
        text = real & ~image
        m = self._merge_size
        rows, columns = tokens.grid[0] // m, tokens.grid[1] // m
        texts_before = text.cumsum(dim=1) - text.long()  # exclusive counts
        images_before = image.cumsum(dim=1) - image.long()
        # a text token follows whole images: its image tokens before are a multiple of n
        start = texts_before + images_before // tokens.per_image * max(rows, columns)
        within = torch.where(image, images_before % tokens.per_image, 0)
        positions = torch.stack([start, start + within // columns, start + within % columns])
        return (positions * real).to(ids.dtype)

    def repeated(self, prepared: Prepared, copies: int) -> ImagePrepared:
        """`VisionLanguageModel.repeated`, the (3, B, T) rotary positions repeated along
        their batch axis, the second (every other argument's batch comes first: the
        flattened patches of every image in order, with their grids)."""
        repeated = super().repeated(prepared, copies)
        arguments = dict(repeated.arguments)
        arguments["position_ids"] = prepared.arguments["position_ids"].repeat(1, copies, 1)
        return dataclasses.replace(repeated, arguments=arguments)

    def prepare(self, inputs: object) -> Prepared:
        """As every vision-language model, with `mm_token_type_ids` for the model's own
        generation, which computes its positions from them."""
        prepared = super().prepare(inputs)
        prepared.arguments["mm_token_type_ids"] = self._modalities(prepared.arguments)
        return prepared

    @contextlib.contextmanager
    def generating(self) -> Iterator[None]:
        """The model's `generate` caches the prompts' rotary offsets on it (`rope_deltas`),
        which a later forward without input_ids would read: put back as found."""
        inner = self.model.model
        found = inner.rope_deltas
        try:
            yield
        finally:
            inner.rope_deltas = found

    def continued(self, extra: Mapping[str, Tensor], count: int) -> dict[str, Tensor]:
        """The answer's tokens are text (modality 0); the image inputs stay as they are."""
        extended = dict(extra)
        types = extra.get("mm_token_type_ids")
        if types is not None:
            extended["mm_token_type_ids"] = torch.cat(
                [types, types.new_zeros(types.shape[0], count)], 1
            )
        return extended
