"""Smoke test of benchmarks/bench_vsl.py: its main runs end to end with ``--quick``, and with
the native kernel switched off it says so and times the PyTorch path alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vlret import _native

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_vsl.py"


def run(tmp_path: Path, **env: str) -> tuple[str, dict]:
    out = tmp_path / "out.json"
    cmd = [sys.executable, str(SCRIPT), "--quick", "--threads", "1", "--json", str(out)]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=300, env={**os.environ, **env}
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, json.loads(out.read_text())["bench_vsl"]["results"]


@pytest.mark.skipif(_native.compiler() is None, reason="no C compiler: no native rows")
def test_bench_vsl_times_both_paths(tmp_path):
    stdout, results = run(tmp_path, VLRET_NATIVE_CACHE=str(tmp_path / "cache"))
    for needle in (
        "native vs torch gradient: max |difference|",
        "triplet+VSL (native)",
        "triplet+VSL (torch)",
        "smooth rank fwd+bwd B=128, wide",
        "peak RSS growth",
    ):
        assert needle in stdout, stdout
    for key in ("from_sim_ms", "from_embeddings_ms"):
        assert set(results[key]) == {"triplet", "vsl_native", "vsl_torch"}
        assert all(v > 0 for v in results[key].values())
    assert set(results["smooth_rank_0.15_ms"]) == {"native", "torch"}


def test_bench_vsl_without_the_kernel(tmp_path):
    stdout, results = run(tmp_path, VLRET_NATIVE="0")
    assert "native smooth-rank kernel: switched off by VLRET_NATIVE; its rows skipped" in stdout
    assert "triplet+VSL (native)" not in stdout and "triplet+VSL (torch)" in stdout
    assert set(results["from_sim_ms"]) == {"triplet", "vsl_torch"}
