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

Every file the tool writes, these and every other output (figures, pages, reports,
caches), is written atomically (`atomic_write`), and a command checks its outputs can be
written before any work (`check_writable`).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import tempfile
import zipfile
import zlib
from collections.abc import Callable, Collection, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch
from torch import Tensor

from explain.errors import InputError, OptionError

__all__ = [
    "FORMATS",
    "MAX_HEADER_BYTES",
    "atomic_write",
    "check_writable",
    "numpy_array",
    "read_payload",
    "suffix_of",
    "write_payload",
]

FORMATS = ("npz", "safetensors", "json")
"""The formats `--save` and `Explanation.save` write, named by their file suffix."""

_HEADER = "__explain__"


def _umask() -> int:
    """The process's file-creation mask (reading it means setting it; set it straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike[str], mode: str = "wb") -> Iterator[IO]:
    """Write `path` through a temporary file in the same folder, renamed on success.

    Readers see the old file or the complete new one, never a half-written one; on an
    exception the temporary file is removed and `path` is untouched.
    """
    target = Path(path)
    if target.is_dir():  # a last guard: commands check their outputs before any work
        raise InputError(f"{target} is a folder; cannot write a file there")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(
            dir=target.parent, prefix=f".{target.name}.", suffix=".partial"
        )
    except (FileExistsError, NotADirectoryError):
        raise InputError(
            f"{target} cannot be written: a file is in the way of its folder"
        ) from None
    except OSError as error:  # a folder that cannot be made or written into (/proc, ...)
        raise InputError(
            f"{target} cannot be written: its folder {target.parent}: "
            f"{error.strerror or error}; choose a folder you can write files into"
        ) from None
    try:
        # mkstemp makes the file private (0600); give it the mode open() would have given
        # it, so outputs are as readable as any other file the user writes.
        os.fchmod(descriptor, 0o666 & ~_umask())
        with os.fdopen(descriptor, mode) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def check_writable(path: str | os.PathLike[str], *, folder: bool, option: str) -> None:
    """Refuse, before any work is done, an output that cannot be written: `path` is a
    folder to write into (`folder`) or a file to write; `option` names it in the message.

    The nearest existing folder on the way must be a folder that takes a new file (checked
    by creating and removing a temporary one there); nothing else is created.
    """
    path = Path(path)
    if path.exists() and path.is_dir() != folder:
        kind = "a file, not a folder" if folder else "a folder; give a file name"
        raise InputError(f"{option} {path} is {kind}")
    existing = path if folder else path.parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise InputError(f"{option} {path} cannot be made: {existing} is a file, not a folder")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as error:
        raise InputError(
            f"{option} {path} cannot be written: {existing}: {error.strerror or error}"
        ) from None


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
