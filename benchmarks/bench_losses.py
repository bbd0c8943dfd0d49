"""Losses at scale (issue 8): forward+backward time and peak memory, dense vs tiled vs bare matmuls.

For each batch size B (default 128, 1024, 8192, 32768, 65536; D=512, float32) and each loss
(``infonce`` by default; ``unified``, ``triplet``, ``goal`` (cir, sig-ms), ``adacl``
(``AdaCLLoss`` in training mode, so each step includes its margin update; no queue) and
``adacl-fixed`` (the same module in eval mode: Eq. 3 for the given margins m1=20, m2=0.1, what
``tiled_adacl_loss`` computes) on request) this measures one training step (forward from the
embeddings + backward to them) of:

* ``dense``  the module without ``chunk_size`` (``InfoNCELoss()`` ...): ``S = X Y^T`` materialised
  and kept by autograd.
* ``tiled``  the same module with ``chunk_size=C`` (the streaming engine): tiles of C rows.
* ``bare``   the lower bound: only the three matrix products ``S = X Y^T``, ``dX = G Y``,
  ``dY = G^T X`` (with G := S), without autograd, computed strip by strip with the same C as
  ``tiled`` (so it fits wherever ``tiled`` does; for B <= C that is one strip, i.e. dense).
* ``pml-ntxent`` / ``pml-circle``  pytorch-metric-learning's ``NTXentLoss(temperature=0.05)`` and
  ``CircleLoss()`` on the image-text pairs, both directions (``loss(X, l, Y, l) + loss(Y, l, X, l)``
  with ``l = arange(B)``), where they fit and when the package is installed.

Every (method, B) runs in a fresh subprocess. Peak memory is the growth beyond the state after
creating the inputs (X, Y with ``requires_grad``) and a tiny warm-up step: on CPU the peak RSS
(``VmHWM`` of ``/proc/self/status``, reset by writing ``5`` to ``/proc/self/clear_refs``) minus
the RSS before the step; on CUDA ``torch.cuda.max_memory_allocated`` minus the allocated bytes
before the step. It includes the input gradients (2 B D elements). The first full step gives the
peak; time is the best of up to ``--repeats`` further steps (stopping once ``--time-budget``
seconds are spent, continuing up to 1000 steps while under 1 s in total, so small B gets many
steps; the first step's time if it alone exceeds the budget). A method whose memory
estimate exceeds ``--max-mem-gb`` (default 70% of RAM / of GPU memory) is not run and is reported
as "does not fit (needs ~X GB)".

At B=128 the module path is also compared with the bare functional, interleaved in one process
(``normalize=False`` on both sides, unit-norm inputs): ``InfoNCELoss(chunk_size=C)(x, y)`` vs
``tiled_infonce_loss(x, y, ...)`` and ``InfoNCELoss()(x, y)`` vs ``infonce_loss(x @ y.T, ...)``;
the ratio is the median of per-repeat ratios.

Targets (issue 8, 2-core 24 GB machine): B=65536 tiled runs with < 2 GB beyond the inputs while
dense cannot run; tiled/dense <= 1.3x where dense fits; tiled/bare <= 1.6x at B >= 8192; module
path <= 1.15x the bare functional at B=128.

    .venv/bin/python benchmarks/bench_losses.py [--batch 128 1024 8192 32768 65536] [--dim 512]
        [--dtype float32|bfloat16] [--device cpu|cuda|cuda:N|auto] [--json FILE]
        [--loss infonce unified triplet goal adacl adacl-fixed]
        [--chunk auto|N] [--repeats 3] [--time-budget 30] [--max-mem-gb G] [--threads N]
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import machine  # noqa: E402

# Public names only: bench_engine.py runs these workers against an older checkout too.
from vlret.losses import (  # noqa: E402
    AdaCLLoss,
    GoalObjective,
    InfoNCELoss,
    TripletLoss,
    UnifiedLoss,
    adacl_loss,
    goal_objective,
    infonce_loss,
    tiled_adacl_loss,
    tiled_goal_objective,
    tiled_infonce_loss,
    tiled_triplet_loss,
    tiled_unified_loss,
    triplet_loss,
    unified_loss,
)

LOSSES = ("infonce", "unified", "triplet", "goal", "adacl", "adacl-fixed")
CLASSES = {
    "infonce": InfoNCELoss,
    "unified": UnifiedLoss,
    "triplet": TripletLoss,
    "goal": GoalObjective,  # (cir, sig-ms)
    "adacl": AdaCLLoss,  # training mode: the margin update of every step included, no queue
    "adacl-fixed": AdaCLLoss,  # eval mode: the loss for the given margins, no update
}
TEMPERATURE = 0.05  # InfoNCELoss default; also used for pml's NTXentLoss
PML_MISSING = "not installed (pip install pytorch-metric-learning in the benchmark environment)"
GB = 1024**3
MB = 1024**2


# ----------------------------------------------------------------------------- methods


def make_module(loss: str, chunk: int | None, normalize: bool = True) -> torch.nn.Module:
    module = CLASSES[loss](chunk_size=chunk, normalize=normalize)
    return module.eval() if loss == "adacl-fixed" else module


def bare_products(x: torch.Tensor, y: torch.Tensor, chunk: int) -> None:
    """The three products S = X Y^T, dX = G Y, dY = G^T X (G := S), strip by strip."""
    with torch.no_grad():
        dx = torch.empty_like(x)
        dy = torch.zeros_like(y)
        for start in range(0, x.shape[0], chunk):
            stop = min(start + chunk, x.shape[0])
            g = x[start:stop] @ y.t()
            torch.mm(g, y, out=dx[start:stop])
            dy.addmm_(g.t(), x[start:stop])


def pml_loss(name: str):
    from pytorch_metric_learning import losses  # lazy: optional, benchmark environment only

    if name == "pml-ntxent":
        return losses.NTXentLoss(temperature=TEMPERATURE)
    return losses.CircleLoss()


def pml_installed() -> bool:
    try:
        import pytorch_metric_learning  # noqa: F401
    except ImportError:
        return False
    return True


def make_step(method: str, loss: str, chunk: int):
    """A function (x, y) -> None doing one forward+backward of ``method``."""
    if method == "bare":
        return lambda x, y: bare_products(x, y, chunk)
    if method.startswith("pml-"):
        fn = pml_loss(method)

        def pml_step(x, y):
            labels = torch.arange(x.shape[0], device=x.device)
            refs = labels.clone()  # pml drops the diagonal when ``ref_labels is labels``
            out = fn(x, labels, ref_emb=y, ref_labels=refs)
            (out + fn(y, labels, ref_emb=x, ref_labels=refs)).backward()

        return pml_step
    module = make_module(loss, chunk if method == "tiled" else None)
    return lambda x, y: module(x, y).backward()


def estimate_bytes(
    method: str, batch: int, dim: int, chunk: int, elem: int, loss: str = "infonce"
) -> int:
    """Rough peak beyond the inputs, from peak RSS measured on CPU float32 (B <= 8192), rounded up.

    dense: ~6 (B, B) float32 matrices (S, its scaled/masked copies kept by autograd, gradients);
    tiled: ~10 strips of chunk x B float32 (forward/backward temporaries of two iterations);
    pml-ntxent: its (B positives) x (B^2 negatives) masks, ~28 B^3 bytes for both directions.
    """
    bd = batch * dim * 4
    if method == "dense":  # AdaCL's anchor selection adds a delta buffer and masks
        per_entry = 10 if loss == "adacl" else 6
        return per_entry * batch * batch * max(elem, 4) + 6 * bd
    if method == "tiled":
        return 10 * min(chunk, batch) * batch * 4 + 8 * bd
    if method == "bare":
        return 2 * min(chunk, batch) * batch * elem + 4 * bd
    if method == "pml-ntxent":
        return 28 * batch**3 + 20 * batch * batch * 4
    if method == "pml-circle":
        return 20 * batch * batch * 4 + 6 * bd
    raise ValueError(method)


# ----------------------------------------------------------------------------- memory probes


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak_rss() -> None:
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")


sync = machine.sync  # bench_engine and bench_grad_cache use it from here


def make_inputs(batch: int, dim: int, dtype: torch.dtype, device: torch.device, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = F.normalize(torch.randn(batch, dim, generator=g), dim=1)
    y = F.normalize(x + 0.8 * torch.randn(batch, dim, generator=g), dim=1)
    x = x.to(device=device, dtype=dtype).requires_grad_(True)
    y = y.to(device=device, dtype=dtype).requires_grad_(True)
    return x, y


def worker(spec: dict) -> dict:
    """Runs in a fresh process: peak memory of the first step, then the timed steps."""
    if spec["threads"]:
        torch.set_num_threads(spec["threads"])
    device = machine.resolve_device(spec["device"])
    dtype = getattr(torch, spec["dtype"])
    step = make_step(spec["method"], spec["loss"], spec["chunk"])

    # Warm-up at a tiny size: loads kernels and thread pools without leaving big freed blocks.
    wx, wy = make_inputs(min(64, spec["batch"]), spec["dim"], dtype, device, seed=1)
    step(wx, wy)
    del wx, wy
    x, y = make_inputs(spec["batch"], spec["dim"], dtype, device)
    gc.collect()
    sync(device)

    def run_once() -> float:
        x.grad = y.grad = None
        sync(device)
        start = time.perf_counter()
        step(x, y)
        sync(device)
        return time.perf_counter() - start

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        first = run_once()
        peak = torch.cuda.max_memory_allocated(device) - base
    else:
        base = _status_kb("VmRSS")
        _reset_peak_rss()
        first = run_once()
        peak = (_status_kb("VmHWM") - base) * 1024
    # At least ``repeats`` steps, more (up to 1000) until 1 s is spent; never past the budget.
    times: list[float] = []
    while first + sum(times) < spec["time_budget"] and (
        len(times) < spec["repeats"] or (sum(times) < 1.0 and len(times) < 1000)
    ):
        times.append(run_once())
    return {"seconds": min(times) if times else first, "steps": len(times) or 1, "peak": peak}


def run_worker(spec: dict, timeout: float, src: str | None = None) -> dict:
    """Run ``spec`` in a fresh process; ``src``: import vlret from that source folder."""
    cmd = [sys.executable, os.path.abspath(__file__), "--_worker", json.dumps(spec)]
    env = None if src is None else {**os.environ, "PYTHONPATH": src}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or [""])[-1][:100]
        return {"error": f"failed (rc={proc.returncode}) {tail}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------- module overhead


def functional_pairs(loss: str, chunk: int):
    """(module, bare functional) for the tiled and the dense form, both with normalize=False."""
    tiled_fn = {
        "infonce": lambda x, y: tiled_infonce_loss(
            x, y, temperature=TEMPERATURE, chunk_size=chunk, normalize=False
        ),
        "unified": lambda x, y: tiled_unified_loss(
            x, y, margin=0.2, gamma=60.0, chunk_size=chunk, reduction="sum", normalize=False
        ),
        "triplet": lambda x, y: tiled_triplet_loss(
            x, y, margin=0.2, hardest=True, chunk_size=chunk, reduction="sum", normalize=False
        ),
        "goal": lambda x, y: tiled_goal_objective(x, y, chunk_size=chunk, normalize=False),
        "adacl-fixed": lambda x, y: tiled_adacl_loss(
            x, y, m1=20.0, m2=0.1, chunk_size=chunk, normalize=False
        ),
    }[loss]
    dense_fn = {
        "infonce": lambda x, y: infonce_loss(x @ y.t(), temperature=TEMPERATURE),
        "unified": lambda x, y: unified_loss(x @ y.t(), margin=0.2, gamma=60.0, reduction="sum"),
        "triplet": lambda x, y: triplet_loss(x @ y.t(), margin=0.2, hardest=True, reduction="sum"),
        "goal": lambda x, y: goal_objective(x @ y.t()),
        "adacl-fixed": lambda x, y: adacl_loss(x @ y.t(), m1=20.0, m2=0.1),
    }[loss]
    tiled_mod = make_module(loss, chunk, normalize=False)
    dense_mod = make_module(loss, None, normalize=False)
    return {"tiled": (tiled_mod, tiled_fn), "dense": (dense_mod, dense_fn)}


def module_overhead(loss, chunk, dim, dtype, device, repeats) -> dict[str, tuple[float, ...]]:
    """Median per-repeat ratio module / functional at B=128, interleaved; also median ms."""
    x, y = make_inputs(128, dim, dtype, device, seed=2)
    out = {}
    for form, (mod, fn) in functional_pairs(loss, chunk).items():
        ref = fn(x, y)
        assert torch.allclose(mod(x, y), ref, rtol=1e-4, atol=1e-6), (loss, form)
        t_mod, t_fn = [], []
        for k in range(repeats + 10):
            for f, acc in ((mod, t_mod), (fn, t_fn)):
                x.grad = y.grad = None
                sync(device)
                start = time.perf_counter()
                f(x, y).backward()
                sync(device)
                if k >= 10:
                    acc.append(time.perf_counter() - start)
        ratio = statistics.median(a / b for a, b in zip(t_mod, t_fn, strict=True))
        out[form] = (ratio, statistics.median(t_mod) * 1e3, statistics.median(t_fn) * 1e3)
    return out


# ----------------------------------------------------------------------------- main


def auto_chunk(batch: int, device: torch.device) -> int:
    """Largest power of two with a strip of <= 16 Mi (CPU) / 256 Mi (CUDA) elements, >= 128.

    On CPU that is a 64 MB float32 strip: with ~10 strip-sized temporaries alive at once, B=65536
    (chunk 256) stays well under the 2 GB target.
    """
    budget = (256 if device.type == "cuda" else 16) * 1024 * 1024
    chunk = 2 ** int(math.log2(max(1, budget // batch)))
    return max(1, min(batch, max(128, chunk)))


def total_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def fmt_result(res: dict | None, note: str = "") -> str:
    if res is None:
        return note
    if "error" in res:
        return res["error"]
    return f"{res['seconds']:9.3f} s {res['peak'] / MB:10.1f} MB   best of {res['steps']}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[128, 1024, 8192, 32768, 65536])
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    machine.add_device_arguments(parser, "cpu")
    parser.add_argument("--loss", nargs="+", choices=LOSSES, default=["infonce"])
    parser.add_argument("--chunk", default="auto", help="strip rows of tiled/bare, or 'auto'")
    parser.add_argument("--repeats", type=int, default=3, help="timed steps after the first")
    parser.add_argument("--time-budget", type=float, default=30.0, help="seconds per method")
    parser.add_argument("--overhead-repeats", type=int, default=200, help="B=128 module check")
    parser.add_argument("--max-mem-gb", type=float, default=None, help="default: 70%% of memory")
    parser.add_argument("--no-pml", action="store_true", help="skip pytorch-metric-learning")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per subprocess")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--_worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args._worker is not None:
        print(json.dumps(worker(json.loads(args._worker))))
        return

    device = machine.resolve_device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    elem = torch.finfo(dtype).bits // 8
    max_mem = args.max_mem_gb * GB if args.max_mem_gb else 0.7 * total_memory_bytes(device)
    have_pml = not args.no_pml and pml_installed()
    print(machine.device_line(device))
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {device}, "
        f"D={args.dim}, {args.dtype}, memory guard {max_mem / GB:.1f} GB, losses {args.loss}"
    )
    print(
        "seconds: one forward+backward (best of the timed steps); MB: peak beyond the inputs "
        + ("(CUDA max_memory_allocated)" if device.type == "cuda" else "(peak RSS, fresh process)")
    )
    if args.no_pml:
        print("pytorch-metric-learning: skipped (--no-pml)")
    elif not have_pml:
        print(f"pytorch-metric-learning: {PML_MISSING}")

    runs: list[dict] = []  # the JSON's "runs": one entry per (B, method, loss)
    ratios: list[dict] = []
    machine.record("runs", runs)
    machine.record("ratios", ratios)
    machine.record("settings", {"dim": args.dim, "dtype": args.dtype, "max_mem": max_mem})
    for batch in args.batch:
        chunk = auto_chunk(batch, device) if args.chunk == "auto" else int(args.chunk)
        print(f"\n=== B={batch}, chunk {chunk} (tiled and bare: {math.ceil(batch / chunk)} strips)")

        def measure(method: str, loss: str, batch=batch, chunk=chunk) -> tuple[dict | None, str]:
            need = estimate_bytes(method, batch, args.dim, chunk, elem, loss)
            if need > max_mem:
                note = f"does not fit (needs ~{need / GB:.1f} GB)"
                runs.append({"batch": batch, "method": method, "loss": loss, "skipped": note})
                return None, note
            spec = {
                "method": method,
                "loss": loss,
                "batch": batch,
                "dim": args.dim,
                "dtype": args.dtype,
                "device": str(device),
                "chunk": chunk,
                "repeats": args.repeats,
                "time_budget": args.time_budget,
                "threads": args.threads,
            }
            res = run_worker(spec, args.timeout)
            runs.append({"batch": batch, "method": method, "loss": loss, "chunk": chunk, **res})
            return res, ""

        bare, bare_note = measure("bare", args.loss[0])
        print(f"  {'bare 3 matmuls':<24} {fmt_result(bare, bare_note)}")
        for loss in args.loss:
            dense, dense_note = measure("dense", loss)
            tiled, tiled_note = measure("tiled", loss)
            print(f"  {loss + ' dense':<24} {fmt_result(dense, dense_note)}")
            print(f"  {loss + ' tiled':<24} {fmt_result(tiled, tiled_note)}")
            ok_tiled = tiled is not None and "error" not in tiled
            if ok_tiled and dense is not None and "error" not in dense:
                r = tiled["seconds"] / dense["seconds"]
                ratios.append({"batch": batch, "loss": loss, "ratio": "tiled/dense", "value": r})
                print(f"    tiled/dense time {r:6.2f}x   target <= 1.3x   {verdict(r <= 1.3)}")
            else:
                print("    tiled/dense time     n/a   (dense did not run)")
            if ok_tiled and bare is not None and "error" not in bare:
                r = tiled["seconds"] / bare["seconds"]
                ratios.append({"batch": batch, "loss": loss, "ratio": "tiled/bare", "value": r})
                tgt = verdict(r <= 1.6) if batch >= 8192 else "(target applies at B >= 8192)"
                print(f"    tiled/bare time  {r:6.2f}x   target <= 1.6x   {tgt}")
            if batch == 65536:
                small = ok_tiled and tiled["peak"] < 2 * GB
                print(
                    "    B=65536: tiled < 2 GB beyond inputs and dense cannot run: "
                    f"{verdict(small and (dense is None or 'error' in dense))}"
                )
            if batch == 128 and loss == "adacl":
                print("    module/functional: n/a (the module also re-estimates its margins)")
            elif batch == 128:
                over = module_overhead(loss, chunk, args.dim, dtype, device, args.overhead_repeats)
                for form, (r, ms_mod, ms_fn) in over.items():
                    ratios.append(
                        {
                            "batch": 128,
                            "loss": loss,
                            "ratio": f"module/functional {form}",
                            "value": r,
                        }
                    )
                    base = "adacl" if loss == "adacl-fixed" else loss
                    name = f"{base}_objective" if loss == "goal" else f"{base}_loss"
                    name = f"tiled_{name}" if form == "tiled" else name
                    print(
                        f"    module/functional ({form}: {ms_mod:.2f} vs {ms_fn:.2f} ms, "
                        f"{name}) {r:5.2f}x   target <= 1.15x   {verdict(r <= 1.15)}"
                    )
        for method in ("pml-ntxent", "pml-circle"):
            if not have_pml:
                continue
            res, note = measure(method, args.loss[0])
            print(f"  {method:<24} {fmt_result(res, note)}")
    machine.save_json(args.json, "bench_losses", device, argv)


if __name__ == "__main__":
    main()
