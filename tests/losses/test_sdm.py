"""SDM (IRRA's similarity distribution matching): dense and tiled forms against a naive float64
loop written from the paper's Eq. 4-6 and IRRA's ``compute_sdm``, with identity ids."""

from __future__ import annotations

import math

import pytest
import torch

from vlret.losses import SDMLoss, build_loss, loss_capabilities, sdm_loss, tiled_sdm_loss
from vlret.similarity import cosine_similarity, positive_mask


def _oracle(img, txt, pids, scale=50.0, eps=1e-8):
    """IRRA's value in plain floats: per direction the mean over anchors of
    sum_j p_ij (log p_ij - log(q_ij + eps)), p the softmax of scale * cos, q the same-identity
    row normalised to sum 1; the two directions summed."""
    n = len(pids)
    cos = [
        [
            sum(a * b for a, b in zip(img[i], txt[j], strict=True))
            / math.sqrt(sum(a * a for a in img[i]) * sum(b * b for b in txt[j]))
            for j in range(n)
        ]
        for i in range(n)
    ]
    total = 0.0
    for scores in (cos, [list(col) for col in zip(*cos, strict=True)]):
        direction = 0.0
        for i in range(n):
            z = [scale * s for s in scores[i]]
            top = max(z)
            norm = sum(math.exp(v - top) for v in z)
            labels = [1.0 if pids[i] == pids[j] else 0.0 for j in range(n)]
            count = sum(labels)
            for j in range(n):
                p = math.exp(z[j] - top) / norm
                direction += p * (math.log(p) - math.log(labels[j] / count + eps))
        total += direction / n
    return total


def _batch(n=7, d=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    img = torch.randn(n, d, generator=gen, dtype=torch.float64)
    txt = img + 0.7 * torch.randn(n, d, generator=gen, dtype=torch.float64)
    return img, txt


@pytest.mark.parametrize("pids", [list(range(7)), [0, 0, 1, 2, 2, 2, 3]])
@pytest.mark.parametrize("scale", [50.0, 5.0])
def test_sdm_equals_irra_formula(pids, scale):
    img, txt = _batch()
    want = _oracle(img.tolist(), txt.tolist(), pids, scale=scale)
    loss = SDMLoss(scale=scale)
    got = loss(img, txt, img_ids=pids, txt_ids=pids)
    # float64 throughout; the sums run over 2 * 7 * 7 terms of size <= log(1/eps) ~ 18
    assert got.item() == pytest.approx(want, rel=1e-12, abs=1e-12)
    sim = cosine_similarity(img, txt)
    dense = sdm_loss(sim, scale=scale, pos_mask=positive_mask(pids, pids))
    torch.testing.assert_close(dense, got, rtol=0, atol=0)


@pytest.mark.parametrize("chunk_size", [1, 3, 7, 16])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_tiled_equals_dense_values_and_gradients(chunk_size, reduction):
    img, txt = (t.requires_grad_(True) for t in _batch(n=9, seed=1))
    pids = [0, 1, 1, 2, 3, 3, 3, 4, 5]
    dense = SDMLoss(reduction=reduction)(img, txt, pids, pids)
    tiled = SDMLoss(reduction=reduction, chunk_size=chunk_size)(img, txt, pids, pids)
    torch.testing.assert_close(tiled, dense, rtol=0, atol=1e-12)
    weight = torch.linspace(0.5, 1.5, dense.numel(), dtype=torch.float64).reshape(dense.shape)
    want = torch.autograd.grad((dense * weight).sum(), (img, txt))
    got = torch.autograd.grad((tiled * weight).sum(), (img, txt))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-11)


def test_shards_add_up_to_the_batch():
    img, txt = _batch(n=8, seed=2)
    pids = [0, 0, 1, 2, 3, 3, 4, 5]
    whole = tiled_sdm_loss(img, txt, img_ids=pids, txt_ids=pids, chunk_size=3)
    parts = [
        tiled_sdm_loss(img, txt, img_ids=pids, txt_ids=pids, chunk_size=3, shard=(a, b))
        for a, b in ((0, 3), (3, 8))
    ]
    torch.testing.assert_close(parts[0] + parts[1], whole, rtol=0, atol=1e-12)
    assert loss_capabilities("sdm").local_shards


def test_separated_pairs_have_the_closed_form_value():
    """sim = I: every row is p_ii = 1 / (1 + 3 e^-50), p_neg = e^-50 / (1 + 3 e^-50) against
    q = one-hot, so each of the 2 x 4 rows contributes the same closed-form KL (about -eps)."""
    z = 1.0 + 3.0 * math.exp(-50.0)
    p_pos, p_neg = 1.0 / z, math.exp(-50.0) / z
    eps = 1e-8
    row = p_pos * (math.log(p_pos) - math.log(1.0 + eps)) + 3 * p_neg * (
        math.log(p_neg) - math.log(eps)
    )
    value = sdm_loss(torch.eye(4, dtype=torch.float64), scale=50.0, eps=eps)
    assert value.item() == pytest.approx(2 * row, rel=1e-9)
    assert abs(value.item()) < 3e-8  # p -> q: SDM -> 0 (up to the eps in log(q + eps))


def test_learnable_scale_gets_a_gradient_and_starts_at_scale():
    img, txt = _batch()
    loss = build_loss("sdm", learnable_scale=True, scale=20.0)
    assert [n for n, _ in loss.named_parameters()] == ["log_scale"]
    assert float(loss.scale.detach()) == pytest.approx(20.0)
    fixed = SDMLoss(scale=20.0)(img, txt)
    value = loss(img, txt)
    torch.testing.assert_close(value, fixed.to(value.dtype), rtol=1e-6, atol=0)
    value.backward()
    assert loss.log_scale.grad is not None and torch.isfinite(loss.log_scale.grad)
    assert "scale=20" in repr(loss) and "learnable_scale=True" in repr(loss)


def test_bad_parameters_are_named():
    with pytest.raises(ValueError, match="scale must be > 0"):
        SDMLoss(scale=0.0)
    with pytest.raises(ValueError, match="eps must be a positive finite number"):
        sdm_loss(torch.eye(3), eps=-1.0)
