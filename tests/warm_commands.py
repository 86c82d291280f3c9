"""`explain` and `python -c` for the docs' shell blocks, each a process forked from one
warm interpreter instead of a cold start.

A cold `explain` process spends most of its time importing: torch, then transformers or
timm (both import torchvision, which imports torch._dynamo) and matplotlib, 6 to 9 of a
docs command's 8 to 10 CPU seconds. `WarmCommands` starts one interpreter that has
imported them (and `explain.cli`) and listens on a Unix socket; the `explain` and
`python` it puts on PATH are small clients that send it their arguments, folder,
environment and standard streams. For each it forks a process that takes them and runs
the command as `python -m explain.cli` or `python -c` would, exits with its status (and
its own atexit handlers), and the client exits with that status. Each command is a
process of its own, forked from the same clean state, so nothing one command does
reaches the next. Where a command's environment differs from the warm interpreter's (a
block that sets a variable for one command: libraries read some at import), or for any
other use of `python`, the client runs the real interpreter instead.

What this does not test, a cold start's own imports, `test_imports.py`,
`test_quiet_imports.py` and `test_packaging.py` test in fresh interpreters.

Run as a script: `warm_commands.py serve SOCKET` (the warm interpreter) or
`warm_commands.py explain|python SOCKET ARGS...` (a client; stdlib only, so it starts in
milliseconds).
"""

from __future__ import annotations

import atexit
import gc
import json
import os
import select
import socket
import struct
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

_HEADER = struct.Struct("!Q")
_FROM_THE_SHELL = ("PWD", "OLDPWD", "SHLVL", "_")
"""Variables bash sets for every command: no library reads them."""


def _but_the_shells(environment: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in environment.items() if k not in _FROM_THE_SHELL}


def _send(connection: socket.socket, message: dict, fds: Sequence[int] = ()) -> None:
    data = json.dumps(message).encode()
    socket.send_fds(connection, [_HEADER.pack(len(data))], list(fds))
    connection.sendall(data)


def _receive(connection: socket.socket, fd_count: int = 0) -> tuple[dict, list[int]]:
    header, fds, _, _ = socket.recv_fds(connection, _HEADER.size, fd_count)
    (size,) = _HEADER.unpack(header)
    data = b""
    while len(data) < size:
        chunk = connection.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the warm interpreter closed the connection")
        data += chunk
    return json.loads(data), fds


# --- the warm interpreter --------------------------------------------------------------


def _serve(path: str) -> tuple[dict, list[int]]:
    """Import what the docs' commands use, then fork a process per request. Returns in
    the forked process only, with the request it is to run."""
    started_with = _but_the_shells(dict(os.environ))  # before any library adds to it
    import importlib

    importlib.import_module("explain.cli")  # first, as in a command: it quiets torchao's notes
    import matplotlib.backends.backend_agg  # noqa: F401  (every figure)
    import timm.models.vision_transformer  # noqa: F401  (the zoo's image models)

    # transformers imports a class's module at its first use: these are the docs' models'.
    from transformers import (  # noqa: F401
        AutoProcessor,
        BertForSequenceClassification,
        LlamaForCausalLM,
        LlavaForConditionalGeneration,
        PreTrainedTokenizerFast,
    )

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen()
    gc.freeze()  # the collector leaves the imports' objects alone: their pages stay shared
    print("ready", flush=True)
    while True:
        # Its stdin is a pipe from the tests: at its end (they are gone) it stops too.
        if sys.stdin in select.select([listener, sys.stdin], [], [])[0]:
            raise SystemExit(0)
        connection, _ = listener.accept()
        request, fds = _receive(connection, 3)
        if _but_the_shells(request["env"]) != started_with:
            _send(connection, {"cold": True})
        elif os.fork() == 0:  # a waiter, which forks the command and reports its status
            listener.close()
            command = os.fork()
            if command == 0:
                connection.close()
                return request, fds
            for fd in fds:  # the command's streams close when the command ends
                os.close(fd)
            _, status = os.waitpid(command, 0)
            _send(connection, {"status": os.waitstatus_to_exitcode(status)})
            os._exit(0)
        for fd in fds:
            os.close(fd)
        connection.close()
        while True:  # reap the waiters that are done
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break


def _run(request: dict, fds: list[int]) -> None:
    """Become the command's process: its folder, streams and arguments, then run it."""
    import io
    import runpy
    import types

    os.chdir(request["cwd"])
    for name in _FROM_THE_SHELL:
        if name in request["env"]:
            os.environ[name] = request["env"][name]
        else:
            os.environ.pop(name, None)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(
        io.FileIO(1, "w", closefd=False), line_buffering=os.isatty(1)
    )
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False), errors="backslashreplace", line_buffering=True
    )
    if request["program"] == "explain":  # as `python -m explain.cli ARGS`
        sys.argv = ["explain", *request["args"]]
        sys.path[0] = os.getcwd()
        runpy.run_module("explain.cli", run_name="__main__", alter_sys=True)
    else:  # as `python -c CODE ARGS`
        code, *rest = request["args"][1:]
        sys.argv = ["-c", *rest]
        sys.path[0] = ""
        sys.modules["__main__"] = main = types.ModuleType("__main__")
        exec(compile(code, "<string>", "exec"), main.__dict__)


# --- the clients -----------------------------------------------------------------------


def _client(program: str, path: str, args: list[str]) -> int:
    """Have the warm interpreter run `program ARGS` here; the real one where it cannot."""
    if program == "explain":
        cold = [sys.executable, "-m", "explain.cli", *args]
    else:
        cold = [sys.executable, *args]
    if program == "python" and (len(args) < 2 or args[0] != "-c"):
        os.execv(sys.executable, cold)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.connect(path)
        request = {"program": program, "args": args, "cwd": os.getcwd(), "env": dict(os.environ)}
        _send(connection, request, [0, 1, 2])
        answer, _ = _receive(connection)
    if answer.get("cold"):
        os.execv(sys.executable, cold)
    status = answer["status"]
    return 128 - status if status < 0 else status  # killed by a signal: as a shell says


class WarmCommands:
    """The warm interpreter and a `bin` folder with its `explain` and `python` clients."""

    def __init__(self, folder: Path, environment: dict[str, str]) -> None:
        self.bin = folder / "bin"
        self.bin.mkdir()
        self.environment = {**environment, "PATH": f"{self.bin}{os.pathsep}{environment['PATH']}"}
        socket_path = folder / "warm.sock"
        script = Path(__file__).resolve()
        for program in ("explain", "python"):
            client = self.bin / program
            # -I -S: the client needs the standard library only (and no PYTHONPATH).
            client.write_text(
                f'#!/bin/sh\nexec {sys.executable} -I -S {script} {program} {socket_path} "$@"\n'
            )
            client.chmod(0o755)
        # Started through `python -c`, so that its sys.path is a `python -c`'s (not this
        # folder's, which would let a command import the tests' modules).
        start = f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')"
        self.process = subprocess.Popen(
            [sys.executable, "-c", start, "serve", str(socket_path)],
            env=self.environment,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        ready = self.process.stdout.readline()
        assert ready == "ready\n", f"the warm interpreter did not start ({ready!r})"

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(30)


def main(argv: list[str]) -> int:
    program, path, *args = argv
    if program == "serve":
        request, fds = _serve(path)
        os._exit(_exit_status(request, fds))
    return _client(program, path, args)


def _exit_status(request: dict, fds: list[int]) -> int:
    """Run the command, then its atexit handlers and the streams' flush, as an exiting
    interpreter does: the status it would exit with. The teardown of every module that
    follows in a real exit (2 s with torch and transformers loaded) is skipped."""
    try:
        _run(request, fds)
        status = 0
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            status = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
            status = 1
    except BaseException:
        sys.excepthook(*sys.exc_info())
        status = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except OSError:  # a closed pipe: an interpreter exits with 120 then
            status = 120
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
