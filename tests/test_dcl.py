"""DCL against a naive per-anchor loop, its InfoNCE identity, and its tiled form."""

from __future__ import annotations

import math

import pytest
import torch

from vlret.losses import build_loss, infonce_loss, loss_capabilities
from vlret.losses.dcl import dcl_loss, tiled_dcl_loss
from vlret.similarity import cosine_similarity, positive_mask


def _pairs(n=10, dim=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    img = torch.randn(n, dim, generator=gen, dtype=torch.float64)
    txt = img + 0.7 * torch.randn(n, dim, generator=gen, dtype=torch.float64)
    return img.requires_grad_(), txt.requires_grad_()


def _naive(sim, ids, tau):
    """Eq. 6 one anchor at a time: -s_ii / tau + log sum over the other modality's negatives."""
    n = sim.shape[0]
    out = []
    for i in range(n):
        total = 0.0
        for line in (sim[i], sim[:, i]):
            negs = [line[j] / tau for j in range(n) if ids[j] != ids[i]]
            if negs:
                total = total + torch.stack(negs).logsumexp(0) - sim[i, i] / tau
        out.append(total if isinstance(total, torch.Tensor) else sim.new_zeros(()))
    return torch.stack(out)


@pytest.mark.parametrize("with_ids", [False, True])
def test_dense_equals_the_naive_loop(with_ids):
    img, txt = _pairs()
    ids = [i // 2 for i in range(10)] if with_ids else list(range(10))
    sim = cosine_similarity(img, txt)
    got = dcl_loss(sim, temperature=0.2, pos_mask=positive_mask(ids, ids), reduction="none")
    torch.testing.assert_close(got, _naive(sim, ids, 0.2), rtol=0, atol=1e-12)


def test_infonce_is_the_softplus_of_each_directions_dcl_term():
    img, txt = _pairs(seed=2)
    sim = cosine_similarity(img, txt).detach()
    rows = dcl_loss(sim, temperature=0.1, reduction="none")  # both directions summed
    t = sim / 0.1
    eye = torch.eye(10, dtype=torch.bool)
    row_terms = t.masked_fill(eye, -math.inf).logsumexp(1) - t.diagonal()
    col_terms = t.masked_fill(eye, -math.inf).logsumexp(0) - t.diagonal()
    torch.testing.assert_close(rows, row_terms + col_terms, rtol=0, atol=1e-12)
    softplus = torch.nn.functional.softplus
    want = infonce_loss(sim, temperature=0.1, reduction="none")
    torch.testing.assert_close(softplus(row_terms) + softplus(col_terms), want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("chunk_size", [1, 3, 16])
def test_tiled_equals_dense_value_and_gradient(reduction, chunk_size):
    img, txt = _pairs(seed=1)
    ids = [0, 1, 1, 2, 3, 4, 4, 4, 5, 6]
    dense = dcl_loss(
        cosine_similarity(img, txt), pos_mask=positive_mask(ids, ids), reduction=reduction
    )
    tiled = tiled_dcl_loss(img, txt, img_ids=ids, chunk_size=chunk_size, reduction=reduction)
    torch.testing.assert_close(tiled, dense, rtol=0, atol=1e-12)
    weight = torch.linspace(0.5, 1.5, 10, dtype=torch.float64) if reduction == "none" else 1.0
    got = torch.autograd.grad((tiled * weight).sum(), (img, txt))
    want = torch.autograd.grad((dense * weight).sum(), (img, txt))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-12)


def test_shards_add_up_to_the_batch_and_the_module_builds_by_name():
    img, txt = _pairs(seed=3)
    loss = build_loss("dcl", temperature=0.1, chunk_size=4)
    assert loss_capabilities(loss).local_shards
    whole = loss(img, txt)
    parts = sum(loss(img, txt, shard=s) for s in ((0, 3), (3, 10)))
    torch.testing.assert_close(parts, whole, rtol=0, atol=1e-12)
    dense = build_loss("dcl", temperature=0.1)(img, txt)
    torch.testing.assert_close(whole, dense, rtol=0, atol=1e-12)


def test_an_anchor_without_negatives_contributes_a_zero_with_finite_gradients():
    img, txt = _pairs(n=3, seed=4)
    sim = cosine_similarity(img, txt)
    every = torch.ones(3, 3, dtype=torch.bool)
    out = dcl_loss(sim, pos_mask=every, reduction="sum")
    assert out.item() == 0.0
    out.backward()
    assert torch.isfinite(img.grad).all() and img.grad.abs().max() == 0
    with pytest.raises(ValueError, match="temperature"):
        build_loss("dcl", temperature=0.0)
