"""The set a lent GPU runs first (issue 31, ``make bench-gpu``), collected into one JSON.

Each benchmark runs as its own subprocess on ``--device`` (default ``cuda``) with ``--json`` into
a temporary file; its output is shown as it runs and its tail kept. The JSON written to ``--out``
(default ``build/bench-gpu.json``; a folder gets ``bench-gpu.json`` inside it) holds::

    {"device_line": ..., "device": {...}, "torch": ..., "started": ..., "seconds": ...,
     "benchmarks": {NAME: {"command": [...], "returncode": 0, "seconds": ...,
                           "results": {...}, "device_line": ..., "output_tail": [...]}}}

The set (``--only NAME ...`` picks some; ``--dry-run`` prints the commands and runs nothing):

* ``losses``: ``bench_losses.py`` tiled InfoNCE (D=512, float32) against its bare 3-GEMM bound
  and the dense module at B = 8192, 65536, 262144 and 1,048,576 (dense where it fits);
* ``coco5k_scan``: ``bench_cross_attention.py --coco5k-scan``, SCAN t2i LSE scored exactly on
  5000 images x 25000 captions (36 regions, D=1024), its time and peak CUDA memory;
* ``pixels``: ``bench_pixels.py`` parts 1 (the shard pipeline's images/s against its decode
  bound, on the host's cores) and 3 (ViT-B/32 pre-training samples/s, bf16);
* ``pixels_b16``: ``bench_pixels.py`` part 3 with ViT-B/16 (``--gpu-patch 16``), beside B/32's;
* ``grad_cache``: ``bench_grad_cache.py``, the GRU model's gradient-caching peak at B=4096 in
  chunks of 128 against a plain B=128 step, and one gradient-caching step at B=65536.

Without CUDA it refuses with one line and exit status 2 (the benchmarks themselves run on the
CPU with ``--device cpu``).

    python benchmarks/run_gpu_set.py [--out build/bench-gpu.json] [--device cuda|cuda:N]
        [--only losses coco5k_scan pixels pixels_b16 grad_cache] [--timeout 3600] [--dry-run]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import machine  # noqa: E402

PROG = "run_gpu_set.py"
DEFAULT_OUT = "build/bench-gpu.json"
TAIL = 60  # output lines kept per benchmark


def gpu_set() -> dict[str, list[str]]:
    """NAME -> the benchmark script and its arguments (``--device`` and ``--json`` added later)."""
    workers = str(max(1, min(8, (os.cpu_count() or 2) - 2)))
    return {
        "losses": [
            "bench_losses.py",
            "--batch",
            *("8192", "65536", "262144", "1048576"),
            *("--loss", "infonce", "--repeats", "1", "--time-budget", "60", "--no-pml"),
        ],
        "coco5k_scan": ["bench_cross_attention.py", "--coco5k-scan"],
        "pixels": [
            "bench_pixels.py",
            *("--parts", "1", "3", "--workers", workers, "--rounds", "2"),
            *("--gpu-batch", "256", "--gpu-steps", "20", "--gpu-amp", "bf16"),
        ],
        "pixels_b16": [
            "bench_pixels.py",
            *("--parts", "3", "--gpu-patch", "16"),
            *("--gpu-batch", "256", "--gpu-steps", "20", "--gpu-amp", "bf16"),
        ],
        "grad_cache": [
            "bench_grad_cache.py",
            *("--models", "gru", "--batches", "4096", "--chunk", "128", "--loss-chunk", "128"),
            *("--rounds", "3", "--big-batch", "65536", "--big-models", "gru", "--threads", "4"),
        ],
    }


def command(name: str, device: str, json_path: str, benches: dict | None = None) -> list[str]:
    script, *rest = (benches or gpu_set())[name]
    return [sys.executable, str(HERE / script), *rest, "--device", device, "--json", json_path]


def run_one(cmd: list[str], timeout: float) -> tuple[int, float, list[str]]:
    """Run ``cmd`` showing its output as it comes; (return code, seconds, the last lines)."""
    tail: deque[str] = deque(maxlen=TAIL)
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    deadline = start + timeout
    for line in proc.stdout:
        print(line, end="", flush=True)
        tail.append(line.rstrip("\n"))
        if time.perf_counter() > deadline:
            proc.kill()
            tail.append(f"killed: past --timeout {timeout:.0f} s")
            break
    rc = proc.wait()
    return rc, time.perf_counter() - start, list(tail)


def output_path(out: str) -> Path:
    path = Path(out)
    return path / "bench-gpu.json" if path.is_dir() else path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=DEFAULT_OUT, help="the JSON file (or a folder for it)")
    parser.add_argument("--device", default="cuda", help="cuda or cuda:N")
    parser.add_argument("--only", nargs="+", choices=tuple(gpu_set()), default=None)
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per benchmark")
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    args = parser.parse_args(argv)
    names = args.only or list(gpu_set())
    if args.dry_run:
        for name in names:
            print(f"{name}: {' '.join(command(name, args.device, '<tmp.json>'))}")
        return 0
    if not torch.cuda.is_available():
        print(
            f"{PROG}: CUDA is not available (torch {torch.__version__}, "
            "torch.cuda.is_available() is False): the GPU set needs a GPU; on a CPU run the "
            "benchmarks one by one with --device cpu",
            file=sys.stderr,
        )
        return 2
    if not args.device.startswith("cuda"):
        print(
            f"{PROG}: --device {args.device!r}: the GPU set runs on cuda or cuda:N", file=sys.stderr
        )
        return 2
    device = machine.resolve_device(args.device, PROG)
    return run_set(names, device, output_path(args.out), args.timeout)


def run_set(
    names: list[str], device: torch.device, out: Path, timeout: float, benches: dict | None = None
) -> int:
    """Run ``names`` of ``benches`` (default :func:`gpu_set`) on ``device``, writing ``out``
    after each; 0 when all succeeded, else 1."""
    out.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "device_line": machine.device_line(device),
        "device": machine.device_info(device),
        "torch": torch.__version__,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "benchmarks": {},
    }
    print(report["device_line"], flush=True)
    start = time.perf_counter()
    failed = []
    with tempfile.TemporaryDirectory(prefix="vlret-bench-gpu-") as tmp:
        for name in names:
            json_path = os.path.join(tmp, f"{name}.json")
            cmd = command(name, str(device), json_path, benches)
            print(f"\n===== {name}: {' '.join(cmd[1:])}", flush=True)
            rc, seconds, tail = run_one(cmd, timeout)
            entry: dict = {"command": cmd[1:], "returncode": rc, "seconds": seconds}
            if os.path.exists(json_path):
                with open(json_path) as fh:
                    for bench in json.load(fh).values():  # one script, one entry
                        entry |= {"results": bench["results"], "device_line": bench["device_line"]}
            entry["output_tail"] = tail
            report["benchmarks"][name] = entry
            if rc != 0:
                failed.append(name)
            report["seconds"] = time.perf_counter() - start
            out.write_text(json.dumps(report, indent=2, default=str) + "\n")  # after each one
    print(f"\nwrote {out} ({report['seconds']:.0f} s)" + (f"; failed: {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
