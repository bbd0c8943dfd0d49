"""NCR's per-epoch loss pass vs a training epoch (issue 29, item 8).

After the warm-up, each NCR epoch starts with a pass that scores every training pair with both
networks (eval mode, no gradient, blocks of the batch size) and fits the two mixtures
(:meth:`vlret.train.procedures.ncr.NCRStep.before_epoch`); the epoch then trains both networks with
their predictions, refined labels and soft margins. This runs a tiny SGR NCR run on a synthetic
noisy precomp folder (20% of the captions re-paired) and times, in the same run, each NCR
epoch's division (pass + mixtures) and its training steps: epoch 1 before the noisy pairs
enter, epoch 2 with them. Target: pass <= 0.3x the training epoch.

The pass scores each distinct image of a block once (:mod:`vlret.train.procedures.ncr.blocks`:
consecutive captions share images). Side by side, each epoch also runs the division with every
block's whole ``B x B`` matrix scored, the released ``eval_train``'s work (same networks, same
blocks, same mixtures; the release's blocks are shuffled batches, and a whole block costs the
same whichever pairs it holds), after the shipped one, and prints its time and ratio, the
largest difference between the two passes' per-pair losses and whether the two divisions
agree; the run trains with the shipped pass's division. Last, on copies of both networks, it
times one epoch in the released ``co_train.py``'s structure (:func:`release_epoch`) and prints
the whole-block division's ratio to that: the release's own pass against the release's own
epoch. Before the noisy pairs enter, an epoch trains each network only on the pairs the other
network's division calls clean, so it is lighter the fewer those are (printed per epoch).

    .venv/bin/python benchmarks/bench_ncr.py [--images 60] [--batch 32] [--embed 64]
        [--sim-dim 32] [--regions 12] [--threads N]
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Subset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import machine  # noqa: E402
from vlret.data.writers import make_tiny_precomp  # noqa: E402
from vlret.run.config import config_from_dict  # noqa: E402
from vlret.train import Trainer  # noqa: E402
from vlret.train.hooks.core import TrainHook  # noqa: E402
from vlret.train.procedures.ncr import (  # noqa: E402
    clean_probability,
    predictions,
    soft_margin_factor,
    soft_margin_triplet,
)
from vlret.train.procedures.ncr import step as ncr_step  # noqa: E402


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


@contextmanager
def whole_blocks() -> Iterator[None]:
    """Inside, the pass scores every block's whole ``B x B`` matrix (no pair's image is taken
    as shared), as the released ``eval_train`` does."""
    real = ncr_step.distinct_images
    ncr_step.distinct_images = lambda batch: None
    try:
        yield
    finally:
        ncr_step.distinct_images = real


def release_epoch(ncr, ctx, *, batch_size: int, lr: float, clip: float, noisy_on: bool) -> float:
    """Seconds of one co-training epoch in the released ``co_train.py``'s structure, on copies
    of both networks (the run's own are untouched) and the epoch's division: each network in
    turn trains on the pairs the other's division calls clean (a shuffled loader of those
    only), and every step predicts its clean batch (the network, eval mode) and a batch of the
    noisy pairs (both networks, eval mode, whether or not it trains on them), then takes one
    Adam step on the clean batch's soft-margin loss, plus the noisy batch's from the noisy
    epochs on (the release: from ``num_epochs // 2``)."""
    ds, d = ctx.train_set, ncr.division
    nets = [copy.deepcopy(ctx.model), copy.deepcopy(ncr.model_b)]
    optimizers = [torch.optim.Adam(n.parameters(), lr=lr) for n in nets]
    generator = torch.Generator().manual_seed(ctx.epoch)

    def loader(where: np.ndarray) -> DataLoader:
        subset = Subset(ds, where.tolist())
        return DataLoader(
            subset, batch_size=batch_size, shuffle=True, collate_fn=ds.collate, generator=generator
        )

    def soft_loss(net, batch, labels):
        margins = ncr.margin * soft_margin_factor(labels, ncr.options.soft_margin)
        return soft_margin_triplet(ncr._scores(ctx, net, batch), margins, reduction="sum")

    def predict(net, batch):
        with ncr_step._eval_mode(net), torch.no_grad():
            return predictions(ncr._scores(ctx, net, batch), margin=ncr.margin)

    machine.sync(ctx.device)
    start = time.perf_counter()
    with torch.random.fork_rng(devices=[]):  # dropout draws leave the run's stream alone
        for k, (clean, prob) in enumerate(
            ((d["clean_b"], d["prob_b"]), (d["clean_a"], d["prob_a"]))
        ):
            net, other, opt = nets[k], nets[1 - k], optimizers[k]
            clean = clean.numpy()
            labeled, unlabeled = loader(np.flatnonzero(clean)), loader(np.flatnonzero(~clean))
            noisy = iter(unlabeled)
            for batch_l in labeled:
                batch_u = next(noisy, None)
                if batch_u is None:
                    noisy = iter(unlabeled)
                    batch_u = next(noisy, None)
                if len(batch_l.cap_index) < 2 or batch_u is None or len(batch_u.cap_index) < 2:
                    break  # the release stops at a one-pair batch (BatchNorm)
                batch_l, batch_u = batch_l.to(ctx.device), batch_u.to(ctx.device)
                w = prob[batch_l.cap_index.cpu()].float().to(ctx.device)
                target_l = w + (1 - w) * predict(net, batch_l)
                target_u = (predict(net, batch_u) + predict(other, batch_u)) / 2
                net.train()
                loss = soft_loss(net, batch_l, target_l)
                if noisy_on:
                    loss = loss + soft_loss(net, batch_u, target_u)
                opt.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(net.parameters(), clip)
                opt.step()
    machine.sync(ctx.device)
    return time.perf_counter() - start


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
    # sklearn's import and its first fit's thread-pool probe are paid once per process, not
    # per epoch: both before the clock, so neither of the two passes timed side by side pays them
    clean_probability(np.linspace(0.0, 1.0, 8))

    clock = Clock()
    trainer = Trainer(config, hooks=[clock], print_fn=None)
    ncr = trainer.loss_step
    divide, loss_pass = ncr.before_epoch, ncr.loss_pass
    #: epoch -> (seconds, per-pair losses, division) of each pass: "shipped", then "whole"
    runs: dict[int, dict[str, tuple[float, tuple[np.ndarray, np.ndarray], dict]]] = {}
    kept: list[tuple[np.ndarray, np.ndarray]] = []
    released: dict[int, float] = {}  # epoch -> seconds of the release-structured epoch

    def kept_pass(t) -> tuple[np.ndarray, np.ndarray]:
        kept.append(loss_pass(t))
        return kept[-1]

    def run_division(t, name: str) -> float:
        machine.sync(device)
        start = time.perf_counter()
        divide(t)
        machine.sync(device)
        seconds = time.perf_counter() - start
        if ncr.division is not None and ncr.division["epoch"] == t.epoch:
            runs.setdefault(t.epoch, {})[name] = (seconds, kept[-1], ncr.division)
        return seconds

    def timed(t) -> None:
        before = ncr.division  # the previous epoch's: each division below redoes this one
        clock.times.setdefault(t.epoch, [0.0, 0.0])[0] = run_division(t, "shipped")
        if t.epoch >= ncr.options.warmup_epochs:
            # second, so any warm cache favours the whole-block pass; the run trains with the
            # shipped pass's division
            shipped, ncr.division = ncr.division, before
            with whole_blocks():
                run_division(t, "whole")
            ncr.division = shipped
            released[t.epoch] = release_epoch(
                ncr,
                t,
                batch_size=args.batch,
                lr=config.optim.lr,
                clip=config.optim.grad_clip,
                noisy_on=t.epoch >= ncr.noisy_from,
            )

    # the hook list holds the object: its attributes are what the trainer calls
    ncr.before_epoch, ncr.loss_pass = timed, kept_pass
    trainer.fit()
    pairs = len(trainer.train_set)
    print(machine.device_line(device))
    print(
        f"SGR NCR, {pairs} training pairs, batch {args.batch}, embed {args.embed}, "
        f"sim_dim {args.sim_dim}, {args.regions} regions"
    )
    for epoch, what in ((1, "clean pairs only"), (2, "clean + noisy pairs")):
        division, steps = clock.times[epoch]
        reference, whole_losses, whole_division = runs[epoch]["whole"]
        _, shipped_losses, shipped_division = runs[epoch]["shipped"]
        diff = max(
            float(np.abs(a - b).max()) for a, b in zip(whole_losses, shipped_losses, strict=True)
        )
        same = all(
            torch.equal(whole_division[k], shipped_division[k]) for k in ("clean_a", "clean_b")
        )
        print(
            f"epoch {epoch} ({what}): division {division:.3f} s, training {steps:.3f} s, "
            f"pass / training epoch = {division / steps:.3f} (target <= 0.3)"
        )
        print(
            f"  whole-block division (the release's work) {reference:.3f} s, "
            f"pass / training epoch = {reference / steps:.3f}; per-pair losses differ by at "
            f"most {diff:.1e}, same clean / noisy split: {'yes' if same else 'NO'}"
        )
        print(
            f"  the release's epoch structure: training {released[epoch]:.3f} s, whole-block "
            f"division / that epoch = {reference / released[epoch]:.3f}"
        )
        fractions = [float(shipped_division[k].double().mean()) for k in ("clean_a", "clean_b")]
        print(
            f"  clean pairs: {100 * fractions[0]:.1f}% by A's division (B trains on them), "
            f"{100 * fractions[1]:.1f}% by B's (A trains on them)"
        )
        machine.record(
            f"epoch {epoch}",
            {
                "division_s": division,
                "training_s": steps,
                "ratio": division / steps,
                "whole_block_s": reference,
                "whole_block_ratio": reference / steps,
                "max_loss_diff": diff,
                "same_split": same,
                "release_epoch_s": released[epoch],
                "release_ratio": reference / released[epoch],
                "clean_fraction_a": fractions[0],
                "clean_fraction_b": fractions[1],
            },
        )
    machine.save_json(args.json, "bench_ncr", device, argv)


if __name__ == "__main__":
    main()
