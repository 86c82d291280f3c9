"""Train the zoo's `shapes-llava`: a small LLaVA answering questions about shapes scenes.

A stock Hugging Face `LlavaForConditionalGeneration`: a CLIP vision tower (a ViT on
64 x 64 scenes, 8 x 8 patches, read at its last block without its class token), LLaVA's
two-layer projector, and a small Llama over the word-level vocabulary of
`explain.data.shapes_questions` (its tokenizer, chat template and questions). It answers
"what colour is the star?", "is there a ring?", "what shape is the red object?" and "what
is left of the circle?" about free-colour scenes (hues independent of the kinds) with one
word and the end token, trained with cross-entropy on those two tokens.

Trains on questions 0..Q-1 of scenes 0..N-1 of the "train" split, flipped upside down at
random (which keeps kinds, colours and what is left of what), monitors question 0 of scenes
N..N+V-1 of the same split, and never sees the "heldout" split.

    .venv/bin/python scripts/train_shapes_llava.py            # writes models/shapes-llava/
"""

from __future__ import annotations

import hashlib
import inspect
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm import tqdm
from vit_training import Recipe, arguments, save, train

from explain.architectures.hf_common import positions_from_mask
from explain.data import shapes, shapes_questions
from explain.export import atomic_write
from explain.loading.zoo import build_model

ROOT = Path(__file__).resolve().parents[1]
IMAGE_SIZE, PATCH = 64, 8
BACKGROUND = len(shapes.KINDS)  # the patch labels' class for "no object": 6 (= len(COLOURS))
PROCESSOR_FILES = [
    "processor_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
]


def processor(tokenizer):
    """The model's LlavaProcessor: the question tokenizer with its chat template, and a
    CLIP image processor that resizes a photo's shorter side to 64 pixels, crops the
    centre 64 x 64 and normalises with the shapes models' mean and std."""
    import transformers as tf

    images = tf.CLIPImageProcessor(
        size={"shortest_edge": IMAGE_SIZE},
        crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        image_mean=list(shapes.MEAN),
        image_std=list(shapes.STD),
    )
    return tf.LlavaProcessor(
        image_processor=images,
        tokenizer=tokenizer,
        patch_size=PATCH,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        chat_template=shapes_questions.CHAT_TEMPLATE,
    )


def config(tokenizer, width: int, vision_depth: int, text_depth: int, heads: int) -> dict:
    """The zoo config: a LlavaConfig's arguments and the processor files in the folder."""
    vision = {
        "model_type": "clip_vision_model",
        "image_size": IMAGE_SIZE,
        "patch_size": PATCH,
        "hidden_size": width,
        "intermediate_size": 2 * width,
        "num_hidden_layers": vision_depth,
        "num_attention_heads": heads,
    }
    text = {
        "model_type": "llama",
        "vocab_size": len(tokenizer),
        "hidden_size": width,
        "intermediate_size": 2 * width,
        "num_hidden_layers": text_depth,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "max_position_embeddings": 128,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "tie_word_embeddings": False,
        # Llama's default 0.02 suits widths in the thousands: at width 64 the text tokens'
        # embeddings are then tiny next to the image tokens', and the question is lost in
        # the first block's sum. 1 / sqrt(width) keeps them on one scale (with ideal image
        # features, a 2-block model answered 64% after 2000 steps at 0.02, 97% after 1000
        # at 0.125). Only training reads it.
        "initializer_range": width**-0.5,
    }
    return {
        "builder": "hf_llava",
        "summary": (
            "LLaVA (CLIP tower, Llama) answering templated questions about shapes scenes, each "
            "answer's object known (its mask)"
        ),
        "modality": "vision_language",
        "classes": None,
        "llava": {
            "vision_config": vision,
            "text_config": text,
            "image_token_id": tokenizer.convert_tokens_to_ids("<image>"),
            # the tower is trained for this model: its last block is read (LLaVA 1.5 reads
            # the second-to-last of a pretrained CLIP)
            "vision_feature_layer": -1,
            "vision_feature_select_strategy": "default",
            "projector_hidden_act": "gelu",
        },
        "processor_files": PROCESSOR_FILES,
    }


def render(start: int, count: int, questions: int) -> tuple[Tensor, ...]:
    """Scenes start..start+count-1 of the "train" split as uint8 images (N, 64, 64, 3),
    questions 0..questions-1 of each as indices into `question_texts()` (N, Q) and answer
    token ids (N, Q), and what covers each patch (N, gh, gw, 2): the kind and the colour
    of the object covering most of it, if at least a quarter (else BACKGROUND).

    Kept under outputs/cache/ (git-ignored): reruns skip rendering. The cache name
    carries a digest of the generators' source and of the functions here that encode
    their output, so a changed generator never trains on stale scenes."""
    sources = [Path(module.__file__).read_text() for module in (shapes, shapes_questions)]
    sources += [inspect.getsource(f) for f in (render, quantised, question_texts)]
    digest = hashlib.sha256("".join(sources).encode()).hexdigest()
    name = f"shapes-questions-{digest[:12]}-{start}-{count}-{questions}.pt"
    cache = ROOT / "outputs" / "cache" / name
    if cache.is_file():
        return torch.load(cache)
    texts = {text: i for i, text in enumerate(question_texts())}
    vocabulary = {word: i for i, word in enumerate(shapes_questions.VOCABULARY)}
    images = torch.empty(count, IMAGE_SIZE, IMAGE_SIZE, 3, dtype=torch.uint8)
    asked = torch.empty(count, questions, dtype=torch.long)
    answers = torch.empty(count, questions, dtype=torch.long)
    grid = IMAGE_SIZE // PATCH
    patches = torch.empty(count, grid, grid, 2, dtype=torch.long)
    for i in tqdm(range(count), desc="rendering scenes", unit="scene"):
        seed = shapes.scene_seed("train", start + i)
        layout = shapes.scene_layout(seed, IMAGE_SIZE, colours="free")
        scene = shapes.render_layout(layout)
        images[i] = torch.from_numpy(quantised(scene.image))
        cover, most = F.avg_pool2d(torch.from_numpy(scene.masks).float(), PATCH).max(dim=0)
        for channel, looks in enumerate((scene.kinds, scene.colours)):
            found = torch.tensor(looks)[most]
            patches[i, ..., channel] = torch.where(cover >= 0.25, found, BACKGROUND)
        for number in range(questions):
            item = shapes_questions.ask(layout, number)
            asked[i, number] = texts[item.text]
            answers[i, number] = vocabulary[item.answer]
    rendered = (images, asked, answers, patches)
    with atomic_write(cache) as handle:
        torch.save(rendered, handle)
    return rendered


def quantised(image: np.ndarray) -> np.ndarray:
    """A scene's [0, 1] image as the uint8 photo a user would save and give the model."""
    return (np.clip(image, 0, 1) * 255).round().astype(np.uint8)


def question_texts() -> list[str]:
    """Every question the templates can ask, in a fixed order."""
    texts = []
    for template in shapes_questions.TEMPLATES:
        names = shapes.COLOURS if template == "shape" else shapes.KINDS
        texts += [shapes_questions.Question(template, i).text for i in range(len(names))]
    return texts


class Answering(nn.Module):
    """The LLaVA model as a classifier of rows: the logits of the first answer word (what
    the validation accuracy measures), and of the end token after it.

    Row r asks question `asked[r]` (an index into `question_texts()`) about scene
    `scenes[r]` of `images` (N, 64, 64, 3) uint8; its answer is token `answers[r]`.
    Prompts are the processor's (its chat template, the image placeholder expanded, left
    padding), so training sees what a user's prompt gives.
    """

    def __init__(
        self, llava: nn.Module, processor, images: Tensor, patches: Tensor, rows: Tensor
    ) -> None:
        super().__init__()
        self.llava = llava
        self.images, self.patches = images, patches
        self.scenes, self.asked, self.answers = rows
        # reads what covers each patch off its image token (the dense loss); not shipped:
        # the kind or background, and the colour or background
        self.patch_head = nn.Linear(llava.config.text_config.hidden_size, 2 * (BACKGROUND + 1))
        photo = np.zeros((IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8)
        chats = [
            [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]
            for text in question_texts()
        ]
        prompts = [processor.apply_chat_template(c, add_generation_prompt=True) for c in chats]
        encoded = processor(
            images=[photo] * len(prompts), text=prompts, padding=True, return_tensors="pt"
        )
        self.prompt_ids, self.prompt_mask = encoded["input_ids"], encoded["attention_mask"]
        self.mean = torch.tensor(shapes.MEAN)[:, None, None]
        self.std = torch.tensor(shapes.STD)[:, None, None]
        self.end = processor.tokenizer.eos_token_id

    def pixels(self, scenes: Tensor, flips: Tensor | None) -> Tensor:
        images = self.images[scenes].permute(0, 3, 1, 2).float() / 255
        if flips is not None:  # upside down: rows reversed
            images = torch.where(flips[:, None, None, None], images.flip(-2), images)
        return (images - self.mean) / self.std

    def forward(self, rows: Tensor, flips: Tensor | None = None, answered: bool = False):
        """(B, V) first-word logits; with `answered`, (B, 2, V): the first word's and the
        next token's, the true answer given (teacher forcing), and the patch head's
        logits (B, gh, gw, kinds + colours)."""
        asked = self.asked[rows]
        ids, mask = self.prompt_ids[asked], self.prompt_mask[asked]
        if answered:
            answer = self.answers[rows][:, None]
            ids = torch.cat([ids, answer], dim=1)
            mask = torch.cat([mask, torch.ones_like(answer)], dim=1)
        tokens = []
        hook = self.llava.model.multi_modal_projector.register_forward_hook(
            lambda module, inputs, output: tokens.append(output)
        )
        try:
            logits = self.llava(
                input_ids=ids,
                attention_mask=mask,
                position_ids=positions_from_mask(mask),
                pixel_values=self.pixels(self.scenes[rows], flips),
                logits_to_keep=2 if answered else 1,
            ).logits
        finally:
            hook.remove()
        if not answered:
            return logits[:, -1]
        # (B, gh * gw, 2 * classes) -> (B, classes, 2, gh, gw), as cross_entropy takes them
        grid = self.patches.shape[1]
        patch_logits = self.patch_head(tokens[0]).unflatten(-1, (2, BACKGROUND + 1))
        return logits, patch_logits.permute(0, 3, 2, 1).unflatten(-1, (grid, grid))

    def tower_patch_logits(self, rows: Tensor, flips: Tensor) -> Tensor:
        """The patch head's logits (B, classes, 2, gh, gw) from the tower and projector
        alone (the language model is not run)."""
        features = self.llava.model.get_image_features(self.pixels(self.scenes[rows], flips))
        grid = self.patches.shape[1]
        patch_logits = self.patch_head(torch.stack(features.pooler_output))
        patch_logits = patch_logits.unflatten(-1, (2, BACKGROUND + 1))
        return patch_logits.permute(0, 3, 2, 1).unflatten(-1, (grid, grid))

    def patch_labels(self, rows: Tensor, flips: Tensor) -> Tensor:
        """(B, 2, gh, gw): the kind and the colour class of each patch (flipped along)."""
        labels = self.patches[self.scenes[rows]].permute(0, 3, 1, 2)
        return torch.where(flips[:, None, None, None], labels.flip(-2), labels)


def upside_down(batch: tuple[Tensor, ...], generator: torch.Generator) -> tuple[Tensor, ...]:
    """Flip each scene upside down with probability 1/2 (kinds, colours and left-right
    order are kept, so every answer stays right)."""
    rows, labels, _ = batch
    return rows, labels, torch.randint(0, 2, (len(rows),), generator=generator).bool()


def answer_loss(patch_weight: float):
    """Cross-entropy of the answer word and of the end token after it, plus
    `patch_weight` times the cross-entropy of each patch's kind and colour classes."""

    def loss(model: Answering, batch: tuple[Tensor, ...]) -> Tensor:
        rows, labels, flips = batch
        logits, patch_logits = model(rows, flips, answered=True)
        end = torch.full_like(labels, model.end)
        value = F.cross_entropy(logits[:, 0], labels) + F.cross_entropy(logits[:, 1], end)
        if patch_weight:
            covered = model.patch_labels(rows, flips)
            value = value + patch_weight * F.cross_entropy(patch_logits, covered)
        return value

    return loss


def patch_loss(model: Answering, batch: tuple[Tensor, ...]) -> Tensor:
    """Cross-entropy of each patch's kind and colour classes, from the tower alone."""
    rows, _, flips = batch
    return F.cross_entropy(model.tower_patch_logits(rows, flips), model.patch_labels(rows, flips))


def main() -> None:
    # --embed-dim is the width of the tower and the language model, --depth the tower's
    # number of blocks.
    parser = arguments(__doc__, ROOT / "models" / "shapes-llava", epochs=5, lr=2e-3)
    parser.add_argument("--text-depth", type=int, default=3)
    parser.add_argument("--train-scenes", type=int, default=16000)
    parser.add_argument("--questions-per-scene", type=int, default=4)
    parser.add_argument("--validation-scenes", type=int, default=500)
    # Dense supervision from the masks: what covers each patch, read off its image token.
    parser.add_argument("--patch-weight", type=float, default=1.0)
    # First train the tower and projector alone on that loss, for this many passes over
    # the scenes: the language model then learns to read image tokens that already say
    # what covers each patch.
    parser.add_argument("--tower-epochs", type=int, default=12)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    started, cpu_started = time.time(), time.process_time()
    tokenizer = shapes_questions.build_tokenizer()
    made = processor(tokenizer)
    train_images, train_asked, train_answers, train_patches = render(
        0, args.train_scenes, args.questions_per_scene
    )
    check_images, check_asked, check_answers, check_patches = render(
        args.train_scenes, args.validation_scenes, 1
    )
    # one table of rows: every question of the training scenes, then the validation rows
    count, questions = train_asked.shape
    images = torch.cat([train_images, check_images])
    patches = torch.cat([train_patches, check_patches])
    scenes = torch.cat(
        [torch.arange(count).repeat_interleave(questions), count + torch.arange(len(check_images))]
    )
    asked = torch.cat([train_asked.flatten(), check_asked[:, 0]])
    answers = torch.cat([train_answers.flatten(), check_answers[:, 0]])
    settings = config(tokenizer, args.embed_dim, args.depth, args.text_depth, args.heads)
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    llava = build_model(settings)
    model = Answering(llava, made, images, patches, (scenes, asked, answers))
    rows = torch.arange(count * questions)
    checked = torch.arange(count * questions, len(scenes))
    no_flips = torch.zeros(len(rows), dtype=torch.bool)
    first = rows[::questions]  # one row per training scene
    tower_history = []
    if args.tower_epochs:
        tower_recipe = Recipe(args.tower_epochs, args.batch_size, learning_rate=args.lr)
        tower_history = train(
            model,
            (first, answers[first], no_flips[: len(first)]),
            (checked, answers[checked]),
            tower_recipe,
            multi_label=False,
            augment=upside_down,
            loss=patch_loss,
            seed=args.seed,
        )
    recipe = Recipe(epochs=args.epochs, batch_size=args.batch_size, learning_rate=args.lr)
    history = train(
        model,
        (rows, answers[rows], no_flips),
        (checked, answers[checked]),
        recipe,
        multi_label=False,
        augment=upside_down,
        loss=answer_loss(args.patch_weight),
        seed=args.seed,
    )
    training = {
        "script": "scripts/train_shapes_llava.py",
        "seed": args.seed,
        "train_scenes": f"train split, scenes 0..{args.train_scenes - 1}, free colours",
        "questions_per_scene": args.questions_per_scene,
        "validation_scenes": f"train split, the {args.validation_scenes} after those, question 0",
        "recipe": vars(recipe),
        "loss": "cross-entropy of the answer word and of the end token after it, plus "
        f"{args.patch_weight} x cross-entropy of the kind and the colour (or background) "
        "covering each patch, read off its image token by a linear head (not shipped)",
        "augmentation": "random upside-down flip",
        "tower_epochs": args.tower_epochs,
        "tower_history": tower_history,
        "cpu_minutes": round((time.process_time() - cpu_started) / 60, 1),
    }
    made.save_pretrained(args.out)
    save(args.out, llava, settings, training, history, started)


if __name__ == "__main__":
    main()
