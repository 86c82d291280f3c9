"""twohop-llama: a Llama answering two-hop questions among distractor facts in long
contexts (explain.data.recall with two hops: `?? a` asks for c through the chain `a b .`
`b c .`), on recall-llama's measure and held-out prompts (two-hop ones, as its config's
task says); its evidence check proves that each fact of the chain is needed."""

import dataclasses

from explain.evaluation import recall_answers
from explain.evaluation.zoo import recall_llama

MODEL = dataclasses.replace(
    recall_llama.MODEL,
    name="twohop-llama",
    count=200,
    evidence_check=recall_answers.chain_check,
)
