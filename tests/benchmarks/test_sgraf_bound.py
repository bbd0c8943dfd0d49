"""benchmarks/sgraf_bound.py: the full GEMM bound lists exactly the products SGRAFScorer runs.

The oracle is the scorer itself: a dispatch mode records every ``mm``/``addmm``/``bmm`` a real
evaluation call runs (shapes after ``F.linear``/``matmul`` lower to them), and the bound's
products must be the same multiset, but for the two differences the bound documents (the
caption side's global attention over real words only, where the scorer runs it on padding
too) and the bfloat16 path's own Gram products (its norms, not model work).
"""

from __future__ import annotations

import importlib
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from vlret.models.sgraf import SGRAFScorer

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
D, S, R = 48, 16, 5
PRODUCTS = {
    getattr(op, overload)
    for op in (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm)
    for overload in ("default", "out")
}


@pytest.fixture(scope="module")
def bound():
    sys.path.insert(0, str(BENCH))
    try:
        yield importlib.import_module("sgraf_bound")
    finally:
        sys.path.remove(str(BENCH))


class _Products(TorchDispatchMode):
    """Records ``(batch, m, k, n)`` of every matrix product dispatched."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in PRODUCTS:
            a, b = args[-2], args[-1]
            batch = a.shape[0] if a.dim() == 3 else None
            self.seen[(batch, a.shape[-2], a.shape[-1], b.shape[-1])] += 1
        return func(*args, **(kwargs or {}))


def _data(n_img=9, n_cap=11, width=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    regions = torch.randn(n_img, R, D, generator=g)
    lengths = torch.randint(2, width + 1, (n_cap,), generator=g)
    lengths[3] = width
    words = torch.randn(n_cap, width, D, generator=g)
    return regions, words, lengths


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
@pytest.mark.parametrize("module", ["sgr", "saf"])
def test_the_bound_lists_the_products_the_scorer_runs(bound, module, precision):
    torch.manual_seed(0)
    scorer = SGRAFScorer(D, S, module, 3, num_regions=R, matmul_precision=precision).eval()
    regions, words, lengths = _data()
    budget = 3 * 7 * D  # small blocks: many of them, several image runs per caption block
    low = precision == "bfloat16"
    with torch.no_grad(), _Products() as rec:
        scorer(regions, words, lengths, max_elements=budget)
    tops = sorted(lengths.tolist(), reverse=True)
    want = Counter()
    mm_dtype = torch.bfloat16 if low else torch.float32
    for p in bound.products(scorer, 9, tops, torch.device("cpu"), budget, mm_dtype):
        if p.name in ("caption local_fc", "caption common"):
            # the scorer runs these over the padded words, the bound over the real ones
            assert p.m == int(lengths.sum())
            want[(p.batch, 11 * 7, p.k, p.n)] += 1
        else:
            want[(p.batch, p.m, p.k, p.n)] += 1
    got = rec.seen
    if low:  # the Gram matrices of the images, then each block's attention times them
        assert got.pop((9, R, D, R)) == 1
        plan = scorer.plan_blocks(9, tops, torch.device("cpu"), budget, eval_dtype=mm_dtype)
        runs = sum(-(-9 // img_block) for *_, img_block in plan)
        grams = Counter({k: v for k, v in got.items() if k[2:] == (R, R)})
        assert sum(grams.values()) == runs
        got = got - grams
    assert got == want


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_bound_runs_each_product_once_in_its_dtype(bound, dtype):
    scorer = SGRAFScorer(D, S, "sgr", 2, num_regions=R)
    _, _, lengths = _data()
    tops = sorted(lengths.tolist(), reverse=True)
    prods = bound.products(scorer, 9, tops, torch.device("cpu"), dtype=dtype)
    with _Products() as rec:
        counts = bound.bound_runner(prods, dtype, torch.device("cpu"))()
    assert rec.seen == Counter((p.batch, p.m, p.k, p.n) for p in prods)
    assert sum(counts.values()) == len(prods)
    assert counts["graph reasoning"] == sum(p.group == "graph reasoning" for p in prods) > 0
