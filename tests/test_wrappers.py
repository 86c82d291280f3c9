"""Models as people run them (docs/wrappers.md): PEFT adapters, accelerate's dispatching
and offloading, weight-only quantisation, pipelines and SentenceTransformers.

Each wrapper explains as the plain model it stands for, at the tolerance docs/wrappers.md
states: a LoRA model as its merged model, an offloaded model as the same model kept in
memory, a weight-only quantised model as a float copy of its dequantised weights. The
wrapper's own state (adapters, accelerate's hooks and weights maps, quantised tensors) and
the model's state (explain.testing.ModelState) are left as found; generation equals the
model's own `generate()`. The matrix at the end runs every method on every wrapper: a
result, or an `ExplainError` before the model runs.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from test_method_matrix import _finite_or_refused_up_front
from torch import Tensor, nn

from explain import METHODS, Explainer, ExplainError
from explain.engine import supported_methods
from explain.errors import UnsupportedModelError
from explain.generation import explain_generation, generate
from explain.testing import ModelState, TinyCase, tiny_case
from explain.testing.tiny_lm import tiny_causal_lm, tiny_tokenizer

PROMPT = {"input_ids": torch.tensor([[0, 5, 9, 7], [6, 8, 12, 14]]), "attention_mask": None}
PROMPT["attention_mask"] = (PROMPT["input_ids"] != 0).long()


def _close(actual: Tensor, expected: Tensor, rtol: float) -> None:
    """Equal at `rtol`, with the absolute slack `rtol` of the largest value (relevance
    near zero has no relative precision)."""
    atol = rtol * float(expected.abs().max())
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol)


def _compared_methods(model: nn.Module) -> list[str]:
    """Every method the plain model takes but `random` (which compares nothing)."""
    return [name for name in supported_methods(Explainer(model).adapter) if name != "random"]


def _explains_as(
    wrapped: Any, plain: nn.Module, inputs: Any, rtol: float, methods: list[str] | None = None
) -> None:
    """Every method's relevance of `wrapped` equals that of `plain` at `rtol`."""
    for method in methods or _compared_methods(plain):
        expected = Explainer(plain).explain(inputs, method=method).relevance
        actual = Explainer(wrapped).explain(inputs, method=method).relevance
        _close(actual, expected, rtol)


def _leaves_alone(model: nn.Module, call: Callable[[], Any]) -> None:
    before = ModelState.capture(model)
    call()
    assert before.differences(ModelState.capture(model)) == []


# -- PEFT ---------------------------------------------------------------------------------


def _lora(model: nn.Module, targets: list[str], seed: int = 0, **options: Any) -> nn.Module:
    """`model` with random (non-zero) LoRA adapters on `targets`. The tests run in float64:
    a merged model's weights are rounded sums, which in float32 differ from the unmerged
    forward's by rounding, and the original LRP rules amplify such differences (their
    separate denominators nearly cancel) to about 5e-3; in float64 every method agrees
    to 1e-10."""
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(
        target_modules=targets, r=4, lora_alpha=8, init_lora_weights=False, **options
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return peft.get_peft_model(model, config)


def _peft_state(peft_model: nn.Module) -> list[Any]:
    """What PEFT decides per layer: the active adapters, merged ones, disabled or not."""
    return [
        (name, list(layer.active_adapters), list(layer.merged_adapters), layer.disable_adapters)
        for name, layer in peft_model.named_modules()
        if hasattr(layer, "merged_adapters")
    ]


def _merged(peft_model: nn.Module) -> nn.Module:
    return copy.deepcopy(peft_model).merge_and_unload()


def test_a_lora_vit_explains_as_its_merged_model_with_lora_on_the_patch_convolution():
    case = tiny_case("timm_vit")
    case.model.double()
    images = case.batch.double()
    base = copy.deepcopy(case.model)
    # "proj" is the attention's output projection and the patch embedding's convolution
    peft_model = _lora(case.model, ["qkv", "proj", "fc1", "fc2"])
    assert type(peft_model.base_model.model.patch_embed.proj).__name__ == "Conv2d"
    assert type(peft_model.base_model.model.patch_embed.proj).__module__.startswith("peft.")
    merged = _merged(peft_model)
    state = _peft_state(peft_model)
    _leaves_alone(peft_model, lambda: _explains_as(peft_model, merged, images, 1e-10))
    assert _peft_state(peft_model) == state
    # the adapters matter: the merged model explains otherwise than the base model
    changed = Explainer(merged).explain(images).relevance
    assert not torch.allclose(changed, Explainer(base).explain(images).relevance, rtol=1e-2)


def test_a_lora_text_classifier_explains_as_its_merged_model():
    """PeftModelForSequenceClassification: LoRA on the attention, the classifier a trained
    copy (ModulesToSaveWrapper), every method, the LRP walks included."""
    case = tiny_case("hf_text_encoder")
    peft_model = _lora(case.model.double(), ["query", "value", "dense"], task_type="SEQ_CLS")
    assert type(peft_model).__name__ == "PeftModelForSequenceClassification"
    merged = _merged(peft_model)
    state = _peft_state(peft_model)
    _leaves_alone(peft_model, lambda: _explains_as(peft_model, merged, case.batch, 1e-10))
    assert _peft_state(peft_model) == state


def test_a_lora_language_model_generates_and_explains_as_its_merged_model():
    case = tiny_case("hf_causal_lm:llama")
    # float32: the float64 path of generation with left padding is not what this tests
    peft_model = _lora(case.model, ["q_proj", "v_proj", "o_proj", "up_proj"], task_type="CAUSAL_LM")
    assert type(peft_model).__name__ == "PeftModelForCausalLM"
    merged = _merged(peft_model)
    explainer = Explainer(peft_model)
    generation = generate(explainer, PROMPT, max_new_tokens=4)
    own = peft_model.generate(**PROMPT, max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert torch.equal(generation.input_ids, own)
    for method in ("generic", "attnlrp", "cp_lrp", "rollout"):
        actual = explain_generation(explainer, generation, method=method).explanation
        expected = explain_generation(Explainer(merged), generation, method=method).explanation
        _close(actual.relevance, expected.relevance, 1e-4)  # float32: rounded merged weights


def test_the_active_adapter_and_disable_adapter_are_respected():
    case = tiny_case("hf_causal_lm:llama")
    base = copy.deepcopy(case.model.double())
    peft = pytest.importorskip("peft")
    peft_model = _lora(case.model, ["q_proj", "v_proj"], task_type="CAUSAL_LM")
    with torch.random.fork_rng():
        torch.manual_seed(1)
        second = peft.LoraConfig(target_modules=["k_proj", "o_proj"], r=2, init_lora_weights=False)
        peft_model.add_adapter("second", second)
    peft_model.set_adapter("second")
    merged_second = _merged(peft_model)
    methods = ["generic", "attnlrp"]
    _explains_as(peft_model, merged_second, case.batch, 1e-10, methods)
    with peft_model.disable_adapter():
        _explains_as(peft_model, base, case.batch, 1e-10, methods)
    assert peft_model.active_adapters == ["second"]
    assert not any(state[3] for state in _peft_state(peft_model))  # enabled again


def test_prompt_learning_adapters_are_refused_with_what_to_do():
    peft = pytest.importorskip("peft")
    case = tiny_case("hf_causal_lm:llama")
    config = peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=3)
    peft_model = peft.get_peft_model(case.model, config)
    with pytest.raises(UnsupportedModelError, match=r"prompt learning.*get_base_model\(\)"):
        Explainer(peft_model)


# -- accelerate -----------------------------------------------------------------------------


def _hooks(model: nn.Module) -> dict[str, tuple[Any, Any]]:
    """accelerate's hook and the forward it installed, by module."""
    return {
        name: (module._hf_hook, module.forward)
        for name, module in model.named_modules()
        if hasattr(module, "_hf_hook")
    }


def _offloaded_values(model: nn.Module) -> dict[str, Tensor]:
    """Every tensor the hooks' weights maps hold (read now, cloned)."""
    found = {}
    for name, (hook, _) in _hooks(model).items():
        for each in getattr(hook, "hooks", None) or [hook]:
            weights = getattr(each, "weights_map", None)
            for key, parameter in model.get_submodule(name).named_parameters(recurse=False):
                if weights is not None and parameter.is_meta:
                    found[f"{name}.{key}"] = weights[key].clone()
    return found


def _requires_grad(model: nn.Module) -> None:
    """Every parameter trainable, so that a lost flag shows."""
    for parameter in model.parameters():
        parameter.requires_grad_(True)


def test_a_disk_offloaded_vit_explains_as_the_model_in_memory(tmp_path):
    accelerate = pytest.importorskip("accelerate")
    case = tiny_case("timm_vit")
    plain = copy.deepcopy(case.model)
    model = accelerate.disk_offload(case.model, str(tmp_path), execution_device="cpu")
    assert all(parameter.is_meta for parameter in model.parameters())
    _requires_grad(model)
    hooks, values = _hooks(model), _offloaded_values(model)
    _leaves_alone(model, lambda: _explains_as(model, plain, case.batch, 1e-4))  # float32
    assert _hooks(model) == hooks
    offloaded = _offloaded_values(model)
    assert offloaded.keys() == values.keys()
    assert all(torch.equal(offloaded[name], value) for name, value in values.items())


def test_a_cpu_offloaded_language_model_generates_and_explains_as_the_model_in_memory():
    accelerate = pytest.importorskip("accelerate")
    case = tiny_case("hf_causal_lm:llama")
    plain = copy.deepcopy(case.model)
    model = accelerate.cpu_offload(case.model, execution_device="cpu")
    hooks = _hooks(model)
    explainer = Explainer(model)
    generation = generate(explainer, PROMPT, max_new_tokens=4)
    own = model.generate(**PROMPT, max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert torch.equal(generation.input_ids, own)
    assert torch.equal(generation.input_ids, generate(Explainer(plain), PROMPT, 4).input_ids)

    def explain_every_way() -> None:
        for method in ("generic", "attnlrp", "cp_lrp", "attention_gradcam"):
            actual = explain_generation(explainer, generation, method=method).explanation
            expected = explain_generation(Explainer(plain), generation, method=method)
            _close(actual.relevance, expected.explanation.relevance, 1e-4)  # float32

    _leaves_alone(model, explain_every_way)
    assert _hooks(model) == hooks


def test_a_device_map_with_a_memory_limit_and_disk_explains_as_the_model_in_memory(tmp_path):
    """from_pretrained(device_map="auto", max_memory=...): what does not fit goes to disk,
    through accelerate's dispatch_model."""
    pytest.importorskip("accelerate")
    from transformers import AutoModelForCausalLM

    case = tiny_case("hf_causal_lm:llama")
    case.model.save_pretrained(tmp_path / "model")
    model = AutoModelForCausalLM.from_pretrained(
        tmp_path / "model",
        device_map="auto",
        max_memory={"cpu": "40KB"},
        offload_folder=str(tmp_path / "offload"),
    )
    assert "disk" in model.hf_device_map.values()
    _explains_as(model, case.model, case.batch, 1e-4)  # float32


# -- quantisation -----------------------------------------------------------------------------


def _dequantised_copy(plain: nn.Module, quantised: nn.Module, weight: Callable) -> nn.Module:
    """`plain` with every linear and convolution weight replaced by the quantised model's,
    dequantised."""
    copied = copy.deepcopy(plain)
    with torch.no_grad():
        for name, module in quantised.named_modules():
            if isinstance(module, nn.Linear | nn.Conv2d):
                copied.get_submodule(name).weight.copy_(weight(module))
    return copied


def _quantised_tensors(model: nn.Module) -> dict[str, Tensor]:
    return {
        f"{name}.{part}": getattr(module.weight, part).clone()
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear)
        for part in ("qdata", "scale")
        if hasattr(module.weight, part)
    }


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_torchao_weight_only_explains_as_its_dequantised_weights(kind):
    pytest.importorskip("torchao")
    from torchao.quantization import Int8WeightOnlyConfig, IntxWeightOnlyConfig, quantize_
    from torchao.quantization.granularity import PerAxis

    case = tiny_case("hf_causal_lm:llama")
    plain = copy.deepcopy(case.model)
    config = (
        Int8WeightOnlyConfig()
        if kind == "int8"
        else IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerAxis(0))
    )
    model = case.model
    quantize_(
        model, config, filter_fn=lambda m, name: isinstance(m, nn.Linear) and "lm_head" not in name
    )
    dequantised = _dequantised_copy(plain, model, lambda m: m.weight.dequantize())
    stored = _quantised_tensors(model)
    assert stored
    _explains_as(model, dequantised, case.batch, 1e-4)
    after = _quantised_tensors(model)
    assert all(torch.equal(after[name], value) for name, value in stored.items())


@pytest.fixture
def quanto_torch_unpacking(monkeypatch):
    """optimum-quanto with its pure-torch kernel for unpacking int4 weights on the CPU in
    place of its C++ one, which it compiles on first use (about 70 CPU-seconds, once per
    environment, into its own package folder). Both are quanto's kernels for the same
    operator and give the same values; what the tests check is the engine's handling of
    the quantised model, which is the same with either."""
    pytest.importorskip("optimum.quanto")
    from optimum.quanto.library.extensions import get_extension

    composite = torch._C.DispatchKeySet(torch._C.DispatchKey.CompositeExplicitAutograd)
    unpack = functools.partial(torch.ops.quanto.unpack.default.redispatch, composite)
    monkeypatch.setattr(get_extension("quanto_cpp"), "_lib", SimpleNamespace(unpack=unpack))


@pytest.mark.parametrize("kind", ["qint8", "qint4"])
def test_optimum_quanto_weight_only_explains_as_its_dequantised_weights(
    kind, quanto_torch_unpacking
):
    quanto = pytest.importorskip("optimum.quanto")
    case = tiny_case("timm_vit")
    plain = copy.deepcopy(case.model)
    model = case.model
    quanto.quantize(model, weights=getattr(quanto, kind))
    quanto.freeze(model)
    dequantised = _dequantised_copy(plain, model, lambda m: m.qweight.dequantize())
    stored = {n: m.qweight.dequantize() for n, m in model.named_modules() if hasattr(m, "qweight")}
    _leaves_alone(model, lambda: _explains_as(model, dequantised, case.batch, 1e-4))
    assert all(
        torch.equal(model.get_submodule(n).qweight.dequantize(), v) for n, v in stored.items()
    )


def _bitsandbytes_4bit(model: nn.Module, quant_type: str) -> nn.Module:
    """`model` with every linear layer but the head replaced by a bitsandbytes `Linear4bit`
    holding its weights quantised (`quant_type` "nf4" or "fp4"), as
    `BitsAndBytesConfig(load_in_4bit=True)` builds it on the CPU."""
    import bitsandbytes as bnb

    for name, module in list(model.named_modules()):
        if isinstance(module, nn.Linear) and "lm_head" not in name:
            layer = bnb.nn.Linear4bit(
                module.in_features,
                module.out_features,
                bias=module.bias is not None,
                compute_dtype=torch.float32,
                quant_type=quant_type,
            )
            weight = module.weight.detach().clone()
            layer.weight = bnb.nn.Params4bit(weight, requires_grad=False, quant_type=quant_type)
            layer.bias = module.bias
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, layer.to("cpu"))  # quantises
    return model


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
def test_bitsandbytes_4bit_explains_as_its_dequantised_weights(quant_type):
    pytest.importorskip("bitsandbytes")
    from bitsandbytes.functional import dequantize_4bit

    # bitsandbytes' CPU kernel quantises in blocks of 64 inputs: widths of whole blocks
    width = {"hidden_size": 64, "intermediate_size": 128, "head_dim": 16}
    plain = tiny_causal_lm("llama", **width)
    model = _bitsandbytes_4bit(copy.deepcopy(plain), quant_type)

    def weight(module: nn.Module) -> Tensor:  # Linear4bit is an nn.Linear; the head is not one
        state = getattr(module.weight, "quant_state", None)
        return module.weight if state is None else dequantize_4bit(module.weight.data, state)

    dequantised = _dequantised_copy(plain, model, weight)
    stored = {n: p.detach().clone() for n, p in model.named_parameters() if p.dtype == torch.uint8}
    up = "model.layers.0.mlp.up_proj.weight"
    quantised = dequantised.get_parameter(up)
    assert stored and not torch.equal(quantised, plain.get_parameter(up))  # really rounded
    kernels = {n: getattr(m, "support_avx512bf16_for_cpu", None) for n, m in model.named_modules()}
    # every method, those that run forwards without input gradients too (which would
    # repack the weights in place on a CPU with AVX512-BF16: explain.architectures.wrappers)
    _leaves_alone(model, lambda: _explains_as(model, dequantised, PROMPT, 1e-4))
    assert all(torch.equal(p, stored[n]) for n, p in model.named_parameters() if n in stored)
    assert kernels == {
        n: getattr(m, "support_avx512bf16_for_cpu", None) for n, m in model.named_modules()
    }


def _activation_quantised(library: str) -> nn.Module:
    model = tiny_case("hf_causal_lm:llama").model
    if library == "torchao":
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

        quantize_(model, Int8DynamicActivationInt8WeightConfig())
    else:
        quanto = pytest.importorskip("optimum.quanto")
        quanto.quantize(model, weights=quanto.qint8, activations=quanto.qint8)
        quanto.freeze(model)
    return model


@pytest.mark.parametrize("library", ["torchao", "optimum.quanto"])
def test_activation_quantisation_is_refused_with_one_message(library):
    pytest.importorskip(library)
    model = _activation_quantised(library)
    with pytest.raises(
        UnsupportedModelError, match=r"quantises its activations.*weight-only.*unquantised"
    ):
        Explainer(model)


# -- pipelines and SentenceTransformers --------------------------------------------------------


def test_a_text_pipeline_brings_its_model_and_tokenizer():
    from transformers import pipeline

    case = tiny_case("hf_causal_lm:llama")
    tokenizer = tiny_tokenizer()
    pipe = pipeline("text-generation", model=case.model, tokenizer=tokenizer)
    explainer = Explainer(pipe)
    assert explainer.model is case.model and explainer.tokenizer is tokenizer
    texts = ["user w9 w12 w20", "w30 w31"]
    actual = explainer.explain(texts)
    expected = Explainer(case.model, tokenizer=tokenizer).explain(texts)
    assert actual.tokens == expected.tokens
    assert torch.equal(actual.relevance, expected.relevance)


def test_an_image_pipeline_brings_its_model():
    from transformers import ViTImageProcessor, pipeline

    case = tiny_case("hf_vit")
    processor = ViTImageProcessor(size={"height": 16, "width": 16})
    pipe = pipeline("image-classification", model=case.model, image_processor=processor)
    explainer = Explainer(pipe)
    assert explainer.model is case.model and explainer.tokenizer is None
    expected = Explainer(case.model).explain(case.batch).relevance
    assert torch.equal(explainer.explain(case.batch).relevance, expected)


def _sentence_transformer(**options: Any) -> Any:
    from reference_hf import minilm_path

    sentence_transformers = pytest.importorskip("sentence_transformers")
    return sentence_transformers.SentenceTransformer(str(minilm_path()), device="cpu", **options)


@functools.cache
def _prompted_sentence_transformer() -> Any:
    return _sentence_transformer(prompts={"query": "query: "}, default_prompt_name="query")


def test_a_sentence_transformer_explains_the_tokens_and_embedding_its_encode_sees():
    from explain.text import similarity

    model = _prompted_sentence_transformer()
    texts = ["a cat sat on the mat", "stock prices fell"]
    explainer = Explainer(model)
    assert explainer.model is model[0].auto_model
    result = explainer.explain(texts, target=lambda embeddings: embeddings[:, 0])
    prompted = model.tokenizer(["query: " + text for text in texts], padding=True)
    assert [
        tokens[: len(ids)] for tokens, ids in zip(result.tokens, prompted["input_ids"], strict=True)
    ] == [model.tokenizer.convert_ids_to_tokens(ids) for ids in prompted["input_ids"]]
    embeddings = torch.as_tensor(model.encode(texts, normalize_embeddings=True))
    _close(nn.functional.normalize(result.logits, dim=-1), embeddings, 1e-4)
    explained = similarity(explainer, texts[0], texts[1])
    assert explained.tokens_a[0][1:3] == ["query", ":"]


def test_a_sentence_transformer_pooled_otherwise_is_refused_naming_it():
    from sentence_transformers.sentence_transformer.modules import Pooling

    model = _sentence_transformer()
    model[1] = Pooling(384, pooling_mode="cls")
    with pytest.raises(UnsupportedModelError, match="pools with 'cls'"):
        Explainer(model)


def test_an_object_that_holds_a_model_is_refused_naming_the_attribute():
    class Runner:
        def __init__(self, model: nn.Module) -> None:
            self.model = model

    with pytest.raises(UnsupportedModelError, match=r"attribute `model`.*Explainer\(obj.model"):
        Explainer(Runner(tiny_case("timm_vit").model))


# -- the method x wrapper matrix ------------------------------------------------------------


def _wrapped(name: str) -> tuple[Any, Any]:
    """(what the user passes to Explainer, inputs) for each wrapper of the matrix."""
    if name.startswith("peft"):
        family, targets = (
            ("timm_vit", ["qkv", "proj"])
            if name == "peft vit"
            else ("hf_causal_lm:llama", ["q_proj", "v_proj"])
        )
        case = tiny_case(family)
        return _lora(case.model, targets), case.batch
    if name.startswith("offloaded"):
        accelerate = pytest.importorskip("accelerate")
        case = tiny_case("timm_vit" if name == "offloaded vit" else "hf_causal_lm:llama")
        return accelerate.cpu_offload(case.model, execution_device="cpu"), case.batch
    if name == "torchao int8":
        pytest.importorskip("torchao")
        from torchao.quantization import Int8WeightOnlyConfig, quantize_

        case = tiny_case("timm_vit")
        quantize_(case.model, Int8WeightOnlyConfig())
        return case.model, case.batch
    if name == "torchao dynamic":
        pytest.importorskip("torchao")
        return _activation_quantised("torchao"), tiny_case("hf_causal_lm:llama").batch
    if name == "pipeline":
        from transformers import pipeline

        case = tiny_case("hf_causal_lm:llama")
        pipe = pipeline("text-generation", model=case.model, tokenizer=tiny_tokenizer())
        return pipe, ["user w9 w12", "w30 w31 w40"]
    return _prompted_sentence_transformer(), ["a cat sat", "prices fell"]


WRAPPERS = [
    "peft vit",
    "peft llama",
    "offloaded vit",
    "offloaded llama",
    "torchao int8",
    "torchao dynamic",
    "pipeline",
    "sentence transformer",
]


@functools.cache
def _matrix_case(name: str) -> TinyCase:
    runner, inputs = _wrapped(name)
    return TinyCase(runner, inputs, (), {})


@pytest.mark.parametrize("method", sorted(METHODS))
@pytest.mark.parametrize("name", WRAPPERS)
def test_every_method_on_every_wrapper_is_finite_or_refused_up_front(name, method):
    case = _matrix_case(name)
    try:
        explainer = Explainer(case.model)
    except ExplainError:
        assert name == "torchao dynamic"  # refused on sight, before any forward
        return
    model = explainer.adapter.model
    target = (lambda embeddings: embeddings[:, 0]) if name == "sentence transformer" else None
    supported = method in supported_methods(explainer.adapter)
    if name == "sentence transformer" and METHODS[method].lrp_rules is not None:
        # The bare encoder's family lists the LRP walk, which covers its classifiers only
        # and refuses a bare encoder when the walk is built, before the forward.
        supported = None
    _finite_or_refused_up_front(
        model, supported, lambda: explainer.explain(case.batch, method=method, target=target)
    )
