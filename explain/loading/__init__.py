"""Loading a model to explain: from a spec (`zoo:NAME`, a folder, a weights file, a timm
name, a Hugging Face Hub id) to a `LoadedModel`, with the preprocessing that feeds it.

- `specs`: `load_model`, the one loader the CLI and the API share;
- `zoo`: the models trained in this repository (models/), loadable offline;
- `hub`: the Hugging Face Hub as the loaders use it (repo ids, offline mode, errors);
- `loaded_model`: `LoadedModel`, what a loader returns;
- `preprocessing`: `ImagePreprocessing`, a model's image preprocessing both ways (photo ->
  input, map -> photo), and image files read as a batch.
"""

from explain.loading.loaded_model import LoadedModel
from explain.loading.preprocessing import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    ImagePreprocessing,
    load_images,
    photo_preprocessing,
)
from explain.loading.specs import DEVICES, DTYPES, ZOO_PREFIX, load_model, resolve_device
from explain.loading.zoo import ZOO, load_zoo_model, minilm_folder, zoo_root

__all__ = [
    "DEVICES",
    "DTYPES",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "ZOO",
    "ZOO_PREFIX",
    "ImagePreprocessing",
    "LoadedModel",
    "load_images",
    "load_model",
    "load_zoo_model",
    "minilm_folder",
    "photo_preprocessing",
    "resolve_device",
    "zoo_root",
]
