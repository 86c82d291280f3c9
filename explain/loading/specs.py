"""Load a model to explain from a spec string: the one loader the CLI and the API share.

A spec is `zoo:NAME`, a local folder (Hugging Face, timm export or zoo), a timm weights
file, a timm model name (or `hf-hub:org/name`) or a Hugging Face Hub id
(`org/name@revision`); downloads go through the libraries' own code and cache, and
`offline=True` uses the cache only. Each model comes with its class names and its own
image preprocessing. README.md ("Command line": the `--model` specs) lists the forms.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from explain.errors import (
    HubUnreachableError,
    ModelLoadError,
    OptionError,
    RepoNotFoundError,
    UnsupportedModelError,
)
from explain.loading.hub import (
    HUB_PREFIX,
    env_offline,
    fetch_config,
    hub_errors,
    hub_session,
    is_repo_id,
    quiet_transformers,
    split_revision,
)
from explain.loading.loaded_model import LoadedModel
from explain.loading.preprocessing import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    ImagePreprocessing,
    photo_preprocessing,
)
from explain.loading.zoo import load_zoo_folder, load_zoo_model

__all__ = ["DEVICES", "DTYPES", "ZOO_PREFIX", "load_model", "resolve_device"]

ZOO_PREFIX = "zoo:"
_WEIGHT_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin")
DEVICES = ("auto", "cpu", "cuda", "mps")
"""Device names `load_model` and `--device` take (`cuda:1` and the like work too)."""
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
"""Parameter types `load_model` and `--dtype` take, by name."""
WEIGHT_DTYPES = (*DTYPES.values(), torch.float64)
"""The torch dtypes `load_model` takes: those above and float64 (not float8, say, or complex:
no layer computes in them)."""
_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
"""OpenAI CLIP's pixel normalisation, for a dual encoder saved without its image processor."""


def load_model(
    spec: str | os.PathLike[str],
    *,
    weights: str | os.PathLike[str] | None = None,
    architecture: str | None = None,
    pretrained: bool = True,
    offline: bool = False,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype | None = None,
    allow_missing_weights: bool = False,
) -> LoadedModel:
    """Load the model `spec` names (see the module docstring) in eval mode.

    Args:
        spec: `zoo:NAME`, a folder, a weights file, a timm model name, `hf-hub:org/name`
            or a Hugging Face repo id `org/name[@revision]`.
        weights: a weights file for a timm model name (its pretrained weights, no download).
        architecture: the timm model name of a bare weights file without a config.
        pretrained: False builds a timm model name with random weights (for trying things).
        offline: use the Hugging Face cache only, never the network (also when the
            environment sets HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE).
        device: where the model (and so every explanation of it) runs: "cpu", "cuda",
            "cuda:1", "mps", or "auto" (a GPU when there is one).
        dtype: "float32", "bfloat16", "float16" (or a floating torch dtype); None keeps
            the checkpoint's float32.
        allow_missing_weights: load a Hugging Face checkpoint that lacks some of the
            model's weights (transformers initialises them at random). By default such a
            checkpoint is refused, naming the missing weights: a classifier whose head is
            random explains nothing.

    Raises:
        ModelLoadError: unknown spec, missing or unreadable files, a config that describes
            no model, weights missing from a checkpoint; its subclasses
            HubUnreachableError (offline or no network, and not cached),
            RepoNotFoundError (no such repo or revision) and GatedRepoError (the repo
            needs its terms accepted and a token).
        UnsupportedModelError: the model is of no family explain can instrument (checked
            before its weights are downloaded).
        OptionError: an unknown or unavailable device or dtype.
    """
    if not isinstance(spec, str | os.PathLike):
        raise ModelLoadError(
            "a model spec is a string or a path (zoo:NAME, a model folder, a weights file or "
            f"a timm model name), got {type(spec).__name__}"
        )
    target_device = resolve_device(device)
    target_dtype = _resolve_dtype(dtype)
    text = os.fspath(spec)
    offline = offline or env_offline()
    if text.startswith(ZOO_PREFIX):
        # Outside quiet_transformers: it imports transformers, which a zoo image model
        # never uses; the zoo's one from_pretrained (MiniLM's) quiets its own bar.
        loaded = load_zoo_model(text[len(ZOO_PREFIX) :])
    else:
        with quiet_transformers(), hub_session(offline):  # no "Loading weights" bar
            loaded = _load_spec(
                text, weights, architecture, pretrained, offline, allow_missing_weights
            )
    loaded.model.to(device=target_device, dtype=target_dtype)
    return loaded


def resolve_device(device: str | torch.device) -> torch.device:
    """The torch device a `device` option names; "auto": CUDA, else MPS, else the CPU."""
    if isinstance(device, torch.device):
        return device
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("mps" if torch.backends.mps.is_available() else "cpu")
    try:
        chosen = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise OptionError(
            f"unknown device {device!r}; use one of {', '.join(DEVICES)} (or cuda:N)"
        ) from None
    if chosen.type == "cuda" and not torch.cuda.is_available():
        raise OptionError("device cuda: this machine has no usable CUDA GPU; use --device cpu")
    if chosen.type == "cuda" and (chosen.index or 0) >= torch.cuda.device_count():
        raise OptionError(
            f"device {device!r} is not available: this machine has "
            f"{torch.cuda.device_count()} CUDA device(s); use cpu or one of those"
        )
    if chosen.type == "mps" and not torch.backends.mps.is_available():
        raise OptionError("device mps: Apple's Metal backend is not available here")
    return chosen


def _resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    if isinstance(dtype, torch.dtype) and dtype not in WEIGHT_DTYPES:
        kind = (
            "a float type no layer computes in"
            if dtype.is_floating_point
            else "not a floating point type"
        )
        raise OptionError(
            f"dtype {dtype} is {kind}: a model's weights take one of "
            f"{', '.join(DTYPES)} (or torch.float64)"
        )
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise OptionError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    return DTYPES[dtype]


def _load_spec(
    text: str,
    weights: str | os.PathLike[str] | None,
    architecture: str | None,
    pretrained: bool,
    offline: bool,
    allow_missing: bool,
) -> LoadedModel:
    """Every spec but `zoo:`, inside the hub session."""
    if text.startswith(HUB_PREFIX):
        repo = text[len(HUB_PREFIX) :]
        if not is_repo_id(repo):
            raise ModelLoadError(
                f"{_shown(text)} names no Hub repository: write hf-hub:org/name, e.g. "
                "hf-hub:timm/vit_small_patch16_224.augreg_in21k_ft_in1k"
            )
        with hub_errors(text, repo, offline):
            return _load_timm_hub(repo, name=text)
    path = Path(text).expanduser()
    if _is(path.is_dir):
        return _load_folder(path, allow_missing)
    if _is(path.is_file) or path.suffix in _WEIGHT_SUFFIXES:
        return _load_timm_file(path, architecture)
    if is_repo_id(text):
        with hub_errors(text, text, offline):
            return _load_repo(text, allow_missing)
    if not _is_timm_name(text) and is_repo_id(text, bare=True):
        return _load_bare_repo(text, offline, allow_missing)
    return _load_timm_name(text, weights, pretrained, offline)


def _is(test: Any) -> bool:
    """A path test (`Path.is_dir`, ...), False where the system cannot even look the name
    up (a name too long for a path is no file, and maybe something else)."""
    try:
        return bool(test())
    except OSError:
        return False


def _shown(name: str) -> str:
    """A spec as error messages quote it: at most 80 characters."""
    return repr(name) if len(name) <= 80 else f"{name[:77]!r}... ({len(name)} characters)"


def _is_timm_name(name: str) -> bool:
    import timm

    return timm.is_model(name.split(".")[0])


def _unknown_spec(name: str) -> str:
    return (
        f"{_shown(name)} is not a zoo model (zoo:NAME), an existing file or folder, a timm model "
        "name, hf-hub:org/name or a Hugging Face repo id org/name; `explain models` lists "
        "the zoo"
    )


def _load_bare_repo(name: str, offline: bool, allow_missing: bool) -> LoadedModel:
    """A Hub id without an organisation (`gpt2`): the Hub's, when it has one; otherwise the
    error says it is none of the spec kinds, and why the Hub was no help."""
    try:
        with hub_errors(name, name, offline):
            return _load_repo(name, allow_missing)
    except RepoNotFoundError as error:
        raise ModelLoadError(f"{_unknown_spec(name)}; as a Hub repo id: {error}") from None
    except HubUnreachableError as error:
        raise HubUnreachableError(
            f"{name!r} is not a zoo model (zoo:NAME), an existing file or folder, or a timm "
            f"model name, so it was looked up as a Hugging Face repo id: {error}"
        ) from None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        content = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ModelLoadError(f"cannot read {path}: {error}") from None
    if not isinstance(content, dict):
        raise ModelLoadError(
            f"{path} holds {type(content).__name__} {json.dumps(content)[:40]}, not a JSON "
            "object: is it a model's config file?"
        )
    return content


def _one_line(error: BaseException) -> str:
    """An exception's message on one line: the CLI prints every error as one."""
    return f"{type(error).__name__}: {' '.join(str(error).split())}"


def _load_folder(folder: Path, allow_missing: bool) -> LoadedModel:
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise ModelLoadError(
            f"{folder} has no config.json: expected a Hugging Face model folder "
            "(save_pretrained), a timm export (timm.models.save_for_hf) or a zoo model folder"
        )
    config = _read_json(config_path)
    if "builder" in config:
        return load_zoo_folder(folder)
    if "architecture" in config:
        _require_supported_timm(config, str(folder))
        return _load_timm(f"local-dir:{folder}", name=str(folder))
    if "model_type" in config:
        return _load_hugging_face(folder, name=str(folder), allow_missing=allow_missing)
    raise ModelLoadError(
        f"{config_path} names no model: expected `model_type` (Hugging Face), "
        "`architecture` (timm) or `family` (zoo)"
    )


def _load_repo(repo: str, allow_missing: bool) -> LoadedModel:
    """A Hub repo id: its config.json says whether timm or transformers made it."""
    config = fetch_config(repo)
    if "architecture" in config:
        return _load_timm_hub(repo, name=repo, config=config)
    if "model_type" in config:
        return _load_hugging_face(repo, name=repo, allow_missing=allow_missing)
    raise ModelLoadError(
        f"{repo} is neither a transformers model (no `model_type` in its config.json) nor a "
        "timm model (no `architecture`)"
    )


def _load_timm_hub(repo: str, *, name: str, config: dict[str, Any] | None = None):
    """A timm model from Hub repo `org/name[@revision]`: its config, then timm's `hf-hub:`
    loader (which reads the same config and downloads the weights)."""
    _require_supported_timm(config if config is not None else fetch_config(repo), name)
    return _load_timm(f"{HUB_PREFIX}{repo}", name=name)


def _require_supported_timm(config: dict[str, Any], name: str) -> None:
    """UnsupportedModelError for a timm config of a family explain cannot instrument,
    found by building the architecture without weights (on the meta device)."""
    import timm

    architecture = config["architecture"]
    model_args = config.get("model_args", {})
    if not isinstance(architecture, str) or not isinstance(model_args, dict):
        raise ModelLoadError(
            f"{name}'s config is not a timm config: `architecture` must be a model name and "
            f"`model_args` an object of keyword arguments, got {architecture!r:.60} and "
            f"{model_args!r:.60}"
        )
    if not timm.is_model(architecture):
        raise ModelLoadError(
            f"{name} is a timm {architecture}, which this timm ({timm.__version__}) does not "
            "know: upgrade timm (`pip install -U timm`)"
        )
    with (
        _failing_as(f"{name}'s config describes no model that can be built", TypeError),
        torch.device("meta"),
    ):
        skeleton = timm.create_model(architecture, pretrained=False, **model_args)
    _require_supported(skeleton, name)


def _require_supported(model: nn.Module, name: str) -> bool:
    """UnsupportedModelError, naming the supported families, unless an adapter takes it;
    whether that adapter reads image prompts (a vision-language model)."""
    from explain.architectures import adapter_for

    try:
        return adapter_for(model).reads_images
    except UnsupportedModelError as error:
        raise UnsupportedModelError(f"{name}: {error}") from None


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


def _load_timm_name(
    name: str, weights: str | os.PathLike[str] | None, pretrained: bool, offline: bool
) -> LoadedModel:
    """A timm model name: its pretrained weights from `weights`, else from the Hub repo
    timm publishes them in (the `hf-hub:` route), else from timm's own download URL."""
    import timm
    import timm.models

    if not _is_timm_name(name):
        raise ModelLoadError(_unknown_spec(name))
    if not pretrained:
        return _load_timm(name, name=name, pretrained=False)
    if weights is not None:
        if not Path(weights).is_file():
            raise ModelLoadError(f"weights file not found: {weights}")
        return _load_timm(name, name=name, pretrained_cfg_overlay={"file": str(weights)})
    config = timm.models.get_pretrained_cfg(name)
    if config is None:
        raise ModelLoadError(
            f"timm has no pretrained weights for {name!r}: see `timm.list_pretrained("
            f"'{name.split('.')[0]}*')` for its tags, or pass pretrained=False"
        )
    if config.hf_hub_id and not config.hf_hub_filename:
        with hub_errors(name, config.hf_hub_id, offline):
            return _load_timm_hub(config.hf_hub_id, name=name)
    # Weights only at a URL: timm's torch.hub download, which has no offline switch.
    with torch.device("meta"):
        _require_supported(timm.create_model(name, pretrained=False), name)
    if offline and not _in_torch_hub_cache(config.url):
        raise ModelLoadError(
            f"the weights of {name} are not in the torch hub cache and offline mode is on: "
            "run once without it where there is network, or pass weights=FILE (--weights)"
        )
    return _load_timm(name, name=name)


def _in_torch_hub_cache(url: str | None) -> bool:
    checkpoints = Path(torch.hub.get_dir()) / "checkpoints"
    return bool(url) and (checkpoints / os.path.basename(url)).is_file()


def _load_timm(model_name: str, *, name: str, pretrained: bool = True, **options: Any):
    """timm.create_model with its pretrained weights (local, cached or downloaded)."""
    import timm
    from safetensors import SafetensorError
    from timm.data import resolve_data_config

    with _failing_as(f"cannot load timm model {name}", RuntimeError, SafetensorError):
        model = timm.create_model(model_name, pretrained=pretrained, **options)
    model.eval()
    _require_supported(model, name)
    return LoadedModel(
        name=name,
        model=model,
        modality="image",
        classes=_timm_class_names(model),
        preprocessing=ImagePreprocessing.from_timm(resolve_data_config({}, model=model)),
    )


@contextlib.contextmanager
def _failing_as(message: str, *also: type[BaseException]) -> Iterator[None]:
    """The libraries' loading errors as ModelLoadError(`message`: error), except the hub
    client's, which `hub_errors` turns into errors that say which (offline, no network, no
    such repo, gated)."""
    try:
        yield
    except (OSError, ValueError, KeyError, *also) as error:
        if type(error).__module__.startswith("huggingface_hub"):
            raise
        raise ModelLoadError(f"{message}: {_one_line(error)}") from None


def _timm_class_names(model: nn.Module) -> tuple[str, ...] | None:
    """The class names timm ships: ImageNet's descriptions ("tabby, tabby cat") for an
    ImageNet head, else the checkpoint's own label names."""
    from timm.data import ImageNetInfo, infer_imagenet_subset

    config = getattr(model, "pretrained_cfg", {}) or {}
    names = config.get("label_descriptions")
    if isinstance(names, list | tuple) and len(names) == model.num_classes:
        return tuple(names)
    subset = infer_imagenet_subset(model)
    if subset is not None:
        return tuple(ImageNetInfo(subset).label_descriptions())
    names = config.get("label_names")
    if names and len(names) == model.num_classes:
        return tuple(names)
    return None


def _weights_files(folder: Path) -> str:
    """The weights files of a Hugging Face folder, for error messages."""
    names = sorted(p.name for p in folder.iterdir() if p.suffix in _WEIGHT_SUFFIXES)
    return ", ".join(names) if names else "no weights file"


def _load_hugging_face(source: str | Path, *, name: str, allow_missing: bool) -> LoadedModel:
    """`from_pretrained` of the architecture the config names, from a folder or a Hub repo
    `org/name[@revision]`; its tokenizer, class names and image processor with it. A
    checkpoint without some of the model's weights is refused unless `allow_missing`."""
    import transformers
    from safetensors import SafetensorError

    local = isinstance(source, Path)
    repo, revision = (source, None) if local else split_revision(source)
    options: dict[str, Any] = {"revision": revision, "local_files_only": local}
    with _failing_as(f"cannot read the Hugging Face config of {name}", AttributeError, TypeError):
        config = transformers.AutoConfig.from_pretrained(repo, **options)
    cls = _model_class(config, name)
    # The family check costs no download and no memory; it also builds the model the
    # config describes, so a config that describes none (0 heads, ...) fails here.
    with (
        _failing_as(
            f"the Hugging Face config of {name} describes no model that can be built",
            TypeError,
            ArithmeticError,
            RuntimeError,
            AttributeError,
        ),
        torch.device("meta"),
    ):
        skeleton = transformers.AutoModel.from_config(config) if cls is None else cls(config)
    answers = _require_supported(skeleton, name)
    files = f" ({_weights_files(source)})" if local else ""
    try:
        with _failing_as(
            f"cannot load the Hugging Face model {name}{files}", RuntimeError, SafetensorError
        ):
            model, loading = (cls or transformers.AutoModel).from_pretrained(
                repo, output_loading_info=True, **options
            )
    except pickle.UnpicklingError:
        raise ModelLoadError(
            f"cannot load the Hugging Face model {name}:{files} holds more than plain tensors, "
            "which explain never unpickles (torch.load with weights_only); save the weights "
            "with safetensors from a copy you trust"
        ) from None
    missing = sorted(loading.get("missing_keys") or ())
    if missing and not allow_missing:
        shown = ", ".join(missing[:8]) + (
            f" and {len(missing) - 8} more" if len(missing) > 8 else ""
        )
        raise ModelLoadError(
            f"{name} lacks {len(missing)} of the model's weights ({shown}), which would be "
            "random: load a checkpoint trained for this architecture, or, to explain it "
            "anyway, allow_missing_weights=True (CLI: --allow-missing-weights)"
        )
    model.eval()
    # A dual encoder (CLIP and its kin) takes images and texts: it needs both preprocessings.
    dual = hasattr(model, "get_image_features") and hasattr(model, "get_text_features")
    image_input = dual or getattr(model, "main_input_name", "input_ids") == "pixel_values"
    # A vision-language model (LLaVA and its kin) answers in text about images: its
    # processor tokenizes, places the image tokens and prepares the pixels.
    if answers:
        with _failing_as(f"{name} is a vision-language model without its processor"):
            processor = transformers.AutoProcessor.from_pretrained(repo, **options)
        return LoadedModel(
            name=name,
            model=model,
            modality="vision_language",
            preprocessing=photo_preprocessing(processor),
            tokenizer=processor,
        )
    tokenizer = None
    if dual or not image_input:
        with _failing_as(f"{name} holds a text model but no tokenizer"):
            tokenizer = transformers.AutoTokenizer.from_pretrained(repo, **options)
    classes = _class_names(config, name)
    if type(model).__name__.endswith("ForObjectDetection"):  # variable sizes, padded batches
        with _failing_as(f"{name} holds a detector but no image processor"):
            processor = transformers.AutoImageProcessor.from_pretrained(repo, **options)
        return LoadedModel(
            name=name, model=model, modality="image", classes=classes, image_processor=processor
        )
    return LoadedModel(
        name=name,
        model=model,
        modality="image_text" if dual else "image" if image_input else "text",
        classes=classes,
        preprocessing=_hugging_face_preprocessing(repo, options, config, dual)
        if image_input
        else None,
        tokenizer=tokenizer,
    )


def _model_class(config: Any, name: str) -> type | None:
    """The transformers class the config's `architectures` names; None (AutoModel) when
    it names none, an Auto class, or one this transformers does not have."""
    import transformers

    architectures = getattr(config, "architectures", None) or []
    if not isinstance(architectures, list | tuple) or not all(
        isinstance(a, str) for a in architectures
    ):
        raise ModelLoadError(
            f"the config of {name} lists architectures {architectures!r:.80}; expected the "
            'names of transformers model classes (e.g. ["BertForSequenceClassification"])'
        )
    if not architectures or architectures[0].startswith("Auto"):
        return None
    found = getattr(transformers, architectures[0], None)
    if found is None:
        return None
    if not (isinstance(found, type) and issubclass(found, transformers.PreTrainedModel)):
        raise ModelLoadError(
            f"the config of {name} names architecture {architectures[0]!r}, which is not a "
            "transformers model class"
        )
    return found


def _class_names(config: Any, name: str) -> tuple[str, ...] | None:
    """The class names of the config's `id2label` (class index -> name), in index order."""
    id2label = getattr(config, "id2label", None) or {}
    if not isinstance(id2label, dict) or not all(
        isinstance(i, int) and isinstance(label, str) for i, label in id2label.items()
    ):
        raise ModelLoadError(
            f"the config of {name} has id2label {id2label!r:.80}; expected an object of class "
            'indices and names, e.g. {"0": "negative", "1": "positive"}'
        )
    if sorted(id2label) != list(range(len(id2label))):
        raise ModelLoadError(
            f"the config of {name} names classes {sorted(id2label)[:10]} in id2label; "
            "expected 0, 1, ... without gaps"
        )
    return tuple(id2label[i] for i in sorted(id2label)) if id2label else None


def _hugging_face_preprocessing(
    repo: str | Path, options: dict[str, Any], config: Any, dual: bool
) -> ImagePreprocessing | None:
    """The model's image processor; without one, a plain resize to the config's image size
    with CLIP's or ImageNet's normalisation."""
    import transformers

    try:
        processor = transformers.AutoImageProcessor.from_pretrained(repo, **options)
    except (OSError, ValueError, KeyError):  # the repo or folder has no image processor
        processor = None
    found = ImagePreprocessing.from_processor(processor) if processor is not None else None
    size = getattr(getattr(config, "vision_config", config), "image_size", None)
    if not isinstance(size, int) or (found is not None and found.size == (size, size)):
        return found
    # No processor, or one saved with another model's size (a default processor next to a
    # small model): a plain resize to the size the model takes.
    return ImagePreprocessing(
        size=(size, size),
        mean=found.mean if found else _CLIP_MEAN if dual else IMAGENET_MEAN,
        std=found.std if found else _CLIP_STD if dual else IMAGENET_STD,
    )
