"""Smoke test of bench_cross_attention.py's part (e), the matchers of AdaCL Table 1: each part
builds its model at the paper's size (CVSE with concept statistics written by ``vlret
cvse-concepts``, CHAN's BERT side with a random local BERT), checks its block scorer against
the authors' loop and records the three timings."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_cross_attention.py"


def test_the_matcher_parts_run_and_record(tmp_path):
    out = tmp_path / "out.json"
    cmd = [sys.executable, str(SCRIPT), "--parts", "cvse,chan,chan_bert"]
    cmd += ["--matcher-images", "2", "--repeats", "1", "--threads", "1", "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for kind in ("cvse", "chan", "chan_bert"):
        assert f"(e) {kind}: 2 x 10 pairs" in proc.stdout, proc.stdout
    assert "(a, b) scoring" not in proc.stdout  # no SCAN / BFAN part was asked for
    results = json.loads(out.read_text())["bench_cross_attention"]["results"]
    for kind in ("cvse", "chan", "chan_bert"):
        row = results[f"matcher_{kind}"]
        assert (row["images"], row["captions"]) == (2, 10)
        assert row["seconds"] > 0 and row["loop/vlret"] > 0 and row["vlret/gemm_bound"] > 0
