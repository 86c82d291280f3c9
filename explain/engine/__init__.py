"""The engine: one run loop for every model kind and every method.

`explain` and `trace` (run.py) take an adapter and a `Request` and return an
`Explanation` or a `Trace`; `Explainer.explain` and `Explainer.trace` are thin fronts over
them. The session (session.py) borrows the model for a call, the recorder (recorder.py)
records what it computes, the passes (passes.py) are the ways through the model a
method's needs choose, and the plans (plans/) say how each kind of model maps the
request onto them. targets.py holds the `Request` and turns its target and score into
the differentiated scalars; fused.py chooses the attention path and recomputes attention
on the fused one; spread.py and kernels/ fold all columns of a call at once.
"""

from explain.engine.plans import (
    GenerationPlan,
    Plan,
    Position,
    check_tokenizer,
    require_causal_lm,
    resolve_score,
    resolve_start_layer,
)
from explain.engine.run import (
    check,
    explain,
    refusals,
    require_methods,
    supported_methods,
    trace,
)
from explain.engine.session import Session
from explain.engine.targets import Request, StartLayer

__all__ = [
    "GenerationPlan",
    "Plan",
    "Position",
    "Request",
    "Session",
    "StartLayer",
    "check",
    "check_tokenizer",
    "explain",
    "refusals",
    "require_causal_lm",
    "require_methods",
    "resolve_score",
    "resolve_start_layer",
    "supported_methods",
    "trace",
]
