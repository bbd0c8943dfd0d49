"""benchmarks/ref_imram.py: the GEMM bound lists exactly the products ``imram_scores`` runs.

The oracle is the scorer itself: a dispatch mode records every ``mm`` / ``addmm`` / ``bmm`` /
``baddbmm`` a real evaluation call runs (shapes after ``F.linear`` / ``matmul`` lower to
them), and the bound's products, which its closure runs, must be the same multiset.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from bench_modules import benchmark_fixture
from vlret.models import build_model

D, R = 8, 5
PRODUCTS = {
    getattr(op, overload)
    for op in (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm, torch.ops.aten.baddbmm)
    for overload in ("default", "out")
} | {torch.ops.aten.baddbmm_.default}


ref = benchmark_fixture("ref_imram")


class _Products(TorchDispatchMode):
    """Records ``(batch, m, k, n)`` of every matrix product dispatched."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in PRODUCTS:
            a, b = (
                (args[1], args[2]) if "addmm" in str(func) or "baddbmm" in str(func) else args[:2]
            )
            batch = a.shape[0] if a.dim() == 3 else None
            self.seen[(batch, a.shape[-2], a.shape[-1], b.shape[-1])] += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("mode", ["text", "image", "full"])
@pytest.mark.parametrize("steps", [1, 3])
def test_the_bound_runs_the_products_the_scorer_runs(ref, mode, steps):
    torch.manual_seed(0)
    model = build_model(
        {"kind": "imram", "embed_dim": D, "mode": mode, "steps": steps, "image": {"in_dim": 4}},
        vocab_size=9,
    ).eval()
    g = torch.Generator().manual_seed(1)
    regions = torch.randn(7, R, D, generator=g)
    lengths = torch.tensor([3, 6, 1, 4, 6, 2, 5, 2, 3])
    words = torch.randn(9, 6, D, generator=g)
    budget = 6 * 2 * D * 6  # several image runs and caption blocks
    with torch.no_grad(), _Products() as scorer:
        model.score(regions, words, lengths, max_elements=budget)
    run = ref.gemm_bound(model, regions, words, lengths, max_elements=budget)
    with _Products() as bound:
        run()
    assert bound.seen == scorer.seen
    assert sum(scorer.seen.values()) > 10
