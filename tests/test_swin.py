"""Swin: the windowed fold against an independent dense computation in float64.

The reference never uses explain.rules.fold: it materialises each block's full
(N, N) attention from its windows by index arithmetic (zeros across windows, the cyclic
shift rolled back), multiplies the dense factors of the whole model in forward order,
patch-merging matrices included, and reads the product out with the mean-pool row. The
attention maps and gradients come from `Explainer.trace`.
"""

from __future__ import annotations

import pytest
import torch

from explain import Explainer, InputError, OptionError, UnsupportedModelError
from explain.architectures.registry import adapter_for
from explain.layout import WindowedBlock
from explain.testing import SWIN_KINDS, tiny_swin

IMAGES = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


def _window_index(block: WindowedBlock) -> torch.Tensor:
    """(windows, w): the grid position (row-major) of each token of each window, by
    walking the rolled grid window by window."""
    (rows, columns), (wr, wc), (sr, sc) = block.grid, block.window, block.shift
    index = torch.empty(block.num_windows, block.window_tokens, dtype=torch.long)
    for wi in range(rows // wr):
        for wj in range(columns // wc):
            for a in range(wr):
                for b in range(wc):
                    # the rolled grid's (y, x) holds the original ((y + s) mod n, ...)
                    y, x = (wi * wr + a + sr) % rows, (wj * wc + b + sc) % columns
                    index[wi * (columns // wc) + wj, a * wc + b] = y * columns + x
    return index


def _dense(windows: torch.Tensor, block: WindowedBlock) -> torch.Tensor:
    """(B * windows, H, w, w) -> (B, H, N, N), zero across windows."""
    index = _window_index(block)
    per_window = windows.reshape(-1, block.num_windows, *windows.shape[1:])
    batch, heads = per_window.shape[0], per_window.shape[2]
    dense = windows.new_zeros(batch, heads, block.num_tokens, block.num_tokens)
    for k in range(block.num_windows):
        rows, keys = index[k][:, None], index[k][None, :]
        dense[:, :, rows, keys] = per_window[:, k]
    return dense


def _merge(grid: tuple[int, int]) -> torch.Tensor:
    """(N / 4, N): each merged token the mean of its 2 x 2 tokens of `grid`."""
    rows, columns = grid
    matrix = torch.zeros(rows * columns // 4, rows * columns, dtype=torch.float64)
    for i in range(rows // 2):
        for j in range(columns // 2):
            for a in range(2):
                for b in range(2):
                    matrix[i * (columns // 2) + j, (2 * i + a) * columns + 2 * j + b] = 0.25
    return matrix


def _reference(model, method: str, target: torch.Tensor, start_layer: int = 0) -> torch.Tensor:
    explainer = Explainer(model)
    trace = explainer.trace(IMAGES, target=target, score="logit")
    layout = adapter_for(model).prepare(IMAGES).layout
    blocks = layout.windows
    assert blocks
    batch = IMAGES.shape[0]
    product = torch.eye(blocks[0].num_tokens, dtype=torch.float64).expand(batch, -1, -1)
    for layer, block in enumerate(blocks):
        if layer and block.grid != blocks[layer - 1].grid:
            product = _merge(blocks[layer - 1].grid) @ product
        attention = _dense(trace.attentions[layer], block)
        if method == "raw_attention":
            if layer == len(blocks) - 1:
                product = attention.mean(dim=1) @ product
            continue
        if layer < start_layer:
            continue
        eye = torch.eye(block.num_tokens, dtype=torch.float64)
        if method == "generic":
            gradient = _dense(trace.attention_grads[layer], block)
            factor = eye + (gradient * attention).clamp(min=0).mean(dim=1)
        else:  # rollout
            factor = eye + attention.mean(dim=1)
            factor = factor / factor.sum(dim=-1, keepdim=True)
        product = factor @ product
    readout = torch.full((batch, 1, blocks[-1].num_tokens), 1.0 / blocks[-1].num_tokens)
    relevance = (readout.to(torch.float64) @ product)[:, 0]
    return relevance.reshape(batch, *layout.grid)


@pytest.mark.parametrize("kind", SWIN_KINDS)
@pytest.mark.parametrize(
    ("method", "start_layer"),
    [("generic", None), ("generic", 3), ("rollout", None), ("raw_attention", None)],
)
def test_the_windowed_fold_equals_the_dense_float64_reference(kind, method, start_layer):
    model = tiny_swin(kind).double()
    target = torch.tensor([1, 3])
    kwargs = {} if start_layer is None else {"start_layer": start_layer}
    result = Explainer(model).explain(IMAGES, target=target, method=method, **kwargs)
    expected = _reference(model, method, target, start_layer or 0)
    assert result.relevance.shape == (2, 16, 16)
    torch.testing.assert_close(result.relevance, expected, rtol=1e-9, atol=1e-12)


def _gradcam_reference(model, images: torch.Tensor, target: int) -> torch.Tensor:
    """Attention GradCAM of class `target` from the last block's dense (N, N) attention
    and gradient, read out by the mean over the last stage's N tokens (the head's pool):
    w_h = mean_k (r @ G_h)[k], map (mean_h w_h r @ A_h)+ over the last stage's grid, then
    carried to the patch grid through the merges as matrices (v @ D)."""
    trace = Explainer(model).trace(images, target=target, score="logit")
    layout = adapter_for(model).prepare(images).layout
    blocks, last = layout.windows, len(layout.windows) - 1
    attention = _dense(trace.attentions[last], blocks[last])
    gradient = _dense(trace.attention_grads[last], blocks[last])
    tokens = blocks[last].num_tokens
    readout = torch.full((images.shape[0], 1, 1, tokens), 1.0 / tokens, dtype=attention.dtype)
    weights = (readout @ gradient).mean(dim=-1, keepdim=True)  # (B, H, 1, 1)
    relevance = (weights * (readout @ attention)).mean(dim=1).clamp(min=0)  # (B, 1, N)
    for layer in range(last, 0, -1):
        if blocks[layer].grid != blocks[layer - 1].grid:
            relevance = relevance @ _merge(blocks[layer - 1].grid).to(relevance.dtype)
    return relevance[:, 0].reshape(images.shape[0], *layout.grid)


@pytest.mark.parametrize("kind", SWIN_KINDS)
def test_attention_gradcam_equals_the_dense_float64_reference(kind):
    """The last stage is one 4 x 4 window: its attention, read out by the mean pool, is
    the map, carried down to the 16 x 16 patch grid. Every class of both images in one
    call (the columns mapped together) against one trace per class."""
    model = tiny_swin(kind).double()
    assert adapter_for(model).prepare(IMAGES).layout.windows[-1].num_windows == 1
    classes = torch.arange(5).expand(2, 5)
    result = Explainer(model).explain(IMAGES, target=classes, method="attention_gradcam")
    assert result.relevance.shape == (2, 5, 16, 16)
    expected = torch.stack([_gradcam_reference(model, IMAGES, c) for c in range(5)], dim=1)
    assert expected.amax() > 0 and (expected.flatten(2).amax(-1) == 0).any()  # the clamp bites
    torch.testing.assert_close(result.relevance, expected, rtol=1e-9, atol=1e-15)


@pytest.mark.parametrize("kind", ["timm", "hf"])
def test_attention_gradcam_at_224_pixels_reads_the_last_stage_s_one_7x7_window(kind):
    """Swin-T's geometry (4 x 4 patches, windows of 7 x 7, four stages at 224 pixels):
    the last stage's 7 x 7 grid is one window, so GradCAM reads all of it at once."""
    shape = dict(patch_size=4, window_size=7, embed_dim=8, num_heads=(1, 1, 2, 2))
    # The weights from their own seed, not from whatever the tests before left in the
    # global RNG: some draws leave every class's map clamped to zero.
    with torch.random.fork_rng():
        torch.manual_seed(0)
        if kind == "timm":
            from timm.models.swin_transformer import SwinTransformer

            model = SwinTransformer(img_size=224, depths=(1, 1, 1, 1), num_classes=3, **shape)
        else:
            from transformers import SwinConfig, SwinForImageClassification

            shape["num_heads"] = list(shape["num_heads"])
            config = SwinConfig(image_size=224, depths=[1, 1, 1, 1], num_labels=3, **shape)
            model = SwinForImageClassification(config)
    model = model.double().eval()
    images = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(1)).double()
    last = adapter_for(model).prepare(images).layout.windows[-1]
    assert (last.grid, last.window, last.num_windows) == ((7, 7), (7, 7), 1)
    result = Explainer(model).explain(images, target=[[0, 1, 2]], method="attention_gradcam")
    expected = torch.stack([_gradcam_reference(model, images, c) for c in range(3)], dim=1)
    assert result.relevance.shape == (1, 3, 56, 56) and expected.amax() > 0
    torch.testing.assert_close(result.relevance, expected, rtol=1e-9, atol=1e-15)


@pytest.mark.parametrize("kind", ["timm", "hf"])
def test_attention_gradcam_refuses_a_last_stage_of_several_windows_before_any_forward(kind):
    """Windows of 2 x 2 tokens leave the last stage's 4 x 4 grid in four windows that
    never attend to each other: no map over all of it exists to read."""
    if kind == "timm":
        from timm.models.swin_transformer import SwinTransformer

        model = SwinTransformer(
            img_size=32, patch_size=2, window_size=2, embed_dim=8, depths=(1, 1, 1),
            num_heads=(1, 1, 1), num_classes=3,
        )  # fmt: skip
    else:
        from transformers import SwinConfig, SwinForImageClassification

        config = SwinConfig(
            image_size=32, patch_size=2, window_size=2, embed_dim=8, depths=[1, 1, 1],
            num_heads=[1, 1, 1], num_labels=3,
        )  # fmt: skip
        model = SwinForImageClassification(config)
    model.eval()
    forwards = []
    model.register_forward_pre_hook(lambda module, args: forwards.append(1))
    explainer = Explainer(model)
    with pytest.raises(UnsupportedModelError, match="4 windows of 2x2 tokens on its 4x4 grid"):
        explainer.explain(torch.randn(1, 3, 32, 32), method="attention_gradcam")
    assert forwards == []
    generic = explainer.explain(torch.randn(1, 3, 32, 32), method="generic")
    assert generic.relevance.shape == (1, 16, 16)  # the folds take its windows


@pytest.mark.parametrize("kind", ["timm", "timm_v2"])
def test_the_dense_attention_reproduces_each_block_s_attention_output(kind):
    """The geometry is the model's: the dense (N, N) attention built from the recorded
    windows, applied to the block's values on its own grid, gives the block's attention
    output, shifted blocks included."""
    model = tiny_swin(kind).double()
    trace = Explainer(model).trace(IMAGES, target=0)
    layout = adapter_for(model).prepare(IMAGES).layout
    blocks = [block for stage in model.layers for block in stage.blocks]
    assert any(any(b.shift) for b in layout.windows)
    inputs = []  # each block's input (B, rows, columns, C), after any merge
    hooks = [b.register_forward_pre_hook(lambda m, args: inputs.append(args[0])) for b in blocks]
    with torch.no_grad():
        model(IMAGES)
    for hook in hooks:
        hook.remove()
    for layer, block in enumerate(blocks):
        geometry = layout.windows[layer]
        hidden = inputs[layer]
        normed = block.norm1(hidden) if kind == "timm" else hidden
        tokens = normed.reshape(hidden.shape[0], geometry.num_tokens, -1)
        heads = block.attn.num_heads
        qkv = torch.nn.functional.linear(tokens, block.attn.qkv.weight)
        if kind == "timm":
            qkv = block.attn.qkv(tokens)
        elif block.attn.q_bias is not None:
            bias = torch.cat((block.attn.q_bias, block.attn.k_bias, block.attn.v_bias))
            qkv = qkv + bias
        values = qkv.reshape(*tokens.shape[:2], 3, heads, -1)[:, :, 2].transpose(1, 2)
        mixed = _dense(trace.attentions[layer], geometry) @ values
        output = block.attn.proj(mixed.transpose(1, 2).reshape(*tokens.shape[:2], -1))
        with torch.no_grad():
            expected = block._attn(normed).reshape(output.shape)
        torch.testing.assert_close(output, expected, rtol=1e-9, atol=1e-12)


def test_relevance_is_conserved_through_the_merges():
    """generic and rollout keep the readout row's total of 1 through every block (rows of
    rollout's factors sum to 1) and every merge (the 2 x 2 split keeps totals)."""
    model = tiny_swin("timm").double()
    rollout = Explainer(model).explain(IMAGES, method="rollout")
    totals = rollout.relevance.sum(dim=(1, 2))
    torch.testing.assert_close(totals, torch.ones(2, dtype=torch.float64))


def test_a_wrong_image_size_and_discard_ratio_are_refused_with_what_to_do():
    explainer = Explainer(tiny_swin("hf"))
    with pytest.raises(InputError, match="takes 32x32 images"):
        explainer.explain(torch.randn(1, 3, 48, 48))
    with pytest.raises(OptionError, match="discard_ratio"):
        explainer.explain(torch.randn(1, 3, 32, 32), method="rollout", discard_ratio=0.5)


def test_a_hub_id_loads_through_load_model_and_is_explained(tmp_path, monkeypatch):
    """A Hugging Face Swin under its real repo id, from a cache laid out as downloads
    leave it (offline), with its image processor."""
    import huggingface_hub
    from transformers import ViTImageProcessor

    from explain.loading.specs import load_model
    from explain.testing import cache_hub_repo

    folder = tmp_path / "saved"
    saved = tiny_swin("hf")
    saved.save_pretrained(folder)
    ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(folder)
    cache_hub_repo(tmp_path / "hub", "microsoft/swin-tiny-patch4-window7-224", folder)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    loaded = load_model("microsoft/swin-tiny-patch4-window7-224")
    assert loaded.image_size == (32, 32)
    images = torch.randn(2, 3, 32, 32)
    result = Explainer(loaded.model).explain(images, target=[0, 1])
    expected = Explainer(saved).explain(images, target=[0, 1])
    torch.testing.assert_close(result.relevance, expected.relevance)
