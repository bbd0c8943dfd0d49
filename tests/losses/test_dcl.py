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


# ----------------------------------------------------------------------------- DCLW

IDS = [0, 1, 1, 2, 3, 4, 4, 4, 5, 6]


def _naive_weighted(sim, ids, tau, sigma, detach=False):
    """DCLW one anchor at a time: ``-w_i s_ii / tau + log sum_neg exp(s_ij / tau)`` with
    ``w_i = 2 - exp(s_ii / sigma) / mean_k exp(s_kk / sigma)`` over the batch's pairs."""
    n = sim.shape[0]
    diag = [sim[k, k].detach() if detach else sim[k, k] for k in range(n)]
    mean = sum(torch.exp(d / sigma) for d in diag) / n
    out = []
    for i in range(n):
        w = 2 - torch.exp(diag[i] / sigma) / mean
        total = sim.new_zeros(())
        for line in (sim[i], sim[:, i]):
            negs = [line[j] / tau for j in range(n) if ids[j] != ids[i]]
            if negs:
                total = total + torch.stack(negs).logsumexp(0) - w * sim[i, i] / tau
        out.append(total)
    return torch.stack(out)


def _grads(out, inputs, weight=1.0):
    return torch.autograd.grad((out * weight).sum(), inputs, retain_graph=True)


@pytest.mark.parametrize("with_ids", [False, True])
@pytest.mark.parametrize("detach", [False, True])
def test_weighted_dense_equals_the_naive_loop(with_ids, detach):
    img, txt = _pairs(seed=5)
    ids = IDS if with_ids else list(range(10))
    sim = cosine_similarity(img, txt)
    got = dcl_loss(
        sim,
        temperature=0.2,
        weighted=True,
        sigma=0.5,
        detach_weight=detach,
        pos_mask=positive_mask(ids, ids),
        reduction="none",
    )
    want = _naive_weighted(sim, ids, 0.2, 0.5, detach)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    for g, w in zip(_grads(got, (img, txt)), _grads(want, (img, txt)), strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-12)
    # the weighting changes the loss, and detaching it changes the gradient
    plain = dcl_loss(sim, temperature=0.2, pos_mask=positive_mask(ids, ids), reduction="none")
    assert (got - plain).abs().max() > 1e-3
    other = _naive_weighted(sim, ids, 0.2, 0.5, not detach)
    assert (_grads(got, (img,))[0] - _grads(other, (img,))[0]).abs().max() > 1e-6


def test_weights_average_one_and_a_wide_sigma_is_plain_dcl():
    img, txt = _pairs(seed=6)
    sim = cosine_similarity(img, txt).detach()
    # sum_i w_i s_ii = B mean(s) - B * E_softmax[s]; with sigma -> inf every w_i -> 1
    wide = dcl_loss(sim, weighted=True, sigma=1e9, reduction="none")
    torch.testing.assert_close(wide, dcl_loss(sim, reduction="none"), rtol=0, atol=1e-7)
    # the positive terms' weights average 1: the weighted and plain sums differ only by
    # sum_i (1 - w_i) s_ii / tau per direction, and sum_i (1 - w_i) = 0
    diff = (dcl_loss(sim, weighted=True, reduction="sum") - dcl_loss(sim, reduction="sum")) * 0.1
    soft = torch.softmax(sim.diagonal() / 0.5, 0)
    expected = 2 * (10 * soft - 1) @ sim.diagonal()
    torch.testing.assert_close(diff, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("chunk_size", [1, 3, 16])
def test_weighted_tiled_equals_dense_value_and_gradient(reduction, chunk_size):
    img, txt = _pairs(seed=1)
    hyper = {"temperature": 0.1, "weighted": True, "sigma": 0.3}
    dense = dcl_loss(
        cosine_similarity(img, txt), pos_mask=positive_mask(IDS, IDS), reduction=reduction, **hyper
    )
    tiled = tiled_dcl_loss(
        img, txt, img_ids=IDS, chunk_size=chunk_size, reduction=reduction, **hyper
    )
    torch.testing.assert_close(tiled, dense, rtol=0, atol=1e-12)
    weight = torch.linspace(0.5, 1.5, 10, dtype=torch.float64) if reduction == "none" else 1.0
    for g, w in zip(
        _grads(tiled, (img, txt), weight), _grads(dense, (img, txt), weight), strict=True
    ):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-12)


@pytest.mark.parametrize("detach", [False, True])
def test_weighted_shards_normalise_over_the_batch_and_add_up(detach):
    """Each shard's weights normalise over all B pairs (a shard-local softmax would not add up)."""
    img, txt = _pairs(seed=3)
    loss = build_loss("dcl", weighted=True, detach_weight=detach, chunk_size=4)
    whole = loss(img, txt, IDS)
    parts = [loss(img, txt, IDS, shard=s) for s in ((0, 3), (3, 7), (7, 10))]
    torch.testing.assert_close(sum(parts), whole, rtol=0, atol=1e-12)
    got = [sum(gs) for gs in zip(*(_grads(p, (img, txt)) for p in parts), strict=True)]
    for g, w in zip(got, _grads(whole, (img, txt)), strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-12)
    dense = build_loss("dcl", weighted=True, detach_weight=detach)(img, txt, IDS)
    torch.testing.assert_close(whole, dense, rtol=0, atol=1e-12)


def test_sigma_and_the_flags_are_checked_by_name():
    sim = torch.eye(3, dtype=torch.float64)
    for value in (0.0, -0.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="sigma"):
            dcl_loss(sim, weighted=True, sigma=value)
        with pytest.raises(ValueError, match="sigma"):
            build_loss("dcl", weighted=True, sigma=value)
        with pytest.raises(ValueError, match="sigma"):
            tiled_dcl_loss(torch.eye(3), torch.eye(3), sigma=value, chunk_size=2)
    with pytest.raises(ValueError, match="weighted must be a bool"):
        build_loss("dcl", weighted=1)
    with pytest.raises(ValueError, match="detach_weight must be a bool"):
        dcl_loss(sim, detach_weight="no")
    assert "sigma=0.5" in repr(build_loss("dcl", weighted=True))
