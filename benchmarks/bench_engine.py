"""The streaming engine (issue 14) against the code before it: bench_losses ratios side by side.

For each loss this runs ``bench_losses.py``'s fresh-process workers on the current checkout and
on an older revision (``--before``, default ``1fd8c76``, the last commit before the engine,
checked out into a temporary ``git worktree``), alternating the two in every round, and
reports the ratios issue 14 keeps within 5% of their old values:

* ``tiled / bare`` at ``B=8192`` (D=512, float32, chunk as ``bench_losses``): the tiled step
  against the three bare matrix products of the same tiles;
* ``tiled / dense`` at ``B=128``: the tiled step against the dense module.

Each time is the best over ``--rounds`` rounds (each round: best of the worker's steps). The
ratio ``after / before`` of each ratio is printed with the verdict (target: within 5%).

``--loss adacl`` (``AdaCLLoss`` in training mode: the margin update of every step included, no
queue) also prints issue 31's figure, "AdaCL tiled training / 3-GEMM bound" at B=8192, before
and after: the median over rounds of each round's ``tiled / bare`` (the two measured back to
back), with the range, against the target <= 1.6x. Issue 31 compares with 6b209b6:

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_engine.py --loss adacl --batches 8192
        --before 6b209b6 --rounds 5

    .venv/bin/python benchmarks/bench_engine.py [--before REV] [--rounds 2] [--threads 1]
        [--loss infonce unified triplet goal adacl adacl-fixed] [--repeats 3]
        [--time-budget 20] [--batches 8192 128] [--device cpu|cuda|cuda:N|auto] [--json FILE]

On CUDA the chunk is ``bench_losses``' CUDA rule (strips of <= 256 Mi elements).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_losses  # noqa: E402  (the workers and the chunk rule are bench_losses')
import machine  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CASES = ((8192, "tiled"), (8192, "bare"), (128, "tiled"), (128, "dense"))


def _spec(args, loss: str, batch: int, method: str) -> dict:
    return {
        "method": method,
        "loss": loss,
        "batch": batch,
        "dim": 512,
        "dtype": "float32",
        "device": args.device,
        "chunk": bench_losses.auto_chunk(batch, torch.device(args.device)),
        "repeats": args.repeats,
        "time_budget": args.time_budget,
        "threads": args.threads,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="1fd8c76", help="the revision to compare with")
    parser.add_argument("--loss", nargs="+", default=["infonce", "unified", "triplet", "goal"])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--time-budget", type=float, default=20.0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--batches", type=int, nargs="+", default=[8192, 128], help="which of 8192 and 128 to run"
    )
    machine.add_device_arguments(parser, "cpu")
    args = parser.parse_args(argv)
    device = machine.resolve_device(args.device)
    args.device = str(device)  # what the workers get
    print(machine.device_line(device))
    with tempfile.TemporaryDirectory(prefix="vlret-before-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(tree), args.before],
            check=True,
        )
        try:
            sources = {"before": str(tree / "src"), "after": str(ROOT / "src")}
            best: dict[tuple, float] = {}
            seconds: dict[tuple, list[float]] = {}  # every round's, for the per-round ratios
            for round_ in range(args.rounds):
                for loss in args.loss:
                    for batch, method in CASES:
                        if batch not in args.batches:
                            continue
                        if method == "bare" and loss != args.loss[0]:
                            continue  # the bare products do not depend on the loss
                        for version, src in sources.items():
                            spec = _spec(args, loss, batch, method)
                            res = bench_losses.run_worker(spec, 3600.0, src)
                            if "error" in res:
                                print(f"{version} {loss} {method} B={batch}: {res['error']}")
                                return 1
                            key = (version, loss if method != "bare" else "", batch, method)
                            best[key] = min(best.get(key, float("inf")), res["seconds"])
                            seconds.setdefault(key, []).append(res["seconds"])
                print(f"round {round_ + 1}/{args.rounds} done", flush=True)
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False
            )
    print(
        f"\ntorch {torch.__version__}, {args.threads} thread(s), D=512 float32, before = "
        f"{args.before}; seconds are the best over {args.rounds} rounds"
    )
    print(f"{'loss':<9} {'ratio':<18} {'before':>8} {'after':>8} {'after/before':>13}  target")
    ok = True
    for loss in args.loss:
        for label, num, den in (
            ("tiled/bare B=8192", (loss, 8192, "tiled"), ("", 8192, "bare")),
            ("tiled/dense B=128", (loss, 128, "tiled"), (loss, 128, "dense")),
        ):
            if num[1] not in args.batches:
                continue
            ratios = [best[(v, *num)] / best[(v, *den)] for v in ("before", "after")]
            change = ratios[1] / ratios[0]
            met = change <= 1.05
            ok &= met
            machine.record(f"{loss} {label}", {"before": ratios[0], "after": ratios[1]})
            print(
                f"{loss:<9} {label:<18} {ratios[0]:8.3f} {ratios[1]:8.3f} {change:12.3f}x  "
                f"<= 1.05x {'met' if met else 'MISSED'}"
            )
    if "adacl" in args.loss and 8192 in args.batches:
        _adacl_bound(seconds, args.rounds)
    machine.save_json(args.json, "bench_engine", device, argv)
    return 0 if ok else 2


def _adacl_bound(seconds: dict[tuple, list[float]], rounds: int) -> None:
    """Issue 31: the AdaCL training step, tiled, over the 3-GEMM bound, per-round ratios."""
    print(
        "\nAdaCL tiled training / 3-GEMM bound (B=8192, D=512, training mode, margin update "
        f"every step): median of {rounds} per-round ratios [min - max]"
    )
    figures = {}
    for version in ("before", "after"):
        tiled = seconds[(version, "adacl", 8192, "tiled")]
        bare = seconds[(version, "", 8192, "bare")]
        ratios = [t / b for t, b in zip(tiled, bare, strict=True)]
        figures[version] = statistics.median(ratios)
        machine.record(f"adacl training tiled/bare B=8192 {version}", ratios)
        print(
            f"  {version:<7} {figures[version]:6.2f}x  [{min(ratios):.2f} - {max(ratios):.2f}]"
            f"   tiled {statistics.median(tiled):6.2f} s, bare {statistics.median(bare):6.2f} s"
        )
    met = figures["after"] <= 1.6
    print(f"  after: target <= 1.6x {'met' if met else 'MISSED'}")


if __name__ == "__main__":
    sys.exit(main())
