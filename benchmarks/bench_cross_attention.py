"""Cross-attention scorers (SCAN, BFAN, SGRAF) at the F30K test geometry, measured side by side.

R = 36 regions, D = 1024, caption lengths drawn from 8 + Poisson(4) clipped to 20 (mean
about 12, padded to the longest), on a subset of the 1000 x 5000 test pairs (--images,
--captions). Prints, each as the median of per-repeat ratios with their range:

(a) vlret's ``scan_scores`` (t2i LSE, i2t AVG) and ``bfan_scores`` (equal) against the
    reference per-caption loop, rewritten here from the algorithm of kuanghuei/SCAN
    ``xattn_score_t2i``/``xattn_score_i2t`` and CrossmodalGroup/BFAN ``xattn_score`` and run
    as their evaluation runs it (shards of 128 images x 128 captions; within a shard each
    caption is repeated over the shard's images, attended with ``bmm``, its attended vectors
    formed and compared by cosine). The scores are asserted equal first. Target >= 10x.
(b) the same scorers against the bare raw-score GEMM ``(n_i R, D) @ (D, n_c L)`` over the
    scorer's own blocks (``block_plan``: length-sorted captions, each block trimmed to its
    longest caption), timed just before each scorer in each repeat; and, for reference,
    the GEMM over the padded input. Target <= 2x the blocked GEMM.
(c) ``SGRAFScorer`` (SGR, eval mode) against the reference ``EncoderSimilarity.forward``
    loop (Paranioar/SGRAF) run with the scorer's own weights (earlier target >= 5x); then SGR
    and SAF (``sgraf_bound.py``) at --sgraf-bound-captions captions against their full GEMM
    bound: every matrix product the scorer must do (the global attentions, the word-region
    scores and attended vectors, the local and global projections, SGR's graph-reasoning
    products, SAF's gate, the head) as bare ``torch.mm``/``bmm`` calls over the scorer's own
    blocks (``SGRAFScorer.plan_blocks``); ``matmul_precision="float32"`` against the bound in
    float32, ``"bfloat16"`` against the same products in bfloat16, each with its largest
    score change against float64 and the share of caption pairs kept in float64's order.
    Target <= 1.5x the full bound in both precisions. The old projection-only bound (the
    D -> 256 projection of every word's difference vector alone) is printed beside it for
    reference. ``--before REV`` times the scorer of that git revision (same weights) in the
    same repeats. The header's "CPU facts" line names what a figure depends on: the CPU
    model and family, its AVX-512 / AVX512-BF16 / AMX flags, ATen's kernel capability and
    the oneDNN kernel a bfloat16 matmul runs.
(e) the matchers of AdaCL Table 1 beyond these (``--parts imram,cvse,chan,chan_bert,dime``;
    ``bench_matchers.py``): each built at its paper's size, its block scorer against the
    authors' per-caption evaluation loop (``ref_<kind>.py``, run on the model's own weights,
    scores asserted equal first; target >= 5x) and against the bare products it must do
    (``gemm_bound``), on a 1 : 5 slice of the COCO 5K test with a 5K time estimate.
(d) one B=128 training step (forward and backward: region and word encoders, the score
    matrix, hardest-negative triplet loss) of ``build_model({"kind": "scan"})`` with the
    batched scorer against the same step with the loop as its scorer. Target >= 3x.

Everything runs in one process with the same torch threads, warmed up, repeats interleaved
so that load from other processes hits both sides alike.

    python benchmarks/bench_cross_attention.py [--images 128] [--captions 192] [--repeats 3]
        [--sgraf-captions 16] [--sgraf-bound-captions 128] [--batch 128] [--threads N]
        [--clock wall|cpu] [--before REV]
        [--device cpu|cuda|cuda:N|auto] [--json FILE] [--parts scan,bfan,sgraf,train]
        [--matcher-images N] [--coco5k-scan] [--coco5k-matcher KIND]

``--coco5k-scan`` (for a GPU) times one full COCO-5K SCAN t2i scoring, 5000 x 25000 pairs,
with vlret only; ``--coco5k-matcher KIND`` the same for a matcher of part (e).
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

from vlret.models.cross_attention import bfan_scores, block_plan, scan_scores

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import machine  # noqa: E402
from bench_matchers import KINDS as MATCHER_KINDS  # noqa: E402
from bench_matchers import bench_coco5k_matcher, bench_matchers  # noqa: E402
from machine import cpu_name, spread  # noqa: E402
from reference_loops import (  # noqa: E402
    ref_bfan_shard,
    ref_scan_shard,
    ref_sgraf,
    sharded,
)
from sgraf_bound import bench_sgraf_bound  # noqa: E402

R, D = 36, 1024


# ----------------------------------------------------------------------------- helpers


def make_data(n_img: int, n_cap: int, device: torch.device, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    regions = F.normalize(torch.randn(n_img, R, D, generator=g), dim=-1)
    lengths = (8 + torch.poisson(torch.full((n_cap,), 4.0), generator=g)).clamp(max=20).long()
    width = int(lengths.max())
    # words near their image's regions, as trained embeddings are
    own = regions[torch.arange(n_cap) % n_img].mean(1, keepdim=True)
    words = F.normalize(torch.randn(n_cap, width, D, generator=g) + 8.0 * own, dim=-1)
    words = words * (torch.arange(width) < lengths[:, None]).unsqueeze(-1)
    return regions.to(device), words.to(device), lengths.to(device)


class Timer:
    """Wall-clock time, or with ``clock="cpu"`` this process's CPU time (all its threads):
    with one thread, the time it computed, whatever else the machine runs."""

    def __init__(self, device: torch.device, clock: str = "wall") -> None:
        self.device = device
        self.clock = time.process_time if clock == "cpu" else time.perf_counter

    def __call__(self, fn: Callable) -> tuple[float, object]:
        self.sync()
        start = self.clock()
        out = fn()
        self.sync()
        return self.clock() - start, out

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()


def check_close(
    name: str, got: torch.Tensor, want: torch.Tensor, tol: float, against: str = "vlret - loop"
) -> None:
    diff = (got.double() - want.double()).abs()
    print(f"  {name}: max |{against}| = {diff.max().item():.2e} (tolerance {tol:.1e})")
    if not diff.max() <= tol:
        raise SystemExit(f"{name}: scores differ ({against})")


# ----------------------------------------------------------------------------- parts


def bench_scoring(args, timer: Timer, device: torch.device) -> None:
    regions, words, lengths = make_data(args.images, args.captions, device)
    n_img = regions.shape[0]
    step, order, blocks = block_plan(n_img, R, D, lengths, device=device)
    # the GEMM baselines' operands are prepared outside the timing
    gemm_words = [
        words[order[a:b], :longest].reshape(-1, D).contiguous() for a, b, longest in blocks
    ]
    flat = regions.reshape(-1, D)
    # into one preallocated output, as the scorer's GEMM writes into a reused buffer
    out = torch.empty(step * R * max(len(w) for w in gemm_words), device=device)

    def gemm_blocks():
        for i0 in range(0, n_img, step):
            rows = flat[i0 * R : (i0 + step) * R]
            for w in gemm_words:
                torch.matmul(rows, w.T, out=out[: len(rows) * len(w)].view(len(rows), len(w)))

    padded = words.reshape(-1, D)
    width = words.shape[1] * max(1, len(gemm_words[0]) // words.shape[1])
    out_padded = torch.empty(step * R * width, device=device)

    def gemm_padded():
        for i0 in range(0, n_img, step):
            rows = flat[i0 * R : (i0 + step) * R]
            for j0 in range(0, len(padded), width):
                w = padded[j0 : j0 + width]
                torch.matmul(rows, w.T, out=out_padded[: len(rows) * len(w)].view(len(rows), -1))

    systems = {}
    if "scan" in args.parts:
        systems["SCAN t2i LSE"] = (
            lambda: scan_scores(regions, words, lengths),
            lambda: sharded(
                lambda i, w, n: ref_scan_shard(i, w, n, "t2i", 9.0, "lse", 6.0),
                regions,
                words,
                lengths,
            ),
        )
        systems["SCAN i2t AVG"] = (
            lambda: scan_scores(
                regions, words, lengths, direction="i2t", aggregation="mean", lambda_softmax=4.0
            ),
            lambda: sharded(
                lambda i, w, n: ref_scan_shard(i, w, n, "i2t", 4.0, "mean", 6.0),
                regions,
                words,
                lengths,
            ),
        )
    if "bfan" in args.parts:
        systems["BFAN equal"] = (
            lambda: bfan_scores(regions, words, lengths),
            lambda: sharded(lambda i, w, n: ref_bfan_shard(i, w, n, 20.0), regions, words, lengths),
        )
    if not systems:
        return
    print(
        f"\n(a, b) scoring {n_img} images x {words.shape[0]} captions "
        f"(mean length {lengths.float().mean():.1f}, padded to {words.shape[1]}); "
        f"{len(blocks)} caption blocks x {-(-n_img // step)} image blocks of {step} images"
    )
    with torch.no_grad():
        print(
            "  same scores (float32; tolerance 4 sqrt(D) lambda eps32: the rounding of D-term "
            "dot products magnified by the softmax's inverse temperature, 4x margin):"
        )
        eps = torch.finfo(torch.float32).eps
        for name, (ours, loop) in systems.items():
            lam = 20.0 if "BFAN" in name else 9.0
            check_close(name, ours(), loop(), 4 * D**0.5 * lam * eps)
        gemm_blocks(), gemm_padded()
        loop_ratio = {k: [] for k in systems}
        gemm_ratio = {k: [] for k in systems}
        pad_ratio = {k: [] for k in systems}
        times = {k: [] for k in systems}
        for _ in range(args.repeats):
            for name, (ours, loop) in systems.items():
                t_gemm, _ = timer(gemm_blocks)
                t_ours, _ = timer(ours)
                t_pad, _ = timer(gemm_padded)
                t_loop, _ = timer(loop)
                times[name].append(t_ours)
                loop_ratio[name].append(t_loop / t_ours)
                gemm_ratio[name].append(t_ours / t_gemm)
                pad_ratio[name].append(t_ours / t_pad)
    pairs = n_img * words.shape[0]
    for name in systems:
        t = statistics.median(times[name])
        machine.record(
            name,
            {
                "pairs": pairs,
                "seconds": t,
                "loop/vlret": statistics.median(loop_ratio[name]),
                "vlret/gemm_blocks": statistics.median(gemm_ratio[name]),
                "vlret/gemm_padded": statistics.median(pad_ratio[name]),
            },
        )
        print(
            f"  {name:13s} vlret {t * 1e3:8.1f} ms ({pairs / t / 1e6:.2f} M pairs/s) | "
            f"loop / vlret {spread(loop_ratio[name])} [target >= 10x] | "
            f"vlret / GEMM same blocks {spread(gemm_ratio[name])} [target <= 2x] | "
            f"vlret / GEMM padded {spread(pad_ratio[name])}"
        )


def bench_sgraf(args, timer: Timer, device: torch.device) -> None:
    try:
        from vlret.models.sgraf import SGRAFScorer
    except ImportError:
        print("\n(c) SGRAF: vlret.models.sgraf not available, skipped")
        return
    n_img, n_cap = args.images, args.sgraf_captions
    regions, words, lengths = make_data(n_img, n_cap, device, seed=1)
    torch.manual_seed(0)
    scorer = SGRAFScorer(D, 256, "sgr", 3).to(device).eval()
    print(f"\n(c) SGRAF (eval mode) against the reference loop, {n_img} images x {n_cap} captions")
    with torch.no_grad():
        eps = torch.finfo(torch.float32).eps
        check_close(
            "SGR",
            scorer(regions, words, lengths),
            ref_sgraf(scorer, regions, words, lengths),
            4 * D**0.5 * 9.0 * eps,
        )
        ratios, times = [], []
        for _ in range(args.repeats):
            t_ours, _ = timer(lambda: scorer(regions, words, lengths))
            t_loop, _ = timer(lambda: ref_sgraf(scorer, regions, words, lengths))
            ratios.append(t_loop / t_ours)
            times.append(t_ours)
    t = statistics.median(times)
    machine.record(
        "SGR", {"pairs": n_img * n_cap, "seconds": t, "loop/vlret": statistics.median(ratios)}
    )
    print(
        f"  SGR vlret {t * 1e3:.1f} ms ({n_img * n_cap / t / 1e6:.3f} M pairs/s) | "
        f"loop / vlret {spread(ratios)} [target >= 5x]"
    )
    for module in ("sgr", "saf"):
        data = make_data(args.images, args.sgraf_bound_captions, device, seed=2)
        bench_sgraf_bound(args, timer, device, SGRAFScorer, module, data)


def bench_train(args, timer: Timer, device: torch.device) -> None:
    try:
        from vlret.data.dataset import RetrievalBatch
        from vlret.losses.triplet import triplet_loss
        from vlret.models import build_model

        model = build_model({"kind": "scan"}, vocab_size=10000).to(device)
    except (ImportError, ValueError, KeyError) as err:
        print(f"\n(d) training step: build_model(kind='scan') not available ({err}), skipped")
        return
    batch_size = args.batch
    g = torch.Generator().manual_seed(2)
    lengths = (8 + torch.poisson(torch.full((batch_size,), 4.0), generator=g)).clamp(max=20).long()
    lengths, _ = lengths.sort(descending=True)
    captions = torch.randint(1, 10000, (batch_size, int(lengths.max())), generator=g)
    captions = captions * (torch.arange(captions.shape[1]) < lengths[:, None])
    batch = RetrievalBatch(
        torch.randn(batch_size, R, 2048, generator=g),
        captions,
        lengths,
        torch.arange(batch_size),
        torch.arange(batch_size),
    ).to(device)
    batched_score = model.score

    def loop_score(regions, words, word_lengths, *, max_elements=None):
        return sharded(
            lambda i, w, n: ref_scan_shard(
                i, w, n, model.direction, model.lambda_softmax, model.aggregation, model.lambda_lse
            ),
            regions,
            words,
            word_lengths,
        )

    def step(score):
        model.score = score
        model.zero_grad(set_to_none=True)
        loss = triplet_loss(model(batch), margin=0.2, hardest=True)
        loss.backward()
        return loss.detach()

    print(f"\n(d) SCAN training step, B={batch_size} (forward + backward, triplet-HN)")
    loss_ours, loss_loop = step(batched_score), step(loop_score)
    print(f"  same loss: vlret {loss_ours.item():.6f}, loop {loss_loop.item():.6f}")
    if not torch.isclose(loss_ours, loss_loop, rtol=1e-4):
        raise SystemExit("training step: losses differ")
    ratios, times = [], []
    for _ in range(args.repeats):
        t_ours, _ = timer(lambda: step(batched_score))
        t_loop, _ = timer(lambda: step(loop_score))
        ratios.append(t_loop / t_ours)
        times.append(t_ours)
    model.score = batched_score
    machine.record(
        "train_step",
        {
            "batch": batch_size,
            "seconds": statistics.median(times),
            "loop/vlret": statistics.median(ratios),
        },
    )
    print(
        f"  step vlret {statistics.median(times) * 1e3:.0f} ms | loop / vlret "
        f"{spread(ratios)} [target >= 3x]"
    )


def bench_coco5k(args, timer: Timer, device: torch.device) -> None:
    regions, words, lengths = make_data(5000, 25000, device, seed=3)
    print(f"\nCOCO-5K SCAN t2i LSE: 5000 x 25000 pairs on {device}")
    with torch.no_grad():
        scan_scores(regions[:256], words[:1024], lengths[:1024])  # warm-up
        base = machine.reset_peak(device)
        t, sims = timer(lambda: scan_scores(regions, words, lengths))
        peak = machine.peak_since(device, base)
    finite = bool(torch.isfinite(sims).all())
    machine.record(
        "coco5k_scan_t2i_lse",
        {
            "images": 5000,
            "captions": 25000,
            "seconds": t,
            "pairs_per_s": 5000 * 25000 / t,
            "finite": finite,
            "peak_bytes": peak,
        },
    )
    print(
        f"  {t:.1f} s ({5000 * 25000 / t / 1e6:.1f} M pairs/s), finite: "
        f"{finite}" + ("" if peak is None else f", peak {peak / 1024**3:.2f} GiB beyond the inputs")
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=128)
    parser.add_argument("--captions", type=int, default=192)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sgraf-captions", type=int, default=16)
    parser.add_argument("--sgraf-bound-captions", type=int, default=128)
    parser.add_argument(
        "--before",
        default=None,
        metavar="REV",
        help="also time the SGRAF scorer of git revision REV against the bound (e.g. 6b209b6)",
    )
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--threads", type=int, default=None)
    machine.add_device_arguments(parser, "cpu")
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="cpu: process CPU time, robust to other load when run with --threads 1",
    )
    parser.add_argument("--parts", default="scan,bfan,sgraf,train")
    parser.add_argument("--coco5k-scan", action="store_true")
    parser.add_argument(
        "--matcher-images",
        type=int,
        default=None,
        help="images of part (e)'s slice (captions: 5x); default per matcher",
    )
    parser.add_argument("--coco5k-matcher", choices=MATCHER_KINDS, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = machine.resolve_device(args.device)
    timer = Timer(device, args.clock)
    print(
        f"CPU: {cpu_name()} ({os.cpu_count()} logical cores), torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, ATen {torch.backends.cpu.get_cpu_capability()}, "
        f"load {os.getloadavg()[0]:.1f}, {args.clock} clock"
    )
    print(machine.device_line(device))
    facts = machine.cpu_facts(onednn=device.type == "cpu")
    machine.record("cpu", facts)
    print(machine.cpu_facts_line(facts))
    if args.coco5k_scan:
        bench_coco5k(args, timer, device)
        machine.save_json(args.json, "bench_cross_attention", device, argv)
        return
    if args.coco5k_matcher:
        bench_coco5k_matcher(args.coco5k_matcher, timer, device)
        machine.save_json(args.json, "bench_cross_attention", device, argv)
        return
    if {"scan", "bfan"} & set(args.parts.split(",")):
        bench_scoring(args, timer, device)
    if "sgraf" in args.parts:
        bench_sgraf(args, timer, device)
    if "train" in args.parts:
        bench_train(args, timer, device)
    bench_matchers(args, timer, device)
    print(f"\nload at the end {os.getloadavg()[0]:.1f}")
    machine.save_json(args.json, "bench_cross_attention", device, argv)


if __name__ == "__main__":
    main()
