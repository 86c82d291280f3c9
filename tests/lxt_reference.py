"""Run LXT 2.1, the reference implementation of AttnLRP and CP-LRP, on a tiny model.

Not a test module: tests/test_attnlrp_lxt.py runs this file with the Python of the cached
LXT environment (scripts/lxt_env.sh), because LXT needs transformers 4.x and
monkey-patches transformers for the whole process. It imports nothing from explain.

Usage: python lxt_reference.py REQUEST.json, where the request holds the model class
("BertForSequenceClassification" or "GPT2LMHeadModel"), its config as a dict, the path of
the weights (a torch state dict), the rule set ("attnlrp" or "cp_lrp"), the texts (lists
of token ids) and one target per text. Prints a JSON list: per text, the relevance of each
token, the sum over the hidden size of the word embeddings times their gradient, exactly
as LXT's documentation computes it.
"""

from __future__ import annotations

import json
import sys

import torch
import transformers
from lxt.efficient import monkey_patch

_MODULES = {
    "BertForSequenceClassification": ("bert", "modeling_bert"),
    "GPT2LMHeadModel": ("gpt2", "modeling_gpt2"),
}


def main(path: str) -> None:
    with open(path) as file:
        request = json.load(file)
    package, module_name = _MODULES[request["model"]]
    lxt_models = __import__(f"lxt.efficient.models.{package}", fromlist=["_"])
    modeling = __import__(f"transformers.models.{package}.{module_name}", fromlist=["_"])
    rules = lxt_models.attnLRP if request["rules"] == "attnlrp" else lxt_models.cp_LRP
    monkey_patch(modeling, rules)
    config_class = transformers.AutoConfig.for_model(request["config"].pop("model_type")).__class__
    config = config_class(**request["config"])
    config._attn_implementation = "eager"
    model = getattr(modeling, request["model"])(config).eval()
    state = torch.load(request["weights"], map_location="cpu")
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise SystemExit(f"weights do not fit: missing {missing}, unexpected {unexpected}")
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    results = []
    for ids, target in zip(request["texts"], request["targets"], strict=True):
        tokens = torch.tensor([ids])
        embeddings = model.get_input_embeddings()(tokens).detach().requires_grad_(True)
        if logits_per_position := request["model"] == "GPT2LMHeadModel":
            logits = model(inputs_embeds=embeddings, use_cache=False).logits
        else:
            logits = model(inputs_embeds=embeddings).logits
        score = logits[0, -1, target] if logits_per_position else logits[0, target]
        score.backward()
        results.append((embeddings * embeddings.grad).sum(dim=-1)[0].tolist())
    print(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1])
