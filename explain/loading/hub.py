"""The Hugging Face Hub as `load_model` uses it: repo ids, offline mode, and errors that say
what happened.

Every download goes through huggingface_hub (directly, or inside timm's and transformers'
own loaders) and so through its cache: what a first run downloads, a second run finds
there, with or without network. `offline` (the CLI's `--offline`, or the environment's
HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE) makes the libraries use the cache only.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import urllib.parse
from collections.abc import Iterator
from typing import Any

from explain.errors import GatedRepoError, HubUnreachableError, ModelLoadError, RepoNotFoundError

__all__ = [
    "HUB_PREFIX",
    "env_offline",
    "fetch_config",
    "hub_errors",
    "hub_reachable",
    "hub_session",
    "is_repo_id",
    "quiet_transformers",
    "split_revision",
]

HUB_PREFIX = "hf-hub:"
"""timm's prefix for a model published on the Hub with its timm config (`hf-hub:org/name`)."""

_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./-]+)?")
_BARE_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*(@[\w./-]+)?")
_TRUE = {"1", "on", "yes", "true"}


def is_repo_id(text: str, *, bare: bool = False) -> bool:
    """Whether `text` reads as a Hub repo id `org/name`, optionally `@revision`; with
    `bare`, as an id without an organisation (`gpt2`, `bert-base-uncased`), the names the
    Hub still serves its oldest models under."""
    return (_BARE_REPO_ID if bare else _REPO_ID).fullmatch(text) is not None


def split_revision(repo: str) -> tuple[str, str | None]:
    """`org/name@revision` -> ("org/name", "revision"); no `@`: revision None (main)."""
    name, _, revision = repo.partition("@")
    return name, revision or None


def env_offline() -> bool:
    """Whether the environment asks for offline mode (HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE),
    read now rather than when huggingface_hub was imported."""
    return any(
        os.environ.get(name, "").strip().lower() in _TRUE
        for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


@contextlib.contextmanager
def hub_session(offline: bool) -> Iterator[None]:
    """Within the block, huggingface_hub (and so timm and transformers, which ask it) works
    from the cache only when `offline`; its setting is restored afterwards.

    timm's loaders take no `local_files_only`, so the one switch they all read is set.
    """
    from huggingface_hub import constants

    before = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = before or offline
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = before


def _cache() -> str:
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


_PROXIES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
PROBE_SECONDS = 3.0
"""How long `hub_reachable` waits for the Hub to answer a connection."""


def hub_reachable(timeout: float = PROBE_SECONDS) -> bool:
    """Whether a connection to the Hub's endpoint opens within `timeout` seconds (its name
    resolved and a TCP handshake made). Without network this fails at once, where the hub
    client retries for about 25 s before it gives up. True when a proxy is configured: the
    client goes through it, so a direct connection would say nothing."""
    from huggingface_hub import constants

    if any(os.environ.get(name) for name in _PROXIES):
        return True
    endpoint = urllib.parse.urlsplit(constants.ENDPOINT)
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        with socket.create_connection((endpoint.hostname, port), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


@contextlib.contextmanager
def hub_errors(spec: str, repo: str, offline: bool) -> Iterator[None]:
    """Turn the hub client's errors inside the block into ModelLoadErrors that say which
    thing happened (no network, offline, no such repo, gated repo) and what to do.

    When not `offline` and the Hub cannot be reached (`hub_reachable`), the block runs
    from the cache only: what is cached loads at once, and what is not fails at once
    with the no-network error instead of after the client's retries."""
    from huggingface_hub import constants, errors

    name, revision = split_revision(repo)
    before = constants.HF_HUB_OFFLINE
    if not (before or offline) and not hub_reachable():
        constants.HF_HUB_OFFLINE = True
    try:
        yield
    except errors.HFValidationError as error:
        raise ModelLoadError(f"{spec!r:.100} is no Hub repo id: {error}") from None
    except errors.GatedRepoError:
        raise GatedRepoError(
            f"{name} is a gated repository: accept its terms at https://huggingface.co/{name} "
            "while logged in, then give your access token: run `hf auth login`, or set "
            "HF_TOKEN=hf_... in the environment"
        ) from None
    except errors.RepositoryNotFoundError:
        raise RepoNotFoundError(
            f"the Hugging Face Hub has no model {name} (check the spelling on "
            "https://huggingface.co/models; a private repository needs your token: "
            "`hf auth login` or HF_TOKEN)"
        ) from None
    except errors.RevisionNotFoundError:
        raise RepoNotFoundError(f"{name} has no revision {revision!r} on the Hub") from None
    except (errors.LocalEntryNotFoundError, errors.OfflineModeIsEnabled) as error:
        if offline:
            raise HubUnreachableError(
                f"{spec} is not in the Hugging Face cache ({_cache()}) and offline mode is on "
                "(--offline, offline=True, HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE): run once "
                "without it where there is network, or point HF_HUB_CACHE (or HF_HOME) at a "
                "cache that holds it"
            ) from None
        raise HubUnreachableError(
            f"cannot reach the Hugging Face Hub to download {spec} (no network?), and it is "
            f"not in the cache ({_cache()}); connect once, or copy a cache that holds it and "
            f"point HF_HUB_CACHE at it ({type(error).__name__})"
        ) from None
    except errors.EntryNotFoundError as error:
        raise ModelLoadError(f"{name} lacks a file its model needs: {error}") from None
    finally:
        constants.HF_HUB_OFFLINE = before


def fetch_config(repo: str) -> dict[str, Any]:
    """The `config.json` of Hub repo `org/name[@revision]`, downloaded into (or found in)
    the cache; call inside `hub_session` and `hub_errors`."""
    import huggingface_hub

    name, revision = split_revision(repo)
    path = huggingface_hub.hf_hub_download(name, "config.json", revision=revision)
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ModelLoadError(f"cannot read the config.json of {repo}: {error}") from None


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Turn off transformers' own progress bars ("Loading weights", "Writing model shards")
    inside the block and restore the setting after it: for a model of a few megabytes they
    are noise on every run. Nothing happens where transformers is not installed."""
    try:
        from transformers.utils import logging
    except ImportError:  # an install for timm models only
        yield
        return
    enabled = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            logging.enable_progress_bar()
