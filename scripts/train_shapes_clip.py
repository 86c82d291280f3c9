"""Train the zoo's `shapes-clip`: a tiny CLIP matching synthetic scenes with captions.

A stock Hugging Face `CLIPModel` (vision tower: a 4-block ViT on 64 x 64 scenes, 8 x 8
patches; text tower: 2 blocks over a word-level vocabulary of 23 tokens), trained with
CLIP's symmetric contrastive loss (learnable temperature) on train-split scenes against
captions naming their objects: "a star and a circle", "a photo of a ring, a cross and a
square" (objects in random order, one of `captions.TEMPLATES` at random).

Batches hold duplicate captions (a scene has one of only 41 sets of kinds), so the loss
does not treat the other scenes of the same set as negatives: each image's target is
spread evenly over every text of its set in the batch, and each text's over every image.

Trains on scenes 0..N-1 of the "train" split (the same rendered scenes, and cache, as
`train_shapes_vit.py`), monitors zero-shot retrieval of the exact set of kinds on scenes
N..N+V-1 of the same split, and never sees the "heldout" split.

    .venv/bin/python scripts/train_shapes_clip.py            # writes models/shapes-clip/
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from train_shapes_vit import dihedral, render
from transformers import PreTrainedTokenizerFast
from vit_training import Recipe, arguments, save, train

from explain.data import captions, shapes
from explain.loading.zoo import build_model

ROOT = Path(__file__).resolve().parents[1]
IMAGE_SIZE, PATCH = 64, 8


def config(
    tokenizer: PreTrainedTokenizerFast, width: int, vision_depth: int, text_depth: int, heads: int
) -> dict:
    """The zoo config of the model: a CLIPConfig's arguments, the preprocessing, and the
    tokenizer files that ship in the folder."""
    text = {
        "vocab_size": len(tokenizer),
        "hidden_size": width,
        "intermediate_size": 2 * width,
        "num_hidden_layers": text_depth,
        "num_attention_heads": heads,
        "max_position_embeddings": tokenizer.model_max_length,
        # CLIPTextTransformer pools each text at its first `eos_token_id`.
        "eos_token_id": tokenizer.eos_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    vision = {
        "image_size": IMAGE_SIZE,
        "patch_size": PATCH,
        "hidden_size": width,
        "intermediate_size": 2 * width,
        "num_hidden_layers": vision_depth,
        "num_attention_heads": heads,
    }
    return {
        "builder": "hf_clip",
        "summary": "CLIP (ViT 4 blocks, text 2 blocks) matching shapes scenes with their captions",
        # A dual encoder: `Explainer.explain` takes images and texts together (load_model
        # reports the same for any Hugging Face CLIPModel folder).
        "modality": "image_text",
        "classes": None,
        "clip": {"text_config": text, "vision_config": vision, "projection_dim": width},
        "tokenizer_files": ["tokenizer.json", "tokenizer_config.json"],
        "preprocessing": {
            "image_size": [IMAGE_SIZE, IMAGE_SIZE],
            "mean": shapes.MEAN,
            "std": shapes.STD,
        },
    }


class ZeroShotSets(nn.Module):
    """A CLIP model as a 41-way classifier: the similarity logits of images with the
    canonical captions of every set of kinds (what the validation accuracy measures)."""

    def __init__(self, clip: nn.Module, tokenizer: PreTrainedTokenizerFast) -> None:
        super().__init__()
        self.clip = clip
        texts = [captions.caption(kinds) for kinds in captions.kind_sets()]
        self.prompts = dict(tokenizer(texts, padding=True, return_tensors="pt"))

    def forward(self, images: Tensor) -> Tensor:
        return self.clip(pixel_values=images, **self.prompts).logits_per_image


def set_index(labels: Tensor) -> Tensor:
    """(N,) index into `captions.kind_sets()` of each multi-hot label row."""
    index = {kinds: i for i, kinds in enumerate(captions.kind_sets())}
    return torch.tensor([index[tuple(np.flatnonzero(row))] for row in labels.numpy()])


def contrastive_loss(tokenizer: PreTrainedTokenizerFast, seed: int):
    """CLIP's symmetric cross-entropy over the batch's image-text similarity logits, with
    every pair of the same set of kinds a positive (targets normalised per row)."""
    rng = np.random.default_rng(seed)  # caption order and template, reproducible per run

    def loss(model: ZeroShotSets, batch: tuple[Tensor, ...]) -> Tensor:
        images, labels, _ = batch
        texts = [
            captions.caption(
                np.flatnonzero(row), rng, captions.TEMPLATES[rng.integers(len(captions.TEMPLATES))]
            )
            for row in labels.numpy()
        ]
        encoded = tokenizer(texts, padding=True, return_tensors="pt")
        logits = model.clip(pixel_values=images, **encoded).logits_per_image  # (B, B)
        same = (labels[:, None, :] == labels[None, :, :]).all(dim=-1).float()
        targets = same / same.sum(dim=1, keepdim=True)  # symmetric, so also per text
        return (F.cross_entropy(logits, targets) + F.cross_entropy(logits.T, targets)) / 2

    return loss


def main() -> None:
    # --embed-dim is the width of both towers and the projections, --depth the vision
    # tower's number of blocks.
    parser = arguments(__doc__, ROOT / "models" / "shapes-clip", epochs=4, lr=1e-3)
    parser.add_argument("--text-depth", type=int, default=2)
    parser.add_argument("--max-text-tokens", type=int, default=16)
    parser.add_argument("--train-scenes", type=int, default=8000)
    parser.add_argument("--validation-scenes", type=int, default=500)
    parser.add_argument("--render-workers", type=int, default=2)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    started = time.time()
    data = render("train", 0, args.train_scenes, IMAGE_SIZE, PATCH, args.render_workers)
    validation = render(
        "train", args.train_scenes, args.validation_scenes, IMAGE_SIZE, PATCH, args.render_workers
    )
    tokenizer = captions.build_tokenizer(args.max_text_tokens)
    settings = config(tokenizer, args.embed_dim, args.depth, args.text_depth, args.heads)
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    model = ZeroShotSets(build_model(settings), tokenizer)
    recipe = Recipe(epochs=args.epochs, batch_size=args.batch_size, learning_rate=args.lr)
    history = train(
        model,
        data,
        (validation[0], set_index(validation[1])),
        recipe,
        multi_label=False,
        augment=dihedral,
        loss=contrastive_loss(tokenizer, args.seed),
        seed=args.seed,
    )
    training = {
        "script": "scripts/train_shapes_clip.py",
        "seed": args.seed,
        "train_scenes": f"train split, scenes 0..{args.train_scenes - 1}",
        "validation_scenes": f"train split, the {args.validation_scenes} after those",
        "recipe": vars(recipe),
        "loss": "symmetric InfoNCE, learnable temperature; same-set pairs are positives",
        "captions": "objects in random order, template drawn from " + repr(captions.TEMPLATES),
        "augmentation": "random flip and rotation by a multiple of 90 degrees",
        "final_logit_scale": round(model.clip.logit_scale.exp().item(), 2),
    }
    tokenizer.save_pretrained(args.out)
    save(args.out, model.clip, settings, training, history, started)


if __name__ == "__main__":
    main()
