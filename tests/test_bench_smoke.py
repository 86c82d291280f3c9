"""The GPU benchmark must work the first time a GPU is lent (about 15 minutes of it, once):
`SMOKE=1 scripts/gpu_check.sh` runs the one prepared command's steps, every GPU case of
scripts/bench.py and the device checks, through the same code at tiny shapes on the CPU,
and writes the GPU section of a copy of docs/benchmarks.md, leaving its other sections
as they were."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _bench(monkeypatch):
    """scripts/bench.py as a module (registered for the test: its dataclasses need it)."""
    spec = importlib.util.spec_from_file_location("bench", ROOT / "scripts" / "bench.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench", module)
    spec.loader.exec_module(module)
    return module


def test_the_gpu_check_runs_every_gpu_case_at_tiny_shapes(tmp_path, monkeypatch):
    """scripts/gpu_check.sh with SMOKE=1: the version check, every GPU case and the device
    checks at tiny shapes on the CPU, writing the GPU section of a copy of the page
    (docs/benchmarks.md itself untouched), every other section kept."""
    bench = _bench(monkeypatch)
    before = (ROOT / "docs" / "benchmarks.md").read_text()
    environment = {**os.environ, "SMOKE": "1", "OUT": str(tmp_path), "PYTHON": sys.executable}
    run = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh")],
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert (ROOT / "docs" / "benchmarks.md").read_text() == before
    after = (tmp_path / "benchmarks-smoke.md").read_text()
    section = bench.gpu_section(after)
    assert "**Smoke run**" in section and "--smoke" in section
    for case in bench.GPU_CASES.values():
        assert f"### {bench.smoke(case).title}, batch" in section, case.name
    assert "readout_spread ran torch_fold" in section  # the kernel cases' note, on CPU
    assert "FAILED" not in section and "DIFFERENT" not in section
    assert "- target generic time / floor at most 1.5" in section  # the goals were judged
    assert "Not measured yet" not in section
    checks = [line for line in section.splitlines() if "| equal (" in line]
    models = {line.split("|")[1].strip() for line in checks}
    assert models >= {"tiny ViT", "tiny BERT", "tiny Llama"}
    kernel = {line.split("|")[1].strip() for line in checks if "readout_spread" in line}
    assert kernel == {
        "readout_spread (torch, float32; causal, padded, grouped-query)",
        "readout_spread (torch, bfloat16; causal, padded, grouped-query)",
    }
    assert after.replace(section, "") == before.replace(bench.gpu_section(before), "")


def test_a_failing_gpu_case_is_reported_and_the_run_goes_on(tmp_path, monkeypatch):
    """One GPU run must report all it can: a case that raises (out of memory at 32k
    tokens, say) is a FAILED entry in the section, the next cases still run, and the
    script exits with an error that names it."""
    bench = _bench(monkeypatch)
    page = tmp_path / "benchmarks.md"
    original = bench.run_case

    def run_case(case, *args, **kwargs):
        if case.name == "kernel-4k-1":
            raise RuntimeError("CUDA out of memory (simulated)")
        return original(case, *args, **kwargs)

    monkeypatch.setattr(bench, "run_case", run_case)
    monkeypatch.setattr(bench, "device_checks", lambda device, failures: ["(checks)"])
    argv = ["bench.py", "--device", "cpu", "--cases", "kernel-4k-1,kernel-4k-64", "--smoke"]
    monkeypatch.setattr(sys, "argv", [*argv, "--rounds", "1", "--out", str(page)])
    with pytest.raises(SystemExit, match="kernel-4k-1"):
        bench.main()
    section = bench.gpu_section(page.read_text())
    assert "FAILED: RuntimeError: CUDA out of memory (simulated)" in section
    assert "64 column(s) [smoke run" in section  # the next case ran


def test_a_cpu_run_keeps_the_sections_other_scripts_wrote(monkeypatch):
    """The page's sections written by other scripts (Swin's windows, Qwen's tower), each
    between its markers, are found for a CPU run to keep; bench.py's own are not."""
    bench = _bench(monkeypatch)
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    kept = [match.group("name") for match in bench.OTHER_SCRIPTS_SECTIONS.finditer(page)]
    assert "windowed attention" in kept and "packed vision tower" in kept
    assert not {"gpu", "long prompts"} & set(kept)
