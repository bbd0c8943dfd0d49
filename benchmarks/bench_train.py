"""Training step speed of every registered loss, as a ratio to the triplet loss.

Model: VSE++ (BUTD) -- an FC layer on 36 x 2048 region features with max pooling and a GRU
text encoder (word 300, joint space 1024) -- trained by :class:`vlret.train.Trainer` at B=128
on generated precomputed features (written in the real SCAN format to a temporary folder).
Each step is the trainer's full step: forward, loss, backward, gradient clipping, Adam.
Losses are timed interleaved round by round (same data, same batches), and the median step
time of each is printed with its ratio to the triplet step. Targets: every loss within 1.1x,
VSL and AdaCL within 1.25x.

Two extra rows time AdaCL in the paper's setting (``configs/adacl_*.toml``, AdaCL Sec. 4.1):
``adacl-paper`` -- joint space 256, bi-GRU text encoder, memory queue of 4096 keys per
modality filled by a momentum encoder (0.99), so each step also scores the batch against
4096 + 4096 queue keys and runs the momentum encoder's forward -- and ``triplet-256``, the
triplet loss on that same model, its baseline (ratio printed against it; no target: the
momentum encoder's extra forward pass is part of the method). The queue's size is fixed, so
its cost does not depend on how full it is.

Usage: ``python benchmarks/bench_train.py [--rounds 5] [--batch 128] [--device auto] [--json F]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader

from vlret.data.writers import make_tiny_precomp
from vlret.losses import available_losses
from vlret.run import config_from_dict
from vlret.train import Trainer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import machine  # noqa: E402

TARGET = {"vsl": 1.25, "adacl": 1.25}


@dataclass(frozen=True)
class Row:
    """One timed setting: a loss on a model; ``baseline`` is the row its ratio is taken to."""

    loss: str
    loss_params: dict[str, Any] = field(default_factory=dict)
    embed_dim: int = 1024
    bidirectional: bool = False
    momentum_encoder: float | None = None
    baseline: str = "triplet"
    target: float | None = 1.1


#: Losses that cannot train without a data file of their own, and what they need (their step
#: is timed elsewhere: AOQ's offline items in ``bench_mine_negatives.py``'s setting).
NEEDS_DATA = {"aoq": "data.offline_negatives, a `vlret mine-negatives` file"}


def rows() -> dict[str, Row]:
    """Every registered loss on VSE++ (BUTD) but :data:`NEEDS_DATA`, then AdaCL's paper setting
    and its baseline."""
    for name, need in NEEDS_DATA.items():
        print(f"{name}: not timed (needs {need})")
    out = {n: Row(n, target=TARGET.get(n, 1.1)) for n in available_losses() if n not in NEEDS_DATA}
    paper_model = {"embed_dim": 256, "bidirectional": True, "baseline": "triplet-256"}
    out["triplet-256"] = Row("triplet", target=None, **paper_model)
    out["adacl-paper"] = Row(
        "adacl",
        {"queue_size": 4096},
        momentum_encoder=0.99,
        target=None,
        **paper_model,
    )
    return out


def make_trainer(data: Path, out: Path, name: str, row: Row, batch: int, device: str) -> Trainer:
    raw = {
        "output_dir": str(out / name),
        "data": {"root": str(data), "min_count": 1},
        "model": {
            "embed_dim": row.embed_dim,
            "image": {"kind": "precomp", "in_dim": 2048, "pooling": "max"},
            "text": {
                "kind": "gru",
                "word_dim": 300,
                "bidirectional": row.bidirectional,
                "pooling": "last",
            },
        },
        "loss": {"name": row.loss, **row.loss_params},
        "optim": {"name": "adam", "lr": 5e-4},
        "train": {
            "epochs": 1,
            "batch_size": batch,
            "seed": 0,
            "validate": False,
            "progress": False,
            "device": device,
        },
    }
    if row.momentum_encoder is not None:
        raw["train"]["momentum_encoder"] = row.momentum_encoder
    return Trainer(config_from_dict(raw))


def batches(trainer: Trainer, n: int) -> list:
    trainer.sampler.set_epoch(0)
    loader = DataLoader(
        trainer.train_set, batch_sampler=trainer.sampler, collate_fn=trainer.train_set.collate
    )
    out = []
    for b in loader:
        out.append(b.to(trainer.device))
        if len(out) == n:
            break
    return out


sync = machine.sync


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="timed steps per loss")
    parser.add_argument("--batch", type=int, default=128)
    machine.add_device_arguments(parser, "auto")
    args = parser.parse_args(argv)
    args.device = str(machine.resolve_device(args.device))
    print(machine.device_line(args.device))

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        n_images = max(2 * args.batch // 5 + 1, 64)
        make_tiny_precomp(
            tmp / "data",
            sizes={"train": n_images, "dev": 1},
            feature_shape=(36, 2048),
        )
        settings = rows()
        names = list(settings)
        trainers = {
            n: make_trainer(tmp / "data", tmp / "runs", n, row, args.batch, args.device)
            for n, row in settings.items()
        }
        device = trainers["triplet"].device
        data = batches(trainers["triplet"], 2)
        times: dict[str, list[float]] = {n: [] for n in names}
        for n in names:  # warm-up
            trainers[n].train_step(data[0])
        sync(device)
        for r in range(args.rounds):
            for n in names:
                t0 = time.perf_counter()
                trainers[n].train_step(data[r % len(data)])
                sync(device)
                times[n].append(time.perf_counter() - t0)

    print(
        f"VSE++ (BUTD) training step, B={args.batch}, device={device}, "
        f"{args.rounds} interleaved rounds (median)"
    )
    header = f"{'loss':<18} {'step ms':>9} {'steps/s':>8} {'ratio':>7} {'to':<12} {'target':>7}"
    print(header)
    for n, row in settings.items():
        t = statistics.median(times[n])
        ratio = t / statistics.median(times[row.baseline])
        if row.target is None:
            goal = f"{'-':>7}"
        else:
            goal = f"{row.target:6.2f}x {'ok' if ratio <= row.target else 'SLOW'}"
        print(f"{n:<18} {1e3 * t:9.1f} {1 / t:8.2f} {ratio:7.3f} {row.baseline:<12} {goal}")
        machine.record(n, {"step_ms": 1e3 * t, "ratio": ratio, "to": row.baseline})
    machine.save_json(args.json, "bench_train", device, argv)


if __name__ == "__main__":
    main()
