"""Smoke test of benchmarks/bench_grad_cache.py: its main runs end to end at the smallest sizes.

The GRU model only (importing transformers in each worker would triple the time); the BERT
tower differs only in its model section.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_grad_cache.py"


def test_bench_grad_cache_runs_at_tiny_sizes(tmp_path):
    cmd = [sys.executable, str(SCRIPT), "--models", "gru", "--batches", "8", "--chunk", "8"]
    cmd += ["--loss-chunk", "8", "--rounds", "1", "--skip-65536", "--device", "cpu"]
    cmd += ["--json", str(tmp_path / "out.json")]
    proc = subprocess.run(cmd + ["--timeout", "120"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for needle in ("=== gru", "(a) peak gc B=8", "same step check", "(b) step time gc / plain"):
        assert needle in out, out
    assert "failed" not in out and "timed out" not in out and "n/a" not in out, out
    assert out.splitlines()[0].startswith("device cpu: "), out
    entry = json.loads((tmp_path / "out.json").read_text())["bench_grad_cache"]
    assert entry["device"]["device"] == "cpu" and "--json" in entry["argv"]
    results = entry["results"]
    assert results["gru B=8"]["plain"]["peak"] > 0 and results["gru B=8"]["gc"]["peak"] > 0
    time_res = results["gru time B=8"]
    assert time_res["gc/plain"] > 0 and len(time_res["times"]["gc"]) == 1
    assert results["summary"] and all(line.startswith("gru (") for line in results["summary"])
