"""The arguments every `explain` command shares, defined once: the model (`--model`,
`--offline`, `--device`, `--dtype`), the output folder, `--save`, and argument types."""

from __future__ import annotations

import argparse
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from explain.errors import InputError
from explain.export import FORMATS
from explain.loading.loaded_model import LoadedModel
from explain.loading.preprocessing import ImagePreprocessing
from explain.loading.specs import DEVICES, DTYPES, load_model

__all__ = [
    "HelpFormatter",
    "Planned",
    "RawDescriptionHelpFormatter",
    "add_model_arguments",
    "add_out_argument",
    "add_save_option",
    "check_planned",
    "crop_caption",
    "load",
    "model_specs",
    "opacity",
    "parse_index",
    "positive_int",
]


def model_specs(timm: bool) -> str:
    """What `--model` takes, for help texts: the timm forms only for the commands that
    explain image classifiers (a timm model cannot answer `explain cite` or `generate`)."""
    forms = (
        "zoo:NAME (`explain models`), a Hugging Face repo id org/name[@revision] (the "
        "oldest ids have no org), "
    )
    if timm:
        forms += (
            "a timm model name with or without its pretrained tag, hf-hub:org/name (a timm "
            "model on the Hugging Face Hub), "
        )
    return (
        f"SPEC is {forms}or a local model folder or weights file. Downloads go to the "
        "Hugging Face cache ($HF_HUB_CACHE, default ~/.cache/huggingface/hub) once; later "
        "runs need no network."
    )


class HelpFormatter(argparse.HelpFormatter):
    """argparse's help layout, wrapped at spaces only: a line never breaks inside
    `hf-hub:org/name` or `--max-new-tokens` (textwrap breaks at hyphens by default,
    and re-wrapping then reads the break as a space: "hf- hub:")."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return textwrap.fill(
            " ".join(text.split()),
            width,
            initial_indent=indent,
            subsequent_indent=indent,
            break_on_hyphens=False,
        )


class RawDescriptionHelpFormatter(argparse.RawDescriptionHelpFormatter, HelpFormatter):
    """`HelpFormatter` for a command whose description is laid out by hand (kept as
    written); its options' help is wrapped at spaces only."""


def add_model_arguments(
    parser: argparse.ArgumentParser,
    *,
    takes: str,
    examples: str | None = None,
    timm: bool = False,
) -> None:
    """`--model SPEC` (required; `takes`: what kind of model the command explains,
    `examples`: specs of such models, `timm`: whether timm models are among them),
    `--offline`, `--device` and `--dtype`, in their own help section."""
    # Wrapped here: a command whose description is preformatted (RawDescriptionHelpFormatter)
    # would print the group's description as one long line; others re-wrap it anyway.
    shown = f" Examples: {examples}." if examples else ""
    about = textwrap.fill(f"{takes}. {model_specs(timm)}{shown}", width=78, break_on_hyphens=False)
    group = parser.add_argument_group("model", about)
    group.add_argument("--model", required=True, metavar="SPEC", help=f"{takes} (see above)")
    group.add_argument(
        "--offline",
        action="store_true",
        help="use the Hugging Face cache only, never the network (as HF_HUB_OFFLINE=1)",
    )
    group.add_argument(
        "--device",
        default="auto",
        metavar="{" + ",".join(DEVICES) + "}",
        help="where the model and its explanations run (also cuda:N); auto: the GPU if "
        "there is one; default: %(default)s",
    )
    group.add_argument(
        "--dtype",
        choices=tuple(DTYPES),
        help="the model's parameter type; default: the checkpoint's (float32)",
    )
    group.add_argument(
        "--allow-missing-weights",
        action="store_true",
        help="load a Hugging Face checkpoint that lacks some of the model's weights (they "
        "are random); default: refused, naming them",
    )


def load(args: argparse.Namespace, **options: Any) -> LoadedModel:
    """`load_model` with the model arguments of `args` (and any command-specific options)."""
    return load_model(
        args.model,
        offline=args.offline,
        device=args.device,
        dtype=args.dtype,
        allow_missing_weights=args.allow_missing_weights,
        **options,
    )


@dataclass(frozen=True)
class Planned:
    """An output a command will write, known from its arguments before any work:
    `check_outputs` refuses it early if it cannot be written."""

    path: Path
    option: str
    """The option the path comes from, for the message (e.g. "--save")."""
    folder: bool = False


def load_vision_language(args: argparse.Namespace) -> LoadedModel:
    """The --model of a command given --image: a vision-language model with its processor,
    or one InputError saying what was loaded instead."""
    loaded = load(args)
    if (
        loaded.modality != "vision_language"
        or loaded.tokenizer is None
        or loaded.preprocessing is None
    ):
        raise InputError(
            f"--image needs a vision-language model with its processor (LLaVA, Qwen2-VL, "
            f"...); {args.model} is a {loaded.modality} model"
        )
    return loaded


def crop_caption(preprocessing: ImagePreprocessing, size: tuple[int, int]) -> str | None:
    """The figures' sentence on what the model saw of a photo of `size` (H, W) when its
    preprocessing crops part of it away (the terminal's words, `crop_note`); None when it
    sees the whole photo."""
    note = preprocessing.crop_note(size)
    return None if note is None else f"The model saw only part of the photo: {note}."


def check_planned(files: list[Planned]) -> None:
    """Refuse any of `files` that cannot be written (explain.export.check_writable): for
    the outputs named only once the model is loaded (the --save files of its default
    method), checked then, before any work."""
    from explain.export import check_writable

    for file in files:
        check_writable(file.path, folder=file.folder, option=file.option)


def add_save_option(parser: argparse.ArgumentParser, what: str) -> None:
    """`--save FORMAT`: the raw explanation (`what` it holds) as a file as well. Read as
    `args.save_format`: argparse sets an option's default only where the namespace lacks
    the attribute, and importing nnsight gives every object a `save` method."""
    parser.add_argument(
        "--save",
        dest="save_format",
        choices=FORMATS,
        metavar="FORMAT",
        help=f"also write {what} as a file of raw relevance, logits, targets, tokens and "
        "settings: npz, safetensors or json (read it back with Explanation.load); "
        "default: not written",
    )


def add_out_argument(parser: argparse.ArgumentParser) -> None:
    """`--out DIR`, the folder the pictures are written to."""
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("explanations"),
        metavar="DIR",
        help="output folder; default: %(default)s",
    )


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def opacity(text: str) -> float:
    """An argparse type: a heatmap opacity in [0, 1]."""
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {value}")
    return value


_INDEX = re.compile(r"-?[0-9]+")


def parse_index(text: str) -> int | None:
    """`text` as a class index when it is one (ASCII digits, optionally negative), else
    None: `str.isdigit` also accepts digits such as "²" that `int` cannot read."""
    return int(text) if _INDEX.fullmatch(text) else None
