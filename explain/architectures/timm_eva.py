"""timm's Eva family: EVA and EVA-02 (rotary position embeddings, SwiGLU MLPs, sub-LN)
and the DINOv3 checkpoints timm builds on it (rotary embeddings, register tokens).

Eva's blocks are read like timm's ViT blocks (`TimmBlocks`): the
probabilities are the output of `attn.attn_drop` on the explicit path, after the rotary
embedding has been applied to q and k; the readout is the class token, the patch mean or
the attention pooling head's probe attention. AttnLRP and CP-LRP attach where they do
on timm's ViT blocks. There is no fused path: the rotary
embedding is applied to q and k inside the attention's forward, so no module outputs
the q and k that the fused kernel multiplies; `attention_path="fused"` is refused and
"auto" runs the explicit path. The LRP methods have no rules for Eva's blocks.
"""

from __future__ import annotations

from torch import nn

from explain.architectures.timm_vit import TimmBlocks, is_timm_class, timm_attnlrp_sites
from explain.lrp.attnlrp import AttnLrpSites

__all__ = ["TimmEva"]


class TimmEva(TimmBlocks):
    family = (
        "timm Eva (EVA, EVA-02 with rotary embeddings and SwiGLU, DINOv3 with register "
        "tokens; class-token, patch-mean or attention-pooling readout)"
    )

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        return is_timm_class(model, "Eva")

    def attnlrp_sites(self) -> AttnLrpSites:
        return timm_attnlrp_sites(self)
