"""Files that results leave the tool in: tensors plus a JSON header, in three formats.

`Explanation.save` and `Explanation.load` (explain/explanation.py) turn an explanation
into named tensors and a JSON-able header and back; this module only writes and reads
those, by the file's suffix:

- `.safetensors`: the tensors as they are (dtype kept), the header as the file's
  `"explain"` metadata entry; readable without `explain` by any safetensors library.
- `.npz`: numpy arrays (bfloat16 and float8 widened to float32, which numpy lacks), the
  header as the string array `__explain__`; `np.load(path)` reads it without pickle.
- `.json`: one object, the header plus each tensor as nested lists (and its dtype, so
  that loading restores it exactly): made for text explanations, readable anywhere.

Every file is written atomically (see explain.io.atomic_write).
"""

from __future__ import annotations

import io
import json
import math
import os
import zipfile
import zlib
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from explain.errors import InputError, OptionError
from explain.io import atomic_write

__all__ = [
    "FORMATS",
    "MAX_HEADER_BYTES",
    "numpy_array",
    "read_payload",
    "suffix_of",
    "write_payload",
]

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


_NUMPY_FLOATS = (torch.float16, torch.float32, torch.float64)


def numpy_array(tensor: Tensor) -> np.ndarray:
    """`tensor` as a numpy array on the CPU; floating types numpy lacks (bfloat16, the
    float8 types) widened to float32, which holds each of their values exactly."""
    tensor = tensor.detach().cpu()
    if tensor.is_floating_point() and tensor.dtype not in _NUMPY_FLOATS:
        tensor = tensor.float()
    return tensor.numpy()


def write_payload(
    path: str | os.PathLike[str], tensors: Mapping[str, Tensor], header: Mapping[str, Any]
) -> Path:
    """Write named tensors and a JSON-able header to `path`, in the format of its suffix.

    The header must be strict JSON (no NaN or infinity, which JSON has no words for, and
    nothing but strings, numbers, booleans, None, lists and dicts): anything else is
    refused before a byte is written."""
    kind = suffix_of(path)
    text = _strict_json(header, "the header (method, tokens, settings)")
    if kind == "safetensors":
        from safetensors.torch import save

        # Copies: safetensors refuses tensors that share memory, as the maps of one sample
        # cut from a batch's (`relevance` and its modality's entry) do.
        data = save(
            {
                name: t.detach().cpu().clone(memory_format=torch.contiguous_format)
                for name, t in tensors.items()
            },
            metadata={"explain": text},
        )
        with atomic_write(path) as handle:
            handle.write(data)
    elif kind == "npz":
        buffer = io.BytesIO()
        np.savez_compressed(
            buffer,
            **{name: numpy_array(t) for name, t in tensors.items()},
            **{_HEADER: np.array(text)},
        )
        with atomic_write(path) as handle:
            handle.write(buffer.getvalue())
    else:
        document = {
            **header,
            "tensors": {name: numpy_array(t).tolist() for name, t in tensors.items()},
            "dtypes": {name: str(t.dtype).removeprefix("torch.") for name, t in tensors.items()},
        }
        text = _strict_json(document, "the tensors (JSON has no NaN or infinity)")
        with atomic_write(path, "w") as handle:
            handle.write(text + "\n")
    return Path(path)


def _strict_json(value: Any, what: str) -> str:
    """`value` as standard JSON text, or OptionError saying what cannot be written."""
    try:
        return json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise OptionError(
            f"{what} cannot be written as JSON: {error}; use strings, finite numbers, "
            "booleans, None, lists and dicts"
        ) from None


MAX_HEADER_BYTES = 64 * 2**20
"""The largest header `read_payload` reads (the tokens of a big batch fit many times)."""

Wanted = Callable[[dict[str, Any]], Collection[str]]
"""Given the file's header, the names of the tensors to read (those the file lacks are
left out of the result); it may raise to refuse the header."""


def read_payload(
    path: str | os.PathLike[str], wanted: Wanted
) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """The header of a file written by `write_payload`, and the tensors `wanted(header)`
    names (only those: other members are never read, let alone inflated).

    A damaged or foreign file raises InputError, whatever the damage: cut short, not a
    zip or safetensors file, a member whose stored size disagrees with its declared shape,
    a header that is not a JSON object or nests too deeply."""
    kind = suffix_of(path)
    if not Path(path).is_file():
        raise InputError(f"no such file: {path}")
    from safetensors import SafetensorError

    try:
        if kind == "safetensors":
            return _read_safetensors(path, wanted)
        if kind == "npz":
            return _read_npz(path, wanted)
        return _read_json(path, wanted)
    except (
        KeyError,
        ValueError,
        TypeError,
        AttributeError,
        IndexError,
        OSError,
        EOFError,
        RecursionError,
        zipfile.BadZipFile,
        zlib.error,
        SafetensorError,
    ) as error:
        reason = "it nests too deeply" if isinstance(error, RecursionError) else error
        raise InputError(
            f"{path} is not an explanation file written by explain, or it is damaged "
            f"({type(error).__name__}: {reason}); write one with Explanation.save or --save"
        ) from None


def _header(text: str) -> dict[str, Any]:
    header = json.loads(text)
    if not isinstance(header, dict):
        raise ValueError(f"the header is a {type(header).__name__}, not a JSON object")
    return header


def _read_safetensors(
    path: str | os.PathLike[str], wanted: Wanted
) -> tuple[dict[str, Tensor], dict[str, Any]]:
    from safetensors import safe_open

    # safetensors checks every tensor's offsets against the file when it opens it, and
    # reads a tensor's bytes only when asked for it.
    with safe_open(str(path), framework="pt") as handle:
        header = _header((handle.metadata() or {})["explain"])
        present = set(handle.keys())
        tensors = {name: handle.get_tensor(name) for name in wanted(header) if name in present}
    return tensors, header


def _read_npz(
    path: str | os.PathLike[str], wanted: Wanted
) -> tuple[dict[str, Tensor], dict[str, Any]]:
    with zipfile.ZipFile(path) as archive:
        present = {name.removesuffix(".npy") for name in archive.namelist()}
        if _HEADER not in present:
            raise KeyError(f"no {_HEADER} member")
        header = _header(str(_npz_member(archive, _HEADER, MAX_HEADER_BYTES)))
        tensors = {
            name: torch.from_numpy(_npz_member(archive, name))
            for name in wanted(header)
            if name in present
        }
    return tensors, header


def _npz_member(archive: zipfile.ZipFile, name: str, limit: int | None = None) -> np.ndarray:
    """One array of an npz archive, its sizes checked before it is inflated: the size the
    zip entry declares must be what the array's own header says (shape x item size), so a
    small file cannot make the reader inflate more than its arrays hold."""
    info = archive.getinfo(name + ".npy")
    if limit is not None and info.file_size > limit:
        raise ValueError(f"{name} holds {info.file_size} bytes, more than {limit}")
    with archive.open(info) as stream:
        version = np.lib.format.read_magic(stream)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(stream)
        else:
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(stream)
        if dtype.hasobject:
            raise ValueError(f"{name} holds Python objects, which are never unpickled")
        expected = stream.tell() + math.prod(shape) * dtype.itemsize
        if info.file_size != expected:
            raise ValueError(
                f"{name} declares {info.file_size} bytes but its shape {shape} and type "
                f"{dtype} make {expected}"
            )
        data = stream.read(expected - stream.tell())
    if len(data) != math.prod(shape) * dtype.itemsize:
        raise EOFError(f"{name} is cut short")
    array = np.frombuffer(data, dtype=dtype)
    return array.reshape(shape, order="F" if fortran else "C").copy()


def _read_json(
    path: str | os.PathLike[str], wanted: Wanted
) -> tuple[dict[str, Tensor], dict[str, Any]]:
    document = _header(Path(path).read_text(encoding="utf-8"))
    dtypes, stored = document.pop("dtypes"), document.pop("tensors")
    if not isinstance(dtypes, dict) or not isinstance(stored, dict):
        raise ValueError("tensors and dtypes must be JSON objects")
    tensors = {}
    for name in wanted(document):
        if name in stored:
            dtype = getattr(torch, str(dtypes[name]), None)
            if not isinstance(dtype, torch.dtype):
                raise ValueError(f"{name} has an unknown dtype {dtypes[name]!r}")
            tensors[name] = torch.tensor(stored[name], dtype=dtype)
    return tensors, document
