"""Hugging Face `Idefics3ForConditionalGeneration` (and SmolVLM, its subclass in
explain.architectures.hf_smolvlm): a SigLIP-like tower over square tiles and the whole
photo downscaled (the global image), a connector that pixel-shuffles each tile's patches
into fewer image tokens, and a Llama language model. Relevance goes back through the
shuffle onto the tiles, put together on the photo with the global image shared out over
them; the tile layout is read from the text's `<row_i_col_j>` tokens. docs/multimodal.md
("Idefics3 and SmolVLM") says how.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from explain.architectures.base import validate_image_batch
from explain.architectures.hf_common import is_transformers_class
from explain.architectures.hf_vision_language import DeviceCheck, VisionLanguageModel, block_sources
from explain.errors import InputError
from explain.layout import ImageTokens

__all__ = ["HFIdefics3", "tile_layout"]

_TILE = re.compile(r"<row_(\d+)_col_(\d+)>")
_GLOBAL_IMAGE = "<global-img>"  # both processors' tag before a photo's global image
_LAYOUT = ("rows", "cols")


def tile_layout(
    input_ids: Tensor, tokenizer: Any
) -> tuple[list[list[int]], list[list[int]]] | None:
    """(rows, cols) of every photo of every text, read from the `<row_i_col_j>` tokens
    that Idefics3's and SmolVLM's processors write before each tile (a photo ends at its
    `<global-img>` tag; one without tiles is (0, 0)); None when `tokenizer` (a processor
    or its tokenizer) cannot tell, or no text holds the tag."""
    text = getattr(tokenizer, "tokenizer", tokenizer)
    if not hasattr(text, "convert_ids_to_tokens"):
        return None
    rows: list[list[int]] = []
    cols: list[list[int]] = []
    known = len(text)
    for sample in input_ids.tolist():
        rows.append([])
        cols.append([])
        row = col = 0
        # An id the tokenizer does not know (a negative one overflows it) is no tile tag;
        # the model's vocabulary check then names it.
        for token in text.convert_ids_to_tokens([i for i in sample if 0 <= i < known]):
            if token == _GLOBAL_IMAGE:
                rows[-1].append(row)
                cols[-1].append(col)
                row = col = 0
            elif isinstance(token, str) and (found := _TILE.fullmatch(token)):
                row, col = max(row, int(found[1])), max(col, int(found[2]))
    if not any(rows):
        return None
    return rows, cols


class HFIdefics3(VisionLanguageModel):
    family = (
        "Hugging Face Idefics3 (Idefics3ForConditionalGeneration: photos split into tiles "
        "and a global image, SigLIP tower, pixel-shuffled image tokens, Llama language "
        "model; the next token and generated answers, over the photo and the prompt)"
    )

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        return is_transformers_class(model, "idefics3", ("Idefics3ForConditionalGeneration",))

    @property
    def tower(self) -> nn.Module:
        return self.model.model.vision_model

    @property
    def language_model(self) -> nn.Module:
        return self.model.model.text_model

    @property
    def tower_embedding(self) -> nn.Module:
        """The patch convolution (the tower's input embeddings add the positions to it)."""
        return self.tower.embeddings.patch_embedding

    @property
    def _shuffle(self) -> int:
        return int(self.model.config.scale_factor)

    def encode(self, inputs: object, tokenizer: Any) -> object:
        """An image prompt through the processor, as every vision-language model; then,
        where the inputs do not say it, the tile layout read from their tokens with the
        Explainer's tokenizer (`tile_layout`)."""
        encoded = super().encode(inputs, tokenizer)
        if not isinstance(encoded, Mapping) or "input_ids" not in encoded:
            return encoded
        if any(name in encoded for name in _LAYOUT) or tokenizer is None:
            return encoded
        ids = encoded["input_ids"]
        layout = tile_layout(ids, tokenizer) if isinstance(ids, Tensor) else None
        if layout is None:
            return encoded
        return {**encoded, "rows": layout[0], "cols": layout[1]}

    def _layout(
        self, inputs: Mapping[str, Any], batch: int
    ) -> tuple[Tensor, Tensor, tuple[int, int]]:
        """`rows` and `cols` (B, photos) of the inputs, validated, and the one (rows, cols)
        of every photo."""
        if any(inputs.get(name) is None for name in _LAYOUT):
            raise InputError(
                f"{type(self.model).__name__} splits each photo into tiles, a layout its "
                "processor does not return: give the processor as the Explainer's tokenizer "
                "(the layout is read from the <row_i_col_j> tokens), or add rows and cols, "
                "per text a list of each photo's tiles (the image processor's output with "
                "return_row_col_info=True)"
            )
        try:
            rows, cols = (
                torch.as_tensor(inputs[name], dtype=torch.long, device="cpu") for name in _LAYOUT
            )
        except (TypeError, ValueError):
            raise InputError(
                "rows and cols give each text's photos' tiles (lists of ints, as many per "
                f"text): every text must hold the same number of photos; got "
                f"{inputs['rows']!r} and {inputs['cols']!r}"
            ) from None
        if rows.dim() != 2 or rows.shape != cols.shape or rows.shape[0] != batch:
            raise InputError(
                f"rows and cols must be ({batch}, photos), one list per text; got shapes "
                f"{tuple(rows.shape)} and {tuple(cols.shape)}"
            )
        # A few numbers, checked on the host: one read of them (none for the lists the
        # Explainer's tokenizer reads the layout into).
        tiles = list(zip(*torch.stack([rows, cols]).flatten(1).tolist(), strict=True))
        if not tiles or any((r == 0) != (c == 0) or r < 0 for r, c in tiles):
            raise InputError(
                f"rows and cols must be positive, or both 0 for a photo not split; got "
                f"{rows.tolist()} and {cols.tolist()}"
            )
        if any(tile != tiles[0] for tile in tiles):
            raise InputError(
                f"the photos of a batch must be split alike (one map size to stack), got "
                f"rows {rows.tolist()} and cols {cols.tolist()}: explain photos of other "
                "shapes apart, or give the processor do_image_splitting=False"
            )
        # Kept on the host: only the host reads them (the model does not take them).
        return rows, cols, tiles[0]

    def image_arguments(
        self, inputs: Mapping[str, Any]
    ) -> tuple[dict[str, Tensor], int, list[DeviceCheck]]:
        """`pixel_values` (B, images, 3, t, t): each text's tiles and global images (all-zero
        images pad a text with fewer, and the model drops them), `pixel_attention_mask`
        where given, and the tile layout `rows`, `cols` (B, photos); the images each text
        holds, and the pixel mask's cover, checked with `prepare`'s checks."""
        pixels = inputs["pixel_values"]
        if not isinstance(pixels, Tensor) or pixels.dim() != 5:
            shape = tuple(pixels.shape) if isinstance(pixels, Tensor) else type(pixels).__name__
            raise InputError(
                f"{type(self.model).__name__} takes pixel_values (B, images, 3, H, W), each "
                f"text's tiles and global images; got {shape}: give the processor's output"
            )
        batch, count = pixels.shape[:2]
        flat = validate_image_batch(pixels.flatten(0, 1), 3, self.parameter, check_values=False)
        side = flat.shape[-1]
        block = int(self.tower.config.patch_size) * self._shuffle
        if flat.shape[-2] != side or side % block:
            raise InputError(
                f"the tiles must be square, a whole number of {block}-pixel blocks (patch "
                f"size x scale factor), got {tuple(flat.shape[-2:])}: give the processor's output"
            )
        real = (flat != 0).flatten(1).any(dim=1).reshape(batch, count)
        arguments = {"pixel_values": flat.reshape(pixels.shape)}
        rows, cols, (tile_rows, tile_cols) = self._layout(inputs, batch)
        checks = []
        mask = inputs.get("pixel_attention_mask")
        if mask is not None:
            mask = torch.as_tensor(mask, device=flat.device)
            if mask.shape != (batch, count, side, side):
                raise self._partial_tiles(batch, count, side)
            arguments["pixel_attention_mask"] = mask
            partial = functools.partial(self._partial_tiles, batch, count, side)
            checks.append(DeviceCheck(mask[real].bool().all(), partial))
        tiles = tile_rows * tile_cols
        expected = rows.shape[1] * (tiles + 1 if tiles else 1)
        held = real.sum(dim=1)

        def layout_differs() -> InputError:
            return InputError(
                f"the tile layout ({rows.shape[1]} photos per text, {tile_rows} x "
                f"{tile_cols} tiles each, and a global image) says {expected} images "
                f"per text, pixel_values holds {held.tolist()} (the model drops all-zero "
                "images): give the layout of these pixels"
            )

        checks.append(DeviceCheck((held == expected).all(), layout_differs))
        # every text holds `expected` images where the checks pass
        return {**arguments, "rows": rows, "cols": cols}, batch * expected, checks

    @staticmethod
    def _partial_tiles(batch: int, count: int, side: int) -> InputError:
        return InputError(
            "explain reads whole tiles: pixel_attention_mask must be "
            f"({batch}, {count}, {side}, {side}) and keep every pixel of every image "
            "(the processor pads only with images it leaves out)"
        )

    def image_tokens(self, arguments: Mapping[str, Tensor]) -> ImageTokens:
        side = arguments["pixel_values"].shape[-1]
        grid = side // int(self.tower.config.patch_size)
        sources = block_sources((grid, grid), self._shuffle, arguments["pixel_values"].device)
        # host tensors (`_layout`): read without a wait for the device
        rows, cols = arguments["rows"][0, 0].tolist(), arguments["cols"][0, 0].tolist()
        size = (rows * side, cols * side) if rows else (side, side)
        return ImageTokens(
            grid=(grid, grid), tower_prefix=0, sources=sources, input_size=size, tiles=(rows, cols)
        )

    def model_arguments(self, arguments: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """All but the tile layout, which the model does not take."""
        return {name: value for name, value in arguments.items() if name not in _LAYOUT}
