"""Smoke test of benchmarks/bench_losses.py: its main runs end to end at the smallest sizes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_losses.py"


def test_bench_losses_runs_at_tiny_sizes(tmp_path):
    cmd = [sys.executable, str(SCRIPT), "--batch", "128", "--dim", "8", "--no-pml"]
    cmd += ["--device", "cpu", "--json", str(tmp_path / "out.json"), "--max-mem-gb", "1e-6"]
    cmd += ["--repeats", "1", "--overhead-repeats", "3", "--threads", "1", "--timeout", "60"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith("device cpu: ") and "does not fit" in out, out
    results = json.loads((tmp_path / "out.json").read_text())["bench_losses"]["results"]
    assert {r["method"] for r in results["runs"]} == {"bare", "dense", "tiled"}
    assert all(r["skipped"].startswith("does not fit") for r in results["runs"]), results
    # with room for them the three methods run and their ratios are recorded
    cmd[cmd.index("--max-mem-gb") + 1] = "8"
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for needle in ("bare 3 matmuls", "infonce dense", "infonce tiled", "tiled/dense time"):
        assert needle in out, out
    assert out.count("module/functional") == 2, out
    assert "failed" not in out and "timed out" not in out, out
    results = json.loads((tmp_path / "out.json").read_text())["bench_losses"]["results"]
    runs = {r["method"]: r for r in results["runs"]}
    assert set(runs) == {"bare", "dense", "tiled"} and all(r["seconds"] > 0 for r in runs.values())
    ratios = {r["ratio"]: r["value"] for r in results["ratios"]}
    assert ratios["tiled/dense"] == runs["tiled"]["seconds"] / runs["dense"]["seconds"]
    assert set(ratios) == {
        "tiled/dense",
        "tiled/bare",
        "module/functional tiled",
        "module/functional dense",
    }
