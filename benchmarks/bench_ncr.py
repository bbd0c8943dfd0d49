"""NCR's per-epoch loss pass vs a training epoch (issue 29, item 8).

After the warm-up, each NCR epoch starts with a pass that scores every training pair with both
networks (eval mode, no gradient, blocks of the batch size) and fits the two mixtures
(:meth:`vlret.train.procedures.ncr.NCRStep.before_epoch`); the epoch then trains both networks with
their predictions, refined labels and soft margins. This runs a tiny SGR NCR run on a synthetic
noisy precomp folder (20% of the captions re-paired) and times, in the same run, each NCR
epoch's division (pass + mixtures) and its training steps: epoch 1 before the noisy pairs
enter, epoch 2 with them. Target: pass <= 0.3x the training epoch.

    .venv/bin/python benchmarks/bench_ncr.py [--images 60] [--batch 32] [--embed 64]
        [--sim-dim 32] [--regions 12] [--threads N]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import machine  # noqa: E402
from vlret.data.writers import make_tiny_precomp  # noqa: E402
from vlret.run.config import config_from_dict  # noqa: E402
from vlret.train import Trainer  # noqa: E402
from vlret.train.hooks.core import TrainHook  # noqa: E402


class Clock(TrainHook):
    """Epoch -> (division seconds, training-step seconds); runs after NCR's own hook."""

    def __init__(self) -> None:
        self.times: dict[int, list[float]] = {}
        self.start = 0.0
        self.last = 0.0

    def before_epoch(self, trainer) -> None:
        machine.sync(trainer.device)
        self.start = time.perf_counter()

    def after_step(self, trainer, step) -> None:
        machine.sync(trainer.device)
        self.last = time.perf_counter()

    def after_epoch(self, trainer, record) -> None:
        self.times.setdefault(trainer.epoch - 1, [0.0, 0.0])[1] = self.last - self.start


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=60)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--embed", type=int, default=64)
    ap.add_argument("--sim-dim", type=int, default=32)
    ap.add_argument("--regions", type=int, default=12)
    ap.add_argument("--threads", type=int, default=None)
    machine.add_device_arguments(ap, "cpu")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = machine.resolve_device(args.device)
    root = Path(tempfile.mkdtemp(prefix="bench_ncr_"))
    in_dim = 2 * args.embed
    make_tiny_precomp(
        root / "data",
        sizes={"train": args.images, "dev": 2, "test": 2},
        feature_shape=(args.regions, in_dim),
    )
    config = config_from_dict(
        {
            "output_dir": str(root / "run"),
            "data": {
                "root": str(root / "data"),
                "format": "precomp",
                "min_count": 1,
                "noise_ratio": 0.2,
            },
            "model": {
                "kind": "sgraf",
                "embed_dim": args.embed,
                "module": "sgr",
                "sim_dim": args.sim_dim,
                "sgr_steps": 3,
                "num_regions": args.regions,
                "image": {"in_dim": in_dim},
                "text": {"word_dim": 32},
            },
            "loss": {"name": "triplet"},
            "optim": {"grad_clip": 2.0},
            "train": {
                "epochs": 3,
                "batch_size": args.batch,
                "progress": False,
                "validate": False,
                "procedure": "ncr",
                "procedure_options": {"warmup_epochs": 1, "noisy_from": 2},
                "device": str(device),
            },
        }
    )
    import sklearn.mixture  # noqa: F401 (imported before the clock: not the pass's cost)

    clock = Clock()
    trainer = Trainer(config, hooks=[clock], print_fn=None)
    ncr = trainer.loss_step
    divide = ncr.before_epoch

    def timed(t) -> None:
        machine.sync(device)
        start = time.perf_counter()
        divide(t)
        machine.sync(device)
        clock.times.setdefault(t.epoch, [0.0, 0.0])[0] = time.perf_counter() - start

    ncr.before_epoch = timed  # the hook list holds the object: its attribute is called
    trainer.fit()
    pairs = len(trainer.train_set)
    print(machine.device_line(device))
    print(
        f"SGR NCR, {pairs} training pairs, batch {args.batch}, embed {args.embed}, "
        f"sim_dim {args.sim_dim}, {args.regions} regions"
    )
    for epoch, what in ((1, "clean pairs only"), (2, "clean + noisy pairs")):
        division, steps = clock.times[epoch]
        print(
            f"epoch {epoch} ({what}): division {division:.3f} s, training {steps:.3f} s, "
            f"pass / training epoch = {division / steps:.3f} (target <= 0.3)"
        )
        machine.record(
            f"epoch {epoch}",
            {"division_s": division, "training_s": steps, "ratio": division / steps},
        )
    machine.save_json(args.json, "bench_ncr", device, argv)


if __name__ == "__main__":
    main()
