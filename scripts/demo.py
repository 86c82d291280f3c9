"""`make demo`: explain the zoo's trained models offline and write the pictures under --out.

- shapes-vit: held-out scenes with two or more objects, every registered method, each
  object's class explained on its own (a classes x methods grid per scene), plus a check
  that prints, per method, how often a class's map is brightest on that class's object;
- digits-vit: held-out handwritten digits explained for their predicted class, by method;
- minilm-sentiment: held-out review sentences highlighted word by word, as an HTML page;
- recall-llama: a held-out recall prompt (facts `key value .` among filler, then `? key`)
  answered and explained by `explain generate` (recall/generation.html and .png) and cited
  by `explain cite` over the prompt's sentences (recall/cite/: cite.html, cite.png and
  cite.json with the ablation check's verdict), both with the language-model default
  method; the known answer is printed beside the model's;
- shapes-llava: a question about a held-out scene answered and explained by `explain
  generate --image` (llava/generation.html and .png: each answer word's map over the
  scene) and cited by `explain cite --image` with the scene's objects as the regions
  (llava/cite/), with the vision-language default method.

The language and vision-language parts run the commands themselves, in this process: what
they write is what a user's `explain generate` and `explain cite` write. With
--readme-images the README's pictures (README_IMAGES) are copied from the outputs into
docs/images/ (`make readme-images`), so that they are regenerated, never hand-made.

Prints what it runs and the paths of the files it wrote.
"""

from __future__ import annotations

import argparse
import shlex
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm import tqdm

from explain import METHODS, Explainer
from explain.cli.cite import FILES as CITE_FILES  # what `explain cite` writes
from explain.export import atomic_write
from explain.loading.specs import load_model
from explain.loading.zoo import ZOO
from explain.viz import batch_figure, explanation_grid, heatmap_figure, save_figure, save_image
from explain.viz.image import class_label

if TYPE_CHECKING:
    from explain.data.recall import RecallExample
    from explain.data.shapes_questions import Example as ShapesQuestion

ROOT = Path(__file__).resolve().parents[1]
SHAPE_SCENES = 3
DIGITS = 8
SENTENCES = 8
DISPLAY_SIZE = 256  # the zoo's images are small; pictures are drawn at this size
HERO_METHODS = ("generic", "transformer_attribution", "attention_gradcam", "rollout")
README_IMAGES: dict[str, str] = {
    "hero.png": "hero.png",
    "generation.png": "recall/generation.png",
    "vision-language.png": "llava/generation.png",
}
"""docs/images/NAME (the README's pictures) -> the output under --out it is a copy of."""
ANSWER_FILES = ("generation.html", "generation.png", *(f"cite/{name}" for name in CITE_FILES))
"""What the language and vision-language parts write into their folders."""
RECALL_TOKENS, RECALL_FACTS = 48, 4  # short enough for every token to be read in the figure


def upscale(pictures: Tensor, size: int = DISPLAY_SIZE) -> Tensor:
    """(B, 3, h, w) [0, 1] pictures resized for display (bicubic, clamped to [0, 1])."""
    return F.interpolate(pictures, size=(size, size), mode="bicubic").clamp(0.0, 1.0)


def model_title(name: str, shown: str) -> str:
    """A figure's title: the zoo model `name` and what it is (its summary), then what the
    figure `shown` holds."""
    return f"zoo:{name}: {ZOO[name].summary}. {shown}"


def shapes_demo(out: Path) -> list[Path]:
    from explain.data import shapes

    loaded = load_model("zoo:shapes-vit")
    explainer = Explainer(loaded.model)
    heldout = shapes.ShapesDataset("heldout", 200)
    scenes = [s for s in map(heldout.scene, range(len(heldout))) if len(s.kinds) >= 2]
    scenes = scenes[:SHAPE_SCENES]
    images = torch.stack([shapes.normalise(scene.image) for scene in scenes])
    pictures = upscale(torch.stack([torch.from_numpy(s.image).permute(2, 0, 1) for s in scenes]))
    # Explain the classes of the first two objects of each scene, one map per object.
    targets = torch.tensor([scene.kinds[:2] for scene in scenes])
    results = {
        method: explainer.explain(images, target=targets, method=method)
        # disable=None: no bar when stderr is piped, so a log holds only the printed lines
        for method in tqdm(sorted(METHODS), desc="shapes-vit", unit="method", disable=None)
    }
    written = []
    for b, scene in enumerate(scenes):
        # The plain scene too, so that `explain image outputs/demo/scenes ...` has input.
        written.append(out / "scenes" / f"scene_{b}.png")
        save_image(scene.image, written[-1])
        figure = explanation_grid(
            pictures[b],
            results,
            sample=b,
            class_names=loaded.classes,
            transpose=True,
            multi_label=loaded.multi_label,
            title=model_title(
                "shapes-vit", f"Held-out scene {b}: each object's class (rows) by every method"
            ),
        )
        written.append(out / f"shapes_{b}_all_methods.png")
        save_figure(figure, written[-1])
        generic = results["generic"]
        maps = generic.heatmap(size=(DISPLAY_SIZE, DISPLAY_SIZE), normalize=False)[b]
        for k, kind in enumerate(targets[b].tolist()):
            explained = class_label(kind, loaded.classes, generic.logits[b], loaded.multi_label)
            figure = heatmap_figure(
                pictures[b],
                maps[k],
                title=f"generic: {explained}",
                note=model_title("shapes-vit", f"Held-out scene {b}."),
            )
            written.append(out / f"shapes_{b}_generic_{loaded.classes[kind]}.png")
            save_figure(figure, written[-1])
    hero = explanation_grid(
        pictures[0],
        {method: results[method] for method in HERO_METHODS},
        class_names=loaded.classes,
        transpose=True,
        multi_label=loaded.multi_label,
        title=model_title(
            "shapes-vit", "A held-out scene: each object's class (rows) by four methods"
        ),
    )
    written.append(out / "hero.png")
    save_figure(hero, written[-1])
    print_object_check(scenes, targets, results, loaded.classes)
    return written


def print_object_check(scenes, targets: Tensor, results, classes) -> None:
    """Per method: how many class maps have their highest mean relevance on the object of
    the explained class (the "cat and dog" test, scored with the scenes' true masks)."""
    print("shapes-vit: class maps brightest on their own object (of the objects in the scene)")
    for method, result in results.items():
        maps = result.heatmap()  # (B, 2, H, W) at the model's input size
        hits = total = 0
        for b, scene in enumerate(scenes):
            masks = torch.from_numpy(scene.masks)
            for k, kind in enumerate(targets[b].tolist()):
                means = torch.stack([maps[b, k][mask].mean() for mask in masks])
                hits += scene.kinds[int(means.argmax())] == kind
                total += 1
        agnostic = "" if METHODS[method].class_specific else "  (class-agnostic)"
        print(f"  {method:24s} {hits}/{total}{agnostic}")


def digits_demo(out: Path) -> list[Path]:
    from explain.data import digits

    loaded = load_model("zoo:digits-vit")
    explainer = Explainer(loaded.model)
    pictures, labels = digits.load("heldout")
    pictures, labels = pictures[:DIGITS], labels[:DIGITS]
    images = digits.normalise(pictures)
    results = {method: explainer.explain(images, method=method) for method in HERO_METHODS}
    figure = batch_figure(
        upscale(pictures, 128),
        results,
        class_names=loaded.classes,
        labels=labels,
        multi_label=loaded.multi_label,
        title=model_title("digits-vit", "Held-out digits, each explained for its prediction"),
    )
    path = out / "digits_methods.png"
    save_figure(figure, path)
    return [path]


def sentiment_demo(out: Path) -> list[Path]:
    from explain.data import sentiment
    from explain.text import words
    from explain.viz.text import document_html, to_html

    loaded = load_model("zoo:minilm-sentiment")
    explainer = Explainer(loaded.model, tokenizer=loaded.tokenizer)
    batch = sentiment.sentences("heldout", SENTENCES)
    mixed = "the acting was not good , but the soundtrack was wonderful ."
    texts = [sentence.text for sentence in batch]
    fragments = ["<h2>Held-out sentences, explained for the predicted class</h2>"]
    result = explainer.explain(texts, method="generic")
    probabilities = result.logits.softmax(dim=-1)
    for sentence, row, target, p in zip(
        batch, words(result, loaded.tokenizer), result.target, probabilities, strict=True
    ):
        decisive = zip(sentence.words, sentence.rationale, strict=True)
        known = ", ".join(word for word, is_decisive in decisive if is_decisive)
        title = (
            f"{loaded.classes[int(target)]} {float(p[target]):.1%}; "
            f"true: {loaded.classes[sentence.label]}; sentiment words: {known}"
        )
        fragments.append(to_html([w.text for w in row], [w.relevance for w in row], title=title))
    fragments.append("<h2>One mixed sentence, explained for each class</h2>")
    for index, name in enumerate(loaded.classes):
        row = words(explainer.explain(mixed, target=index), loaded.tokenizer)[0]
        fragments.append(
            to_html([w.text for w in row], [w.relevance for w in row], title=f"for {name}")
        )
    path = out / "sentiment.html"
    with atomic_write(path, "w") as handle:
        about = model_title("minilm-sentiment", "Each word coloured by its relevance (generic).")
        page = document_html(fragments, title="explain: zoo:minilm-sentiment, generic", note=about)
        handle.write(page)
    return [path]


def run_command(*argv: str) -> None:
    """One `explain` command, in this process: the demo writes what the command writes."""
    from explain.cli import main as explain

    print("$ explain " + " ".join(shlex.quote(word) for word in argv))
    status = explain(list(argv))
    if status != 0:
        raise SystemExit(f"`explain {argv[0]}` failed with status {status}")


def recall_example() -> RecallExample:
    """The held-out recall prompt the demo explains: the split's first."""
    from explain.data import recall

    (example,) = recall.examples("heldout", 1, RECALL_TOKENS, facts=RECALL_FACTS)
    return example


def recall_demo(out: Path) -> list[Path]:
    """recall-llama's answer to a held-out prompt, as `explain generate` and `explain cite`
    explain it with the language-model default (no --method)."""
    example = recall_example()
    folder = out / "recall"
    folder.mkdir(parents=True, exist_ok=True)
    words = example.text.split(" ")  # the question is the prompt's last three words: ? key
    question = " ".join(words[-3:])
    context = folder / "context.txt"
    context.write_text(" ".join(words[:-3]), encoding="utf-8")
    print(f"recall-llama: held-out prompt {example.seed}, the known answer: {example.answer_text}")
    answer_tokens = str(len(example.answer))
    model = ("--model", "zoo:recall-llama", "--max-new-tokens", answer_tokens)
    run_command("generate", example.text, *model, "--out", str(folder))
    template = ("--template", "{context} {question}")  # the prompt exactly, as generated
    cite = ("--context", str(context), "--question", question, *template)
    run_command("cite", *cite, *model, "--out", str(folder / "cite"))
    return [context, *(folder / name for name in ANSWER_FILES)]


def scene_question() -> ShapesQuestion:
    """The held-out question the demo asks shapes-llava: the first whose answer is about
    an object, in a scene of more than one (so that the regions compete)."""
    from explain.data import shapes_questions

    return next(
        item
        for item in shapes_questions.examples("heldout", 50)
        if item.target is not None and len(item.scene.kinds) > 1
    )


def vision_language_demo(out: Path) -> list[Path]:
    """shapes-llava's answer to a question about a held-out scene: `explain generate
    --image` (each answer word's map) and `explain cite --image` over the scene's objects
    (each object's mask a region)."""
    import json

    from explain.data.shapes import COLOURS, KINDS

    example = scene_question()
    folder = out / "llava"
    scene = example.scene
    photo = folder / "scene.png"
    save_image(scene.image, photo)
    regions = []
    for index, (kind, colour) in enumerate(zip(scene.kinds, scene.colours, strict=True)):
        mask = folder / f"object_{index}.png"
        save_image(np.repeat(scene.masks[index][..., None], 3, axis=-1).astype(float), mask)
        regions.append({"name": f"{COLOURS[colour]} {KINDS[kind]}", "mask": mask.name})
    regions_file = folder / "regions.json"
    regions_file.write_text(json.dumps(regions, indent=1), encoding="utf-8")
    print(
        f"shapes-llava: held-out scene {example.seed}, {example.text!r}, "
        f"the known answer: {example.answer}"
    )
    model = ("--model", "zoo:shapes-llava")
    run_command("generate", "--image", str(photo), example.text, *model, "--out", str(folder))
    cite = ("--image", str(photo), "--question", example.text, "--regions", str(regions_file))
    run_command("cite", *cite, *model, "--out", str(folder / "cite"))
    return [photo, regions_file, *(folder / name for name in ANSWER_FILES)]


def copy_readme_images(out: Path, images: Path = ROOT / "docs" / "images") -> list[Path]:
    """Copy the README's pictures (README_IMAGES) from the demo's outputs in `out` into
    `images`, atomically; returns the copies."""
    copies = []
    for name, output in README_IMAGES.items():
        copies.append(images / name)
        with atomic_write(copies[-1]) as handle:
            handle.write((out / output).read_bytes())
    return copies


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "demo")
    parser.add_argument(
        "--readme-images",
        action="store_true",
        help="then copy the README's pictures from the outputs into docs/images/",
    )
    args = parser.parse_args()
    start = time.perf_counter()
    written = (
        shapes_demo(args.out)
        + digits_demo(args.out)
        + sentiment_demo(args.out)
        + recall_demo(args.out)
        + vision_language_demo(args.out)
    )
    if args.readme_images:
        written += copy_readme_images(args.out)
    print(f"wrote {len(written)} files in {time.perf_counter() - start:.0f} s:")
    for path in written:
        print(f"  {path}")


if __name__ == "__main__":
    main()
