"""The LRP engine: relevance propagation for the LRP-based methods (CVPR 2021).

`rules` holds the per-operation relevance rules; one module per model family walks the
family's stock modules with them (`timm_vit`); `run` is the explanation call that records
one forward pass through the recorder and propagates relevance from the target logit.
"""

from explain.lrp.rules import CHEFER, ORIGINAL, RULE_SETS, RuleSet
from explain.lrp.run import explain_with_lrp, tape_for

__all__ = ["CHEFER", "ORIGINAL", "RULE_SETS", "RuleSet", "explain_with_lrp", "tape_for"]
