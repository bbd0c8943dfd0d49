"""Smoke test of benchmarks/bench_losses.py: its main runs end to end at the smallest sizes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_losses.py"


def test_bench_losses_runs_at_tiny_sizes():
    cmd = [sys.executable, str(SCRIPT), "--batch", "128", "--dim", "8", "--no-pml"]
    cmd += ["--repeats", "1", "--overhead-repeats", "3", "--threads", "1", "--timeout", "60"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for needle in ("bare 3 matmuls", "infonce dense", "infonce tiled", "tiled/dense time"):
        assert needle in out, out
    assert out.count("module/functional") == 2, out
    assert "failed" not in out and "timed out" not in out, out
