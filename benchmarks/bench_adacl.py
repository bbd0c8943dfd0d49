"""AdaCL step cost against InfoNCE on the same inputs, measured side by side in one run.

One step = forward from embeddings (normalise, similarities, loss) + backward + state update.
For AdaCL the state update is the margin re-estimation (Algorithm 1 steps 2-5, inside the
training-mode forward) plus, with a queue, enqueueing the batch. Cases (paper Sec. 4.1, A.9,
D = 256):

* B=64 with a full 4096-entry queue: ``AdaCLLoss(queue_size=4096)`` against a MoCo-style
  InfoNCE over the same in-batch and queue negatives (same id masks, same enqueue), and, for
  reference, against the library's in-batch ``InfoNCELoss`` (which has no queue).
* B=128 without a queue: ``AdaCLLoss()`` against ``InfoNCELoss``.

Contenders run interleaved, repeat by repeat; a ratio is the median of the per-repeat ratios,
which is robust to load changes on a shared machine. Target <= 1.5x.

    .venv/bin/python benchmarks/bench_adacl.py [--repeats 100] [--threads N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from vlret.losses import AdaCLLoss, InfoNCELoss
from vlret.memory import MemoryQueue

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import machine  # noqa: E402

DIM = 256
TEMPERATURE = 0.05
DEVICE = torch.device("cpu")


def sync() -> None:
    machine.sync(DEVICE)


def moco_infonce(
    img: torch.Tensor,
    txt: torch.Tensor,
    ids: torch.Tensor,
    img_queue: MemoryQueue,
    txt_queue: MemoryQueue,
) -> torch.Tensor:
    """Bidirectional InfoNCE with queue negatives (the baseline), same reduction as vlret."""
    img_n, txt_n = F.normalize(img, dim=1), F.normalize(txt, dim=1)
    q_txt, q_img = txt_queue.keys.clone(), img_queue.keys.clone()
    fill = torch.finfo(img_n.dtype).min
    i2t = torch.cat(
        [img_n @ txt_n.t(), (img_n @ q_txt.t()).masked_fill(~txt_queue.negative_mask(ids), fill)],
        dim=1,
    )
    t2i = torch.cat(
        [txt_n @ img_n.t(), (txt_n @ q_img.t()).masked_fill(~img_queue.negative_mask(ids), fill)],
        dim=1,
    )
    labels = torch.arange(img.shape[0])
    loss = F.cross_entropy(i2t / TEMPERATURE, labels, reduction="none") + F.cross_entropy(
        t2i / TEMPERATURE, labels, reduction="none"
    )
    img_queue.enqueue(img_n.detach(), ids)
    txt_queue.enqueue(txt_n.detach(), ids)
    return loss.mean()


def make_batches(batch: int, count: int, seed: int) -> list[tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for k in range(count):
        img = torch.randn(batch, DIM, generator=g)
        txt = img + 0.8 * torch.randn(batch, DIM, generator=g)
        ids = torch.arange(batch) + batch * k
        img, txt, ids = img.to(DEVICE), txt.to(DEVICE), ids.to(DEVICE)
        out.append((img.requires_grad_(True), txt.requires_grad_(True), ids))
    return out


def fill(queue: MemoryQueue, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    keys = F.normalize(torch.randn(queue.size, queue.dim, generator=g), dim=1)
    queue.enqueue(keys.to(DEVICE), (torch.arange(queue.size) + 10_000_000).to(DEVICE))


def measure(
    contenders: dict[str, Callable[[tuple[torch.Tensor, ...]], torch.Tensor]],
    batches: list[tuple[torch.Tensor, ...]],
    warmup: int,
) -> dict[str, list[float]]:
    """Seconds per step of each contender; they run in turn on each batch (interleaved)."""
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for k, batch in enumerate(batches):
        for name, step in contenders.items():
            img, txt, _ = batch
            img.grad = txt.grad = None
            sync()
            t0 = time.perf_counter()
            step(batch).backward()
            sync()
            elapsed = time.perf_counter() - t0
            if k >= warmup:
                times[name].append(elapsed)
    return times


def paired_ratio(a: list[float], b: list[float]) -> float:
    """Median over repeats of a_i / b_i: adjacent steps share the machine's load of the moment."""
    return statistics.median(x / y for x, y in zip(a, b, strict=True))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    machine.add_device_arguments(parser, "cpu")
    args = parser.parse_args(argv)
    global DEVICE
    DEVICE = machine.resolve_device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(machine.device_line(DEVICE))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {DEVICE}, D={DIM}")
    print(f"median of {args.repeats} interleaved steps (forward + backward + state update)\n")

    # B=64 with a 4096 queue.
    adacl_q = AdaCLLoss(queue_size=4096, embed_dim=DIM).to(DEVICE).train()
    fill(adacl_q.img_queue, 1)
    fill(adacl_q.txt_queue, 2)
    base_img_q = MemoryQueue(4096, DIM).to(DEVICE)
    base_txt_q = MemoryQueue(4096, DIM).to(DEVICE)
    fill(base_img_q, 1)
    fill(base_txt_q, 2)
    infonce = InfoNCELoss(temperature=TEMPERATURE)
    t64 = measure(
        {
            "adacl": lambda b: adacl_q(b[0], b[1], b[2]),
            "infonce_queue": lambda b: moco_infonce(b[0], b[1], b[2], base_img_q, base_txt_q),
            "infonce_inbatch": lambda b: infonce(b[0], b[1], b[2]),
        },
        make_batches(64, args.repeats + args.warmup, seed=3),
        args.warmup,
    )
    # B=128 without a queue.
    adacl = AdaCLLoss().to(DEVICE).train()
    t128 = measure(
        {
            "adacl": lambda b: adacl(b[0], b[1], b[2]),
            "infonce": lambda b: infonce(b[0], b[1], b[2]),
        },
        make_batches(128, args.repeats + args.warmup, seed=4),
        args.warmup,
    )

    rows = [
        ("B=64, queue 4096", "InfoNCE + same queue", t64["adacl"], t64["infonce_queue"]),
        ("B=64, queue 4096", "InfoNCE in-batch (ref.)", t64["adacl"], t64["infonce_inbatch"]),
        ("B=128, no queue", "InfoNCE", t128["adacl"], t128["infonce"]),
    ]
    med = statistics.median
    print(f"{'case':<18} {'baseline':<24} {'AdaCL ms':>9} {'base ms':>9} {'ratio':>7}  target")
    for case, base, a, b in rows:
        ratio = paired_ratio(a, b)
        verdict = "n/a" if base.endswith("(ref.)") else ("met" if ratio <= 1.5 else "MISSED")
        ms = f"{med(a) * 1e3:9.2f} {med(b) * 1e3:9.2f}"
        print(f"{case:<18} {base:<24} {ms} {ratio:6.2f}x  {verdict}")
        machine.record(
            f"{case} vs {base}", {"adacl_ms": med(a) * 1e3, "base_ms": med(b) * 1e3, "ratio": ratio}
        )
    print("(ms: medians; ratio: median of per-repeat ratios of interleaved steps)")
    print(f"\nlast AdaCL stats (B=128): {adacl.last_stats}")
    machine.save_json(args.json, "bench_adacl", DEVICE, argv)


if __name__ == "__main__":
    main()
