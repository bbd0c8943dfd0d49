"""SGRAF's block plan and its ``matmul_precision="bfloat16"`` evaluation path.

The float32 path's values and gradients are checked against the naive reference in
``test_sgraf.py``; here: the bfloat16 path stays within the error its roundings allow, is
really taken (it differs from float32), is never taken when autograd records, and the block
plan covers every caption once within its memory bound.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vlret.models import build_model
from vlret.models.attention import CPU_BLOCK_ELEMENTS
from vlret.models.sgraf import CPU_EVAL_BLOCK_BYTES, SGRAFScorer
from vlret.models.sgraf_ops import graph_reasoning, graph_steps

D, S, R = 32, 16, 6
BF16_EPS = 2.0**-7  # bfloat16's machine epsilon (8 significand bits, the leading one implicit)


pytestmark = pytest.mark.usefixtures("one_thread")


def _tokens(n_img=5, n_cap=7, width=6, seed=1):
    g = torch.Generator().manual_seed(seed)
    regions = F.normalize(torch.randn(n_img, R, D, generator=g, dtype=torch.float64), dim=-1)
    words = F.normalize(torch.randn(n_cap, width, D, generator=g, dtype=torch.float64), dim=-1)
    lengths = torch.randint(1, width + 1, (n_cap,), generator=g)
    lengths[0] = width
    return regions, words * (torch.arange(width)[None] < lengths[:, None])[..., None], lengths


def _scorer(module: str, seed: int = 0) -> SGRAFScorer:
    torch.manual_seed(seed)
    scorer = SGRAFScorer(D, S, module, 3, num_regions=R).eval()
    with torch.no_grad():  # spread the scores: default init puts every score near 0.5
        for p in scorer.parameters():
            p.mul_(3.0)
    return scorer


@pytest.mark.parametrize("module", ["sgr", "saf"])
def test_bfloat16_scores_within_their_rounding_error(module):
    scorer = _scorer(module)
    regions, words, lengths = _tokens()
    with torch.no_grad():
        want = scorer.double()(regions, words, lengths)
        scorer.float()
        exact = scorer(regions.float(), words.float(), lengths)
        scorer.matmul_precision = "bfloat16"
        low = scorer(regions.float(), words.float(), lengths)
    assert low.dtype == torch.float32 and low.shape == want.shape
    # The score is sigmoid(w . v + b) with v unit-norm: |d score| <= |w| |dv| / 4. Each of
    # the ~12 chained products (attention, attended vectors, projection, 3 SGR steps, ...)
    # rounds its operands and its result to bfloat16, a relative error of BF16_EPS / 2 each;
    # the normalised vectors carry relative errors, so |dv| <= 12 * 3 * BF16_EPS / 2.
    bound = scorer.head.weight.norm().item() * 12 * 3 * BF16_EPS / 2 / 4
    err = (low.double() - want).abs().max().item()
    assert err <= bound, (err, bound)
    # ... and the path is really taken: float32 is a thousand times closer.
    assert (exact.double() - want).abs().max().item() < err / 100


@pytest.mark.parametrize("module", ["sgr", "saf"])
def test_bfloat16_never_applies_when_autograd_records(module):
    scorer = _scorer(module)
    regions, words, lengths = (t.float() if t.is_floating_point() else t for t in _tokens())
    exact = scorer(regions, words, lengths)
    scorer.matmul_precision = "bfloat16"
    recorded = scorer(regions.requires_grad_(), words, lengths)
    assert recorded.requires_grad and torch.equal(recorded, exact)
    recorded.sum().backward()
    assert torch.isfinite(regions.grad).all()


def test_graph_reasoning_bfloat16_close_to_float32():
    torch.manual_seed(0)
    scorer = _scorer("sgr")
    nodes = F.normalize(torch.randn(3, 2, 5, S), dim=-1)
    mask = torch.tensor([[True] * 5, [True, True, True, False, False]])
    with torch.no_grad():
        exact = graph_reasoning(nodes.double(), mask, graph_steps(scorer.sgr, torch.float64, False))
        low_steps = graph_steps(scorer.sgr, torch.float32, True, offset=False)
        low = graph_reasoning(nodes, mask, low_steps, torch.float32)
    assert low_steps[0].fused.dtype == torch.bfloat16 and low.dtype == torch.float32
    # relu(W s + b) over 3 steps, |W| <= 3 * init scale: relative error a few BF16_EPS each.
    scale = exact.abs().max().item()
    assert (low.double() - exact).abs().max().item() <= 3 * 3 * BF16_EPS * scale * 4


def test_graph_reasoning_without_the_logit_offset_is_the_same():
    """The offset row (constant over the keys) cancels in the softmax: calls without autograd
    leave it out, with the same numbers up to float64 rounding."""
    scorer = _scorer("sgr")
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():  # biases give the offset row W_q^T b_k its weight
        for step in scorer.sgr:
            for layer in (step.query, step.key, step.update):
                layer.bias.copy_(torch.randn(S, generator=g))
    nodes = F.normalize(torch.randn(3, 2, 5, S, generator=g, dtype=torch.float64), dim=-1)
    mask = torch.tensor([[True] * 5, [True, True, False, False, False]])
    with_offset = graph_steps(scorer.sgr, torch.float64, False)
    without = graph_steps(scorer.sgr, torch.float64, False, offset=False)
    assert with_offset[0].offset and with_offset[0].fused.shape == (2 * S + 1, S)
    assert not without[0].offset and without[0].fused.shape == (2 * S, S)
    want = graph_reasoning(nodes, mask, with_offset)
    assert with_offset[0].fused[S].abs().max() > 0.1  # the offset row is not zero
    assert torch.allclose(graph_reasoning(nodes, mask, without), want, rtol=0, atol=1e-13)


@pytest.mark.parametrize("eval_dtype", [None, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_plan_blocks_cover_every_caption_once_within_the_bound(device, eval_dtype):
    scorer = SGRAFScorer(1024, 256, "sgr", 3)
    g = torch.Generator().manual_seed(0)
    lengths = sorted((1 + torch.randint(0, 30, (301,), generator=g)).tolist(), reverse=True)
    n_img, budget = 97, 2**22
    plan = scorer.plan_blocks(n_img, lengths, torch.device(device), budget, eval_dtype=eval_dtype)
    assert plan[0][0] == 0 and plan[-1][1] == len(lengths)
    cpu_cap = CPU_BLOCK_ELEMENTS  # with autograd; without, a byte bound of the products' dtype
    if eval_dtype is not None:
        cpu_cap = CPU_EVAL_BLOCK_BYTES // (4 if eval_dtype == torch.float32 else 2)
    cap = min(budget, cpu_cap) if device == "cpu" else budget
    for (c0, c1, top, img_block), nxt in zip(plan, plan[1:] + [None], strict=True):
        assert c0 < c1 and (nxt is None or nxt[0] == c1)  # contiguous, in order
        assert top == lengths[c0] == max(lengths[c0:c1])  # trimmed to its longest caption
        assert 1 <= img_block <= n_img
        per_pair = max(top * 1024, (top + 1) * 256)
        pairs = img_block * (c1 - c0)
        assert pairs == 1 or pairs * per_pair <= cap
        if device == "cpu" and c1 < len(lengths):  # enough rows for the word-region GEMM
            assert (c1 - c0) * top >= 64 or img_block == 1
    if device == "cuda":  # a GPU block takes as many images as fit first
        assert all(
            b[3] == min(n_img, max(1, budget // max(b[2] * 1024, (b[2] + 1) * 256))) for b in plan
        )


def test_bad_precision_names_its_argument():
    with pytest.raises(ValueError, match="matmul_precision"):
        SGRAFScorer(D, S, num_regions=R, matmul_precision="float16")
    scorer = SGRAFScorer(D, S, num_regions=R)
    with pytest.raises(ValueError, match="matmul_precision"):
        scorer.matmul_precision = "bf16"  # set later: checked too
    assert scorer.matmul_precision == "float32"
    base = {
        "kind": "sgraf",
        "embed_dim": 8,
        "sim_dim": 4,
        "num_regions": 4,
        "image": {"in_dim": 6},
        "text": {"word_dim": 5},
    }
    model = build_model({**base, "matmul_precision": "bfloat16"}, vocab_size=13)
    assert model.scorer.matmul_precision == "bfloat16"
    with pytest.raises(ValueError, match="matmul_precision"):
        build_model({**base, "matmul_precision": "half"}, vocab_size=13)
