"""What the benchmarks print about the machine and how they summarise repeats (imported by the
scripts beside it, which put this folder on ``sys.path`` when run from anywhere)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import NoReturn

import torch


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what :mod:`platform` knows."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


#: The CPU flags the GEMM kernels depend on: bfloat16 dot products (AVX512-BF16), AMX tiles,
#: VNNI, AVX-512 itself.
GEMM_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile")
GEMM_FLAGS += ("amx_bf16", "amx_int8", "avx_vnni")


def cpu_id() -> str:
    """Family, model and stepping, and the per-core cache size ``/proc/cpuinfo`` reports (they
    tell CPU generations apart where a virtual machine's model name is only "AMD EPYC")."""
    wanted = {"cpu family": "family", "model": "model", "stepping": "stepping"}
    wanted["cache size"] = "cache"
    found: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                name = wanted.get(key.strip())
                if name and name not in found:
                    found[name] = value.strip()
                if not line.strip() and found:
                    break
    except OSError:
        pass
    return " ".join(f"{k} {v}" for k, v in found.items()) or "n/a"


def cpu_flags() -> list[str]:
    """Which of :data:`GEMM_FLAGS` ``/proc/cpuinfo`` lists (empty where it cannot be read)."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("flags"):
                    have = set(line.split(":", 1)[1].split())
                    return [f for f in GEMM_FLAGS if f in have]
    except OSError:
        pass
    return []


_ONEDNN_PROBE = """
import torch
torch.set_num_threads(1)
a = torch.ones(64, 64, dtype=torch.bfloat16)
a @ a
"""


def onednn_facts(timeout: float = 60.0) -> dict[str, str]:
    """What oneDNN says about this CPU (``ONEDNN_VERBOSE=1`` in a fresh process running one
    bfloat16 product): ``isa``, the instruction set it dispatches to, and ``bf16_matmul``,
    the kernel a bfloat16 matmul runs (e.g. ``brg_matmul:avx512_core_bf16``; a kernel
    without ``bf16`` or ``amx`` converts). Empty where oneDNN prints nothing."""
    env = dict(os.environ, ONEDNN_VERBOSE="1", OMP_NUM_THREADS="1")
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _ONEDNN_PROBE],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )
    except (OSError, subprocess.TimeoutExpired):
        return {}
    facts = {}
    for line in proc.stdout.splitlines():
        fields = line.split(",")
        if "isa:" in line and "isa" not in facts:
            facts["isa"] = line.split("isa:", 1)[1].strip()
        elif "exec" in fields and "matmul" in fields and "bf16_matmul" not in facts:
            facts["bf16_matmul"] = fields[fields.index("matmul") + 1]
    return facts


def cpu_facts(onednn: bool = True) -> dict:
    """The CPU facts a CPU speed figure depends on: model name, :func:`cpu_flags`, the ATen
    kernels' capability (``torch.backends.cpu.get_cpu_capability()``) and, with ``onednn``,
    :func:`onednn_facts` (a fresh process, about 2 s)."""
    facts = {
        "cpu": cpu_name(),
        "cpu_id": cpu_id(),
        "flags": cpu_flags(),
        "aten_capability": torch.backends.cpu.get_cpu_capability(),
    }
    if onednn:
        facts["onednn"] = onednn_facts()
    return facts


def cpu_facts_line(facts: dict) -> str:
    """One line of :func:`cpu_facts`."""
    flags = " ".join(facts["flags"]) or "none of the GEMM ones"
    line = (
        f"CPU facts: {facts['cpu']} ({facts['cpu_id']}); flags {flags}; "
        f"ATen {facts['aten_capability']}"
    )
    if "onednn" in facts:
        one = facts["onednn"]
        line += (
            f"; oneDNN ISA {one.get('isa', 'n/a')}, bfloat16 matmul kernel "
            f"{one.get('bf16_matmul', 'n/a')}"
        )
    return line


def load_average() -> str:
    """The 1-minute load average, or ``n/a``."""
    return f"{os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else "n/a"


def timed(fn) -> tuple[float, object]:
    """``(seconds, fn())``."""
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def spread(values: list[float], unit: str = "x", digits: int = 2) -> str:
    """Median, then the range over repeats."""
    med, lo, hi = (f"{v:.{digits}f}" for v in (statistics.median(values), min(values), max(values)))
    return f"{med}{unit} ({lo}-{hi})"


# ----------------------------------------------------------------------------- devices and JSON
#
# Every benchmark takes ``--device cpu|cuda|cuda:N|auto`` and ``--json FILE``
# (:func:`add_device_arguments`), prints :func:`device_line` in its header, fills :data:`RESULTS`
# through :func:`record` and merges them into FILE with :func:`save_json` at the end.

RESULTS: dict = {}


def add_device_arguments(parser: argparse.ArgumentParser, default: str = "cpu") -> None:
    """``--device`` (``cpu``, ``cuda``, ``cuda:N`` or ``auto``: CUDA when there is one) and
    ``--json FILE`` (merge this run's results into FILE under the script's name). Empties
    :data:`RESULTS` (a script's ``main`` may run more than once in one process)."""
    RESULTS.clear()
    parser.add_argument(
        "--device", default=default, help=f"cpu, cuda, cuda:N or auto (default {default})"
    )
    parser.add_argument(
        "--json", default=None, metavar="FILE", help="merge the results into this JSON file"
    )


def resolve_device(name: str, prog: str | None = None) -> torch.device:
    """The :class:`torch.device` for ``--device NAME``; a CUDA device becomes the current one
    (so that ``torch.cuda.synchronize()`` and the caching allocator's counters are its). A
    device this machine lacks ends the run with one line naming it (exit status 2)."""
    prog = prog or os.path.basename(sys.argv[0]) or "benchmark"
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        _exit(prog, f"--device {name!r}: not a device (cpu, cuda, cuda:N or auto)")
    if device.type == "cpu":
        return torch.device("cpu")
    if device.type != "cuda":
        _exit(prog, f"--device {name!r}: only cpu, cuda, cuda:N and auto are supported")
    if not torch.cuda.is_available():
        _exit(prog, f"--device {name!r}: CUDA is not available (torch {torch.__version__})")
    index = torch.cuda.current_device() if device.index is None else device.index
    if index >= torch.cuda.device_count():
        _exit(prog, f"--device {name!r}: this machine has {torch.cuda.device_count()} GPU(s)")
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def _exit(prog: str, message: str) -> NoReturn:
    print(f"{prog}: {message}", file=sys.stderr)
    raise SystemExit(2)


def device_info(device: torch.device) -> dict:
    """What the JSON records about the device (and the host and torch beside it)."""
    info = {
        "device": str(device),
        "torch": torch.__version__,
        "cpu": cpu_name(),
        "cpu_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info |= {
            "gpu": props.name,
            "capability": f"{props.major}.{props.minor}",
            "memory_bytes": props.total_memory,
            "multiprocessors": props.multi_processor_count,
            "cuda": torch.version.cuda,
            "gpus": torch.cuda.device_count(),
        }
    return info


def device_line(device: torch.device | str) -> str:
    """One line naming where the benchmark runs: on CUDA the GPU's name, compute capability,
    memory and SM count, then the host CPU; on CPU its model, cores and torch threads."""
    info = device_info(torch.device(device))
    host = f"{info['cpu']} ({info['cpu_cores']} logical cores, {info['torch_threads']} threads)"
    if "gpu" in info:
        return (
            f"device {info['device']}: {info['gpu']}, capability {info['capability']}, "
            f"{info['memory_bytes'] / 1024**3:.1f} GiB, {info['multiprocessors']} SMs, CUDA "
            f"{info['cuda']}; host {host}; torch {info['torch']}"
        )
    return f"device cpu: {host}; torch {info['torch']}, load {load_average()}"


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on CPU): timed regions start and end here."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak(device: torch.device) -> int:
    """Start a CUDA peak-memory measurement: resets the peak, returns the bytes allocated now
    (0 on CPU, where the benchmarks read peak RSS of a fresh process instead)."""
    if device.type != "cuda":
        return 0
    sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device)


def peak_since(device: torch.device, base: int) -> int | None:
    """Peak CUDA bytes allocated beyond ``base`` since :func:`reset_peak` (None on CPU)."""
    if device.type != "cuda":
        return None
    sync(device)
    return torch.cuda.max_memory_allocated(device) - base


def record(key: str, value: object) -> None:
    """Keep ``value`` (JSON-able) under ``key`` for :func:`save_json`."""
    RESULTS[key] = value


def save_json(path: str | None, name: str, device: torch.device, argv: list[str] | None) -> None:
    """Merge ``{name: {"device": ..., "argv": ..., "results": RESULTS}}`` into the JSON object
    in ``path`` (created when missing; other benchmarks' entries are kept). No-op without path."""
    if not path:
        return
    data = {}
    if os.path.exists(path) and os.path.getsize(path):
        with open(path) as fh:
            data = json.load(fh)
        if not isinstance(data, dict):
            _exit(name, f"--json {path}: holds {type(data).__name__}, not a JSON object")
    data[name] = {
        "device": device_info(device),
        "device_line": device_line(device),
        "argv": list(sys.argv[1:] if argv is None else argv),
        "results": dict(RESULTS),
    }
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(data, fh, indent=2, default=str)
        fh.write("\n")
    os.replace(tmp, path)


def run_worker(script: str, spec: dict, timeout: float, env: dict | None = None) -> dict:
    """``script --_worker SPEC`` in a fresh process; its last stdout line is the JSON result,
    else ``{"error": ...}`` (the time-out, or the exit status and the last stderr line)."""
    cmd = [sys.executable, script, "--_worker", json.dumps(spec)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or [""])[-1][:200]
        return {"error": f"failed (rc={proc.returncode}) {tail}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])
