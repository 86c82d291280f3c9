"""`explain detect`: every detection of an object detector (DETR), explained.

Each image goes through the model's own image processor (resize, normalise, pad); every
detection whose class probability is above `--threshold` is explained with the
encoder-decoder rule in one batched backward, its map put back on the original image
(padding cut off, resize undone) with its box. One figure per image, OUT/STEM_grid.png
(as `explain image --grid` names its figures; images of the same name get STEM-2, ...):
a panel per detection, titled with its label and score, under a title, with a colour key
and the scaling rule; written atomically (several methods, `--method a,b` or `all`: one
figure per method, named with it). One line per detection on stdout.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from explain.cli.image import collect_images, unique_stems
from explain.cli.method_options import (
    add_method_option,
    method_file,
    methods_the_model_takes,
    named_methods,
    parse_methods,
)
from explain.cli.options import Planned, add_model_arguments, add_out_argument, load
from explain.detections import maps_on_images
from explain.engine.plans import DEFAULT_THRESHOLD
from explain.errors import OptionError, TargetError
from explain.inputs import read_image

__all__ = ["register"]


def planned(args: argparse.Namespace) -> list[Planned]:
    """The figure of every image and method."""
    stems = unique_stems(collect_images(args.images))
    return [
        Planned(method_file(args.out / f"{stem}_grid.png", method, args.method), "--out")
        for stem in stems
        for method in named_methods(args.method)
    ]


def run(args: argparse.Namespace) -> int:
    from explain import Explainer
    from explain.viz import detection_figure, save_figure

    parse_methods(args.method)  # unknown names fail before the model is loaded
    loaded = load(args)
    processor = loaded.image_processor
    if processor is None:
        raise OptionError(
            f"explain detect explains object detectors (DETR); {args.model} is not one: use "
            "explain image for classifiers"
        )
    explainer = Explainer(loaded.model)
    methods = methods_the_model_takes(args.method, explainer.adapter, args.model)
    args.out.mkdir(parents=True, exist_ok=True)
    paths = collect_images(args.images)
    for path, stem in zip(paths, unique_stems(paths), strict=True):
        photo = read_image(path)
        inputs = processor(images=[photo], return_tensors="pt")
        batch = {"pixel_values": inputs["pixel_values"], "pixel_mask": inputs["pixel_mask"]}
        for index, method in enumerate(methods):
            try:
                result = explainer.explain(batch, threshold=args.threshold, method=method)
            except TargetError:
                print(f"{path}: no detection above {args.threshold}")
                break
            found = result.detections
            assert found is not None and result.input_size is not None
            size = [(photo.height, photo.width)]
            (maps,) = maps_on_images(result.relevance, found, result.input_size, sizes=size)
            corners = found.corners(size)[0]
            labels = found.labels[0]
            names = [loaded.classes[int(c)] if loaded.classes else str(int(c)) for c in labels]
            scores = found.scores[0].tolist()
            if index == 0:  # the detections are the model's, whichever method explains them
                for name, score, box in zip(names, scores, corners.tolist(), strict=True):
                    print(f"{path}: {name} {score:.3f} box {[round(v, 1) for v in box]}")
            picture = torch.from_numpy(np.asarray(photo, dtype=np.float32) / 255.0)
            title = (
                f"explain detect: {args.model}: {path.name} ({result.method}; the detections "
                f"above {args.threshold:g})"
            )
            figure = detection_figure(picture, maps, corners, names, scores, title=title)
            out = method_file(args.out / f"{stem}_grid.png", method, args.method)
            save_figure(figure, out)
            print(out)
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "detect",
        help="explain every detection of an object detector (DETR) on image files",
        description=__doc__.splitlines()[0],
    )
    parser.add_argument("images", nargs="+", help="image files or folders")
    add_model_arguments(
        parser,
        takes="an object detector (DETR: a folder or a hub id)",
        examples="facebook/detr-resnet-50, ./my-detr",
    )
    add_method_option(parser)
    parser.add_argument(
        "--threshold",
        type=float,
        default=DEFAULT_THRESHOLD,
        help="explain the detections whose class probability is above this; default: %(default)s",
    )
    add_out_argument(parser)
    parser.set_defaults(run=run, planned=planned)
