"""Which part of a context an answer came from: span attribution of a language model's
answer, checked by ablation (`cite`), and contrasts of two answers (`explain_contrast`).

The context is split into spans (explain.cite.spans), put into a prompt with the question
(explain.cite.prompt), every answer token is explained over the prompt in one batched
backward (explain.cite.attribution, on explain.generation), and the ranking is checked by
removing the top spans (explain.cite.check) and read into a verdict in words
(explain.cite.verdict); `cite(..., ablate=k)` rescores the k spans of largest |score| by
removing each alone (explain.cite.leave_one_out). A photo's regions are cited the same
way (explain.cite.regions: the regions and where they lie among the model's patches;
explain.cite.image: attribution and check). Each answer is also split into sentences,
each with its own scores (explain.cite.statements: the matrix answer sentence x
source). docs/cite.md is the guide.
"""

from explain.cite.attribution import (
    Citation,
    ContrastExplanation,
    cite,
    explain_contrast,
)
from explain.cite.check import ABLATION, Check, TopKDrop, check_ranking, check_scores, spearman
from explain.cite.image import ContextSpans, RegionCitation, cite_image
from explain.cite.prompt import (
    TEMPLATE,
    Context,
    Prompt,
    build_prompt,
    read_context,
    span_sums,
)
from explain.cite.regions import GRID, Region, grid_regions, read_regions, slic_regions
from explain.cite.spans import KINDS, Span, split
from explain.cite.verdict import Verdict, verdict

__all__ = [
    "ABLATION",
    "GRID",
    "KINDS",
    "TEMPLATE",
    "Check",
    "Citation",
    "Context",
    "ContextSpans",
    "ContrastExplanation",
    "Prompt",
    "Region",
    "RegionCitation",
    "Span",
    "TopKDrop",
    "Verdict",
    "build_prompt",
    "check_ranking",
    "check_scores",
    "cite",
    "cite_image",
    "explain_contrast",
    "grid_regions",
    "read_context",
    "read_regions",
    "slic_regions",
    "span_sums",
    "spearman",
    "split",
    "verdict",
]
