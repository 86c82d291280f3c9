"""Reading images from files and writing output files atomically (and checking, before
any work, that they can be written)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO

import torch
from torch import Tensor

from explain.errors import InputError
from explain.preprocessing import ImagePreprocessing, read_image

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "atomic_write", "check_writable", "load_images"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


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


def load_images(
    paths: Sequence[str | os.PathLike[str]],
    size: tuple[int, int],
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
) -> tuple[Tensor, Tensor]:
    """Load image files as a normalised batch.

    Each image is converted to RGB, resized (bicubic) to `size` = (H, W), scaled to
    [0, 1] and normalised with `mean` and `std` (a model's own preprocessing, crop
    included, is `LoadedModel.preprocessing`).

    Returns:
        (normalised (B, 3, H, W), unnormalised (B, 3, H, W) in [0, 1] for display).
    """
    plain = ImagePreprocessing(size=tuple(size), mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))
    raw = plain([read_image(path) for path in paths])
    normalised = (raw - torch.tensor(mean)[:, None, None]) / torch.tensor(std)[:, None, None]
    return normalised, raw
