"""Load a model to explain from a spec string: the one loader the CLI and the API share.

A spec is one of:
- `zoo:NAME`: a model of this repository's zoo (see `explain.zoo`);
- a folder: a Hugging Face model (`config.json` with a `model_type`, loaded with
  `from_pretrained(folder)`), a timm export (`config.json` with an `architecture`, as
  `timm.models.save_for_hf` writes it, loaded with timm's `local-dir:` source) or a zoo-style
  folder (`config.json` with a `family`);
- a weights file (`.safetensors`, `.pth`, `.pt`, `.bin`) of a timm model, with the timm
  `config.json` next to it or the architecture given as `architecture=`;
- a timm model name such as `vit_base_patch16_224.augreg2_in21k_ft_in1k`, with the
  pretrained weights from `weights=FILE` or already in the local Hugging Face / torch hub
  cache.

Local files go through the same code as a download would: timm's `create_model(...,
pretrained=True)` with the file as the pretrained source (its checkpoint filters, class-count
and position-embedding adaptation included) and Hugging Face's `from_pretrained`. Nothing
here touches the network: a missing download is a ModelLoadError that says how to provide
the weights.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from torch import nn

from explain.errors import ModelLoadError
from explain.loaded_model import LoadedModel

__all__ = ["ZOO_PREFIX", "LoadedModel", "load_model"]

ZOO_PREFIX = "zoo:"
_WEIGHT_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin")


def load_model(
    spec: str | os.PathLike[str],
    *,
    weights: str | os.PathLike[str] | None = None,
    architecture: str | None = None,
    pretrained: bool = True,
) -> LoadedModel:
    """Load the model `spec` names (see the module docstring) on the CPU, in eval mode.

    Args:
        spec: `zoo:NAME`, a folder, a weights file or a timm model name.
        weights: a weights file for a timm model name (the pretrained weights to use).
        architecture: the timm model name of a bare weights file without a config.
        pretrained: False builds a timm model name with random weights (for trying things).

    Raises:
        ModelLoadError: unknown spec, missing or unreadable files, or pretrained weights
            that are not available locally.
    """
    text = os.fspath(spec)
    if text.startswith(ZOO_PREFIX):
        from explain.zoo import load_zoo_model

        return load_zoo_model(text[len(ZOO_PREFIX) :])
    path = Path(text).expanduser()
    if path.is_dir():
        return _load_folder(path)
    if path.is_file() or path.suffix in _WEIGHT_SUFFIXES:
        return _load_timm_file(path, architecture)
    return _load_timm_name(text, weights, pretrained)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ModelLoadError(f"cannot read {path}: {error}") from None


def _load_folder(folder: Path) -> LoadedModel:
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise ModelLoadError(
            f"{folder} has no config.json: expected a Hugging Face model folder "
            "(save_pretrained), a timm export (timm.models.save_for_hf) or a zoo model folder"
        )
    config = _read_json(config_path)
    if "family" in config:
        from explain.zoo import load_zoo_folder

        return load_zoo_folder(folder)
    if "architecture" in config:
        return _load_timm(f"local-dir:{folder}", name=str(folder))
    if "model_type" in config:
        return _load_hugging_face(folder)
    raise ModelLoadError(
        f"{config_path} names no model: expected `model_type` (Hugging Face), "
        "`architecture` (timm) or `family` (zoo)"
    )


def _load_timm_file(path: Path, architecture: str | None) -> LoadedModel:
    if not path.is_file():
        raise ModelLoadError(f"weights file not found: {path}")
    if path.suffix not in _WEIGHT_SUFFIXES:
        raise ModelLoadError(
            f"{path} is not a weights file (expected {', '.join(_WEIGHT_SUFFIXES)}) "
            "or a model folder"
        )
    sidecar = path.parent / "config.json"
    if architecture is not None:
        return _load_timm(architecture, name=str(path), pretrained_cfg_overlay={"file": str(path)})
    if not sidecar.is_file():
        raise ModelLoadError(
            f"cannot tell which timm model {path} holds: put timm's config.json next to "
            "it, or name the architecture (Python: architecture=..., CLI: --arch)"
        )
    if "architecture" not in _read_json(sidecar):
        raise ModelLoadError(f"{sidecar} is not a timm config (no `architecture` entry)")
    # timm's own parser of an exported config (the one its `local-dir:` source uses), then
    # this file instead of the folder's default weights file.
    from timm.models._hub import load_model_config_from_path

    pretrained_cfg, architecture, model_args = load_model_config_from_path(path.parent)
    pretrained_cfg = {**pretrained_cfg, "file": str(path)}
    pretrained_cfg.pop("source", None)
    return _load_timm(architecture, name=str(path), pretrained_cfg=pretrained_cfg, **model_args)


def _cached_timm_weights(name: str) -> Path | None:
    """The pretrained weights of timm model `name` if a download already left them here."""
    import timm.models

    try:
        config = timm.models.get_pretrained_cfg(name)
    except (RuntimeError, ValueError):
        config = None
    if config is None:
        return None
    hub_id = getattr(config, "hf_hub_id", None)
    if hub_id:
        from huggingface_hub import try_to_load_from_cache

        filenames = [config.hf_hub_filename] if getattr(config, "hf_hub_filename", None) else []
        for filename in [*filenames, "model.safetensors", "pytorch_model.bin"]:
            found = try_to_load_from_cache(hub_id, filename)
            if isinstance(found, str):
                return Path(found)
    url = getattr(config, "url", None)
    if url:
        import torch.hub

        candidate = Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(url)
        if candidate.is_file():
            return candidate
    return None


def _load_timm_name(name: str, weights: str | os.PathLike[str] | None, pretrained: bool):
    import timm

    if not timm.is_model(name.split(".")[0]):
        raise ModelLoadError(
            f"{name!r} is not a zoo model (zoo:NAME), an existing file or folder, or a timm "
            "model name; `explain models` lists the zoo"
        )
    if not pretrained:
        return _load_timm(name, name=name, pretrained=False)
    if weights is None:
        weights = _cached_timm_weights(name)
        if weights is None:
            raise ModelLoadError(
                f"the pretrained weights of timm model {name!r} are not on this machine and "
                "explain never downloads: pass the weights file (Python: weights=FILE, CLI: "
                f"--weights FILE), or fetch them once where there is network with "
                f"`python -c \"import timm; timm.create_model('{name}', pretrained=True)\"`"
            )
    weights = Path(weights)
    if not weights.is_file():
        raise ModelLoadError(f"weights file not found: {weights}")
    return _load_timm(name, name=name, pretrained_cfg_overlay={"file": str(weights)})


def _load_timm(model_name: str, *, name: str, pretrained: bool = True, **options: Any):
    """timm.create_model with pretrained weights from a local source, as a LoadedModel."""
    import timm
    from safetensors import SafetensorError
    from timm.data import resolve_data_config

    try:
        model = timm.create_model(model_name, pretrained=pretrained, **options)
    except (OSError, RuntimeError, ValueError, KeyError, SafetensorError) as error:
        raise ModelLoadError(f"cannot load timm model {name}: {error}") from None
    model.eval()
    data = resolve_data_config({}, model=model)
    return LoadedModel(
        name=name,
        model=model,
        modality="image",
        classes=_timm_class_names(model),
        image_size=tuple(data["input_size"][1:]),
        mean=tuple(data["mean"]),
        std=tuple(data["std"]),
    )


def _timm_class_names(model: nn.Module) -> tuple[str, ...] | None:
    """ImageNet class descriptions that timm ships, when the head is an ImageNet head."""
    names = getattr(model, "pretrained_cfg", {}).get("label_names")
    if names and len(names) == model.num_classes:
        return tuple(names)
    from timm.data import ImageNetInfo, infer_imagenet_subset

    subset = infer_imagenet_subset(model)
    if subset is None:
        return None
    return tuple(ImageNetInfo(subset).label_descriptions())


def _load_hugging_face(folder: Path) -> LoadedModel:
    """`from_pretrained(folder)` of the architecture the folder's config names."""
    import transformers

    try:
        config = transformers.AutoConfig.from_pretrained(folder, local_files_only=True)
        architectures = getattr(config, "architectures", None) or []
        cls = getattr(transformers, architectures[0], None) if architectures else None
        model = (cls or transformers.AutoModel).from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError, KeyError) as error:
        raise ModelLoadError(f"cannot load the Hugging Face model in {folder}: {error}") from None
    model.eval()
    # A dual encoder (CLIP and its kin) takes images and texts: it needs both preprocessings.
    dual = hasattr(model, "get_image_features") and hasattr(model, "get_text_features")
    image_input = dual or getattr(model, "main_input_name", "input_ids") == "pixel_values"
    tokenizer = None
    if dual or not image_input:
        try:
            tokenizer = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
        except (OSError, ValueError, KeyError) as error:
            raise ModelLoadError(
                f"{folder} holds a text model but no tokenizer files: {error}"
            ) from None
    id2label = getattr(config, "id2label", None) or {}
    classes = tuple(id2label[i] for i in sorted(id2label)) if id2label else None
    image_size = mean = std = None
    if image_input:
        size = getattr(getattr(config, "vision_config", config), "image_size", None)
        image_size = (size, size) if isinstance(size, int) else None
        processor = folder / "preprocessor_config.json"
        if processor.is_file():
            values = _read_json(processor)
            mean = tuple(values["image_mean"]) if "image_mean" in values else None
            std = tuple(values["image_std"]) if "image_std" in values else None
    return LoadedModel(
        name=str(folder),
        model=model,
        modality="image_text" if dual else "image" if image_input else "text",
        classes=classes,
        image_size=image_size,
        mean=mean,
        std=std,
        tokenizer=tokenizer,
    )
