"""What the zoo's image-model training scripts share (imported by scripts/train_*_vit.py).

The command-line arguments every script takes (`arguments`), the training loop (AdamW
with a linear warm-up and a cosine decay, seeded, one tqdm bar over all steps, a
validation measurement after each epoch on images from the training split's reserve,
never the held-out split, which only scripts/zoo_accuracy.py reads), and writing the
trained model with its training record (`save`).
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from tqdm import tqdm

from explain.loading.zoo import save_zoo_model


def arguments(description: str, out: Path, *, epochs: int, lr: float) -> argparse.ArgumentParser:
    """A parser with the options every training script takes (its own defaults for the
    output folder, epochs and learning rate); scripts add their own options to it."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=out)
    parser.add_argument("--epochs", type=int, default=epochs)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=lr)
    parser.add_argument("--embed-dim", type=int, default=64)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    # One thread: on a busy 2-core machine two threads ran six times slower than one.
    parser.add_argument("--threads", type=int, default=1)
    return parser


def save(
    out: Path,
    model: nn.Module,
    settings: dict[str, Any],
    training: dict[str, Any],
    history: list[dict[str, float]],
    started: float,
) -> None:
    """Write the trained model to `out` with `settings["training"]`: the script's record,
    the last validation accuracy and the minutes since `started` (time.time())."""
    settings["training"] = {
        **training,
        "final_validation_accuracy": history[-1]["validation_accuracy"],
        "minutes": round((time.time() - started) / 60, 1),
    }
    path = save_zoo_model(out, model, settings)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB)")


@dataclass(frozen=True)
class Recipe:
    """Optimisation settings; the model cards quote them."""

    epochs: int
    batch_size: int = 128
    learning_rate: float = 1e-3
    weight_decay: float = 0.05
    warmup_fraction: float = 0.05
    label_smoothing: float = 0.0


def accuracy(logits: Tensor, labels: Tensor, multi_label: bool) -> float:
    """Single-label: argmax equals the label. Multi-label: every sigmoid decision is right."""
    if multi_label:
        return ((logits > 0) == (labels > 0.5)).all(dim=1).float().mean().item()
    return (logits.argmax(dim=1) == labels).float().mean().item()


@torch.no_grad()
def predict(model: nn.Module, images: Tensor, batch_size: int = 512) -> Tensor:
    model.eval()
    return torch.cat([model(images[i : i + batch_size]) for i in range(0, len(images), batch_size)])


Batch = tuple[Tensor, ...]
"""Images first, labels second, then any per-example extras (e.g. per-patch labels)."""


def train(
    model: nn.Module,
    data: Batch,
    validation: tuple[Tensor, Tensor],
    recipe: Recipe,
    *,
    multi_label: bool,
    augment: Callable[[Batch, torch.Generator], Batch],
    seed: int,
    loss: Callable[[nn.Module, Batch], Tensor] | None = None,
) -> list[dict[str, float]]:
    """Train `model` in place; returns one {epoch, loss, validation_accuracy} per epoch.

    `augment` transforms a batch (all its tensors consistently); `loss` computes the
    training loss of a batch (default: cross-entropy, or binary cross-entropy when
    `multi_label`, of the model's logits against the labels).
    """
    generator = torch.Generator().manual_seed(seed)
    decay = [p for n, p in model.named_parameters() if p.ndim > 1 and "pos_embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if p.ndim <= 1 or "pos_embed" in n]
    optimiser = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": recipe.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=recipe.learning_rate,
    )
    steps_per_epoch = math.ceil(len(data[0]) / recipe.batch_size)
    total = recipe.epochs * steps_per_epoch
    warmup = max(1, int(recipe.warmup_fraction * total))

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimiser, schedule)
    if multi_label:
        criterion: nn.Module = nn.BCEWithLogitsLoss()
    else:
        criterion = nn.CrossEntropyLoss(label_smoothing=recipe.label_smoothing)
    if loss is None:

        def loss(model: nn.Module, batch: Batch) -> Tensor:
            return criterion(model(batch[0]), batch[1])

    history = []
    with tqdm(total=total, desc="training", unit="step") as bar:
        for epoch in range(recipe.epochs):
            model.train()
            order = torch.randperm(len(data[0]), generator=generator)
            running = 0.0
            for step in range(steps_per_epoch):
                chosen = order[step * recipe.batch_size : (step + 1) * recipe.batch_size]
                value = loss(model, augment(tuple(t[chosen] for t in data), generator))
                optimiser.zero_grad(set_to_none=True)
                value.backward()
                optimiser.step()
                scheduler.step()
                running += value.item()
                bar.update(1)
                bar.set_postfix(epoch=epoch + 1, loss=f"{value.item():.4f}")
            score = accuracy(predict(model, validation[0]), validation[1], multi_label)
            history.append(
                {
                    "epoch": epoch + 1,
                    "loss": running / steps_per_epoch,
                    "validation_accuracy": score,
                }
            )
            bar.write(
                f"epoch {epoch + 1}: loss {running / steps_per_epoch:.4f}, "
                f"validation accuracy {score:.4f}"
            )
    model.eval()
    return history
