"""Files that results leave the tool in: tensors plus a JSON header, in three formats.

`Explanation.save` and `Explanation.load` (explain/explanation.py) turn an explanation
into named tensors and a JSON-able header and back; this module only writes and reads
those, by the file's suffix:

- `.safetensors`: the tensors as they are (dtype kept), the header as the file's
  `"explain"` metadata entry; readable without `explain` by any safetensors library.
- `.npz`: numpy arrays (bfloat16 widened to float32, which numpy lacks), the header as
  the string array `__explain__`; `np.load(path)` reads it without pickle.
- `.json`: one object, the header plus each tensor as nested lists (and its dtype, so
  that loading restores it exactly): made for text explanations, readable anywhere.

Every file is written atomically (see explain.io.atomic_write).
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from explain.errors import InputError
from explain.io import atomic_write

__all__ = ["FORMATS", "read_payload", "suffix_of", "write_payload"]

FORMATS = ("npz", "safetensors", "json")
"""The formats `--save` and `Explanation.save` write, named by their file suffix."""

_HEADER = "__explain__"


def suffix_of(path: str | os.PathLike[str]) -> str:
    """The format of `path` from its suffix, or InputError naming the formats."""
    suffix = Path(path).suffix.lower().lstrip(".")
    if suffix not in FORMATS:
        raise InputError(
            f"cannot tell the format of {path}: give it one of the suffixes "
            f"{', '.join('.' + f for f in FORMATS)}"
        )
    return suffix


def _numpy(tensor: Tensor) -> np.ndarray:
    tensor = tensor.detach().cpu()
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.float()
    return tensor.numpy()


def write_payload(
    path: str | os.PathLike[str], tensors: Mapping[str, Tensor], header: Mapping[str, Any]
) -> Path:
    """Write named tensors and a JSON-able header to `path`, in the format of its suffix."""
    kind = suffix_of(path)
    text = json.dumps(header)
    if kind == "safetensors":
        from safetensors.torch import save

        data = save(
            {name: t.detach().cpu().contiguous() for name, t in tensors.items()},
            metadata={"explain": text},
        )
        with atomic_write(path) as handle:
            handle.write(data)
    elif kind == "npz":
        buffer = io.BytesIO()
        np.savez_compressed(
            buffer, **{name: _numpy(t) for name, t in tensors.items()}, **{_HEADER: np.array(text)}
        )
        with atomic_write(path) as handle:
            handle.write(buffer.getvalue())
    else:
        document = {
            **header,
            "tensors": {name: _numpy(t).tolist() for name, t in tensors.items()},
            "dtypes": {name: str(t.dtype).removeprefix("torch.") for name, t in tensors.items()},
        }
        with atomic_write(path, "w") as handle:
            json.dump(document, handle)
            handle.write("\n")
    return Path(path)


def read_payload(path: str | os.PathLike[str]) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """The named tensors and the header of a file written by `write_payload`."""
    kind = suffix_of(path)
    if not Path(path).is_file():
        raise InputError(f"no such file: {path}")
    try:
        if kind == "safetensors":
            from safetensors import safe_open

            with safe_open(str(path), framework="pt") as handle:
                header = json.loads((handle.metadata() or {})["explain"])
                tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
        elif kind == "npz":
            with np.load(path, allow_pickle=False) as arrays:
                header = json.loads(str(arrays[_HEADER]))
                tensors = {
                    name: torch.from_numpy(arrays[name]) for name in arrays.files if name != _HEADER
                }
        else:
            document = json.loads(Path(path).read_text(encoding="utf-8"))
            dtypes = document.pop("dtypes")
            tensors = {
                name: torch.tensor(values, dtype=getattr(torch, dtypes[name]))
                for name, values in document.pop("tensors").items()
            }
            header = document
    except (KeyError, ValueError, TypeError, AttributeError, OSError) as error:
        raise InputError(
            f"{path} is not an explanation file written by explain ({error}); write one with "
            "Explanation.save or --save"
        ) from None
    return tensors, header
