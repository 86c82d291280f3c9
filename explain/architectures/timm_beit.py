"""timm's Beit family: BEiT and BEiT v2 (relative position bias in every block).

Beit's blocks are read like timm's ViT blocks (`TimmBlocks`): the
probabilities are the output of `attn.attn_drop` on the explicit path, where the
relative position bias has been added before the softmax. There is no fused path: with
a q bias the qkv projection runs as a function (no module outputs q, k and v) and the
bias enters the kernel as a mask no module shows, so `attention_path="fused"` is refused
and "auto" runs the explicit path. The LRP methods have no rules for Beit's blocks, and
AttnLRP and CP-LRP cannot attach: Beit calls F.linear with qkv's weight, so no module
outputs q, k and v for their rules.
"""

from __future__ import annotations

from torch import nn

from explain.architectures.timm_vit import TimmBlocks, is_timm_class

__all__ = ["TimmBeit"]


class TimmBeit(TimmBlocks):
    family = "timm Beit (BEiT, BEiT v2: relative position bias; class-token or patch-mean readout)"

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        return is_timm_class(model, "Beit")
