"""The one folder `explain serve` writes to: cached results, uploads and exports.

Results are JSON files keyed by what produced them (the model, as `model_identity` names
it, the method, the input file's SHA-256 and the class), so a second visit, or a restart
on the same folder, reads them instead of recomputing. Every file is written atomically
(explain.export.atomic_write): a crash leaves complete files or none.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from explain.export import atomic_write

__all__ = ["ResultCache", "default_cache_folder", "model_identity"]


def model_identity(spec: str) -> list[Any]:
    """What names a model's results in the cache: its spec, and for a local folder or
    file also each file's name, size and modification time, so that results computed
    before a checkpoint was overwritten are never reused for the new one."""
    path = Path(spec)
    if not path.exists():
        return [spec]  # a zoo name, a hub id (its revision in the spec) or a timm name
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    identity: list[Any] = [spec]
    for file in files:
        stat = file.stat()
        name = file.relative_to(path).as_posix() if path.is_dir() else file.name
        identity.append([name, stat.st_size, stat.st_mtime_ns])
    return identity


def default_cache_folder() -> Path:
    """$XDG_CACHE_HOME/explain/serve, by default ~/.cache/explain/serve."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "explain" / "serve"


class ResultCache:
    """JSON results under `folder`/results, uploads under `folder`/uploads and exports
    under `folder`/exports (and, from `explain serve`, the caches libraries make on their
    own: `keep_library_caches_inside`); nothing is written anywhere else."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder).resolve()
        self.uploads = self.folder / "uploads"
        self.exports = self.folder / "exports"
        for sub in (self.folder / "results", self.uploads, self.exports):
            sub.mkdir(parents=True, exist_ok=True)

    def keep_library_caches_inside(self) -> None:
        """Point the caches that libraries make on import at this folder, unless the
        user named them: matplotlib's config folder (`folder`/matplotlib; the page's
        colormaps import matplotlib) and PyTorch's inductor cache (`folder`/torchinductor;
        `import timm` makes $TMPDIR/torchinductor_$USER). Call it before the model loads."""
        os.environ.setdefault("MPLCONFIGDIR", str(self.folder / "matplotlib"))
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(self.folder / "torchinductor"))

    @staticmethod
    def key(*parts: object) -> str:
        """A file-name-safe key for the tuple `parts` (e.g. model, method, file hash)."""
        return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:32]

    def _path(self, key: str) -> Path:
        return self.folder / "results" / f"{key}.json"

    def get(self, key: str) -> Any | None:
        """The result stored under `key`, or None (also for an unreadable file)."""
        try:
            return json.loads(self._path(key).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    def put(self, key: str, value: Any) -> None:
        """Store the JSON-able `value` under `key`, atomically."""
        with atomic_write(self._path(key), "w") as handle:
            json.dump(value, handle)
