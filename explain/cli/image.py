"""`explain image`: heatmaps for image files and folders, one PNG per image, method and class.

Images are explained in batches (one forward and one backward per batch and class) with a
progress bar. Every PNG is written atomically: a failure leaves complete files or none,
never a half-written one.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from explain.errors import InputError, TargetError
from explain.explanation import Explanation

__all__ = ["IMAGE_SUFFIXES", "collect_images", "parse_targets", "register"]

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")
"""Files a folder contributes; files named explicitly are read whatever their suffix."""


def collect_images(inputs: Sequence[str | Path]) -> list[Path]:
    """The image files named by `inputs`: files as given, folders' images in sorted order."""
    found: list[Path] = []
    for entry in map(Path, inputs):
        if entry.is_dir():
            images = sorted(
                p for p in entry.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES
            )
            if not images:
                raise InputError(f"folder {entry} holds no images ({', '.join(IMAGE_SUFFIXES)})")
            found.extend(images)
        elif entry.is_file():
            found.append(entry)
        else:
            raise InputError(f"no such file or folder: {entry}")
    return found


# A target column: ("top", k) is the k-th highest logit of each image, ("class", i) class i.
TargetColumn = tuple[str, int]
_TOP = re.compile(r"top(\d*)")


def parse_targets(
    text: str, class_names: Sequence[str] | None, num_classes: int
) -> list[TargetColumn]:
    """Read `--target`: comma-separated `top`, `topK`, class indices or class names.

    Class names match case-insensitively, in full or by one comma-separated synonym (timm's
    ImageNet names read "tabby, tabby cat"). A column named twice is explained once.
    """
    columns: list[TargetColumn] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            raise TargetError(f"empty entry in --target {text!r}")
        top = _TOP.fullmatch(item.lower())
        if top:
            rank = int(top.group(1) or 1)
            if not 1 <= rank <= num_classes:
                raise TargetError(
                    f"--target {item}: the model has {num_classes} classes (top1..top{num_classes})"
                )
            columns.append(("top", rank))
        elif item.lstrip("-").isdigit():
            index = int(item)
            if not 0 <= index < num_classes:
                raise TargetError(
                    f"--target {index} is out of range: the model has {num_classes} classes "
                    f"(0..{num_classes - 1})"
                )
            columns.append(("class", index))
        else:
            columns.append(("class", _class_index(item, class_names)))
    return list(dict.fromkeys(columns))


def _class_index(name: str, class_names: Sequence[str] | None) -> int:
    """The class whose name (or one of its comma-separated synonyms) is `name`."""
    if not class_names:
        raise TargetError(
            f"--target {name!r}: this model has no class names; give a class index instead"
        )
    wanted = name.strip().lower()
    matches = [
        index
        for index, label in enumerate(class_names)
        if wanted == label.lower() or wanted in (s.strip().lower() for s in label.split(","))
    ]
    if len(matches) == 1:
        return matches[0]
    if matches:
        listed = ", ".join(f"{i} ({class_names[i]})" for i in matches)
        raise TargetError(f"--target {name!r} names several classes: {listed}; use an index")
    close = difflib.get_close_matches(wanted, [n.lower() for n in class_names], n=3)
    hint = (
        f"did you mean {', '.join(close)}?"
        if close
        else f"the classes are {', '.join(class_names)}"
        if len(class_names) <= 20
        else "use a class index"
    )
    raise TargetError(f"--target {name!r} is not a class of this model; {hint}")


def _target_callable(columns: list[TargetColumn]) -> Callable[[Tensor], Tensor]:
    """The (B, K) class indices of the columns, for `Explainer.explain(target=...)`."""

    def choose(logits: Tensor) -> Tensor:
        order = logits.detach().argsort(dim=-1, descending=True)
        picked = [
            order[:, value - 1] if kind == "top" else torch.full_like(order[:, 0], value)
            for kind, value in columns
        ]
        return torch.stack(picked, dim=1)

    return choose


def _methods(text: str) -> list[str]:
    from explain.rules import METHODS, get_method

    if text.strip() == "all":
        return sorted(METHODS)
    names = [part.strip() for part in text.split(",")]
    for name in names:
        get_method(name)  # unknown names fail before the model is loaded
    return list(dict.fromkeys(names))


def _file_label(index: int, class_names: Sequence[str] | None) -> str:
    """A class as it appears in file names: its first synonym, filesystem-safe."""
    if class_names and index < len(class_names):
        name = class_names[index].split(",")[0].strip().lower()
        safe = re.sub(r"[^a-z0-9]+", "-", name).strip("-")
        if safe:
            return f"{index}-{safe}"
    return str(index)


def _unique_stems(paths: Sequence[Path]) -> list[str]:
    """File stems, with -2, -3, ... appended where two inputs share a name."""
    seen: dict[str, int] = {}
    stems = []
    for path in paths:
        count = seen.get(path.stem, 0) + 1
        seen[path.stem] = count
        stems.append(path.stem if count == 1 else f"{path.stem}-{count}")
    return stems


def _display_image(path: Path) -> np.ndarray:
    """The file at its own resolution, RGB in [0, 1], for drawing the maps over it."""
    from PIL import Image

    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from explain.api import Explainer
    from explain.io import load_images
    from explain.loading import load_model
    from explain.rules import METHODS
    from explain.viz import check_style, explanation_grid, overlay, save_figure, save_image

    check_style(args.cmap, args.alpha)
    methods = _methods(args.method)
    paths = collect_images(args.inputs)
    loaded = load_model(args.model, weights=args.weights, architecture=args.arch)
    if loaded.modality != "image":
        command = "explain clip" if loaded.modality == "image_text" else "explain text"
        raise InputError(f"{args.model} is a {loaded.modality} model; use `{command}`")
    if loaded.image_size is None:
        raise InputError(f"{args.model} does not say which image size it takes")
    num_classes = len(loaded.classes) if loaded.classes else _num_outputs(loaded)
    columns = parse_targets(args.target, loaded.classes, num_classes)
    target = _target_callable(columns)
    explainer = Explainer(loaded.model)
    stems = _unique_stems(paths)
    norm = {"mean": loaded.mean, "std": loaded.std} if loaded.mean and loaded.std else {}
    written: list[Path] = []
    with tqdm(total=len(paths), unit="image", desc="explaining", file=sys.stderr) as bar:
        for start in range(0, len(paths), args.batch_size):
            batch = paths[start : start + args.batch_size]
            images, _ = load_images(batch, size=loaded.image_size, **norm)
            results = {}
            for method in methods:
                options = {}
                if args.start_layer is not None and METHODS[method].default_start_layer:
                    options["start_layer"] = args.start_layer
                results[method] = explainer.explain(
                    images, target=target, method=method, score=args.score, **options
                )
            for offset, path in enumerate(batch):
                stem = stems[start + offset]
                display = _display_image(path)
                size = tuple(display.shape[:2])
                one = {m: _one_image(r, offset, size) for m, r in results.items()}
                for method, result in one.items():
                    maps = result.heatmap()[0]  # (K, H, W) at the file's own resolution
                    for column, heat in zip(result.target[0].tolist(), maps, strict=True):
                        label = _file_label(column, loaded.classes)
                        out = args.out / f"{stem}_{method}_{label}.png"
                        save_image(overlay(display, heat, cmap=args.cmap, alpha=args.alpha), out)
                        written.append(out)
                if args.grid:
                    figure = explanation_grid(
                        display, one, class_names=loaded.classes, cmap=args.cmap, alpha=args.alpha
                    )
                    out = args.out / f"{stem}_grid.png"
                    save_figure(figure, out)
                    written.append(out)
            bar.update(len(batch))
    for out in dict.fromkeys(written):
        print(out)
    return 0


def _one_image(result: Explanation, offset: int, size: tuple[int, int]) -> Explanation:
    """Sample `offset` of `result` as a one-image Explanation whose heatmaps are drawn
    straight at `size` (the file's resolution) from the relevance, in one upsampling."""
    return dataclasses.replace(
        result,
        relevance=result.relevance[offset : offset + 1],
        target=result.target[offset : offset + 1],
        input_size=size,
    )


def _num_outputs(loaded) -> int:
    """Number of classes of a model whose classes are not named (its head's outputs)."""
    head = getattr(loaded.model, "num_classes", None)
    if isinstance(head, int) and head > 0:
        return head
    raise InputError(f"cannot tell how many classes {loaded.name} has")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _opacity(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {value}")
    return value


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "image",
        help="heatmaps for image files and folders",
        description=__doc__,
        epilog=(
            "Output names: OUT/STEM_METHOD_CLASS.png, e.g. scene_generic_0-circle.png, and "
            "OUT/STEM_grid.png with --grid. Example (after `make demo`): explain image "
            "outputs/demo/scenes --model zoo:shapes-vit --method generic,rollout "
            "--target circle,square --grid --out maps"
        ),
    )
    parser.add_argument(
        "inputs", nargs="+", metavar="FILE|DIR", help="image files, or folders of images"
    )
    parser.add_argument(
        "--model",
        required=True,
        metavar="SPEC",
        help="zoo:NAME (see `explain models`), a timm model name with local weights, a "
        "model folder, or a weights file",
    )
    parser.add_argument(
        "--weights", type=Path, metavar="FILE", help="weights file for a timm model name"
    )
    parser.add_argument(
        "--arch", metavar="NAME", help="timm architecture of a weights file without config.json"
    )
    parser.add_argument(
        "--method",
        default="generic",
        metavar="M[,M2]",
        help="comma-separated method names, or `all` (`explain models` lists them); "
        "default: %(default)s",
    )
    parser.add_argument(
        "--target",
        default="top",
        metavar="T[,T2]",
        help="classes to explain per image, comma-separated: `top` (the predicted class), "
        "`topK` (the K-th highest), a class index, or a class name; default: %(default)s",
    )
    parser.add_argument(
        "--score",
        default="logit",
        choices=("logit", "probability", "log_probability"),
        help="what is differentiated for the explained class; default: %(default)s",
    )
    parser.add_argument(
        "--start-layer",
        type=int,
        metavar="L",
        help="first block the aggregating methods use (negative: from the end); methods "
        "that read one fixed block ignore it; default: each method's own",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("explanations"),
        metavar="DIR",
        help="output folder; default: %(default)s",
    )
    parser.add_argument(
        "--batch-size",
        type=_positive_int,
        default=16,
        metavar="B",
        help="images per batch; default: %(default)s",
    )
    parser.add_argument(
        "--cmap", default="jet", help="matplotlib colormap of the heatmaps; default: %(default)s"
    )
    parser.add_argument(
        "--alpha",
        type=_opacity,
        default=0.5,
        help="opacity of the heatmap over the image, 0..1; default: %(default)s",
    )
    parser.add_argument(
        "--grid",
        action="store_true",
        help="also write one methods x classes figure per image, with a colour bar",
    )
    parser.set_defaults(run=run)
