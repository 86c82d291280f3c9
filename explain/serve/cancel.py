"""Stopping the work of a request whose client has gone.

The views' work runs in a worker thread (Starlette's thread pool), one explanation per
method; requests on one model take turns in the engine's session. A client that gives
up (the page cancels a view the user has left) used to leave its request computing every
method to the end, and queued requests after it: minutes of work nobody would receive.
`run_until_disconnected` runs the work while it listens for the client's disconnect and,
when it comes, flags the request; the workbench checks the flag before each piece of work
(`stop_if_cancelled`: the first pass, each method's maps, an export, a generation), so a
cancelled request stops at the next piece instead of the last.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, TypeVar

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

__all__ = ["Cancelled", "run_until_disconnected", "stop_if_cancelled"]

T = TypeVar("T")

_CANCELLED: ContextVar[threading.Event | None] = ContextVar("explain_serve_cancelled", default=None)
"""The running request's flag; the worker thread sees it through the context it is given."""


class Cancelled(Exception):  # not an ExplainError: the client asked for nothing more
    """The request's client went away; its work stopped at a check."""


def stop_if_cancelled() -> None:
    """Raise Cancelled where the running request's client has gone (nothing outside one)."""
    flag = _CANCELLED.get()
    if flag is not None and flag.is_set():
        raise Cancelled


async def _disconnected(request: Request) -> None:
    """Returns when the client disconnects (the request's body has been read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def run_until_disconnected(request: Request, work: Callable[..., T], *args: Any) -> T:
    """`work(*args)` in a worker thread; Cancelled at its next check once the client of
    `request` disconnects."""
    flag = threading.Event()
    token = _CANCELLED.set(flag)
    try:  # a task runs in a copy of the context it was made in, the flag included
        running = asyncio.ensure_future(run_in_threadpool(work, *args))
    finally:
        _CANCELLED.reset(token)
    listening = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({running, listening}, return_when=asyncio.FIRST_COMPLETED)
        if not running.done():
            flag.set()
        return await running
    finally:
        listening.cancel()
