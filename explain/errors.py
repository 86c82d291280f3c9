"""The one exception family of `explain`: every error says what went wrong and what to do."""

from __future__ import annotations

__all__ = [
    "ExplainError",
    "GatedRepoError",
    "HubUnreachableError",
    "InputError",
    "ModelLoadError",
    "NestedExplanationError",
    "OptionError",
    "RepoNotFoundError",
    "TargetError",
    "UnknownMethodError",
    "UnsupportedModelError",
]


class ExplainError(Exception):
    """Base class of every error `explain` raises on purpose."""


class UnsupportedModelError(ExplainError, TypeError):
    """The model is not of a family `explain` knows how to instrument."""


class ModelLoadError(ExplainError, OSError):
    """A model cannot be loaded: unknown name, missing or corrupted file, no local weights."""


class HubUnreachableError(ModelLoadError):
    """A model must come from the Hugging Face Hub and is not in the local cache, but the
    Hub cannot be reached: offline mode is on, or there is no network."""


class RepoNotFoundError(ModelLoadError):
    """The Hugging Face Hub has no such repository (or revision), or it is private."""


class GatedRepoError(RepoNotFoundError):
    """The repository is gated: its terms must be accepted and an access token given."""


class InputError(ExplainError, ValueError):
    """The inputs cannot be explained as given (shape, size, values, emptiness)."""


class TargetError(ExplainError, ValueError):
    """The requested target class or score is invalid for this model output."""


class UnknownMethodError(ExplainError, KeyError):
    """The method name is not registered.

    Subclasses KeyError for dictionary-like lookups, but prints its message plainly.
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class OptionError(ExplainError, ValueError):
    """A method option (start_layer, head_fusion, ...) has an invalid value."""


class NestedExplanationError(ExplainError, RuntimeError):
    """An explanation started inside another one where it cannot run: on a model the same
    thread is already explaining, or where waiting for its model would deadlock with
    another thread (explain.engine.session)."""
