"""benchmarks/run_gpu_set.py and the device/JSON helpers of benchmarks/machine.py on the CPU:
the refusal without CUDA, the set's commands, the JSON collected from the benchmarks' own
``--json`` (run here on the CPU with a tiny set), and ``--device`` / ``--json`` of the
benchmarks run in-process at tiny sizes."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is present here")


@pytest.fixture(scope="module")
def mod():
    sys.path.insert(0, str(BENCH))
    try:
        yield lambda name: importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCH))


@no_cuda
def test_refuses_without_cuda_in_one_line():
    proc = subprocess.run(
        [sys.executable, str(BENCH / "run_gpu_set.py")], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("run_gpu_set.py: CUDA is not available")


def test_the_set_and_its_sizes(mod, capsys):
    assert mod("run_gpu_set").main(["--dry-run", "--device", "cuda:1"]) == 0
    lines = dict(line.split(": ", 1) for line in capsys.readouterr().out.splitlines())
    assert list(lines) == ["losses", "coco5k_scan", "pixels", "pixels_b16", "grad_cache"]
    for cmd in lines.values():
        assert cmd.endswith("--device cuda:1 --json <tmp.json>")
    assert "--batch 8192 65536 262144 1048576 " in lines["losses"]
    assert "bench_cross_attention.py --coco5k-scan" in lines["coco5k_scan"]
    assert "--parts 1 3 " in lines["pixels"]
    assert "--parts 3 --gpu-patch 16 " in lines["pixels_b16"]
    assert "--batches 4096 --chunk 128" in lines["grad_cache"]
    assert "--big-batch 65536" in lines["grad_cache"]


def test_run_set_collects_each_benchmarks_json(mod, tmp_path, capsys):
    """The driver's collection on the CPU: one benchmark that runs, one that fails."""
    benches = {
        "goal": ["bench_goal.py", "--batch", "6", "--dim", "4", "--rounds", "1"],
        "bad": ["bench_goal.py", "--no-such-option"],
    }
    out = tmp_path / "sub" / "set.json"
    rc = mod("run_gpu_set").run_set(["goal", "bad"], torch.device("cpu"), out, 120.0, benches)
    assert rc == 1
    report = json.loads(out.read_text())
    assert report["device"]["device"] == "cpu" and report["torch"] == torch.__version__
    goal, bad = report["benchmarks"]["goal"], report["benchmarks"]["bad"]
    assert goal["returncode"] == 0 and goal["device_line"].startswith("device cpu: ")
    row = goal["results"]["B=6"]
    assert row["triplet (hardest, autograd)"]["x_triplet"] == 1.0
    assert set(row) == {
        "triplet (hardest, autograd)",
        "goal (cir, sig-ms) default",
        "goal (con, con)",
    }
    assert any(line.startswith("B=6") for line in goal["output_tail"])
    assert bad["returncode"] == 2 and "results" not in bad
    assert goal["command"][-4:] == ["--device", "cpu", "--json", goal["command"][-1]]


def test_output_path_in_a_folder(mod, tmp_path):
    assert mod("run_gpu_set").output_path(str(tmp_path)) == tmp_path / "bench-gpu.json"
    assert mod("run_gpu_set").output_path(str(tmp_path / "a.json")) == tmp_path / "a.json"


@pytest.mark.parametrize(
    "name, message",
    [
        ("meta", "only cpu, cuda, cuda:N and auto are supported"),
        ("tpu", "not a device"),
        pytest.param("cuda:3", "CUDA is not available", marks=no_cuda),
    ],
)
def test_resolve_device_refuses_in_one_line(mod, capsys, name, message):
    with pytest.raises(SystemExit) as err:
        mod("machine").resolve_device(name, "bench_x.py")
    assert err.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"bench_x.py: --device {name!r}: ")
    assert message in lines[0]


@no_cuda
def test_auto_is_the_cpu_without_cuda(mod):
    machine = mod("machine")
    assert machine.resolve_device("auto") == torch.device("cpu")
    line = machine.device_line("cpu")
    assert line.startswith(f"device cpu: {machine.cpu_name()} ") and torch.__version__ in line
    assert machine.peak_since(torch.device("cpu"), machine.reset_peak(torch.device("cpu"))) is None


def test_save_json_merges_and_refuses_a_list(mod, tmp_path, capsys):
    machine = mod("machine")
    path = tmp_path / "r.json"
    cpu = torch.device("cpu")
    machine.RESULTS.clear()
    machine.record("a", 1)
    machine.save_json(str(path), "one", cpu, ["--x"])
    machine.RESULTS.clear()
    machine.record("b", [2.5])
    machine.save_json(str(path), "two", cpu, [])
    data = json.loads(path.read_text())
    assert data["one"]["results"] == {"a": 1} and data["one"]["argv"] == ["--x"]
    assert data["two"]["results"] == {"b": [2.5]} and data["two"]["device"]["device"] == "cpu"
    path.write_text("[1]")
    with pytest.raises(SystemExit):
        machine.save_json(str(path), "three", cpu, [])
    assert "holds list, not a JSON object" in capsys.readouterr().err


TINY = {
    "bench_goal": ["--batch", "6", "--dim", "4", "--rounds", "1"],
    "bench_adacl": ["--repeats", "1", "--warmup", "0", "--threads", "1"],
    "bench_metrics": ["--images", "20", "--dim", "8", "--repeats", "1", "--loop-repeats", "1"],
    "bench_person_search": [
        *("--captions", "30", "--images", "20", "--identities", "6", "--dim", "8"),
        *("--repeats", "1", "--irra-repeats", "1", "--threads", "1"),
    ],
    "bench_cross_attention": [
        *("--images", "3", "--captions", "4", "--repeats", "1", "--sgraf-captions", "2"),
        *("--sgraf-bound-captions", "3"),
        *("--threads", "1", "--parts", "scan,sgraf"),
    ],
}
KEYS = {
    "bench_goal": {"B=6"},
    "bench_adacl": {
        "B=64, queue 4096 vs InfoNCE + same queue",
        "B=64, queue 4096 vs InfoNCE in-batch (ref.)",
        "B=128, no queue vs InfoNCE",
    },
    "bench_metrics": {"retrieval_metrics"},
    "bench_person_search": {"t2i", "i2t", "matmul_s"},
    "bench_cross_attention": {"cpu", "SCAN t2i LSE", "SCAN i2t AVG", "SGR"}
    | {f"{m}_bound" for m in ("sgr", "saf")}
    | {f"{m}_{p}_error" for m in ("sgr", "saf") for p in ("float32", "bfloat16")},
}


@pytest.mark.parametrize("name", list(TINY))
def test_benchmark_runs_with_device_cpu_and_json(mod, tmp_path, capsys, name):
    path = tmp_path / "out.json"
    path.write_text(json.dumps({"other": {"kept": True}}))
    mod(name).main([*TINY[name], "--device", "cpu", "--json", str(path)])
    out = capsys.readouterr().out
    data = json.loads(path.read_text())
    assert data["other"] == {"kept": True}
    entry = data[name]
    assert entry["device"]["device"] == "cpu" and "device cpu: " in out
    assert set(entry["results"]) == KEYS[name], entry["results"]
