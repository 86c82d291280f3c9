"""The `explain` console script (pyproject's [project.scripts]): a Ctrl-C at any moment,
the seconds of the CLI's imports included, ends it with one line and exit status 130."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

from explain.cli import INTERRUPTED

ROOT = Path(__file__).parents[1]

# Put on the child's path as sitecustomize: the import of explain.cli announces itself
# (the marker file) and then takes a minute, so the SIGINT lands inside the import.
SLOW_IMPORT = """
import os, pathlib, sys, time

class SlowCli:
    def find_spec(self, name, path=None, target=None):
        if name == "explain.cli":
            pathlib.Path(os.environ["IMPORTING_MARKER"]).touch()
            time.sleep(60)
        return None

sys.meta_path.insert(0, SlowCli())
"""


def _console_script() -> tuple[str, str]:
    """(module, function) of the `explain` script, as pip's wrapper imports it."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, function = scripts["explain"].split(":")
    return module, function


def test_ctrl_c_while_the_cli_is_importing_prints_one_line(tmp_path):
    """Issue 46: the interrupt came out of the import as a KeyboardInterrupt traceback."""
    (tmp_path / "sitecustomize.py").write_text(SLOW_IMPORT)
    marker = tmp_path / "importing"
    module, function = _console_script()
    wrapper = f"import sys; from {module} import {function}; sys.exit({function}())"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
        "IMPORTING_MARKER": str(marker),
    }
    child = subprocess.Popen(
        [sys.executable, "-c", wrapper, "models"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not marker.exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.exists(), "the CLI's import never started"
        child.send_signal(signal.SIGINT)
        _, stderr = child.communicate(timeout=60)
    finally:
        child.kill()
    assert (child.returncode, stderr) == (130, INTERRUPTED + "\n")
