"""The LRP maths, family-free: the per-operation relevance rules and their rule sets
(`propagation`), what a family's LRP walk offers and shares (`walk`), and the gradient
rules of AttnLRP and CP-LRP (`attnlrp`). Each family's walk and AttnLRP sites live in its
own file in explain.architectures (`Adapter.lrp_walk`, `Adapter.attnlrp_sites`);
explain.engine runs the calls.
"""

from explain.lrp.propagation import CHEFER, ORIGINAL, RULE_SETS, RuleSet
from explain.lrp.walk import LrpWalk

__all__ = ["CHEFER", "ORIGINAL", "RULE_SETS", "LrpWalk", "RuleSet"]
