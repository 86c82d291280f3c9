"""`make demo`: explain the zoo's models offline and write the pictures under --out.

- shapes-vit: held-out scenes with two or more objects, every registered method, each
  object's class explained on its own (a classes x methods grid per scene), plus a check
  that prints, per method, how often a class's map is brightest on that class's object;
- digits-vit: held-out handwritten digits explained for their predicted class, by method;
- minilm-sentiment: held-out review sentences highlighted word by word, as an HTML page;
- a tiny random Llama (no trained language model ships offline): a generated continuation
  explained token by token, as the HTML page and the matrix figure `explain generate`
  writes; random weights, so it shows the pictures, not what a trained model reads.

Prints the paths of the files it wrote.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm import tqdm

from explain import METHODS, Explainer
from explain.export import atomic_write
from explain.loading.specs import load_model
from explain.viz import batch_figure, explanation_grid, heatmap_figure, save_figure, save_image

ROOT = Path(__file__).resolve().parents[1]
SHAPE_SCENES = 3
DIGITS = 8
SENTENCES = 8
DISPLAY_SIZE = 256  # the zoo's images are small; pictures are drawn at this size
HERO_METHODS = ("generic", "transformer_attribution", "attention_gradcam", "rollout")


def upscale(pictures: Tensor, size: int = DISPLAY_SIZE) -> Tensor:
    """(B, 3, h, w) [0, 1] pictures resized for display (bicubic, clamped to [0, 1])."""
    return F.interpolate(pictures, size=(size, size), mode="bicubic").clamp(0.0, 1.0)


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
            pictures[b], results, sample=b, class_names=loaded.classes, transpose=True
        )
        written.append(out / f"shapes_{b}_all_methods.png")
        save_figure(figure, written[-1])
        maps = results["generic"].heatmap(size=(DISPLAY_SIZE, DISPLAY_SIZE), normalize=False)[b]
        for k, kind in enumerate(targets[b].tolist()):
            figure = heatmap_figure(pictures[b], maps[k], title=f"generic: {loaded.classes[kind]}")
            written.append(out / f"shapes_{b}_generic_{loaded.classes[kind]}.png")
            save_figure(figure, written[-1])
    hero = explanation_grid(
        pictures[0],
        {method: results[method] for method in HERO_METHODS},
        class_names=loaded.classes,
        transpose=True,
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
        upscale(pictures, 128), results, class_names=loaded.classes, labels=labels
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
            f"{loaded.classes[int(target)]} ({float(p[target]):.2f}); "
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
        handle.write(document_html(fragments, title="explain: zoo:minilm-sentiment, generic"))
    return [path]


def generation_demo(out: Path) -> list[Path]:
    import tempfile

    from explain.generation import explain_generation
    from explain.loading.hub import quiet_transformers
    from explain.testing.tiny_lm import save_tiny_lm
    from explain.viz.generation import generation_html
    from explain.viz.generation_figure import generation_figure

    with tempfile.TemporaryDirectory() as folder, quiet_transformers():
        # the folder `explain generate --model` would read
        loaded = load_model(save_tiny_lm(Path(folder) / "tiny-llama"))
    explainer = Explainer(loaded.model, tokenizer=loaded.tokenizer)
    found = explain_generation(explainer, "w12 w30 w41 w17 w25 w9", max_new_tokens=8)
    answer = found.answer()  # what `explain generate` shows, in the terminal, page and PNG
    tokens, width, matrix = answer.tokens, answer.prompt_length, answer.relevance
    rests = [answer.rests_on(g) for g in range(len(answer.generated))]
    title = "tiny random Llama (shows the pictures, not a trained model)"
    page = out / "generation.html"
    with atomic_write(page, "w") as handle:
        handle.write(
            generation_html(tokens, width, matrix, method="generic", rests_on=rests, title=title)
        )
    picture = out / "generation.png"
    save_figure(generation_figure(matrix, tokens, width, method="generic", title=title), picture)
    return [page, picture]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "demo")
    args = parser.parse_args()
    start = time.perf_counter()
    written = (
        shapes_demo(args.out)
        + digits_demo(args.out)
        + sentiment_demo(args.out)
        + generation_demo(args.out)
    )
    print(f"wrote {len(written)} files in {time.perf_counter() - start:.0f} s:")
    for path in written:
        print(f"  {path}")


if __name__ == "__main__":
    main()
