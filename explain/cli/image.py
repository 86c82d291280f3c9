"""`explain image`: heatmaps for image files and folders, one PNG per image, method and class.

Each photo is preprocessed as the model's own data config says (resize, centre crop,
normalisation) and its heatmaps are drawn back on the original photo at its own
resolution, the crop and resize undone, so each map sits on the pixels the model saw: by
default over the photo in grey, so that every colour is relevance, titled with the method
and the class, with a colour key and the normalisation rule below (--bare: the overlay
alone, exactly the photo's size). Images are explained
in batches (one forward and one backward per batch and class) with a progress bar (once
the first batch has been explained, so that a method the model cannot take fails first).
Every PNG is written atomically: a failure leaves complete files or none, never a
half-written one.
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

from explain.cli.method_options import (
    add_method_arguments,
    methods_the_model_takes,
    parse_methods,
    score_for,
    start_layer_for,
)
from explain.cli.options import (
    Planned,
    add_model_arguments,
    add_out_argument,
    add_save_option,
    check_planned,
    crop_caption,
    load,
    opacity,
    parse_index,
    positive_int,
)
from explain.errors import InputError, TargetError
from explain.explanation import Explanation
from explain.inputs import read_image
from explain.viz.image import (
    BACKGROUNDS,
    class_agnostic_note,
    class_label,
    method_label,
    prediction,
)

__all__ = [
    "IMAGE_SUFFIXES",
    "collect_images",
    "parse_targets",
    "register",
    "unique_stems",
]

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
        elif (index := parse_index(item)) is not None:
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


def _file_label(index: int, class_names: Sequence[str] | None) -> str:
    """A class as it appears in file names: its first synonym, filesystem-safe."""
    if class_names and index < len(class_names):
        name = class_names[index].split(",")[0].strip().lower()
        safe = re.sub(r"[^a-z0-9]+", "-", name).strip("-")
        if safe:
            return f"{index}-{safe}"
    return str(index)


def unique_stems(paths: Sequence[Path]) -> list[str]:
    """One output stem per input, unique whatever the inputs (and the same for the same
    inputs): a file's own stem, or for the second, third, ... file of a stem the first free
    `STEM-N` (N = 2, 3, ...) that is neither taken nor another input's own stem, so that
    `a.png a.jpg a-2.png` give a, a-3 and a-2."""
    own = {path.stem for path in paths}
    taken: set[str] = set()
    stems = []
    for path in paths:
        stem, count = path.stem, 1
        while stem in taken or (count > 1 and stem in own):
            count += 1
            stem = f"{path.stem}-{count}"
        taken.add(stem)
        stems.append(stem)
    return stems


def planned(args: argparse.Namespace, methods: list[str] | None = None) -> list[Planned]:
    """Per input: the --save file of each method (`methods`, default: those --method
    names) and the --grid figure."""
    methods = parse_methods(args.method) if methods is None else methods
    stems = unique_stems(collect_images(args.inputs))
    files = [
        Planned(args.out / f"{stem}_{method}.{args.save_format}", "--save")
        for stem in stems
        for method in (methods if args.save_format else ())
    ]
    files += [Planned(args.out / f"{stem}_grid.png", "--grid") for stem in stems if args.grid]
    return files


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from explain.api import Explainer
    from explain.viz import check_style, grid_figure, save_figure

    check_style(args.cmap, args.alpha, args.background)
    parse_methods(args.method)  # unknown names fail before the model is loaded
    paths = collect_images(args.inputs)
    loaded = load(args, weights=args.weights, architecture=args.arch)
    if loaded.modality != "image":
        command = "explain clip" if loaded.modality == "image_text" else "explain text"
        raise InputError(f"{args.model} is a {loaded.modality} model; use `{command}`")
    preprocessing = loaded.preprocessing
    if preprocessing is None:
        raise InputError(f"{args.model} does not say which image size it takes")
    num_classes = len(loaded.classes) if loaded.classes else _num_outputs(loaded)
    columns = parse_targets(args.target, loaded.classes, num_classes)
    target = _target_callable(columns)
    explainer = Explainer(loaded.model)
    methods = methods_the_model_takes(args.method, explainer.adapter, args.model)
    if args.method is None:  # the default's --save files are named now
        check_planned(planned(args, methods))
    settings = {
        method: {
            "score": score_for(method, args.score),
            "start_layer": start_layer_for(method, args.start_layer),
        }
        for method in methods
    }
    stems = unique_stems(paths)
    multi = loaded.multi_label  # titles and the prediction in probabilities of presence
    written: list[Path] = []
    # The bar opens after the first batch: an error of the first explanation (a method
    # this model cannot take, an input it refuses) is then the only thing printed. It stays
    # quiet when stderr is not a terminal (disable=None), so piped output has no bar lines.
    bar = None
    try:
        for start in range(0, len(paths), args.batch_size):
            batch = paths[start : start + args.batch_size]
            photos = [read_image(path) for path in batch]
            images = preprocessing(photos)
            results = {
                method: explainer.explain(images, target=target, method=method, **options)
                for method, options in settings.items()
            }
            # the grid heads a class-agnostic method's row as the figures do, and says why
            agnostic = class_agnostic_note(r.class_agnostic for r in results.values())
            for offset, photo in enumerate(photos):
                stem = stems[start + offset]
                display = np.asarray(photo)
                # (K, H, W) raw relevance on the photo's pixels, the model's crop and resize
                # undone; each map is scaled on its own (signed maps: the diverging scale).
                maps = {
                    m: preprocessing.to_original(r.relevance[offset], display.shape[:2])
                    for m, r in results.items()
                }
                columns = results[methods[0]].target[offset].tolist()
                logits = results[methods[0]].logits[offset]  # titles say each class's rank
                said = prediction(logits, loaded.classes, multi)
                cropped = preprocessing.crop_note(display.shape[:2])  # the model saw part
                tqdm.write(f"{batch[offset]}: {said}" + (f" ({cropped})" if cropped else ""))
                seen = crop_caption(preprocessing, display.shape[:2])  # the figures say it too
                for method, heats in maps.items():
                    for column, heat in zip(columns, heats, strict=True):
                        label = _file_label(column, loaded.classes)
                        out = args.out / f"{stem}_{method}_{label}.png"
                        kind = class_label(column, loaded.classes, logits, multi)
                        title = f"{method_label(method, results[method].class_agnostic)}: {kind}"
                        _save_map(display, heat, out, title, args, seen)
                        written.append(out)
                if args.save_format:
                    for method, result in results.items():
                        out = args.out / f"{stem}_{method}.{args.save_format}"
                        settings = {"model": args.model, "input": str(batch[offset])}
                        _one_image(result, offset, settings).save(out)
                        written.append(out)
                if args.grid:
                    names = [class_label(c, loaded.classes, logits, multi) for c in columns]
                    figure = grid_figure(
                        display,
                        [list(heats) for heats in maps.values()],
                        rows=[method_label(m, results[m].class_agnostic) for m in maps],
                        columns=names,
                        cmap=args.cmap,
                        alpha=args.alpha,
                        background=args.background,
                        note=" ".join(filter(None, [seen, agnostic])) or None,
                    )
                    out = args.out / f"{stem}_grid.png"
                    save_figure(figure, out)
                    written.append(out)
            if bar is None:
                bar = tqdm(
                    total=len(paths), unit="image", desc="explaining", file=sys.stderr, disable=None
                )
            bar.update(len(batch))
    finally:
        if bar is not None:
            bar.close()
    for out in dict.fromkeys(written):
        print(out)
    return 0


def _save_map(
    display: np.ndarray, heat: Tensor, out: Path, title: str, args, note: str | None
) -> None:
    """One map as a figure (title, colour key, normalisation rule, then `note`) or, with
    --bare, as the overlay alone at the photo's own resolution, for further processing."""
    from explain.viz import heatmap_figure, overlay, save_figure, save_image
    from explain.viz.scaling import scale_maps

    if not args.bare:
        figure = heatmap_figure(
            display,
            heat,
            cmap=args.cmap,
            alpha=args.alpha,
            title=title,
            background=args.background,
            note=note,
        )
        save_figure(figure, out)
        return
    scaled = scale_maps([heat.numpy()])
    signed = scaled.signed[0]  # then the diverging map, whatever --cmap
    picture = overlay(
        display,
        scaled.maps[0],
        cmap=None if signed else args.cmap,
        alpha=args.alpha,
        signed=signed,
        background=args.background,
    )
    save_image(picture, out)
    if scaled.notes[0]:
        print(f"explain: note: {out} is an {scaled.notes[0]}", file=sys.stderr)


def _one_image(result: Explanation, offset: int, settings: dict[str, str]) -> Explanation:
    """Sample `offset` of a batch's `result` as a one-image Explanation (for --save)."""
    one = slice(offset, offset + 1)
    return dataclasses.replace(
        result,
        relevance=result.relevance[one],
        logits=result.logits[one],
        target=result.target[one],
        relevances={name: r[one] for name, r in result.relevances.items()},
        settings=settings,
    )


def _num_outputs(loaded) -> int:
    """Number of classes of a model whose classes are not named (its head's outputs)."""
    head = getattr(loaded.model, "num_classes", None)
    if isinstance(head, int) and head > 0:
        return head
    raise InputError(f"cannot tell how many classes {loaded.name} has")


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "image",
        help="heatmaps for image files and folders",
        description=__doc__,
        epilog=(
            "Output names: OUT/STEM_METHOD_CLASS.png, e.g. scene_generic_0-circle.png, and "
            "OUT/STEM_grid.png with --grid. Photos: explain image cat.jpg --model "
            'vit_base_patch16_224.augreg2_in21k_ft_in1k --target "tabby cat" --out maps. '
            "Example (after `make demo`): explain image "
            "outputs/demo/scenes --model zoo:shapes-vit --method generic,rollout "
            "--target circle,square --grid --out maps"
        ),
    )
    parser.add_argument(
        "inputs", nargs="+", metavar="FILE|DIR", help="image files, or folders of images"
    )
    add_model_arguments(
        parser,
        takes="an image classifier (timm or Hugging Face ViT family)",
        timm=True,
        examples="zoo:shapes-vit, vit_base_patch16_224.augreg2_in21k_ft_in1k, "
        "google/vit-base-patch16-224, ./my-vit",
    )
    parser.add_argument(
        "--weights",
        type=Path,
        metavar="FILE",
        help="weights file for a timm model name (instead of its pretrained download)",
    )
    parser.add_argument(
        "--arch", metavar="NAME", help="timm architecture of a weights file without config.json"
    )
    add_method_arguments(
        parser,
        default="top",
        metavar="T[,T2]",
        help="classes to explain per image, comma-separated: `top` (the predicted class), "
        "`topK` (the K-th highest), a class index, or a class name; default: %(default)s",
    )
    add_out_argument(parser)
    parser.add_argument(
        "--batch-size",
        type=positive_int,
        default=16,
        metavar="B",
        help="images per batch; default: %(default)s",
    )
    parser.add_argument(
        "--cmap",
        default=None,
        help="matplotlib colormap of the heatmaps; default: inferno, RdBu_r for signed "
        "relevance (lrp)",
    )
    parser.add_argument(
        "--alpha",
        type=opacity,
        default=0.8,
        help="opacity of the heatmap where the relevance is highest (it fades with the "
        "relevance, so the image keeps its colours where there is none), 0..1; "
        "default: %(default)s",
    )
    parser.add_argument(
        "--background",
        choices=BACKGROUNDS,
        default="grey",
        help="what the heatmap is drawn over: the image in grey, so that every colour is "
        "relevance and a coloured object is never taken for heat, or its own colours; "
        "default: %(default)s",
    )
    parser.add_argument(
        "--bare",
        action="store_true",
        help="write each map as the overlay alone, at the image's own resolution (no title, "
        "colour key or caption), for further processing; default: a figure that states "
        "its scale",
    )
    parser.add_argument(
        "--grid",
        action="store_true",
        help="also write one figure per image: the input, then methods x classes, each map "
        "scaled on its own (stated on the figure)",
    )
    add_save_option(parser, "OUT/STEM_METHOD.FORMAT per image and method")
    parser.set_defaults(run=run, planned=planned)
