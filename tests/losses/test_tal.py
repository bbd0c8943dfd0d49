"""TAL (RDE's triplet alignment loss): dense and tiled forms against a naive float64 loop
written from RDE's ``compute_TAL_per``, with identity ids."""

from __future__ import annotations

import math

import pytest
import torch

from vlret._checks import ParamError
from vlret.losses import build_loss, loss_capabilities
from vlret.losses.tal import TALLoss, tal_loss, tiled_tal_loss
from vlret.similarity import cosine_similarity, positive_mask


def _cos(img, txt):
    n = len(img)
    return [
        [
            sum(a * b for a, b in zip(img[i], txt[j], strict=True))
            / math.sqrt(sum(a * a for a in img[i]) * sum(b * b for b in txt[j]))
            for j in range(n)
        ]
        for i in range(n)
    ]


def _oracle_terms(img, txt, pids, tau=0.015, margin=0.1):
    """Per pair, in plain floats: for each direction's anchor
    [m - sum_{pos} alpha_j s_j + tau log sum_{neg} exp(s_j / tau)]_+ with alpha the softmax of
    the positives' s / tau (RDE's compute_TAL_per: rows texts, then the transpose)."""
    n = len(pids)
    cos = _cos(img, txt)  # rows images
    t2i = [[cos[j][i] for j in range(n)] for i in range(n)]  # rows texts (RDE's scores)
    terms = [0.0] * n
    for scores in (t2i, cos):
        for i in range(n):
            pos = [scores[i][j] for j in range(n) if pids[i] == pids[j]]
            neg = [scores[i][j] for j in range(n) if pids[i] != pids[j]]
            if not neg:
                continue  # RDE: log 0 = -inf, clamped to 0
            top = max(pos)
            w = [math.exp((s - top) / tau) for s in pos]
            positive = sum(a * s for a, s in zip(w, pos, strict=True)) / sum(w)
            big = max(neg)
            lse = big / tau + math.log(sum(math.exp((s - big) / tau) for s in neg))
            terms[i] += max(0.0, margin - positive + tau * lse)
    return terms


def _batch(n=7, d=5, seed=0, noise=0.7):
    gen = torch.Generator().manual_seed(seed)
    img = torch.randn(n, d, generator=gen, dtype=torch.float64)
    txt = img + noise * torch.randn(n, d, generator=gen, dtype=torch.float64)
    return img, txt


@pytest.mark.parametrize("pids", [list(range(7)), [0, 0, 1, 2, 2, 2, 3]])
@pytest.mark.parametrize(("tau", "margin"), [(0.015, 0.1), (0.2, 0.5)])
def test_tal_equals_rde_formula(pids, tau, margin):
    img, txt = _batch()
    want = _oracle_terms(img.tolist(), txt.tolist(), pids, tau=tau, margin=margin)
    assert sum(want) > 0  # the hinge is active somewhere: the check has teeth
    loss = TALLoss(tau=tau, margin=margin)
    got = loss(img, txt, img_ids=pids, txt_ids=pids)
    # float64; the log-sum-exp of values up to 1/tau ~ 67 loses ~1e-14 relative
    assert got.item() == pytest.approx(sum(want), rel=1e-11, abs=1e-12)
    terms = TALLoss(tau=tau, margin=margin, reduction="none")(img, txt, pids, pids)
    want_terms = torch.tensor(want, dtype=torch.float64)
    torch.testing.assert_close(terms, want_terms, rtol=1e-11, atol=1e-12)
    mean = TALLoss(tau=tau, margin=margin, reduction="mean")(img, txt, pids, pids)
    assert mean.item() == pytest.approx(sum(want) / len(pids), rel=1e-11, abs=1e-12)
    sim = cosine_similarity(img, txt)
    dense = tal_loss(sim, tau=tau, margin=margin, pos_mask=positive_mask(pids, pids))
    torch.testing.assert_close(dense, got, rtol=0, atol=0)


def test_defaults_are_rde_released_runs():
    loss = build_loss("tal")
    assert (loss.tau, loss.margin, loss.reduction, loss.config.detach_weights) == (
        0.015,
        0.1,
        "sum",
        True,
    )
    assert loss_capabilities("tal").local_shards
    assert "tau=0.015" in repr(loss) and "margin=0.1" in repr(loss)


@pytest.mark.parametrize("chunk_size", [1, 4, 16])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("detach_weights", [True, False])
def test_tiled_equals_dense_values_and_gradients(chunk_size, reduction, detach_weights):
    img, txt = (t.requires_grad_(True) for t in _batch(n=9, seed=1, noise=0.4))
    pids = [0, 1, 1, 2, 3, 3, 3, 4, 5]
    kw = {"reduction": reduction, "detach_weights": detach_weights, "tau": 0.05}
    dense = TALLoss(**kw)(img, txt, pids, pids)
    tiled = TALLoss(**kw, chunk_size=chunk_size)(img, txt, pids, pids)
    torch.testing.assert_close(tiled, dense, rtol=0, atol=1e-12)
    weight = torch.linspace(0.5, 1.5, dense.numel(), dtype=torch.float64).reshape(dense.shape)
    want = torch.autograd.grad((dense * weight).sum(), (img, txt))
    got = torch.autograd.grad((tiled * weight).sum(), (img, txt))
    assert want[0].abs().sum() > 0
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-11)


def test_weights_gradient_only_without_detach():
    """Same value either way; the gradient through alpha exists only with detach_weights=False,
    and that gradient is the true one (finite differences)."""
    img, txt = _batch(n=6, seed=3, noise=0.4)
    pids = [0, 0, 0, 1, 1, 2]  # several positives per row: alpha is not one-hot
    sim = cosine_similarity(img, txt).requires_grad_(True)
    mask = positive_mask(pids, pids)
    kept = tal_loss(sim, tau=0.3, margin=0.5, pos_mask=mask, detach_weights=True)
    full = tal_loss(sim, tau=0.3, margin=0.5, pos_mask=mask, detach_weights=False)
    torch.testing.assert_close(kept, full, rtol=0, atol=0)
    g_kept = torch.autograd.grad(kept, sim)[0]
    g_full = torch.autograd.grad(full, sim)[0]
    assert (g_kept - g_full).abs().max() > 1e-4
    assert torch.autograd.gradcheck(
        lambda s: tal_loss(s, tau=0.3, margin=0.5, pos_mask=mask, detach_weights=False),
        (sim.detach().clone().requires_grad_(True),),
    )


def test_shards_add_up_to_the_batch():
    img, txt = _batch(n=8, seed=2)
    pids = [0, 0, 1, 2, 3, 3, 4, 5]
    whole = tiled_tal_loss(img, txt, img_ids=pids, txt_ids=pids, chunk_size=3, reduction="mean")
    parts = [
        tiled_tal_loss(
            img, txt, img_ids=pids, txt_ids=pids, chunk_size=3, shard=(a, b), reduction="mean"
        )
        for a, b in ((0, 3), (3, 8))
    ]
    torch.testing.assert_close(parts[0] + parts[1], whole, rtol=0, atol=1e-12)


def test_one_identity_batch_gives_a_graph_attached_zero():
    """Every pair the same person: no negatives, the loss is 0 with a zero gradient (not NaN)."""
    img, txt = (t.requires_grad_(True) for t in _batch(n=4))
    for chunk in (None, 2):
        value = TALLoss(chunk_size=chunk)(img, txt, [7] * 4, [7] * 4)
        assert value.item() == 0.0
        grads = torch.autograd.grad(value, (img, txt))
        assert all(torch.equal(g, torch.zeros_like(g)) for g in grads)


def test_separated_pairs_give_zero_and_close_pairs_the_margin():
    """sim = I: each positive beats every negative by 1 > m, so each term is
    [0.1 - 1 + 0.015 log(3)]_+ = 0; sim = 0 everywhere: each of the 2 x 4 anchors pays
    m + tau log 3."""
    assert tal_loss(torch.eye(4, dtype=torch.float64)).item() == 0.0
    flat = tal_loss(torch.zeros(4, 4, dtype=torch.float64))
    assert flat.item() == pytest.approx(8 * (0.1 + 0.015 * math.log(3.0)), rel=1e-14)


def test_bad_parameters_are_named():
    with pytest.raises(ParamError, match="tau must be > 0"):
        TALLoss(tau=0.0)
    with pytest.raises(ParamError, match="margin must be >= 0"):
        build_loss("tal", margin=-0.1)
    with pytest.raises(ValueError, match="tau"):
        tal_loss(torch.eye(3), tau=-1.0)
