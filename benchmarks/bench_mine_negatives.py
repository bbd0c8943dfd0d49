"""`vlret mine-negatives` scoring rate vs the bare score-matrix GEMM (issue 29, item 8).

Mining scores every caption against every image in blocks of captions and keeps each caption's
top-K images and each image's top-K captions (:func:`vlret.run.mining.mine_embeddings`). The
lower bound is the bare GEMM of the same blocks (``txt[t0:t1] @ img.T``, nothing kept). Both run
side by side on the same unit-norm embeddings (float32), alternating, best of ``--repeats``;
the rate is image-caption pairs scored per second. Target: mining >= 0.8x the GEMM rate.
``--previous`` also times the implementation before issue 29's item 8 (kept below as a
reference: float ``topk`` per block, a stable-sort pass for ties, a padded merge per image)
and checks that both give the same lists.

    .venv/bin/python benchmarks/bench_mine_negatives.py [--images 4000] [--captions 20000]
        [--dim 1024] [--k 300] [--block 1024] [--repeats 2] [--threads N] [--device cpu|cuda]
        [--previous]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import machine  # noqa: E402
from machine import load_average  # noqa: E402
from vlret.run.mining import mine_embeddings  # noqa: E402


def sync(device: torch.device) -> None:
    machine.sync(device)


def bare_gemm(img: torch.Tensor, txt: torch.Tensor, block: int) -> float:
    """Seconds of the block products alone (each block reduced to one number, so it is kept)."""
    start = time.perf_counter()
    total = img.new_zeros(())
    for t0 in range(0, txt.shape[0], block):
        total += (txt[t0 : t0 + block] @ img.T)[0, 0]
    sync(img.device)
    _ = float(total)
    return time.perf_counter() - start


def mining(img, txt, t2i, k: int, block: int, out: list | None = None) -> float:
    start = time.perf_counter()
    mined = mine_embeddings(img, txt, t2i, k=k, block_size=block, device=img.device)
    sync(img.device)
    seconds = time.perf_counter() - start
    if out is not None:
        out[:] = [mined.i2t, mined.t2i]
    return seconds


# ----------------------------------------------------------------------------- the previous way


def _old_top_k(values: torch.Tensor, k: int, ids: torch.Tensor | None = None):
    """``(scores, ids)`` of the ``k`` best entries of each row of ``values``, ordered by score
    (descending) then id (ascending); ``ids`` (same shape, default the column positions) name
    the entries. ``-inf`` entries are never told apart (they are padding or excluded)."""
    rows, width = values.shape
    take = min(k + 1, width)
    v, pos = values.topk(take, dim=1)
    if torch.isnan(v).any():
        raise ValueError("the model's scores contain NaN")
    finite = v > float("-inf")
    tie = ((v[:, 1:] == v[:, :-1]) & finite[:, 1:]).any(1) if take > 1 else finite[:, 0] & False
    v, pos = v[:, :k], pos[:, :k]
    out_ids = pos if ids is None else ids.gather(1, pos)
    if bool(tie.any()):  # rare: redo the rows with equal scores by a stable sort
        bad = tie.nonzero().squeeze(1)
        sub = values.index_select(0, bad)
        sub_ids = (
            torch.arange(width, device=values.device).expand(len(bad), width)
            if ids is None
            else ids.index_select(0, bad)
        )
        by_id = sub_ids.argsort(dim=1, stable=True)
        sub, sub_ids = sub.gather(1, by_id), sub_ids.gather(1, by_id)
        by_score = sub.argsort(dim=1, descending=True, stable=True)[:, :k]
        v[bad], out_ids[bad] = sub.gather(1, by_score), sub_ids.gather(1, by_score)
    return v, out_ids


def _padded(values: torch.Tensor, where: torch.Tensor, ids: torch.Tensor, sentinel: int):
    """The entries ``where`` (``(n, 2)`` row-major (row, column) pairs of ``values``, grouped by
    row) packed to the left of a ``(rows, widest)`` matrix, ``-inf`` / ``sentinel`` after."""
    row = where[:, 0]
    counts = torch.bincount(row, minlength=values.shape[0])
    col = torch.arange(len(row), device=values.device) - (torch.cumsum(counts, 0) - counts)[row]
    shape = (values.shape[0], int(counts.max()))
    pad = torch.full(shape, float("-inf"), dtype=values.dtype, device=values.device)
    pad_ids = torch.full(shape, sentinel, dtype=torch.long, device=values.device)
    pad[row, col] = values[row, where[:, 1]]
    pad_ids[row, col] = ids
    return pad, pad_ids


def _old_rows_top_k(
    values: torch.Tensor, k: int, ids: torch.Tensor | None = None, *, sample_rank: int = 8
):
    """`_old_top_k` of wide rows, exact, through a cheap filter: a threshold per
    row from a strided sample of its columns (its ``sample_rank``-th best, about ``2k`` entries
    expected at or above it); rows with at least ``k`` entries at or above their threshold keep
    only those (every entry of the top ``k``, ties included, is among them), the others are
    ranked whole."""
    rows, width = values.shape
    m = 2 * sample_rank * width // k
    if m < sample_rank or 2 * m > width:
        return _old_top_k(values, k, ids)
    thr = values[:, :: width // m].topk(sample_rank, dim=1).values[:, -1:]
    passed = values >= thr
    ok = passed.sum(dim=1) >= k
    v = torch.empty(rows, k, dtype=values.dtype, device=values.device)
    bad, good = (~ok).nonzero().squeeze(1), ok.nonzero().squeeze(1)
    out = torch.empty(rows, k, dtype=torch.long, device=values.device)
    if len(bad):
        sub_ids = None if ids is None else ids.index_select(0, bad)
        v[bad], out[bad] = _old_top_k(values.index_select(0, bad), k, sub_ids)
    if len(good):
        sub = values.index_select(0, good)
        where = passed.index_select(0, good).nonzero()
        named = where[:, 1] if ids is None else ids.index_select(0, good)[where[:, 0], where[:, 1]]
        sentinel = width if ids is None else int(ids.max()) + 1
        pad, pad_ids = _padded(sub, where, named, sentinel)
        v[good], out[good] = _old_top_k(pad, k, pad_ids)
    return v, out


def _old_merge_images(
    best: torch.Tensor, best_ids: torch.Tensor, s: torch.Tensor, t0: int, sentinel: int
) -> None:
    """Merge the block ``s`` (captions ``t0:`` x images) into each image's best captions, in
    place: only entries above the image's current k-th best can enter (an equal one has a higher
    caption id than every kept one, so it loses the tie). Padding is ``-inf`` with the id
    ``sentinel``, as the placeholders."""
    passed = s.t() > best[:, -1:]  # (n_images, c), strict: equal scores keep the earlier ids
    n_passed = int(passed.sum())
    if n_passed == 0:
        return
    if n_passed * 8 > passed.numel():  # the first blocks: most entries pass, merge densely
        ids = torch.arange(t0, t0 + s.shape[0], device=s.device).expand(best.shape[0], -1)
        merged = torch.cat([best, s.t()], dim=1)
        v, kept = _old_rows_top_k(merged, best.shape[1], torch.cat([best_ids, ids], dim=1))
        best.copy_(v)
        best_ids.copy_(kept)
        return
    where = passed.nonzero()  # row-major: grouped by image, captions ascending
    active = torch.unique_consecutive(where[:, 0])
    slot = torch.empty(best.shape[0], dtype=torch.long, device=s.device)
    slot[active] = torch.arange(len(active), device=s.device)
    local = torch.stack([slot[where[:, 0]], where[:, 1]], dim=1)
    pad, pad_ids = _padded(s.t().index_select(0, active), local, where[:, 1] + t0, sentinel)
    merged = torch.cat([best.index_select(0, active), pad], dim=1)
    merged_ids = torch.cat([best_ids.index_select(0, active), pad_ids], dim=1)
    v, ids = _old_top_k(merged, best.shape[1], merged_ids)
    best[active], best_ids[active] = v, ids


@torch.no_grad()
def previous(img, txt, t2img, k: int, block: int, out: list | None = None) -> float:
    """Seconds of the previous ``mine_blocks`` loop over ``txt[t0:t1] @ img.T`` blocks."""
    start = time.perf_counter()
    n_img, n_txt, dev = img.shape[0], txt.shape[0], img.device
    best = torch.full((n_img, k), float("-inf"), device=dev)
    best_ids = torch.full((n_img, k), n_txt, dtype=torch.long, device=dev)
    t2i = torch.empty(n_txt, k, dtype=torch.long)
    t2img_dev = t2img.to(dev)
    for t0 in range(0, n_txt, block):
        t1 = min(t0 + block, n_txt)
        s = txt[t0:t1] @ img.T
        s[torch.arange(t1 - t0, device=dev), t2img_dev[t0:t1]] = float("-inf")
        if bool(torch.isnan(s).any()):
            raise ValueError("NaN")
        t2i[t0:t1] = _old_rows_top_k(s, k)[1].cpu()
        _old_merge_images(best, best_ids, s, t0, n_txt)
    sync(dev)
    seconds = time.perf_counter() - start
    if out is not None:
        out[:] = [best_ids.cpu().numpy(), t2i.numpy()]
    return seconds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=4000)
    p.add_argument("--captions", type=int, default=20000)
    p.add_argument("--dim", type=int, default=1024)
    p.add_argument("--k", type=int, default=300)
    p.add_argument("--block", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=None)
    machine.add_device_arguments(p, "cpu")
    p.add_argument("--previous", action="store_true", help="also time the previous way")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = machine.resolve_device(args.device)
    g = torch.Generator().manual_seed(0)
    img = F.normalize(torch.randn(args.images, args.dim, generator=g), dim=1).to(device)
    # captions near their image, so the top-K lists are not random
    t2i = torch.arange(args.captions) % args.images
    noise = torch.randn(args.captions, args.dim, generator=g).to(device)
    txt = F.normalize(img[t2i.to(device)] + 2.0 * noise / args.dim**0.5, dim=1)
    print(machine.device_line(device))
    print(f"load {load_average()} (1-minute average, before)")
    print(
        f"sizes: {args.images} images x {args.captions} captions, D={args.dim}, "
        f"K={args.k}, block {args.block} captions, float32"
    )
    warm = (img[: args.k + 2], txt[: 2 * args.k], t2i[: 2 * args.k] % (args.k + 2), args.k, 64)
    mining(*warm)
    if args.previous:
        previous(*warm)
    bare_gemm(img, txt[: args.block], args.block)  # warm-up of all
    gemm_s, mine_s, prev_s = [], [], []
    new_lists: list = []
    old_lists: list = []
    for _ in range(args.repeats):
        gemm_s.append(bare_gemm(img, txt, args.block))
        mine_s.append(mining(img, txt, t2i, args.k, args.block, new_lists))
        if args.previous:
            prev_s.append(previous(img, txt, t2i, args.k, args.block, old_lists))
    pairs = args.images * args.captions
    gemm_rate, mine_rate = pairs / min(gemm_s), pairs / min(mine_s)
    print(f"bare GEMM       {min(gemm_s):8.3f} s  {gemm_rate / 1e6:10.1f} M pairs/s")
    print(f"mine-negatives  {min(mine_s):8.3f} s  {mine_rate / 1e6:10.1f} M pairs/s")
    if args.previous:
        prev_rate = pairs / min(prev_s)
        print(f"previous way    {min(prev_s):8.3f} s  {prev_rate / 1e6:10.1f} M pairs/s")
        same = [
            float(np.mean((a == b).all(axis=1))) for a, b in zip(new_lists, old_lists, strict=True)
        ]
        print(
            f"same lists as the previous way: i2t {same[0]:.1%} of images, "
            f"t2i {same[1]:.1%} of captions; previous / GEMM rate: {prev_rate / gemm_rate:.2f}x"
        )
    print(f"load {load_average()} (1-minute average, after)")
    print(f"mining / GEMM rate: {mine_rate / gemm_rate:.2f}x (target >= 0.8x)")
    machine.record(
        "mining",
        {"gemm_s": min(gemm_s), "mine_s": min(mine_s), "mining/gemm_rate": mine_rate / gemm_rate}
        | ({"previous_s": min(prev_s)} if args.previous else {}),
    )
    machine.save_json(args.json, "bench_mine_negatives", device, argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
