"""SGRAF's full GEMM bound: every matrix product ``SGRAFScorer`` must do, at its own block
shapes, timed as bare ``torch.mm`` / ``torch.bmm`` calls (imported by
``bench_cross_attention.py``).

What the bound contains, for one call scoring ``n_img`` images against ``n_cap`` captions of
lengths ``L_c`` (``R`` regions, ``D`` features, ``S = sim_dim`` node size):

- SGR's step matrices ``W_k^T W_q`` (``S x S x S``, once per call and step);
- the global attentions (once per call): the image side's ``D x D`` products over every region
  (``local_fc``) and over each image's mean (``global_fc``), the caption side's over every real
  word and over each caption's mean, and their ``D -> 1`` ``common`` products;
- per block of ``SGRAFScorer.plan_blocks`` (``ib`` images x ``cb`` captions trimmed to ``top``
  words, ``K = top + 1`` nodes a pair):

  - the word-region raw scores ``(cb top, D) x (D, ib R)``;
  - the attended vectors ``(ib; cb top, R) x (R, D)`` (attention weights times regions);
  - the local projection ``(ib cb top, D) x (D, S)`` of every difference vector, and the
    global projection ``(ib cb, D) x (D, S)`` of every pair's global difference;
  - SGR: each step but the last the fused node product ``(ib cb K, S) x (S, 2 S)`` (edge
    query and update value of every node, see ``vlret.models.sgraf_ops.graph_reasoning``),
    the edge logits ``(ib cb; K, S) x (S, K)`` and the mixing ``(ib cb; K, K) x (K, S)``; the
    last step for the global node only: its query ``(ib cb, S) x (S, S)``, ``(ib cb; 1, S) x
    (S, K)``, ``(ib cb; 1, K) x (K, S)`` and the update ``(ib cb, S) x (S, S)``;
  - SAF: the gate product ``(ib cb K, S) x (S, 1)`` and the gated sum ``(ib cb; 1, K) x (K,
    S)``;
  - the score head ``(ib cb, S) x (S, 1)``.

Why this is the floor: the model's scores need each of these products (the reference computes
more: three ``S x S`` products per node and step where the fused form has two, since the
query and key maps fold into one ``S x S`` matrix and the logit offset they leave is constant
over the keys, so it cancels in the softmax; and it scores one caption at a time); what a
scorer adds on top is element-wise work (LeakyReLU, norms, softmaxes, the difference vectors
and their squares, conversions) and dispatch.
The products are timed on preallocated operands with preallocated outputs (``out=``), in the
operand layouts the scorer uses (weights as the transposed ``(out, in)`` matrices ``F.linear``
reads), so the bound carries no allocation and no element-wise pass. The float32 bound runs
every product in float32; the bfloat16 bound runs the same products on bfloat16 operands with
bfloat16 results (float32 accumulation), the precision of ``matmul_precision="bfloat16"``.
"""

from __future__ import annotations

import importlib
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

import machine
from machine import spread
from vlret.models.attention import DEFAULT_MAX_ELEMENTS

#: The bound's two precisions (each over the scorer's blocks for that precision).
PRECISIONS = (torch.float32, torch.bfloat16)
#: The groups the bound's time is reported in, in this order.
GROUPS = ("global attentions", "attention", "projections", "graph reasoning", "gates and head")


@dataclass(frozen=True)
class Product:
    """One product ``(batch;) m x k  @  k x n``, ``name`` in ``group``; ``b_t``: the right
    operand is stored transposed (``(n, k)``, as a weight ``F.linear`` reads, or regions/nodes
    read as keys)."""

    group: str
    name: str
    batch: int | None
    m: int
    k: int
    n: int
    b_t: bool

    @property
    def flops(self) -> int:
        return 2 * (self.batch or 1) * self.m * self.k * self.n


def products(
    scorer,
    n_img: int,
    lengths: list[int],
    device: torch.device,
    max_elements: int = DEFAULT_MAX_ELEMENTS,
    dtype: torch.dtype = torch.float32,
) -> list[Product]:
    """Every product of ``scorer`` (an ``SGRAFScorer``) scoring ``n_img`` images against
    captions of ``lengths`` (sorted longest first, as the scorer sorts them), in the order it
    does them, over its blocks (``plan_blocks``) for a call without autograd with its
    products in ``dtype`` (``matmul_precision``) under ``max_elements``."""
    r, d, s = scorer.num_regions, scorer.embed_dim, scorer.sim_dim
    n_cap, words = len(lengths), sum(lengths)
    glob, att, proj, graph, last = (
        "global attentions",
        "attention",
        "projections",
        "graph reasoning",
        "gates and head",
    )
    out = [
        Product(glob, "image local_fc", None, n_img * r, d, d, True),
        Product(glob, "image global_fc", None, n_img, d, d, True),
        Product(glob, "image common", None, n_img * r, d, 1, True),
        Product(glob, "caption local_fc", None, words, d, d, True),  # real words only
        Product(glob, "caption global_fc", None, n_cap, d, d, True),
        Product(glob, "caption common", None, words, d, 1, True),
    ]
    if scorer.module == "sgr":  # each step's W_k^T W_q, once per call
        out += [Product(graph, "step matrix", None, s, s, s, False)] * scorer.sgr_steps
    for c0, c1, top, img_block in scorer.plan_blocks(
        n_img, lengths, device, max_elements, eval_dtype=dtype
    ):
        cb, k = c1 - c0, top + 1
        for i0 in range(0, n_img, img_block):
            ib = min(n_img, i0 + img_block) - i0
            pairs = ib * cb
            out += [
                Product(att, "raw scores", None, cb * top, d, ib * r, True),
                Product(att, "attended vectors", ib, cb * top, r, d, False),
                Product(proj, "local projection", None, pairs * top, d, s, True),
                Product(proj, "global projection", None, pairs, d, s, True),
            ]
            if scorer.module == "sgr":
                for _ in range(scorer.sgr_steps - 1):
                    out += [
                        Product(graph, "query and value", None, pairs * k, s, 2 * s, True),
                        Product(graph, "edge logits", pairs, k, s, k, True),
                        Product(graph, "mixing", pairs, k, k, s, False),
                    ]
                out += [
                    Product(graph, "global query", None, pairs, s, s, True),
                    Product(graph, "global edge logits", pairs, 1, s, k, True),
                    Product(graph, "global mixing", pairs, 1, k, s, False),
                    Product(graph, "global update", None, pairs, s, s, True),
                ]
            else:
                out += [
                    Product(last, "SAF gates", None, pairs * k, s, 1, True),
                    Product(last, "SAF gated sum", pairs, 1, k, s, False),
                ]
            out.append(Product(last, "score head", None, pairs, s, 1, True))
    return out


def bound_runner(
    prods: list[Product], dtype: torch.dtype, device: torch.device
) -> Callable[[], dict[str, int]]:
    """A function running every product of ``prods`` once in ``dtype`` (preallocated random
    operands and outputs; each product gets views of three shared buffers) and returning how
    many products of each group it ran."""
    g = torch.Generator().manual_seed(0)
    size_a = max((p.batch or 1) * p.m * p.k for p in prods)
    size_b = max((p.batch or 1) * p.k * p.n for p in prods)
    size_o = max((p.batch or 1) * p.m * p.n for p in prods)
    a_buf = torch.randn(size_a, generator=g).to(device=device, dtype=dtype)
    b_buf = (torch.randn(size_b, generator=g) / 32).to(device=device, dtype=dtype)
    o_buf = torch.empty(size_o, device=device, dtype=dtype)
    calls = []
    for p in prods:
        lead = () if p.batch is None else (p.batch,)
        n_a, n_b = (p.batch or 1) * p.m * p.k, (p.batch or 1) * p.k * p.n
        n_o = (p.batch or 1) * p.m * p.n
        a = a_buf[:n_a].view(*lead, p.m, p.k)
        b = (
            b_buf[:n_b].view(*lead, p.n, p.k).transpose(-1, -2)
            if p.b_t
            else b_buf[:n_b].view(*lead, p.k, p.n)
        )
        o = o_buf[:n_o].view(*lead, p.m, p.n)
        calls.append((torch.mm if p.batch is None else torch.bmm, a, b, o))
    counts = {group: sum(p.group == group for p in prods) for group in GROUPS}

    def run() -> dict[str, int]:
        for fn, a, b, o in calls:
            fn(a, b, out=o)
        return counts

    return run


def group_runner(
    prods: list[Product], group: str, dtype: torch.dtype, device: torch.device
) -> Callable[[], dict[str, int]]:
    """:func:`bound_runner` on the products of one group (for the breakdown)."""
    return bound_runner([p for p in prods if p.group == group], dtype, device)


def pair_order_agreement(got: torch.Tensor, want: torch.Tensor) -> float:
    """The share of (image, caption, caption) triples whose two scores are in the same order
    in ``got`` as in ``want`` (ties in either count as agreeing)."""
    agree, total = 0, 0
    for g, w in zip(got.double(), want.double(), strict=True):
        dg, dw = g[:, None] - g[None, :], w[:, None] - w[None, :]
        agree += int(((dg * dw) >= 0).sum())
        total += dg.numel()
    return agree / total


def before_sgraf(rev: str):
    """``SGRAFScorer`` as it was at git revision ``rev``: its ``models/sgraf.py`` with the
    kernels it imports (``attention.py``, ``sgraf_ops.py`` where it exists) copied into a
    temporary package, imported beside today's."""
    root = Path(__file__).resolve().parent.parent
    pkg = Path(tempfile.mkdtemp(prefix="vlret_before_")) / f"sgraf_{rev}"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for name in ("sgraf.py", "attention.py", "sgraf_ops.py"):
        shown = subprocess.run(
            ["git", "-C", str(root), "show", f"{rev}:src/vlret/models/{name}"],
            capture_output=True,
            text=True,
        )
        if shown.returncode == 0:
            (pkg / name).write_text(shown.stdout)
        elif name == "sgraf.py":
            raise SystemExit(f"--before {rev}: {shown.stderr.strip()}")
    sys.path.insert(0, str(pkg.parent))
    return importlib.import_module(f"{pkg.name}.sgraf").SGRAFScorer


def _shares(prods: list[Product], dtype: torch.dtype, device: torch.device, timer) -> str:
    """Each group's share of the bound's time (each group timed once on its own)."""
    times = {}
    for group in GROUPS:
        if any(p.group == group for p in prods):
            run = group_runner(prods, group, dtype, device)
            run()
            times[group] = timer(run)[0]
    total = sum(times.values())
    return ", ".join(f"{g} {t / total:.0%}" for g, t in times.items())


def bench_sgraf_bound(args, timer, device: torch.device, cls, module: str, data) -> None:
    """``module``'s scoring (``cls`` is ``SGRAFScorer``) of ``data = (regions, words,
    lengths)`` against its full GEMM bound in both precisions and, for reference, against the
    local projection's GEMMs alone; with ``args.before`` the scorer of that revision (same
    weights) in the same repeats. ``timer(fn) -> (seconds, fn())``."""
    regions, words, lengths = data
    n_img, n_cap = regions.shape[0], words.shape[0]
    torch.manual_seed(0)
    scorer = cls(regions.shape[2], 256, module, 3).to(device).eval()
    old = None
    if args.before:
        old = before_sgraf(args.before)(regions.shape[2], 256, module, 3).to(device).eval()
        old.load_state_dict(scorer.state_dict())
    tops = sorted(lengths.tolist(), reverse=True)
    prods = {p: products(scorer, n_img, tops, device, dtype=p) for p in PRECISIONS}
    full = {p: bound_runner(prods[p], p, device) for p in PRECISIONS}
    local = [p for p in prods[torch.float32] if p.name == "local projection"]
    proj = {p: bound_runner(local, p, device) for p in (torch.float32, torch.bfloat16)}
    triples = sum(p.m for p in local)

    def score(precision: str):
        scorer.matmul_precision = precision
        return scorer(regions, words, lengths)

    print(
        f"\n(c) {module.upper()} against its GEMM bound, {n_img} images x {n_cap} captions "
        f"({triples} image-caption-word triples; float32: {len(local)} blocks, "
        f"{len(prods[torch.float32])} products; bfloat16: {len(prods[torch.bfloat16])} products)"
    )
    with torch.no_grad():
        want = scorer.double()(regions.double(), words.double(), lengths)
        scorer.float()
        for p in ("float32", "bfloat16"):
            got = score(p)
            err = (got.double() - want).abs().max().item()
            order = pair_order_agreement(got, want)
            machine.record(f"{module}_{p}_error", {"max_abs": err, "pair_order_agreement": order})
            print(
                f"  {p}: max |score - float64| = {err:.2e} (scores spread {want.std():.2e}); "
                f"caption pairs in float64's order {order * 100:.3f}%"
            )
        if old is not None:
            diff = (old(regions, words, lengths).double() - want).abs().max().item()
            print(f"  {args.before}: max |score - float64| = {diff:.2e}")
            if not diff <= 1e-5:
                raise SystemExit(f"{args.before}: scores differ from float64")
        for run in (*full.values(), *proj.values()):
            run()
        keys = ("full", "full_low", "float32", "bfloat16", "proj", "proj_low", "before")
        t: dict[str, list[float]] = {k: [] for k in keys}
        for _ in range(args.repeats):
            t["full"].append(timer(full[torch.float32])[0])
            t["float32"].append(timer(lambda: score("float32"))[0])
            t["full_low"].append(timer(full[torch.bfloat16])[0])
            t["bfloat16"].append(timer(lambda: score("bfloat16"))[0])
            t["proj"].append(timer(proj[torch.float32])[0])
            t["proj_low"].append(timer(proj[torch.bfloat16])[0])
            if old is not None:
                t["before"].append(timer(lambda: old(regions, words, lengths))[0])
        shares = {p: _shares(prods[p], p, device, timer) for p in PRECISIONS}

    def ratio(a: str, b: str) -> list[float]:
        return [x / y for x, y in zip(t[a], t[b], strict=True)]

    ratios = {
        "float32/full_bound": ratio("float32", "full"),
        "bfloat16/full_bound_low": ratio("bfloat16", "full_low"),
        "full_bound_low/full_bound": ratio("full_low", "full"),
        "float32/bound": ratio("float32", "proj"),
        "bfloat16/bound": ratio("bfloat16", "proj"),
        "bound_low/bound": ratio("proj_low", "proj"),
        "bfloat16/bound_low": ratio("bfloat16", "proj_low"),
    }
    if old is not None:
        ratios["before/full_bound"] = ratio("before", "full")
    seconds = {f"{k}_seconds": statistics.median(t[k]) for k in ("full", "full_low", "proj")}
    machine.record(
        f"{module}_bound",
        {
            "full_bound_seconds": seconds["full_seconds"],
            "full_bound_low_seconds": seconds["full_low_seconds"],
            "bound_seconds": seconds["proj_seconds"],
            "full_bound_shares": shares[torch.float32],
            "full_bound_low_shares": shares[torch.bfloat16],
        }
        | {k: statistics.median(v) for k, v in ratios.items()},
    )
    print(
        f"  full bound (every product) in float32 {seconds['full_seconds'] * 1e3:.0f} ms "
        f"({shares[torch.float32]}); in bfloat16 {seconds['full_low_seconds'] * 1e3:.0f} ms "
        f"({shares[torch.bfloat16]}), {spread(ratios['full_bound_low/full_bound'])} the float32"
    )
    print(
        f"  {module.upper()} float32 / full float32 bound "
        f"{spread(ratios['float32/full_bound'])} [target <= 1.5x]"
    )
    print(
        f"  {module.upper()} bfloat16 / full bfloat16 bound "
        f"{spread(ratios['bfloat16/full_bound_low'])} [target <= 1.5x]"
    )
    if old is not None:
        print(f"  {args.before} float32 / full float32 bound {spread(ratios['before/full_bound'])}")
    print(
        f"  (projection-only bound, the local projection's GEMMs alone, float32 "
        f"{seconds['proj_seconds'] * 1e3:.0f} ms: vlret float32 / it "
        f"{spread(ratios['float32/bound'])}, vlret bfloat16 / it "
        f"{spread(ratios['bfloat16/bound'])}; the same GEMMs in bfloat16 / it "
        f"{spread(ratios['bound_low/bound'])}, so vlret bfloat16 / them "
        f"{spread(ratios['bfloat16/bound_low'])})"
    )


__all__ = [
    "GROUPS",
    "Product",
    "bench_sgraf_bound",
    "before_sgraf",
    "bound_runner",
    "group_runner",
    "pair_order_agreement",
    "products",
]
