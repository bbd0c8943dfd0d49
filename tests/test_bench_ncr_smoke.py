"""Smoke test of benchmarks/bench_ncr.py: its main runs end to end at tiny sizes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_ncr.py"


def test_bench_ncr_runs_at_tiny_sizes():
    cmd = [sys.executable, str(SCRIPT), "--images", "6", "--batch", "8", "--embed", "8"]
    cmd += ["--sim-dim", "4", "--regions", "3", "--threads", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for needle in ("cpu:", "30 training pairs", "epoch 1 (clean pairs only)", "pass / training"):
        assert needle in proc.stdout, proc.stdout
