"""What `explain serve` shows: a folder of images, a text file of sentences, or nothing,
and the one way a request names a file under that folder.

A folder's images are the image files directly in it (no label) and those in its
immediate subfolders, whose names are read as the images' labels (the ImageFolder layout).
Requests name an image by its path relative to the folder; only the gallery's images are
served, and `resolve` also refuses anything that would reach outside the folder (`..`,
absolute paths, symbolic links that point out), so the server can only ever read images
under DATA.
"""

from __future__ import annotations

import functools
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal

from explain.errors import InputError

__all__ = [
    "IMAGE_SUFFIXES",
    "DataSource",
    "ImageItem",
    "OutsideDataError",
    "file_sha256",
    "read_data",
    "resolve",
]

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")
"""Files a folder contributes to the gallery."""

MAX_SENTENCES = 10_000
"""The most sentences a text file may hold (one a line): the page lists them all."""


class OutsideDataError(InputError):
    """A request named a file that is not under the served folder (or does not exist)."""


@dataclass(frozen=True)
class ImageItem:
    """One image of the gallery.

    Attributes:
        path: its path relative to the folder, with "/" separators (what requests name).
        label: its class subfolder's name, None for images directly in the folder.
    """

    path: str
    label: str | None


@dataclass(frozen=True)
class DataSource:
    """What the server was started on.

    Attributes:
        kind: "images" (a folder), "texts" (a text file) or "none" (uploads only).
        root: the folder (resolved, "images"); None otherwise: no file is served.
        images: the gallery, sorted by path ("images").
        sentences: the file's non-empty lines ("texts").
    """

    kind: Literal["images", "texts", "none"]
    root: Path | None = None
    images: tuple[ImageItem, ...] = ()
    sentences: tuple[str, ...] = ()

    @property
    def labelled(self) -> bool:
        """Whether any image has a label (class subfolders)."""
        return any(item.label is not None for item in self.images)

    @functools.cached_property
    def _listed(self) -> frozenset[str]:
        return frozenset(item.path for item in self.images)

    def image_file(self, relative: str) -> Path:
        """The file of the gallery image `relative` names; OutsideDataError for any other
        name, even of a file under the folder: the server serves the gallery, nothing else."""
        if relative not in self._listed:
            raise OutsideDataError(f"no such image in the gallery: {relative!r}")
        return resolve(self.root, relative)


def read_data(path: str | os.PathLike[str] | None) -> DataSource:
    """The DataSource of `path`: a folder of images, a text file, or None (uploads only)."""
    if path is None:
        return DataSource(kind="none")
    given = Path(path)
    if given.is_dir():
        root = given.resolve()
        images = tuple(_images(root))
        if not images:
            raise InputError(
                f"folder {given} holds no images ({', '.join(IMAGE_SUFFIXES)}), neither "
                "directly nor in class subfolders"
            )
        return DataSource(kind="images", root=root, images=images)
    if given.is_file():
        try:
            lines = given.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as error:
            raise InputError(f"cannot read {given} as UTF-8 text: {error}") from None
        sentences = tuple(line.strip() for line in lines if line.strip())
        if not sentences:
            raise InputError(f"{given} holds no sentences (one per line)")
        if len(sentences) > MAX_SENTENCES:
            raise InputError(f"{given} holds {len(sentences)} sentences; at most {MAX_SENTENCES}")
        return DataSource(kind="texts", sentences=sentences)
    raise InputError(f"no such folder or file: {given}")


def _images(root: Path) -> list[ImageItem]:
    """The images directly in `root` and in its immediate subfolders (their labels),
    leaving out anything whose real location is outside `root` (symbolic links out)."""
    found = []
    for entry in sorted(root.iterdir()):
        if entry.is_dir() and not entry.name.startswith(".") and _inside(entry, root):
            found.extend(
                ImageItem(path=f"{entry.name}/{image.name}", label=entry.name)
                for image in sorted(entry.iterdir())
                if _is_image(image, root)
            )
        elif _is_image(entry, root):
            found.append(ImageItem(path=entry.name, label=None))
    return found


def _is_image(path: Path, root: Path) -> bool:
    return (
        path.suffix.lower() in IMAGE_SUFFIXES
        and not path.name.startswith(".")
        and path.is_file()
        and _inside(path, root)
    )


def _inside(path: Path, root: Path) -> bool:
    return path.resolve().is_relative_to(root)


def resolve(root: Path | None, relative: str) -> Path:
    """The file that `relative` names under `root`, or OutsideDataError.

    Refused: no folder being served, an empty name, absolute paths (also Windows drive
    and UNC forms), any `..` component, NUL bytes, names that do not exist, and names
    whose real location (symbolic links followed) is outside `root`.
    """
    if root is None:
        raise OutsideDataError("this server was started without a folder: no files to serve")
    if not relative or "\x00" in relative or "\\" in relative:
        raise OutsideDataError(f"not a file name under the served folder: {relative!r}")
    parts = PurePosixPath(relative)
    if parts.is_absolute() or ".." in parts.parts or ":" in parts.parts[0]:
        raise OutsideDataError(f"not a file name under the served folder: {relative!r}")
    candidate = (root / parts).resolve()
    if not candidate.is_relative_to(root) or not candidate.is_file():
        raise OutsideDataError(f"no such file under the served folder: {relative!r}")
    return candidate


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a file's bytes: the key a file's cached results are kept under."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
