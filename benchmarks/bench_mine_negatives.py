"""`vlret mine-negatives` scoring rate vs the bare score-matrix GEMM (issue 29, item 8).

Mining scores every caption against every image in blocks of captions and keeps each caption's
top-K images and each image's top-K captions (:func:`vlret.train.mining.mine_embeddings`). The
lower bound is the bare GEMM of the same blocks (``txt[t0:t1] @ img.T``, nothing kept). Both run
side by side on the same unit-norm embeddings (float32), alternating, best of ``--repeats``;
the rate is image-caption pairs scored per second. Target: mining >= 0.8x the GEMM rate.

    .venv/bin/python benchmarks/bench_mine_negatives.py [--images 4000] [--captions 20000]
        [--dim 1024] [--k 300] [--block 1024] [--repeats 2] [--threads N] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import cpu_name, load_average  # noqa: E402
from vlret.train.mining import mine_embeddings  # noqa: E402


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bare_gemm(img: torch.Tensor, txt: torch.Tensor, block: int) -> float:
    """Seconds of the block products alone (each block reduced to one number, so it is kept)."""
    start = time.perf_counter()
    total = img.new_zeros(())
    for t0 in range(0, txt.shape[0], block):
        total += (txt[t0 : t0 + block] @ img.T)[0, 0]
    sync(img.device)
    _ = float(total)
    return time.perf_counter() - start


def mining(img: torch.Tensor, txt: torch.Tensor, t2i: torch.Tensor, k: int, block: int) -> float:
    start = time.perf_counter()
    mine_embeddings(img, txt, t2i, k=k, block_size=block, device=img.device)
    sync(img.device)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=4000)
    p.add_argument("--captions", type=int, default=20000)
    p.add_argument("--dim", type=int, default=1024)
    p.add_argument("--k", type=int, default=300)
    p.add_argument("--block", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    g = torch.Generator().manual_seed(0)
    img = F.normalize(torch.randn(args.images, args.dim, generator=g), dim=1).to(device)
    # captions near their image, so the top-K lists are not random
    t2i = torch.arange(args.captions) % args.images
    noise = torch.randn(args.captions, args.dim, generator=g).to(device)
    txt = F.normalize(img[t2i.to(device)] + 2.0 * noise / args.dim**0.5, dim=1)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
    print(
        f"device: {device} ({name}), torch threads {torch.get_num_threads()}, load {load_average()}"
    )
    print(
        f"sizes: {args.images} images x {args.captions} captions, D={args.dim}, "
        f"K={args.k}, block {args.block} captions, float32"
    )
    mining(img[: args.k + 2], txt[: 2 * args.k], t2i[: 2 * args.k] % (args.k + 2), args.k, 64)
    bare_gemm(img, txt[: args.block], args.block)  # warm-up of both
    gemm_s, mine_s = [], []
    for _ in range(args.repeats):
        gemm_s.append(bare_gemm(img, txt, args.block))
        mine_s.append(mining(img, txt, t2i, args.k, args.block))
    pairs = args.images * args.captions
    gemm_rate, mine_rate = pairs / min(gemm_s), pairs / min(mine_s)
    print(f"bare GEMM       {min(gemm_s):8.3f} s  {gemm_rate / 1e6:10.1f} M pairs/s")
    print(f"mine-negatives  {min(mine_s):8.3f} s  {mine_rate / 1e6:10.1f} M pairs/s")
    ratio = mine_rate / gemm_rate
    print(f"mining / GEMM rate: {ratio:.2f}x (target >= 0.8x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
