"""Smoke test of benchmarks/bench_ncr.py: its main runs end to end at tiny sizes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_ncr.py"


def test_bench_ncr_runs_at_tiny_sizes(tmp_path):
    cmd = [sys.executable, str(SCRIPT), "--images", "6", "--batch", "8", "--embed", "8"]
    cmd += ["--sim-dim", "4", "--regions", "3", "--threads", "1"]
    cmd += ["--device", "cpu", "--json", str(tmp_path / "out.json")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    needles = ("device cpu: ", "30 training pairs", "epoch 1 (clean pairs only)", "pass / training")
    needles += ("whole-block division (the release's work)", "same clean / noisy split: yes")
    needles += ("the release's epoch structure: training", "clean pairs: ")
    for needle in needles:
        assert needle in proc.stdout, proc.stdout
    results = json.loads((tmp_path / "out.json").read_text())["bench_ncr"]["results"]
    assert set(results) == {"epoch 1", "epoch 2"}
    for epoch in results.values():
        assert epoch["ratio"] == epoch["division_s"] / epoch["training_s"] > 0
        assert epoch["whole_block_ratio"] == epoch["whole_block_s"] / epoch["training_s"] > 0
        # the two passes' per-pair losses: float32 scores of O(1), a few ulps apart
        assert 0 <= epoch["max_loss_diff"] < 1e-5 and epoch["same_split"] is True
        assert epoch["release_ratio"] == epoch["whole_block_s"] / epoch["release_epoch_s"] > 0
        assert 0 <= epoch["clean_fraction_a"] <= 1 and 0 <= epoch["clean_fraction_b"] <= 1
