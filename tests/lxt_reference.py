"""Run LXT 2.1, the reference implementation of AttnLRP and CP-LRP, on a tiny model.

Not a test module: tests/test_attnlrp_lxt.py runs this file with the Python of the cached
LXT environment (scripts/lxt_env.sh), because LXT needs transformers 4.x and
monkey-patches transformers for the whole process. It imports nothing from explain.

Usage: python lxt_reference.py REQUEST.json, where the request holds the rule set
("attnlrp" or "cp_lrp": LXT patches for the whole process, so one process serves one rule
set) and jobs, each with the model class (BertForSequenceClassification, or a causal LM:
GPT2LMHeadModel, LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Gemma3ForCausalLM),
its config as a dict, the path of the weights (a torch state dict), the texts (lists of
token ids) and one target per text. Prints a JSON list: per job and text, the relevance
of each token, the sum over the hidden size of the word embeddings times their gradient,
exactly as LXT's documentation computes it.
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
    "LlamaForCausalLM": ("llama", "modeling_llama"),
    "Qwen2ForCausalLM": ("qwen2", "modeling_qwen2"),
    "Qwen3ForCausalLM": ("qwen3", "modeling_qwen3"),
    "Gemma3ForCausalLM": ("gemma3", "modeling_gemma3"),
}


def main(path: str) -> None:
    with open(path) as file:
        request = json.load(file)
    print(json.dumps([explain_one(request["rules"], job) for job in request["jobs"]]))


def explain_one(rules: str, job: dict) -> list[list[float]]:
    """Patch the job's transformers module with LXT's rule set (once per process: a
    process serves one rule set), build the model, explain each text alone."""
    package, module_name = _MODULES[job["model"]]
    lxt_models = __import__(f"lxt.efficient.models.{package}", fromlist=["_"])
    modeling = __import__(f"transformers.models.{package}.{module_name}", fromlist=["_"])
    monkey_patch(modeling, lxt_models.attnLRP if rules == "attnlrp" else lxt_models.cp_LRP)
    config_class = transformers.AutoConfig.for_model(job["config"].pop("model_type")).__class__
    config = config_class(**job["config"])
    config._attn_implementation = "eager"
    model = getattr(modeling, job["model"])(config).eval()
    state = torch.load(job["weights"], map_location="cpu")
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise SystemExit(f"weights do not fit: missing {missing}, unexpected {unexpected}")
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    results = []
    for ids, target in zip(job["texts"], job["targets"], strict=True):
        tokens = torch.tensor([ids])
        embeddings = model.get_input_embeddings()(tokens).detach().requires_grad_(True)
        if causal := job["model"] != "BertForSequenceClassification":
            logits = model(inputs_embeds=embeddings, use_cache=False).logits
        else:
            logits = model(inputs_embeds=embeddings).logits
        score = logits[0, -1, target] if causal else logits[0, target]
        score.backward()
        results.append((embeddings * embeddings.grad).sum(dim=-1)[0].tolist())
    return results


if __name__ == "__main__":
    main(sys.argv[1])
