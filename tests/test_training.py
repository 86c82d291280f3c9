"""Explaining between training steps leaves the loss curve bit-identical, dropout included."""

from __future__ import annotations

import torch

from explain import METHODS, Explainer
from explain.testing import tiny_vit


def _train(explain_between_steps: bool) -> list[float]:
    torch.manual_seed(0)
    model = tiny_vit(drop_rate=0.2, attn_drop_rate=0.2, proj_drop_rate=0.2, drop_path_rate=0.2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    data = torch.randn(6, 4, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    labels = torch.randint(0, 5, (6, 4), generator=torch.Generator().manual_seed(2))
    explainer = Explainer(model)
    losses = []
    model.train()
    for step in range(6):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(data[step]), labels[step])
        if explain_between_steps:  # between forward and backward: the graph must survive
            explainer.explain(data[step][:2], method="generic")
        loss.backward()
        if explain_between_steps:  # between backward and step: grads must survive
            for method in sorted(METHODS):
                explainer.explain(data[step][:2], method=method, target=1)
            explainer.trace(data[step][:1])
        optimizer.step()
        losses.append(loss.item())
    return losses


def test_loss_curve_is_bit_identical():
    plain = _train(explain_between_steps=False)
    interleaved = _train(explain_between_steps=True)
    assert plain == interleaved
    assert len(set(plain)) > 1  # the model did train
