"""Plans: how each kind of model maps a request onto the engine's passes.

- `Plan` (base.py): one token sequence, and what every plan shares;
- `DualEncoderPlan` (dual_encoder.py, CLIP): each explained (image, text) pair a sample;
- `EncoderDecoderPlan` (encoder_decoder.py): the token predicted at a decoder position;
- `GenerationPlan` (generation.py): every generated token of a decoder-only language
  model, over the tokens before it;
- `ImageTextPlan` (image_text.py): a vision-language model's next token or answer, over
  the image and the prompt (it explains its generations itself);
- `DetectionPlan` (detection.py): each detection of a detector (DETR) at its query.

Each names the adapter contract it serves (`Plan.serves`: the kind of model) and
declares the passes it accepts (`Plan.passes`); `plan_kind` picks the plan of a model and
request.
"""

from __future__ import annotations

from explain.architectures.base import Adapter
from explain.engine.plans.base import (
    Plan,
    check_tokenizer,
    resolve_score,
    resolve_start_layer,
)
from explain.engine.plans.detection import DEFAULT_THRESHOLD, DetectionPlan
from explain.engine.plans.dual_encoder import DualEncoderPlan
from explain.engine.plans.encoder_decoder import EncoderDecoderPlan, Position
from explain.engine.plans.generation import GenerationPlan, require_causal_lm
from explain.engine.plans.image_text import ImageTextPlan
from explain.engine.targets import Request

__all__ = [
    "DEFAULT_THRESHOLD",
    "PLANS",
    "DetectionPlan",
    "DualEncoderPlan",
    "EncoderDecoderPlan",
    "GenerationPlan",
    "ImageTextPlan",
    "Plan",
    "Position",
    "check_tokenizer",
    "plan_kind",
    "require_causal_lm",
    "resolve_score",
    "resolve_start_layer",
]

PLANS: tuple[type[Plan], ...] = (
    DualEncoderPlan,
    EncoderDecoderPlan,
    DetectionPlan,
    ImageTextPlan,
    Plan,
)
"""The plan of every kind of model, the one-stack plan (which serves any adapter) last."""


def plan_kind(adapter: Adapter | type[Adapter], request: Request) -> type[Plan]:
    """The plan for `adapter`'s kind of model (the first plan whose `serves` it is); for a
    generation (a request with a `prompt_length`), the generation plan, unless the kind's
    plan explains its own."""
    adapter_class = adapter if isinstance(adapter, type) else type(adapter)
    kind = next(plan for plan in PLANS if issubclass(adapter_class, plan.serves))
    if request.prompt_length is not None and not kind.generates:
        return GenerationPlan
    return kind
