"""Shared fixtures: tiny timm ViT configurations covering the family's forms."""

from __future__ import annotations

import os

import pytest
import tolerances
import torch

from explain import METHODS
from explain.rules import Need
from explain.testing import tiny_vit

PLAIN_BASELINES = frozenset(
    name
    for name, spec in METHODS.items()
    if spec.needs & {Need.EMBEDDING_GRADIENTS, Need.EMBEDDING_COPIES}
    and spec.gradient_rules is None
)
"""The methods that read the input embeddings with no rule in the backward (Gradient x
Input, integrated gradients, occlusion, SmoothGrad). In float32 their maps carry the
rounding of the attention softmax and, for the gradients, its Jacobian: about 1e-5 of the
map's largest value between two forwards of other shapes (measured 2e-6 to 4e-6 on the
tiny Llama, against 2e-7 to 5e-7 for AttnLRP), so float32 comparisons of their maps scale
their absolute tolerance by the map (`float32_atol`). So do float64 comparisons on models
that compute a part in float32 whatever their dtype (Llama's RMSNorm), whose backward a
plain gradient goes through."""


def float32_atol(method: str, expected: torch.Tensor, atol: float) -> float:
    """`atol`, or for the plain baselines 1e-5 of `expected`'s largest magnitude where
    that is larger (PLAIN_BASELINES)."""
    if method not in PLAIN_BASELINES:
        return atol
    return max(atol, 1e-5 * float(expected.abs().max()))


def pytest_addoption(parser):
    # The suite must pass on any CPU, whatever its thread count and denormal mode; to see
    # that it does, run it as well with OMP_NUM_THREADS=1 and =2, and with this option.
    parser.addoption(
        "--flush-denormal",
        action="store_true",
        help="flush denormal floats to zero for the session (torch.set_flush_denormal; "
        "x86 with SSE3 only: elsewhere the run stops with a message)",
    )


def pytest_configure(config):
    """No test touches the network: the Hugging Face libraries read HF_HUB_OFFLINE when
    first imported, which is after this (test modules import them). Every float comparison
    a test makes is checked against the suite's rule (tests/tolerances.py)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    tolerances.install()
    if config.getoption("flush_denormal") and not torch.set_flush_denormal(True):
        raise pytest.UsageError("--flush-denormal: this CPU cannot flush denormals to zero")


# name -> (constructor kwargs, input (H, W))
VIT_CONFIGS = {
    "vit": (dict(depth=3, num_heads=2), (32, 32)),
    "deep-3heads": (dict(depth=5, num_heads=3, embed_dim=48), (32, 32)),
    "one-block": (dict(depth=1, num_heads=4), (32, 32)),
    "patch4-img24": (dict(img_size=24, patch_size=4), (24, 24)),
    "registers": (dict(reg_tokens=3), (32, 32)),
    "gap-no-cls": (dict(class_token=False, global_pool="avg", fc_norm=False), (32, 32)),
    "gap-registers": (dict(class_token=False, reg_tokens=2, global_pool="avg"), (32, 32)),
    "distilled": (dict(distilled=True), (32, 32)),
    "deit3-layerscale": (dict(init_values=0.5, no_embed_class=True), (32, 32)),
    "dynamic-size": (dict(dynamic_img_size=True), (48, 24)),
}


@pytest.fixture(params=sorted(VIT_CONFIGS))
def vit_case(request):
    """(model, images) for one configuration, batch of 3, float32."""
    kwargs, (height, width) = VIT_CONFIGS[request.param]
    model = tiny_vit(**kwargs)
    generator = torch.Generator().manual_seed(1)
    images = torch.randn(3, 3, height, width, generator=generator)
    return model, images


@pytest.fixture
def vit():
    return tiny_vit(depth=3, num_heads=2)


@pytest.fixture
def images():
    return torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
