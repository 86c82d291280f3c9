"""`explain serve`: look around a model's explanations in the browser (explain.serve).

DATA is a folder of images (images in class subfolders are labelled with the
subfolder's name), a text file of sentences (one per line), or nothing (uploads and typed
text only). The server binds to 127.0.0.1 unless --host says otherwise, works without a
network, writes only under its cache folder (printed at start), and stops on Ctrl-C.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from explain.cli.options import add_model_arguments, load
from explain.errors import ExplainError, OptionError

__all__ = ["listen_on", "register"]

LOOPBACK = "127.0.0.1"


def listen_on(host: str | None) -> tuple[str, str | None]:
    """The address to listen on (`host`, by default the loopback address) and the warning
    to print when it is reachable from other machines."""
    if host is None or host in ("127.0.0.1", "localhost", "::1"):
        return host or LOOPBACK, None
    return host, (
        f"listening on {host}: anyone who can reach this machine on that address can use "
        "the model and read the files under DATA"
    )


def run(args: argparse.Namespace) -> int:
    try:
        from explain.serve import ResultCache, Workbench, build_app, default_cache_folder, read_data
        from explain.serve.app import allowed_hosts_for
        from explain.serve.server import address, bind
        from explain.serve.server import run as serve_forever
    except ImportError as error:
        raise ExplainError(
            f"explain serve needs the `serve` extra ({error.name} is missing): "
            "pip install 'explain-transformers[serve]'"
        ) from None
    data = read_data(args.data)
    cache = ResultCache(args.cache or default_cache_folder())
    cache.keep_library_caches_inside()  # nothing is written outside the folder printed below
    loaded = load(args)
    workbench = Workbench(loaded, cache, args.model)
    if workbench.kind in ("text", "generation") and data.kind == "images":
        raise ExplainError(
            f"{args.model} ({workbench.kind} model) reads text: give it a text file of "
            "sentences, not a folder of images"
        )
    if workbench.kind in ("image", "clip") and data.kind == "texts":
        raise ExplainError(
            f"{args.model} ({workbench.kind} model) explains images: give it a folder of "
            "images, not a text file"
        )
    host, warning = listen_on(args.host)
    if warning:
        print(f"explain serve: warning: {warning}", file=sys.stderr)
    try:
        sock = bind(host, args.port)
    except OSError as error:
        raise OptionError(f"cannot listen on {host}:{args.port}: {error.strerror}") from None
    app = build_app(workbench, data, allowed_hosts=allowed_hosts_for(host))
    print(f"explain serve: {args.model} ({workbench.kind}) on {address(sock)}", flush=True)
    print(f"explain serve: cache folder {cache.folder}", flush=True)
    print("explain serve: press Ctrl-C to stop", flush=True)
    try:
        serve_forever(app, sock, quiet=not args.verbose)
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
    print("explain serve: stopped", file=sys.stderr)
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "serve",
        help="a local web app to explore explanations in the browser",
        description=__doc__,
        epilog="Example (after `make demo`): explain serve outputs/demo/scenes "
        "--model zoo:shapes-vit, then open the address it prints.",
    )
    parser.add_argument(
        "data",
        nargs="?",
        type=Path,
        metavar="DATA",
        help="a folder of images (class subfolders are labels), or a text file of sentences",
    )
    add_model_arguments(
        parser,
        takes="the model to explain (image, text, CLIP or language model)",
        timm=True,
        examples="zoo:shapes-vit, zoo:minilm-sentiment, zoo:shapes-clip, ./my-model",
    )
    parser.add_argument(
        "--host",
        help=f"address to listen on; default: {LOOPBACK} (this machine only). Another "
        "address makes the server reachable from the network (a warning is printed)",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=8000,
        help="port to listen on (0: any free port); default: %(default)s",
    )
    parser.add_argument(
        "--cache",
        type=Path,
        metavar="DIR",
        help="the one folder the server writes to (cached results, uploads, exports); "
        "default: $XDG_CACHE_HOME/explain/serve (~/.cache/explain/serve)",
    )
    parser.add_argument("--verbose", action="store_true", help="log every request")
    parser.set_defaults(run=run)
