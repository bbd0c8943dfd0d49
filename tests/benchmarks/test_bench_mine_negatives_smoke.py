"""Smoke test of benchmarks/bench_mine_negatives.py: its main runs end to end at tiny sizes, and
the reference (previous) implementation it times gives the same lists."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_mine_negatives.py"


def test_bench_mine_negatives_runs_at_tiny_sizes(tmp_path):
    cmd = [sys.executable, str(SCRIPT), "--images", "40", "--captions", "200", "--dim", "8"]
    cmd += ["--k", "5", "--block", "64", "--repeats", "1", "--threads", "1", "--previous"]
    cmd += ["--device", "cpu", "--json", str(tmp_path / "out.json")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for needle in ("40 images x 200 captions", "bare GEMM", "mine-negatives", "previous way"):
        assert needle in out, out
    assert "mining / GEMM rate" in out and "device cpu: " in out and "load " in out
    entry = json.loads((tmp_path / "out.json").read_text())["bench_mine_negatives"]
    assert entry["device"]["device"] == "cpu" and entry["device_line"] in out
    mining = entry["results"]["mining"]
    assert mining["gemm_s"] > 0 and mining["mine_s"] > 0 and mining["previous_s"] > 0
    want = mining["gemm_s"] / mining["mine_s"]  # the rate ratio: same pairs over both times
    assert abs(mining["mining/gemm_rate"] - want) <= 1e-12 * want
    # random float scores: no ties, so both ways must give the very same lists
    assert "i2t 100.0% of images, t2i 100.0% of captions" in out, out
