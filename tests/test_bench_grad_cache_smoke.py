"""Smoke test of benchmarks/bench_grad_cache.py: its main runs end to end at the smallest sizes.

The GRU model only (importing transformers in each worker would triple the time); the BERT
tower differs only in its model section.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_grad_cache.py"


def test_bench_grad_cache_runs_at_tiny_sizes():
    cmd = [sys.executable, str(SCRIPT), "--models", "gru", "--batches", "8", "--chunk", "8"]
    cmd += ["--loss-chunk", "8", "--rounds", "1", "--skip-65536", "--device", "cpu"]
    proc = subprocess.run(cmd + ["--timeout", "120"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for needle in ("=== gru", "(a) peak gc B=8", "same step check", "(b) step time gc / plain"):
        assert needle in out, out
    assert "failed" not in out and "timed out" not in out and "n/a" not in out, out
