"""Checking an uploaded image before anything decodes it in full.

An upload is refused with a message when it is too large, is not one of the image
formats the server reads, or declares more pixels than `MAX_PIXELS` (a decompression
bomb: a few kilobytes of PNG can declare gigapixels). The header is read first, the
pixels only once the size is known to be safe.
"""

from __future__ import annotations

import io
import warnings
from typing import Any

from explain.errors import InputError

__all__ = ["FORMATS", "MAX_BYTES", "MAX_PIXELS", "UploadError", "read_upload"]

MAX_BYTES = 20 * 1024 * 1024
"""The largest upload accepted, in bytes."""
MAX_PIXELS = 40_000_000
"""The most pixels an uploaded image may declare (a 40-megapixel photo)."""
FORMATS = ("PNG", "JPEG", "GIF", "BMP", "WEBP", "TIFF")
"""Pillow format names accepted."""


class UploadError(InputError):
    """An upload is refused; `status` is the HTTP status that says why."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def read_upload(data: bytes) -> Any:
    """The uploaded bytes as a fully decoded RGB PIL image, or UploadError."""
    from PIL import Image, UnidentifiedImageError

    if not data:
        raise UploadError("the upload is empty", 400)
    if len(data) > MAX_BYTES:
        raise UploadError(
            f"the upload is {len(data) / 2**20:.1f} MiB; at most {MAX_BYTES // 2**20} MiB", 413
        )
    try:
        # Opening reads the header only: the size is known before any pixel is decoded.
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=FORMATS)
            width, height = image.size
            if width * height > MAX_PIXELS:
                raise UploadError(
                    f"the image declares {width} x {height} pixels: too many pixels (at most "
                    f"{MAX_PIXELS:,})",
                    413,
                )
            image.load()
            return image.convert("RGB")
    except UploadError:
        raise
    except UnidentifiedImageError:
        raise UploadError(
            f"the upload is not an image in a format the server reads ({', '.join(FORMATS)})",
            415,
        ) from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise UploadError(
            "the image declares too many pixels (a decompression bomb)", 413
        ) from None
    except (OSError, ValueError, SyntaxError) as error:
        raise UploadError(f"the image cannot be decoded: {error}", 400) from None
