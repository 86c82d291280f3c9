"""The web app of `explain serve`: a Starlette application over one Workbench.

Routes (JSON unless said otherwise):

    GET  /                        the page (explain/serve/static, shipped in the package)
    GET  /static/NAME             its script and style sheet
    GET  /api/info                the model: kind, classes, methods, normalisation rules
    GET  /api/gallery             the folder's images with their predictions so far
    GET  /api/sentences           the sentences of a text file
    GET  /api/view?item=ITEM      PNG: the image as the model sees it (&background=grey:
                                  in grey, as the maps are drawn over it)
    GET  /api/file?path=PATH      an image of the gallery, as it is
    POST /api/upload              an image as the request body -> its ITEM (upload/SHA)
    POST /api/explain/image       {item, methods, classes|top, rule}
    POST /api/explain/text        {text, methods, classes|top, rule}
    POST /api/explain/clip        {item, captions, method}
    POST /api/explain/generation  {prompt, max_new_tokens, method}
    POST /api/export              {format: npz|json, method, classes, item|text} or
                                  {format, method, item, captions} (CLIP) -> a file

Security: the only files read are the gallery's images under DATA (DataSource.image_file)
and uploads in the cache folder the server names at start; uploads are checked before
decoding (explain.serve.uploads); POSTs must be JSON or carry the upload header, so
another web site cannot post to the server through the browser (both need a CORS
preflight, which is never granted); the Host header must name a loopback address
(127.0.0.1, localhost, [::1]) unless the server was started on another host (no DNS
rebinding). Errors are JSON `{"error": message}` with a 4xx status, the refusal of a
Host header too; an unexpected failure is a 500 with a one-line message, its traceback
only in the server's log. A client that goes away mid-request is one line in the log,
and an explanation's work stops at its next piece (explain.serve.cancel).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import sys
from collections.abc import AsyncIterator
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from explain.errors import ExplainError, InputError
from explain.export import atomic_write
from explain.inputs import read_image
from explain.serve.cancel import Cancelled, run_until_disconnected
from explain.serve.data import DataSource, OutsideDataError
from explain.serve.gallery import GalleryPass
from explain.serve.uploads import MAX_BYTES, UploadError, read_upload
from explain.serve.workbench import Workbench

__all__ = ["LOOPBACK_HOSTS", "UPLOAD_HEADER", "allowed_hosts_for", "build_app"]

UPLOAD_HEADER = "X-Explain-Upload"
"""The header an upload must carry (a custom header: cross-site posts need a preflight)."""
MAX_JSON_BYTES = 1 << 20
"""The largest JSON request body accepted."""
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
"""The names of this machine that only this machine reaches: a server listening on one
of them accepts only these in the Host header."""
_UPLOAD_ITEM = re.compile(r"upload/([0-9a-f]{64})")
_STATIC_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css"}
_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data: blob:; style-src 'self'; "
        "connect-src 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def allowed_hosts_for(listening_on: str) -> list[str] | None:
    """The `allowed_hosts` of `build_app` for a server listening on `listening_on`: the
    loopback names (None) for a loopback address, else any (["*"]): the user's own
    names for a machine reachable from the network must work."""
    return None if listening_on in LOOPBACK_HOSTS else ["*"]


def build_app(
    workbench: Workbench, data: DataSource, *, allowed_hosts: list[str] | None = None
) -> Starlette:
    """The app serving `workbench` over `data`. `allowed_hosts`: the host names accepted
    in the Host header, IPv6 addresses without brackets (default: LOOPBACK_HOSTS); ["*"]
    for a server on another host. The gallery's background pass starts with the app and
    stops with it."""
    gallery = GalleryPass(workbench, data)
    static = _static_files()
    handlers = _Handlers(workbench, data, gallery)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        gallery.start()
        try:
            yield
        finally:
            gallery.stop()

    routes = [
        Route("/", lambda request: _static(static, "index.html")),
        Route("/static/{name}", lambda request: _static(static, request.path_params["name"])),
        Route("/api/info", handlers.info),
        Route("/api/gallery", handlers.gallery),
        Route("/api/sentences", handlers.sentences),
        Route("/api/view", handlers.view),
        Route("/api/file", handlers.file),
        Route("/api/upload", handlers.upload, methods=["POST"]),
        Route("/api/explain/image", handlers.explain_image, methods=["POST"]),
        Route("/api/explain/text", handlers.explain_text, methods=["POST"]),
        Route("/api/explain/clip", handlers.explain_clip, methods=["POST"]),
        Route("/api/explain/generation", handlers.explain_generation, methods=["POST"]),
        Route("/api/export", handlers.export, methods=["POST"]),
    ]
    hosts = allowed_hosts or list(LOOPBACK_HOSTS)
    return Starlette(
        routes=routes,
        middleware=[] if "*" in hosts else [Middleware(_HostCheck, hosts=hosts)],
        exception_handlers={
            ExplainError: _explain_error,
            HTTPException: _http_error,
            ClientDisconnect: _client_gone,
            Cancelled: _client_gone,
            Exception: _internal_error,
        },
        lifespan=lifespan,
    )


class _HostCheck:
    """Refuses a request whose Host header names no host of `hosts` (DNS rebinding: a
    web site's own name pointed at 127.0.0.1), with the JSON error every refusal uses."""

    def __init__(self, app: ASGIApp, hosts: list[str]) -> None:
        self.app = app
        self.hosts = frozenset(host.lower() for host in hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            header = Headers(scope=scope).get("host", "")
            if _host_name(header) not in self.hosts:
                if scope["type"] == "websocket":  # closed before it opens: a 403
                    await send({"type": "websocket.close", "code": 1008})
                    return
                message = f"this server does not answer to the host {header!r}"
                await _json({"error": message}, 400)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _host_name(header: str) -> str | None:
    """The host a Host header names, lower case, an IPv6 address without its brackets
    ("[::1]:8000" -> "::1"); None for anything but host[:port]."""
    try:
        parts = urlsplit(f"//{header}")
        parts.port  # noqa: B018  (reading it checks it: a port that is no number raises)
    except ValueError:
        return None
    if parts.username is not None or parts.path or parts.query or parts.fragment:
        return None
    return parts.hostname


def _static_files() -> dict[str, Path]:
    """The page's files by name: exactly what ships in explain/serve/static."""
    folder = resources.files("explain.serve") / "static"
    return {
        entry.name: Path(str(entry))
        for entry in folder.iterdir()
        if entry.is_file() and Path(entry.name).suffix in _STATIC_TYPES
    }


def _static(files: dict[str, Path], name: str) -> Response:
    path = files.get(name)
    if path is None:
        raise HTTPException(404, f"no such page file: {name}")
    return FileResponse(path, media_type=_STATIC_TYPES[path.suffix], headers=_HEADERS)


def _json(payload: Any, status: int = 200) -> JSONResponse:
    return JSONResponse(payload, status_code=status, headers=_HEADERS)


async def _explain_error(request: Request, error: Exception) -> Response:
    status = getattr(error, "status", 404 if isinstance(error, OutsideDataError) else 400)
    return _json({"error": str(error)}, status)


async def _http_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, HTTPException)
    return _json({"error": error.detail}, error.status_code)


async def _client_gone(request: Request, error: Exception) -> Response:
    """A client that closed its connection mid-request (a cancelled upload, or a view
    whose work stopped at its next piece: explain.serve.cancel): one line in the log,
    and an answer nobody receives."""
    print(
        f"explain serve: {request.method} {request.url.path}: the client closed the "
        "connection before the request was complete",
        file=sys.stderr,
    )
    return Response(status_code=400)


async def _internal_error(request: Request, error: Exception) -> Response:
    print(f"explain serve: {request.method} {request.url.path} failed: {error!r}", file=sys.stderr)
    return _json({"error": f"internal error ({type(error).__name__}); see the server's log"}, 500)


async def _body(request: Request) -> dict[str, Any]:
    """The request's JSON object, or a 4xx that says what is wrong with it."""
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
        raise HTTPException(415, "send the request as JSON (Content-Type: application/json)")
    raw = await _read(request, MAX_JSON_BYTES)
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as error:
        raise HTTPException(400, f"the request is not valid JSON: {error}") from None
    except RecursionError:
        raise HTTPException(400, "the request's JSON is nested too deeply") from None
    if not isinstance(body, dict):
        raise HTTPException(400, "the request must be a JSON object")
    return body


async def _read(request: Request, limit: int) -> bytes:
    """The request body, refused with 413 as soon as it passes `limit` bytes."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise HTTPException(413, f"the request is larger than {limit // 2**20} MiB")
        chunks.append(chunk)
    return b"".join(chunks)


def _field(body: dict[str, Any], name: str, kind: type | tuple[type, ...], default: Any = ...):
    """`body[name]`, checked to be of `kind` (a 400 naming the field otherwise)."""
    if name not in body or body[name] is None:
        if default is ...:
            raise HTTPException(400, f"the request needs {name!r}")
        return default
    value = body[name]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise HTTPException(400, f"{name!r} has the wrong type ({type(value).__name__})")
    return value


def _strings(body: dict[str, Any], name: str, default: Any = ...) -> list[str]:
    values = _field(body, name, list, default)
    if not all(isinstance(v, str) for v in values):
        raise HTTPException(400, f"{name!r} must be a list of strings")
    return values


def _ints(body: dict[str, Any], name: str) -> list[int] | None:
    values = _field(body, name, list, None)
    if values is not None and not all(
        isinstance(v, int) and not isinstance(v, bool) for v in values
    ):
        raise HTTPException(400, f"{name!r} must be a list of class indices")
    return values


def _explain_options(
    body: dict[str, Any], default: str
) -> tuple[list[str], list[int] | None, int, str]:
    """The options an image or text explanation request shares: the methods (none named:
    the model's `default`), the classes (None: the top predicted ones), how many top
    classes, and the scale rule."""
    methods = _strings(body, "methods", [default])
    classes = _ints(body, "classes")
    top = body.get("top")
    if top is None:
        top = 1
    elif isinstance(top, bool) or not isinstance(top, int) or top < 1:
        # the workbench bounds it by the model's classes; a 0 read as "the top one" or a
        # 1.5 read as 1 would show another view than the one asked for
        raise HTTPException(400, f"top must be a whole number of classes, 1 or more; got {top!r}")
    rule = _field(body, "rule", str, "per_map")
    return methods, classes, top, rule


class _Handlers:
    """The route handlers, sharing the workbench, the data and the gallery."""

    def __init__(self, workbench: Workbench, data: DataSource, gallery: GalleryPass) -> None:
        self.workbench = workbench
        self.data = data
        self.first_pass = gallery

    async def info(self, request: Request) -> Response:
        return _json({**self.workbench.info(), "data": self.data.kind})

    async def gallery(self, request: Request) -> Response:
        return _json(self.first_pass.snapshot())

    async def sentences(self, request: Request) -> Response:
        return _json({"sentences": list(self.data.sentences)})

    def _photo(self, item: str) -> tuple[Any, str]:
        """The image ITEM names (a gallery path or upload/SHA) and its content hash."""
        upload = _UPLOAD_ITEM.fullmatch(item)
        if upload:
            path = self.workbench.cache.uploads / f"{upload.group(1)}.png"
            if not path.is_file():
                raise OutsideDataError(f"no such upload: {item}")
            return read_image(path), upload.group(1)
        path = self.data.image_file(item)
        return read_image(path), self.first_pass.file_hash(item)

    async def view(self, request: Request) -> Response:
        item = request.query_params.get("item", "")
        background = request.query_params.get("background", "colour")
        png = await run_in_threadpool(
            lambda: self.workbench.view_png(self._photo(item)[0], background)
        )
        return Response(png, media_type="image/png", headers=_HEADERS)

    async def file(self, request: Request) -> Response:
        path = self.data.image_file(request.query_params.get("path", ""))
        return FileResponse(path, headers=_HEADERS)

    async def upload(self, request: Request) -> Response:
        if request.headers.get(UPLOAD_HEADER) != "1":
            raise HTTPException(400, f"an upload carries the header {UPLOAD_HEADER}: 1")
        try:
            data = await _read(request, MAX_BYTES)
        except HTTPException as error:
            raise UploadError(f"the upload is larger than {MAX_BYTES // 2**20} MiB", 413) from error
        return _json(await run_in_threadpool(self._store_upload, data))

    def _store_upload(self, data: bytes) -> dict[str, Any]:
        import io

        if self.workbench.kind not in ("image", "clip"):
            raise InputError(f"{self.workbench.spec} takes no images")
        photo = read_upload(data)
        buffer = io.BytesIO()
        photo.save(buffer, format="PNG")  # stored re-encoded: only decoded pixels are kept
        png = buffer.getvalue()
        sha = hashlib.sha256(png).hexdigest()
        path = self.workbench.cache.uploads / f"{sha}.png"
        if not path.exists():
            with atomic_write(path) as handle:
                handle.write(png)
        prediction = None
        if self.workbench.kind == "image":
            prediction = self.workbench.cached_prediction(sha)
            if prediction is None:
                (prediction,) = self.workbench.predict_images([photo], [sha])
        return {"item": f"upload/{sha}", "prediction": prediction}

    async def explain_image(self, request: Request) -> Response:
        body = await _body(request)
        item = _field(body, "item", str)
        methods, classes, top, rule = _explain_options(body, self.workbench.default.method)

        def answer() -> dict[str, Any]:
            photo, file_hash = self._photo(item)
            return self.workbench.explain_image(photo, file_hash, methods, classes, top, rule)

        return _json(await run_until_disconnected(request, answer))

    async def explain_text(self, request: Request) -> Response:
        body = await _body(request)
        text = _field(body, "text", str)
        methods, classes, top, rule = _explain_options(body, self.workbench.default.method)
        return _json(
            await run_until_disconnected(
                request, self.workbench.explain_text, text, methods, classes, top, rule
            )
        )

    async def explain_clip(self, request: Request) -> Response:
        body = await _body(request)
        item = _field(body, "item", str)
        captions = _strings(body, "captions")
        method = _field(body, "method", str, self.workbench.default.method)

        def answer() -> dict[str, Any]:
            return self.workbench.explain_clip(self._photo(item)[0], captions, method)

        return _json(await run_until_disconnected(request, answer))

    async def explain_generation(self, request: Request) -> Response:
        body = await _body(request)
        prompt = _field(body, "prompt", str)
        max_new_tokens = _field(body, "max_new_tokens", int, 8)
        method = _field(body, "method", str, self.workbench.default.method)
        return _json(
            await run_until_disconnected(
                request, self.workbench.explain_generation, prompt, max_new_tokens, method
            )
        )

    async def export(self, request: Request) -> Response:
        body = await _body(request)
        fmt = _field(body, "format", str)
        if fmt not in ("npz", "json"):
            raise HTTPException(400, f"format must be npz or json, got {fmt!r}")
        method = _field(body, "method", str, self.workbench.default.method)
        classes = _ints(body, "classes") or []
        if "item" in body and "captions" in body:  # CLIP: the image against every caption
            item = _field(body, "item", str)
            captions = _strings(body, "captions")

            def inputs() -> Any:
                return self.workbench.clip_inputs(self._photo(item)[0], captions)

            classes = list(range(len(captions)))
            settings = {"input": item, "captions": captions}
        elif "item" in body:
            item = _field(body, "item", str)

            def inputs() -> Any:
                return self.workbench.model_input([self._photo(item)[0]])

            settings = {"input": item}
        elif "text" in body:
            text = self.workbench.checked_text(_field(body, "text", str))  # the views' limits

            def inputs() -> Any:
                return [text]

            settings = {"input": text}
        else:
            raise InputError("an export names the `item` (image) or the `text` it explains")
        path = await run_until_disconnected(
            request, self.workbench.export, inputs, method, classes, f".{fmt}", settings
        )
        stem = Path(settings["input"]).stem if "item" in body else "text"
        return FileResponse(path, filename=f"{stem}_{method}.{fmt}", headers=_HEADERS)
