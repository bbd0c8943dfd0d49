"""Smoke test of benchmarks/bench_person_search.py: its main runs end to end at a tiny size and
its metrics agree with IRRA's argsort computation (the script exits non-zero otherwise)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_person_search.py"


def test_bench_person_search_runs_at_tiny_sizes():
    cmd = [sys.executable, str(SCRIPT), "--captions", "120", "--images", "60"]
    cmd += ["--identities", "25", "--dim", "16", "--repeats", "1", "--irra-repeats", "1"]
    proc = subprocess.run(cmd + ["--threads", "1"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith("device cpu: "), out  # the machine first
    assert "120 captions x 60 images of 25 persons, D=16" in out, out
    for needle in ("--- t2i", "--- i2t", "ratio to the matmul", "speed-up of vlret"):
        assert needle in out, out
    assert out.count("agree: True") == 2, out


def test_bench_person_search_refuses_impossible_sizes():
    cmd = [sys.executable, str(SCRIPT), "--captions", "10", "--images", "20", "--repeats", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "need 0 < identities <= images <= captions" in proc.stderr
