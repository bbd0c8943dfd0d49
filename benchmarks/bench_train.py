"""Training step speed of every registered loss, as a ratio to the triplet loss.

Model: VSE++ (BUTD) -- an FC layer on 36 x 2048 region features with max pooling and a GRU
text encoder (word 300, joint space 1024) -- trained by :class:`vlret.train.Trainer` at B=128
on generated precomputed features (written in the real SCAN format to a temporary folder).
Each step is the trainer's full step: forward, loss, backward, gradient clipping, Adam.
Losses are timed interleaved round by round (same data, same batches), and the median step
time of each is printed with its ratio to the triplet step. Targets: every loss within 1.1x,
VSL and AdaCL within 1.25x.

Usage: ``python benchmarks/bench_train.py [--rounds 5] [--batch 128] [--device auto]``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from vlret.data.writers import make_tiny_precomp
from vlret.losses import available_losses
from vlret.train import Trainer, config_from_dict

TARGET = {"vsl": 1.25, "adacl": 1.25}


def make_trainer(data: Path, out: Path, loss: str, batch: int, device: str) -> Trainer:
    raw = {
        "output_dir": str(out / loss),
        "data": {"root": str(data), "min_count": 1},
        "model": {
            "embed_dim": 1024,
            "image": {"kind": "precomp", "in_dim": 2048, "pooling": "max"},
            "text": {"kind": "gru", "word_dim": 300, "pooling": "last"},
        },
        "loss": {"name": loss},
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


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="timed steps per loss")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        n_images = max(2 * args.batch // 5 + 1, 64)
        make_tiny_precomp(
            tmp / "data",
            sizes={"train": n_images, "dev": 1},
            feature_shape=(36, 2048),
        )
        names = available_losses()
        trainers = {
            n: make_trainer(tmp / "data", tmp / "runs", n, args.batch, args.device) for n in names
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

    base = statistics.median(times["triplet"])
    print(
        f"VSE++ (BUTD) training step, B={args.batch}, device={device}, "
        f"{args.rounds} interleaved rounds (median)"
    )
    print(f"{'loss':<18} {'step ms':>9} {'steps/s':>8} {'x triplet':>10} {'target':>7}")
    for n in names:
        t = statistics.median(times[n])
        target = TARGET.get(n, 1.1)
        flag = "ok" if t / base <= target else "SLOW"
        print(f"{n:<18} {1e3 * t:9.1f} {1 / t:8.2f} {t / base:10.3f} {target:6.2f}x {flag}")


if __name__ == "__main__":
    main()
