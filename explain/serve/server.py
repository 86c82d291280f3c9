"""Running the app: in the foreground for `explain serve` (Ctrl-C stops it cleanly), or
in a background thread for notebooks and tests (`BackgroundServer`).

The socket is bound before the server starts, so the address printed is the one the
server listens on, also when port 0 asked for any free port.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

__all__ = ["BackgroundServer", "address", "bind", "run"]


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on (host, port); port 0 picks a free one."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def address(sock: socket.socket) -> str:
    """The http:// address a bound socket serves."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


def _server(app: Any, *, quiet: bool) -> Any:
    import uvicorn

    config = uvicorn.Config(
        app,
        log_level="warning" if quiet else "info",
        access_log=not quiet,
        lifespan="on",
        timeout_graceful_shutdown=5,
    )
    return uvicorn.Server(config)


def run(app: Any, sock: socket.socket, *, quiet: bool = False) -> None:
    """Serve `app` on `sock` until Ctrl-C (or SIGTERM), then shut down cleanly."""
    _server(app, quiet=quiet).run(sockets=[sock])


class BackgroundServer:
    """`app` served from a daemon thread on 127.0.0.1 (a free port by default).

    >>> with BackgroundServer(app) as server:   # doctest: +SKIP
    ...     print(server.url)
    """

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0) -> None:
        self._socket = bind(host, port)
        self.url = address(self._socket)
        self._server = _server(app, quiet=True)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, daemon=True
        )

    def __enter__(self) -> BackgroundServer:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the server and wait for it (the app's shutdown runs)."""
        self._server.should_exit = True
        self._thread.join(timeout=30)
        self._socket.close()
