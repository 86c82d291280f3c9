"""explain.quiet_imports: a command's stderr carries no torchao start-up deprecation
notes (transformers imports torchao at the first model load), and torch's other pytree
warnings still show."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

from PIL import Image

import explain  # noqa: F401  (installs the filter)


def test_a_command_that_loads_a_model_prints_only_its_error(tmp_path):
    image = tmp_path / "photo.png"
    Image.new("RGB", (32, 32)).save(image)
    command = [sys.executable, "-m", "explain.cli", "image", str(image)]
    command += ["--model", "zoo:shapes-vit", "--target", "hexagon", "--out", str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 2
    assert done.stderr.startswith("explain: error: --target 'hexagon' is not a class")
    assert done.stderr.count("\n") == 1  # no deprecation note before or after it


def test_only_the_enum_registration_note_is_dropped(caplog):
    logger = logging.getLogger("torch.utils._pytree")
    with caplog.at_level(logging.WARNING, logger="torch.utils._pytree"):
        logger.warning(
            "%s is an Enum subclass and is now natively supported by "
            "torch.compile as an opaque value type.",
            "<enum 'X'>",
        )
        logger.warning("some other pytree warning")
    assert [r.getMessage() for r in caplog.records] == ["some other pytree warning"]
