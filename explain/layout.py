"""The data every package shares: what a family's adapter tells the engine and the rules
about a model and its inputs, as plain values. This module imports nothing of `explain`,
and every package may import it (docs/architecture.md).

- token layouts (`TokenLayout`, windowed blocks `WindowedBlock`), token sets
  (`TokenSet`) and prepared inputs (`Prepared`, a vision-language model's
  `ImagePrepared` with its `ImageTokens`);
- where attention is seen (`AttentionSite`, `FusedAttentionSite`, `FusedPath`,
  `Pieces`), the flags a call sets (`FlagSetting`) and the hooks it runs (`ModuleHook`,
  `InputHook`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn

__all__ = [
    "AttentionSite",
    "FlagSetting",
    "FusedAttentionSite",
    "FusedPath",
    "ImagePrepared",
    "ImageTokens",
    "InputHook",
    "Modality",
    "ModuleHook",
    "Pieces",
    "Prepared",
    "TokenLayout",
    "TokenSet",
    "WindowedBlock",
]

Modality = Literal["image", "text"]


ModuleHook = Callable[[nn.Module, tuple[Any, ...], dict[str, Any], Any], Any]
"""A forward hook (module, args, kwargs, output) -> None that only reads what it is given,
or -> a replacement output equal in value whose gradient follows a rule (explain.lrp.attnlrp)."""


@dataclass(frozen=True)
class InputHook:
    """A hook on a module's inputs, run before the module: `hook(module, args, kwargs)`
    -> None, or the (args, kwargs) to call it with instead (AttnLRP's embeddings read at
    a language model's `inputs_embeds`, explain.lrp.attnlrp)."""

    hook: Callable[
        [nn.Module, tuple[Any, ...], dict[str, Any]], tuple[tuple[Any, ...], dict[str, Any]] | None
    ]


@dataclass(frozen=True)
class AttentionSite:
    """Where one block's post-softmax attention probabilities can be seen in the forward.

    The recorder puts a forward hook on `module`; `probabilities(output)` picks the
    (B, H, N, N) tensor that the block multiplies with its values out of the module's output.

    Models with two token sets (dual encoders, encoder-decoders) have several stacks of
    blocks: `layer` is then unique over the whole model, `stack` names the block's stack
    (e.g. "image", "text", "source", "target") and `kind` is "self", or "cross" for
    attention whose keys come from another stack (queries (B, H, N_q, N_k)).
    """

    layer: int
    module: nn.Module
    probabilities: Callable[[Any], Tensor]
    stack: str = "main"
    kind: Literal["self", "cross"] = "self"
    seen_in: Literal["output", "input"] = "output"
    """Where the probabilities are: in the module's output (`probabilities` gets the
    output), or among its positional inputs (`probabilities` gets the args tuple), for a
    module the probabilities enter, such as a module that computes A @ V."""
    recomputed: FusedAttentionSite | None = None
    """Where the block's probabilities are no tensor of the model (a packed sequence
    attended piece by piece, explain.architectures.hf_packed_attention): the fused site
    whose q, k, v and output the recorder recomputes them from, and their gradient from
    dO (explain.engine.fused), on either path; `probabilities` is then never called."""


@dataclass(frozen=True)
class FlagSetting:
    """An attribute the session (explain.engine.session) sets for the duration of a call
    and then restores."""

    owner: object
    name: str
    value: object


@dataclass(frozen=True)
class Pieces:
    """A block's mask said by its shape: every sequence of the block's batch is cut into
    contiguous pieces of `lengths` tokens (alike in every sequence), and a token attends
    only within its own piece (a packed tower's windows,
    explain.architectures.hf_packed_attention). A fold then takes the pieces one by one
    (explain.engine.spread) and no (N x N) mask is ever built, unless a whole map is
    asked for (`dense`)."""

    lengths: tuple[int, ...]

    def dense(self, device: torch.device) -> Tensor:
        """(1, 1, N, N) bool: True where query and key lie in the same piece."""
        sizes = torch.tensor(self.lengths, device=device)
        piece = torch.arange(len(self.lengths), device=device).repeat_interleave(sizes)
        return (piece[:, None] == piece[None, :])[None, None]


@dataclass(frozen=True)
class FusedAttentionSite:
    """Where one block's q, k, v and attention output can be seen on the fused path.

    With a fused scaled-dot-product kernel the attention probabilities never exist as a
    tensor. They are recomputed from q and k, `A = softmax(q k^T * scale)`, and their
    gradient from v and the gradient of the attention output, `dA = dO v^T`. The recorder
    puts forward hooks on `query` and `key` (their outputs are q and k, (B, H, N, d),
    before the scale) and on `value` (`values(output)` picks v, (B, H, N, d), out of its
    output), and a forward pre-hook on `output`, whose first input is the attention output
    that `heads(x)` turns back into (B, H, N, d). Where the query and key modules output
    (B, N, H * d), `queries` and `keys` split the heads. Where the kernel takes an attention
    mask, a forward pre-hook on `mask_module` reads it with `masks(args, kwargs)`: a bool
    mask (True = attend) or an additive float mask that broadcasts to (B, H, N, N), a
    `Pieces`, or None.
    """

    layer: int
    query: nn.Module
    key: nn.Module
    value: nn.Module
    values: Callable[[Tensor], Tensor]
    output: nn.Module
    heads: Callable[[Tensor], Tensor]
    scale: float
    queries: Callable[[Tensor], Tensor] | None = None
    keys: Callable[[Tensor], Tensor] | None = None
    mask_module: nn.Module | None = None
    masks: Callable[[tuple[Any, ...], dict[str, Any]], Tensor | Pieces | None] | None = None
    causal: bool = False
    """Queries attend to keys at or before their own position only, on top of the mask:
    the recomputation then builds the causal mask by chunks of rows (never N x N) and
    skips the keys after a chunk's last row."""


@dataclass(frozen=True)
class FusedPath:
    """An adapter's fused-attention capability: its sites and the flags that keep the
    fused kernel on (and checkpointing off) for the duration of a call."""

    sites: Sequence[FusedAttentionSite]
    flags: Sequence[FlagSetting]
    context: Callable[[], AbstractContextManager[Any]] | None = None
    """What the path needs in place for the call besides its flags (an entry in a
    library's registry that a flag names), entered before the flags are set and exited
    after they are restored; None: nothing."""


@dataclass(frozen=True)
class WindowedBlock:
    """One block's view of its stage: a `grid` (rows, columns) of tokens in row-major
    order, cut into windows of `window` (rows, columns) tokens after rolling the grid by
    `-shift` (the cyclic shift, undone after the attention). Windows are numbered
    row-major over the grid, tokens row-major inside a window, as timm and transformers
    both partition them."""

    grid: tuple[int, int]
    window: tuple[int, int]
    shift: tuple[int, int]

    @property
    def num_tokens(self) -> int:
        return self.grid[0] * self.grid[1]

    @property
    def num_windows(self) -> int:
        return (self.grid[0] // self.window[0]) * (self.grid[1] // self.window[1])

    @property
    def window_tokens(self) -> int:
        return self.window[0] * self.window[1]


@dataclass(frozen=True)
class TokenLayout:
    """How the model's token sequence relates to the input.

    `token_mask` (B, N) marks the real tokens (False at padding); it is None when every
    token is real, as in images.
    """

    modality: Modality
    num_tokens: int
    num_prefix_tokens: int = 0
    grid: tuple[int, int] | None = None
    input_size: tuple[int, int] | None = None
    token_mask: Tensor | None = None
    windows: tuple[WindowedBlock, ...] = ()
    """A windowed, hierarchical model's blocks in forward order (Swin): `grid` is then the
    input patch grid (no prefix tokens), and between two consecutive blocks whose grids
    differ sits a patch merging (each grid half the one before); the readout row is over
    the last block's grid. Empty: every block attends over the layout's tokens."""

    def key_mask(self, batch: int, device: torch.device) -> Tensor:
        """(B, N) bool: the tokens a relevance map is over (patches, or real text tokens)."""
        if self.token_mask is not None:
            return self.token_mask.to(device=device, dtype=torch.bool)
        mask = torch.zeros(batch, self.num_tokens, dtype=torch.bool, device=device)
        mask[:, self.num_prefix_tokens :] = True
        return mask

    def last_block_keys(self, batch: int, device: torch.device) -> Tensor:
        """(B, N) bool over the last block's tokens, which the readout row is over: the
        keys a map of the last block averages over. `key_mask`, except for a windowed
        layout, whose last block runs on a smaller grid than the input's (every token of
        it a patch)."""
        if self.windows:
            tokens = self.windows[-1].num_tokens
            return torch.ones(batch, tokens, dtype=torch.bool, device=device)
        return self.key_mask(batch, device)

    @classmethod
    def image(
        cls, grid: tuple[int, int], input_size: tuple[int, int], num_prefix_tokens: int = 1
    ) -> TokenLayout:
        """The layout of an image: `num_prefix_tokens` (class, distillation, register
        tokens) followed by the patches of a `grid` in row-major order."""
        return cls(
            modality="image",
            num_tokens=num_prefix_tokens + grid[0] * grid[1],
            num_prefix_tokens=num_prefix_tokens,
            grid=(int(grid[0]), int(grid[1])),
            input_size=(int(input_size[0]), int(input_size[1])),
        )

    @classmethod
    def text(cls, mask: Tensor) -> TokenLayout:
        """The layout of a (B, T) text batch: every position a token, pads (mask 0) False."""
        return cls(modality="text", num_tokens=mask.shape[1], token_mask=mask.bool())

    def patch_grid(self, token_relevance: Tensor) -> Tensor:
        """(..., N) relevance over an image's tokens -> (..., gh, gw) over its patch grid
        (the prefix tokens, class and register tokens, dropped)."""
        assert self.grid is not None, "patch_grid needs an image layout"
        patches = token_relevance[..., self.num_prefix_tokens :]
        return patches.reshape(*patches.shape[:-1], *self.grid)

    def unpadded(self, token_relevance: Tensor) -> Tensor:
        """(B, ..., N) relevance over text tokens with every padding position exactly 0."""
        assert self.token_mask is not None, "unpadded needs a text layout"
        mask = self.token_mask
        shape = (mask.shape[0],) + (1,) * (token_relevance.dim() - 2) + (mask.shape[1],)
        return token_relevance * mask.reshape(shape).to(token_relevance.dtype)

    def to_input_space(self, token_relevance: Tensor) -> Tensor:
        """Token relevance on the input: an image's patch grid, or text tokens with pads 0."""
        if self.modality == "image":
            return self.patch_grid(token_relevance)
        return self.unpadded(token_relevance)


@dataclass(frozen=True)
class TokenSet:
    """One set of tokens whose relevance an explanation returns (`Explanation.relevances`).

    A single-stack model has one set, named after its modality; a dual encoder has
    "image" and "text" (each tower explained on its own), an encoder-decoder "source" and
    "target". `layers` are the model-wide numbers of the set's attention sites, `readout`
    (B, N) its readout row, and `default_start_layer` the start layer used when the caller
    gives none (None: the method's own default; -1: the set's last block).
    """

    name: str
    layers: range
    layout: TokenLayout
    readout: Tensor
    default_start_layer: int | None = None


@dataclass(frozen=True)
class Prepared:
    """Validated inputs on the model's device and in its dtype, with their token layout."""

    batch_size: int
    layout: TokenLayout
    arguments: dict[str, Tensor]


@dataclass(frozen=True)
class ImageTokens:
    """How one image's tower tokens become image tokens of the text, and where the tower's
    images lie on the photo.

    Most families run each photo through the tower as one image. Idefics3 and SmolVLM
    split it into `tiles` = (rows, cols) square tiles and add the whole photo downscaled to
    one tile (the global image), each its own image of the tower's batch: the tiles in
    raster order, then the global image. Their maps are put together on the photo's grid
    of tile patches (rows * gh, cols * gw): each tile's patches where the tile lies, and
    each patch of the global image, which covers rows x cols of those cells, shared out
    equally over them (the relevance is conserved).

    Attributes:
        grid: (gh, gw) the tower's patch grid (of each tile).
        tower_prefix: tokens before the patches in the tower (a class token: 1).
        sources: (n, m) long: row j holds the m tower tokens (in the tower's order) that
            image token j of the text was made from, each with an equal share (m = 1 for a
            projector that maps token by token); the same for every image of the tower's
            batch. Indices, not an (n x tower tokens) matrix: a photo of thousands of
            patches costs no square table.
        input_size: (H, W) pixels of the processed photo the photo's grid lies on.
        tiles: (rows, cols) of a photo split into tiles; (0, 0): not split, the tower's
            image is the photo.
        order: (gh * gw,) the patch (row-major on the grid) at each of the tower's patch
            positions, for a tower that runs its patches in an order of its own (Qwen2-VL:
            2 x 2 blocks contiguous; Qwen2.5-VL: window by window); None: row-major.
    """

    grid: tuple[int, int]
    tower_prefix: int
    sources: Tensor
    input_size: tuple[int, int]
    tiles: tuple[int, int] = (0, 0)
    order: Tensor | None = None

    @property
    def per_image(self) -> int:
        """Image tokens each image of the tower's batch puts into the text."""
        return self.sources.shape[0]

    @property
    def tower_tokens(self) -> int:
        return self.tower_prefix + self.grid[0] * self.grid[1]

    @property
    def tower_images(self) -> int:
        """Images of the tower's batch per photo: the tiles and the global image, or 1."""
        rows, cols = self.tiles
        return rows * cols + 1 if rows else 1

    @property
    def photo_grid(self) -> tuple[int, int]:
        """(gh, gw) of the map returned per photo: the tiles' patches side by side."""
        rows, cols = self.tiles
        if not rows:
            return self.grid
        return rows * self.grid[0], cols * self.grid[1]

    def to_tower(self, relevance: Tensor) -> Tensor:
        """(..., n) relevance over one image's image tokens -> (..., tower tokens): each
        image token's relevance shared out equally over its sources."""
        count = self.sources.shape[1]
        shares = (relevance / count).repeat_interleave(count, dim=-1)
        tower = relevance.new_zeros(*relevance.shape[:-1], self.tower_tokens)
        return tower.index_add_(-1, self.sources.flatten().to(relevance.device), shares)

    def in_grid_order(self, tower_relevance: Tensor) -> Tensor:
        """(..., tower tokens) in the tower's order -> the same with the patches in
        row-major order on the grid (the prefix tokens first, as they are)."""
        if self.order is None:
            return tower_relevance
        patches = tower_relevance[..., self.tower_prefix :]
        row_major = patches.index_select(-1, torch.argsort(self.order).to(patches.device))
        return torch.cat([tower_relevance[..., : self.tower_prefix], row_major], dim=-1)

    def to_photo(self, tower_relevance: Tensor) -> Tensor:
        """(..., k * tower images, tower tokens) in the tower's order -> (..., k, tokens on
        the photo): as it is for a photo that is one image of the tower (its prefix tokens
        kept, the patch grid last, row-major), else the tiles' patches side by side on the
        photo's grid, flattened, with the global image's patches shared out over the
        rows x cols cells each covers."""
        tower_relevance = self.in_grid_order(tower_relevance)
        rows, cols = self.tiles
        lead = tower_relevance.shape[:-2]
        if not rows:
            return tower_relevance.reshape(*lead, -1, self.tower_tokens)
        gh, gw = self.grid
        patches = tower_relevance[..., self.tower_prefix :]
        images = patches.reshape(*lead, -1, self.tower_images, gh, gw)
        tiles = images[..., : rows * cols, :, :].reshape(*lead, -1, rows, cols, gh, gw)
        tiles = tiles.transpose(-3, -2).reshape(*lead, -1, rows * gh, cols * gw)
        whole = images[..., -1, :, :] / (rows * cols)
        whole = whole.repeat_interleave(rows, dim=-2).repeat_interleave(cols, dim=-1)
        return (tiles + whole).flatten(-2)


@dataclass(frozen=True)
class ImagePrepared(Prepared):
    """A vision-language model's prepared inputs, with what its checks found out about
    the images, so that no later step reads the device again for it.

    Attributes:
        tokens: how each image becomes image tokens (the family's `image_tokens`).
        image_at: (B, k * n) each text's image-token positions, image by image.
    """

    tokens: ImageTokens
    image_at: Tensor
