"""The gallery's first pass: every image of the folder predicted in the background, in
batches, so the page fills as results arrive and shows how far the pass has got.

Images whose results are cached (same model and file hash) are answered from the cache
without running the model. An image that cannot be read is listed with its error, and
the pass goes on. `stop()` ends the pass between batches (Ctrl-C, shutdown).
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from explain.errors import ExplainError
from explain.inputs import read_image
from explain.serve.data import DataSource, file_sha256
from explain.serve.workbench import Workbench

__all__ = ["GalleryPass"]

BATCH = 16
"""Images per batch of the first pass."""


class GalleryPass:
    """Predictions of a folder's images, filled in by a background thread."""

    def __init__(self, workbench: Workbench, data: DataSource) -> None:
        self.workbench = workbench
        self.data = data
        self._entries: dict[str, dict[str, Any]] = {}
        self._hashes: dict[str, str] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="explain-serve-gallery", daemon=True)

    def start(self) -> None:
        """Start the pass (once)."""
        if self.data.kind == "images" and self.workbench.kind in ("image", "clip"):
            self._thread.start()

    def stop(self) -> None:
        """Ask the pass to end after its current batch, and wait for it."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def file_hash(self, path: str) -> str:
        """The SHA-256 of the gallery file `path` (computed once)."""
        with self._lock:
            known = self._hashes.get(path)
        if known is None:
            known = file_sha256(self.data.image_file(path))
            with self._lock:
                self._hashes[path] = known
        return known

    def snapshot(self) -> dict[str, Any]:
        """The gallery so far: every image with its label and, once known, its
        prediction, confidence and whether it is right; and the progress."""
        with self._lock:
            entries = dict(self._entries)
        items = []
        for item in self.data.images:
            entry = {"path": item.path, "label": item.label, **entries.get(item.path, {})}
            prediction = entry.get("prediction")
            if prediction is not None and item.label is not None:
                entry["correct"] = any(c["name"] == item.label for c in prediction["present"])
            items.append(entry)
        done = sum(1 for item in self.data.images if item.path in entries)
        return {
            "items": items,
            "labelled": self.data.labelled,
            "progress": {"done": done, "total": len(self.data.images)},
        }

    def _run(self) -> None:
        images = self.data.images
        for start in range(0, len(images), BATCH):  # batch by batch: the gallery fills
            if self._stop.is_set():
                return
            pending = []
            for item in images[start : start + BATCH]:
                try:
                    file_hash = self.file_hash(item.path)
                except (ExplainError, OSError) as error:
                    self._record(item.path, {"error": str(error)})
                    continue
                cached = self.workbench.cached_prediction(file_hash) if self._predicts else None
                if cached is not None or not self._predicts:
                    self._record(item.path, {"prediction": cached})
                else:
                    pending.append((item.path, file_hash))
            if pending:
                self._predict(pending)

    @property
    def _predicts(self) -> bool:
        """Whether the model has predictions to show (a classifier, not CLIP)."""
        return self.workbench.kind == "image"

    def _predict(self, batch: list[tuple[str, str]]) -> None:
        photos, readable = [], []
        for path, file_hash in batch:
            try:
                photos.append(read_image(self.data.image_file(path)))
                readable.append((path, file_hash))
            except ExplainError as error:
                self._record(path, {"error": str(error)})
        if not readable:
            return
        try:
            predictions = self.workbench.predict_images(photos, [h for _, h in readable])
        except ExplainError as error:
            for path, _ in readable:
                self._record(path, {"error": str(error)})
            return
        except Exception as error:  # the pass must not die silently: say so and go on
            print(f"explain serve: gallery batch failed: {error!r}", file=sys.stderr)
            for path, _ in readable:
                self._record(path, {"error": "internal error (see the server's log)"})
            return
        for (path, _), prediction in zip(readable, predictions, strict=True):
            self._record(path, {"prediction": prediction})

    def _record(self, path: str, entry: dict[str, Any]) -> None:
        with self._lock:
            self._entries[path] = entry
