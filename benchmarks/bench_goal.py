"""GOAL objective vs the autograd triplet loss, forward + backward, measured side by side.

Each step includes the embedding matmul ``S = x y^T`` (x, y: (B, D) leaves that require grad),
the loss and the backward pass to x and y. The two methods alternate within each round and
the median over rounds is reported, so machine noise hits both alike. Target: GOAL <= 1.5x
the triplet loss (hardest negative, the VSE++ loss GOAL replaces).

    python benchmarks/bench_goal.py [--batch 128 1024] [--dim 1024] [--rounds 15] [--threads N]
        [--all]

``--all`` also times every one of the 15 (triplet weight, pair weight) combinations.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

from vlret.losses import PAIR_WEIGHTS, TRIPLET_WEIGHTS, goal_objective, triplet_loss

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import machine  # noqa: E402


def make_step(loss_fn, x: torch.Tensor, y: torch.Tensor):
    def step() -> None:
        x.grad = y.grad = None
        loss_fn(x @ y.t()).backward()

    return step


def time_side_by_side(steps: dict, rounds: int, sync) -> dict[str, float]:
    for step in steps.values():  # warm-up
        step()
        step()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            sync()
            start = time.perf_counter()
            step()
            sync()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[128, 1024])
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=15)
    machine.add_device_arguments(parser, "cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument("--all", action="store_true", help="time all 15 combinations")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = machine.resolve_device(args.device)

    def sync() -> None:
        machine.sync(device)

    print(machine.device_line(device))

    print(
        f"torch {torch.__version__}, device {device}, threads {torch.get_num_threads()}, "
        f"D={args.dim}, median of {args.rounds} rounds, forward+backward incl. S = x y^T"
    )
    for batch in args.batch:
        g = torch.Generator().manual_seed(0)
        x = torch.nn.functional.normalize(torch.randn(batch, args.dim, generator=g), dim=1)
        y = torch.nn.functional.normalize(x + torch.randn(batch, args.dim, generator=g), dim=1)
        x = x.to(device).requires_grad_(True)
        y = y.to(device).requires_grad_(True)
        steps = {
            "triplet (hardest, autograd)": make_step(
                lambda s: triplet_loss(s, margin=0.2, hardest=True), x, y
            ),
            "goal (cir, sig-ms) default": make_step(goal_objective, x, y),
            "goal (con, con)": make_step(
                lambda s: goal_objective(s, triplet_weight="con", pair_weight="con"), x, y
            ),
        }
        if args.all:
            for t in TRIPLET_WEIGHTS:
                for p in PAIR_WEIGHTS:
                    steps[f"goal ({t}, {p})"] = make_step(
                        lambda s, t=t, p=p: goal_objective(s, triplet_weight=t, pair_weight=p),
                        x,
                        y,
                    )
        medians = time_side_by_side(steps, args.rounds, sync)
        base = medians["triplet (hardest, autograd)"]
        print(f"\nB={batch}")
        for name, t in medians.items():
            print(f"  {name:<30} {t * 1e3:9.2f} ms   {t / base:5.2f}x triplet")
        machine.record(
            f"B={batch}",
            {name: {"ms": t * 1e3, "x_triplet": t / base} for name, t in medians.items()},
        )
    machine.save_json(args.json, "bench_goal", device, argv)


if __name__ == "__main__":
    main()
