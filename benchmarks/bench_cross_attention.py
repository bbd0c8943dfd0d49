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
    and SAF against their bound, the irreducible work: every (image, caption, word) triple's
    difference vector through the D -> 256 projection, as float32 GEMMs over the scorer's
    own blocks (``SGRAFScorer.plan_blocks``), at --sgraf-bound-captions captions (the
    per-image and per-caption global attentions are in the scorer's time: about 12 pairs'
    work an image, so their share falls as captions grow). Both ``matmul_precision``
    values, each with its largest score change against float64 and the share of caption
    pairs kept in float64's order. Target <= 1.5x the bound.
(d) one B=128 training step (forward and backward: region and word encoders, the score
    matrix, hardest-negative triplet loss) of ``build_model({"kind": "scan"})`` with the
    batched scorer against the same step with the loop as its scorer. Target >= 3x.

Everything runs in one process with the same torch threads, warmed up, repeats interleaved
so that load from other processes hits both sides alike.

    python benchmarks/bench_cross_attention.py [--images 128] [--captions 192] [--repeats 3]
        [--sgraf-captions 16] [--sgraf-bound-captions 128] [--batch 128] [--threads N]
        [--clock wall|cpu]
        [--device cpu|cuda|cuda:N|auto] [--json FILE] [--parts scan,bfan,sgraf,train]
        [--coco5k-scan]

``--coco5k-scan`` (for a GPU) times one full COCO-5K SCAN t2i scoring, 5000 x 25000 pairs,
with vlret only.
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
from machine import cpu_name, spread  # noqa: E402

R, D, SHARD = 36, 1024, 128


# ----------------------------------------------------------------------------- reference loops


def _l2norm(x: torch.Tensor, dim: int) -> torch.Tensor:
    return torch.div(x, torch.pow(x, 2).sum(dim=dim, keepdim=True).sqrt() + 1e-8)


def _cosine(x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
    w12 = torch.sum(x1 * x2, 2)
    w1, w2 = torch.norm(x1, 2, 2), torch.norm(x2, 2, 2)
    return (w12 / (w1 * w2).clamp(min=1e-8)).squeeze()


def ref_attention(query, context, lam, focal=None):
    """func_attention, step for step: query (n, q, d), context (n, c, d) -> the attended
    context (n, q, d) as the transposed view the reference returns."""
    n, q, c = query.shape[0], query.shape[1], context.shape[1]
    attn = torch.bmm(context, torch.transpose(query, 1, 2))  # (n, c, q)
    attn = _l2norm(F.leaky_relu(attn, 0.1), 2)  # each context item over the queries
    attn = torch.transpose(attn, 1, 2).contiguous().view(n * q, c)
    attn = torch.softmax(attn * lam, dim=1).view(n, q, c)
    if focal == "equal":  # BFAN: focal_equal, then the kept weights renormalised
        keep = torch.where(attn * c - attn.sum(dim=-1, keepdim=True) > 0, 1.0, 0.0)
        attn = keep * attn
        attn = attn / attn.sum(dim=-1, keepdim=True)
    attn_t = torch.transpose(attn, 1, 2).contiguous()
    weighted = torch.bmm(torch.transpose(context, 1, 2), attn_t)  # (n, d, q)
    return torch.transpose(weighted, 1, 2)


def ref_scan_shard(images, captions, lengths, direction, lam, aggregation, lambda_lse):
    """xattn_score_t2i / xattn_score_i2t on one shard."""
    columns = []
    for i in range(captions.shape[0]):
        cap = captions[i, : lengths[i], :].unsqueeze(0).contiguous()
        cap = cap.repeat(images.shape[0], 1, 1)
        if direction == "t2i":
            rel = _cosine(cap, ref_attention(cap, images, lam).contiguous())
        else:
            rel = _cosine(images, ref_attention(images, cap, lam))
        rel = rel.view(images.shape[0], -1)
        if aggregation == "lse":
            col = torch.log(torch.exp(rel * lambda_lse).sum(dim=1, keepdim=True)) / lambda_lse
        else:
            col = rel.mean(dim=1, keepdim=True)
        columns.append(col)
    return torch.cat(columns, 1)


def ref_bfan_shard(images, captions, lengths, lam):
    """BFAN xattn_score (focal_equal) on one shard: both directions summed."""
    columns = []
    for i in range(captions.shape[0]):
        cap = captions[i, : lengths[i], :].unsqueeze(0).contiguous()
        cap = cap.repeat(images.shape[0], 1, 1)
        t2i = _cosine(cap, ref_attention(cap, images, lam, "equal")).view(images.shape[0], -1)
        i2t = _cosine(images, ref_attention(images, cap, lam, "equal"))
        columns.append(t2i.mean(dim=1, keepdim=True) + i2t.mean(dim=1, keepdim=True))
    return torch.cat(columns, 1)


def sharded(fn: Callable, regions, words, lengths) -> torch.Tensor:
    """The reference evaluation's shard_xattn: 128 x 128 shards, each scored by ``fn``."""
    out = regions.new_zeros(regions.shape[0], words.shape[0])
    lens = lengths.tolist()
    for i0 in range(0, regions.shape[0], SHARD):
        for j0 in range(0, words.shape[0], SHARD):
            out[i0 : i0 + SHARD, j0 : j0 + SHARD] = fn(
                regions[i0 : i0 + SHARD], words[j0 : j0 + SHARD], lens[j0 : j0 + SHARD]
            )
    return out


def ref_sgraf(scorer, regions, words, lengths) -> torch.Tensor:
    """Paranioar/SGRAF EncoderSimilarity.forward (eval mode) with the scorer's weights, read
    through its reference parameter names."""
    ours = dict(scorer.state_dict())
    p = {ref: ours[name] for ref, name in scorer.reference_names("sgr", scorer.sgr_steps).items()}

    def lin(x, name):
        return F.linear(x, p[f"{name}.weight"], p[f"{name}.bias"])

    def bn(x, name):
        return F.batch_norm(
            x,
            p[f"{name}.running_mean"],
            p[f"{name}.running_var"],
            p[f"{name}.weight"],
            p[f"{name}.bias"],
            False,
            0.0,
            1e-5,
        )

    def global_sa(local, side, norm):
        l_emb = lin(local, f"{side}.embedding_local.0")
        g_emb = lin(local.mean(1), f"{side}.embedding_global.0")
        if norm:
            l_emb, g_emb = (
                bn(l_emb, f"{side}.embedding_local.1"),
                bn(g_emb, f"{side}.embedding_global.1"),
            )
        common = torch.tanh(l_emb) * torch.tanh(g_emb).unsqueeze(1)
        weights = torch.softmax(lin(common, f"{side}.embedding_common.0").squeeze(2), dim=1)
        return _l2norm((weights.unsqueeze(2) * local).sum(dim=1), -1)

    n_img = regions.shape[0]
    img_glo = global_sa(regions, "v_global_w", True)
    columns = []
    for i in range(words.shape[0]):
        cap = words[i, : lengths[i]].unsqueeze(0)
        cap_expand = cap.repeat(n_img, 1, 1)
        cap_glo = global_sa(cap, "t_global_w", False)
        context = _l2norm(ref_attention(cap_expand, regions, 9.0), -1)
        sim_loc = _l2norm(lin((context - cap_expand).pow(2), "sim_tranloc_w"), -1)
        sim_glo = _l2norm(lin((img_glo - cap_glo).pow(2), "sim_tranglo_w"), -1)
        nodes = torch.cat([sim_glo.unsqueeze(1), sim_loc], 1)
        for step in range(scorer.sgr_steps):
            query = lin(nodes, f"SGR_module.{step}.graph_query_w")
            key = lin(nodes, f"SGR_module.{step}.graph_key_w")
            edge = torch.softmax(torch.bmm(query, key.transpose(1, 2)), dim=-1)
            nodes = torch.relu(lin(torch.bmm(edge, nodes), f"SGR_module.{step}.sim_graph_w"))
        columns.append(torch.sigmoid(lin(nodes[:, 0, :], "sim_eval_w")))
    return torch.cat(columns, 1)


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


def check_close(name: str, got: torch.Tensor, want: torch.Tensor, tol: float) -> None:
    diff = (got.double() - want.double()).abs()
    print(f"  {name}: max |vlret - loop| = {diff.max().item():.2e} (tolerance {tol:.1e})")
    if not diff.max() <= tol:
        raise SystemExit(f"{name}: scores differ from the reference loop")


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
        bench_sgraf_bound(args, timer, device, SGRAFScorer, module)


def _pair_order_agreement(got: torch.Tensor, want: torch.Tensor) -> float:
    """The share of (image, caption, caption) triples whose two scores are in the same order
    in ``got`` as in ``want`` (ties in either count as agreeing)."""
    agree, total = 0, 0
    for g, w in zip(got.double(), want.double(), strict=True):
        dg, dw = g[:, None] - g[None, :], w[:, None] - w[None, :]
        agree += int(((dg * dw) >= 0).sum())
        total += dg.numel()
    return agree / total


def bench_sgraf_bound(args, timer: Timer, device: torch.device, cls, module: str) -> None:
    """(c) continued: ``module``'s scoring against the projection bound, both precisions."""
    n_img, n_cap = args.images, args.sgraf_bound_captions
    regions, words, lengths = make_data(n_img, n_cap, device, seed=2)
    torch.manual_seed(0)
    scorer = cls(D, 256, module, 3).to(device).eval()
    weight = scorer.local_proj.weight.detach()
    # The irreducible work: each (image, caption, word) triple's difference vector through
    # the D -> 256 projection, as one GEMM per block of the scorer's own plan.
    tops = sorted(lengths.tolist(), reverse=True)
    runs = []
    for c0, c1, top, img_block in scorer.plan_blocks(n_img, tops, device):
        for i0 in range(0, n_img, img_block):
            runs.append((min(n_img, i0 + img_block) - i0) * (c1 - c0) * top)
    diffs = torch.randn(max(runs), D, device=device)
    out = torch.empty(max(runs), weight.shape[0], device=device)
    low_diffs, low_weight = diffs.bfloat16(), weight.bfloat16()

    def bound() -> None:
        for rows in runs:
            torch.mm(diffs[:rows], weight.T, out=out[:rows])

    def bound_low() -> None:
        for rows in runs:
            torch.mm(low_diffs[:rows], low_weight.T)

    def score(precision: str):
        scorer.matmul_precision = precision
        return scorer(regions, words, lengths)

    print(
        f"\n(c) {module.upper()} against the projection bound, {n_img} images x {n_cap} "
        f"captions ({sum(runs)} image-caption-word triples, {len(runs)} blocks)"
    )
    with torch.no_grad():
        want = scorer.double()(regions.double(), words.double(), lengths)
        scorer.float()
        got = {p: score(p) for p in ("float32", "bfloat16")}
        for p, g in got.items():
            err = (g.double() - want).abs().max().item()
            order = _pair_order_agreement(g, want)
            machine.record(f"{module}_{p}_error", {"max_abs": err, "pair_order_agreement": order})
            print(
                f"  {p}: max |score - float64| = {err:.2e} (scores spread {want.std():.2e}); "
                f"caption pairs in float64's order {order * 100:.3f}%"
            )
        ratios: dict[str, list[float]] = {"float32": [], "bfloat16": [], "bound_low": []}
        times = []
        for _ in range(args.repeats):
            t_bound, _ = timer(bound)
            for p in ("float32", "bfloat16"):
                ratios[p].append(timer(lambda p=p: score(p))[0] / t_bound)
            ratios["bound_low"].append(timer(bound_low)[0] / t_bound)
            times.append(t_bound)
    t = statistics.median(times)
    machine.record(
        f"{module}_bound",
        {"bound_seconds": t} | {f"{k}/bound": statistics.median(v) for k, v in ratios.items()},
    )
    print(
        f"  bound (float32 projection GEMMs) {t * 1e3:.1f} ms | "
        f"vlret float32 / bound {spread(ratios['float32'])} [target <= 1.5x] | "
        f"vlret bfloat16 / bound {spread(ratios['bfloat16'])} | "
        f"(the same GEMMs in bfloat16 / bound {spread(ratios['bound_low'])})"
    )


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
    if args.coco5k_scan:
        bench_coco5k(args, timer, device)
        machine.save_json(args.json, "bench_cross_attention", device, argv)
        return
    bench_scoring(args, timer, device)
    if "sgraf" in args.parts:
        bench_sgraf(args, timer, device)
    if "train" in args.parts:
        bench_train(args, timer, device)
    print(f"\nload at the end {os.getloadavg()[0]:.1f}")
    machine.save_json(args.json, "bench_cross_attention", device, argv)


if __name__ == "__main__":
    main()
