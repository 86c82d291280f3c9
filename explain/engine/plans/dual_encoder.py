"""The plan of a dual encoder (CLIP): image and text relevance for the similarity of
each explained (image, text) pair.

Every explained pair is run as its own sample, so two images explained against the same
text never share a gradient; the single column is each pair's similarity logit. Each
tower gets the method on its own.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from explain.architectures.dual_encoder import DualEncoder
from explain.engine.passes import AttentionGradientPass, Columns, ForwardPass, Relevances
from explain.engine.plans.base import Plan
from explain.engine.session import Session
from explain.engine.targets import Request, resolve_targets
from explain.errors import TargetError
from explain.rules.registry import Method

__all__ = ["DualEncoderPlan"]


class DualEncoderPlan(Plan):
    """Image and text relevance for the similarity of each image with its text.

    The target chooses texts: None pairs image i with text i when there are as many texts
    as images, and otherwise explains each image's best-matching text (zero-shot
    classification over prompts); an int, B ints, a (B, K) tensor (K texts per image: the
    relevances get a K axis) or a callable on the (images, texts) similarity logits
    choose others. The score is the similarity logit.
    """

    serves = DualEncoder
    passes = frozenset({ForwardPass, AttentionGradientPass})
    refused_because = (
        "the LRP methods (AttnLRP and CP-LRP too) need relevance rules through the "
        "similarity of two towers, which explain does not have, and the methods that read "
        "the input embeddings (gradient_x_input, integrated_gradients, occlusion) one "
        "embedding module, where the towers have two"
    )
    trace_score = "logit"
    contrast_refused = "a dual encoder's target picks the text an image is paired with"

    adapter: DualEncoder

    def __init__(
        self, adapter: DualEncoder, spec: Method | None, request: Request, tokenizer: Any
    ) -> None:
        super().__init__(adapter, spec, request, tokenizer)
        if self.score != "logit":
            raise TargetError(
                f"a dual encoder explains the similarity logit (score='logit'); got {self.score!r}"
            )
        self._logits: Tensor | None = None
        self._classes: Tensor | None = None

    def choose_inputs(self) -> None:
        prepared, encoder = self.prepared, self.adapter
        num_images = prepared.batch_size
        if self.request.target is None and encoder.num_texts(prepared) == num_images:
            classes = torch.arange(num_images, device=encoder.parameter.device)
        else:
            if self.spec is not None:
                self.call_fold()  # bad options and start layers fail before this forward
            with Session(encoder):
                self._logits = encoder.forward(prepared)
            chosen, _ = resolve_targets(self._logits, self.request.target)
            if chosen is None:
                raise TargetError(
                    "a dual encoder's target chooses texts: a callable must return text indices"
                )
            classes = chosen
        self._classes = classes
        columns = classes if classes.dim() == 2 else classes[:, None]
        images = torch.arange(num_images, device=columns.device).repeat_interleave(columns.shape[1])
        self._use(encoder.pair(prepared, images, columns.reshape(-1)))

    def columns(self, output: Tensor) -> Columns:
        assert self._classes is not None
        # Without a first forward the pairs were the inputs as given: their logits are
        # the model's.
        logits = output if self._logits is None else self._logits
        return Columns(output.diagonal()[:, None], self._classes.to(logits.device), logits)

    def finish(self, relevances: Relevances, columns: Columns) -> dict[str, Tensor]:
        result = {name: r[:, 0] for name, r in relevances.items()}  # one column: the pairs'
        if columns.classes.dim() == 1:
            return result
        batch, count = columns.classes.shape  # each (image, text) pair was a sample
        return {name: r.reshape(batch, count, *r.shape[1:]) for name, r in result.items()}

    def tokens(self) -> list[list[str]] | None:
        """The tokens of each image's text (none with several texts per image)."""
        if self._classes is None or self._classes.dim() == 2:
            return None
        return super().tokens()
