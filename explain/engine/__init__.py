"""The engine: one run loop for every model kind and every method.

`explain` and `trace` take an adapter and a `Request` and return an `Explanation` or a
`Trace`; `Explainer.explain` and `Explainer.trace` are thin fronts over them. The plans
(explain.engine.plans) say how each kind of model maps the request onto the loop.
"""

from explain.engine.plans import (
    Plan,
    Position,
    check_tokenizer,
    plan_for,
    resolve_score,
    resolve_start_layer,
    supported_methods,
)
from explain.engine.request import Request, StartLayer
from explain.engine.run import explain, trace

__all__ = [
    "Plan",
    "Position",
    "Request",
    "StartLayer",
    "check_tokenizer",
    "explain",
    "plan_for",
    "resolve_score",
    "resolve_start_layer",
    "supported_methods",
    "trace",
]
