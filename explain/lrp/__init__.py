"""The LRP engine: relevance propagation for the LRP-based methods (CVPR 2021).

`rules` holds the per-operation relevance rules; one module per model family walks the
family's stock modules with them (`timm_vit`, `hf_bert`), declared by the family's adapter
(`Adapter.lrp_walk`); `walk` defines what a walk offers. explain.engine runs the calls.
"""

from explain.lrp.rules import CHEFER, ORIGINAL, RULE_SETS, RuleSet
from explain.lrp.walk import Tape, tape_for

__all__ = ["CHEFER", "ORIGINAL", "RULE_SETS", "RuleSet", "Tape", "tape_for"]
