"""HN-NCE against a naive per-anchor loop, its InfoNCE and DCL identities, and its tiled form."""

from __future__ import annotations

import math

import pytest
import torch

from train_helpers import tiny_config
from vlret.losses import build_loss, dcl_loss, infonce_loss, loss_capabilities
from vlret.losses.hn_nce import HNNCELoss, hn_nce_loss, tiled_hn_nce_loss
from vlret.losses.registry import check_loss_params
from vlret.run.loss_builder import build_run_loss
from vlret.similarity import cosine_similarity, positive_mask

IDS = [0, 1, 1, 2, 3, 4, 4, 4, 5, 6]
#: (alpha, beta1, beta2): the defaults, unequal betas, the decoupled form, a partial positive.
SETTINGS = [(1.0, 0.5, 0.5), (1.0, 0.2, 0.9), (0.0, 0.5, 0.5), (0.3, 0.0, 1.2)]


def _pairs(n=10, dim=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    img = torch.randn(n, dim, generator=gen, dtype=torch.float64)
    txt = img + 0.7 * torch.randn(n, dim, generator=gen, dtype=torch.float64)
    return img.requires_grad_(), txt.requires_grad_()


def _naive(sim, ids, tau, alpha, beta1, beta2):
    """The HN-NCE formula one anchor at a time with explicit weights
    ``w_ij = n_i e^{beta z_ij} / sum_k e^{beta z_ik}`` over the other modality's negatives."""
    n = sim.shape[0]
    out = []
    for i in range(n):
        total = sim.new_zeros(())
        for line, beta in ((sim[i], beta1), (sim[:, i], beta2)):
            negs = [j for j in range(n) if ids[j] != ids[i]]
            if not negs:
                continue
            z = [line[j] / tau for j in negs]
            norm = sum(torch.exp(beta * zk) for zk in z)
            weighted = sum(len(negs) * torch.exp(beta * zj) / norm * torch.exp(zj) for zj in z)
            pos = torch.exp(sim[i, i] / tau)
            total = total - torch.log(pos / (alpha * pos + weighted))
        out.append(total)
    return torch.stack(out)


def _grads(out, inputs, weight=1.0):
    return torch.autograd.grad((out * weight).sum(), inputs, retain_graph=True)


@pytest.mark.parametrize("with_ids", [False, True])
@pytest.mark.parametrize(("alpha", "beta1", "beta2"), SETTINGS)
def test_dense_equals_the_naive_loop(with_ids, alpha, beta1, beta2):
    img, txt = _pairs()
    ids = IDS if with_ids else list(range(10))
    sim = cosine_similarity(img, txt)
    got = hn_nce_loss(
        sim,
        temperature=0.2,
        alpha=alpha,
        beta1=beta1,
        beta2=beta2,
        pos_mask=positive_mask(ids, ids),
        reduction="none",
    )
    want = _naive(sim, ids, 0.2, alpha, beta1, beta2)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    for g, w in zip(_grads(got, (img, txt)), _grads(want, (img, txt)), strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-12)


@pytest.mark.parametrize("with_ids", [False, True])
def test_zero_beta_and_unit_alpha_is_infonce_values_and_gradients(with_ids):
    img, txt = _pairs(seed=2)
    mask = positive_mask(IDS, IDS) if with_ids else None
    sim = cosine_similarity(img, txt)
    got = hn_nce_loss(sim, temperature=0.1, beta1=0.0, beta2=0.0, pos_mask=mask, reduction="none")
    want = infonce_loss(sim, temperature=0.1, pos_mask=mask, reduction="none")
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    for g, w in zip(_grads(got, (img, txt)), _grads(want, (img, txt)), strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-12)
    # and a positive beta is not InfoNCE (the test can fail)
    hard = hn_nce_loss(sim, temperature=0.1, pos_mask=mask, reduction="none")
    assert (hard - want).abs().max() > 1e-3


def test_zero_alpha_removes_the_positive_from_the_denominator():
    img, txt = _pairs(seed=5)
    sim = cosine_similarity(img, txt)
    mask = positive_mask(IDS, IDS)
    # beta = 0: exactly DCL (Eq. 6 of Yeh et al.), values and gradients
    got = hn_nce_loss(sim, temperature=0.1, alpha=0.0, beta1=0.0, beta2=0.0, pos_mask=mask)
    want = dcl_loss(sim, temperature=0.1, pos_mask=mask)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    for g, w in zip(_grads(got, (img, txt)), _grads(want, (img, txt)), strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-12)
    # any alpha: the term is log(alpha + exp(alpha=0 term)), so it rises with alpha
    # each line's term is log(alpha + exp(its alpha = 0 value)): it rises with alpha
    s = sim.detach()
    everything = torch.ones(10, 10, dtype=torch.bool)
    for alpha in (0.25, 1.0):
        decoupled = hn_nce_loss(s, alpha=0.0, pos_mask=mask, reduction="none")
        coupled = hn_nce_loss(s, alpha=alpha, pos_mask=mask, reduction="none")
        assert (coupled > decoupled).all()
    assert hn_nce_loss(s, alpha=0.0, pos_mask=everything).item() == 0.0


def test_each_beta_acts_on_its_own_direction():
    img, txt = _pairs(seed=6)
    sim = cosine_similarity(img, txt).detach()
    both = hn_nce_loss(sim, beta1=0.2, beta2=0.9, reduction="none")
    # the text anchors of sim are the image anchors of sim.T
    swapped = hn_nce_loss(sim.t(), beta1=0.9, beta2=0.2, reduction="none")
    torch.testing.assert_close(both, swapped, rtol=0, atol=1e-12)
    # image term at beta1 plus text term at beta2: additive over the two directions
    rows = hn_nce_loss(sim, beta1=0.2, beta2=0.0, reduction="none")
    cols = hn_nce_loss(sim, beta1=0.0, beta2=0.9, reduction="none")
    neither = hn_nce_loss(sim, beta1=0.0, beta2=0.0, reduction="none")
    torch.testing.assert_close(both, rows + cols - neither, rtol=0, atol=1e-12)
    assert (both - hn_nce_loss(sim, beta1=0.2, beta2=0.2, reduction="none")).abs().max() > 1e-4


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("chunk_size", [1, 3, 16])
@pytest.mark.parametrize(("alpha", "beta1", "beta2"), SETTINGS[:3])
def test_tiled_equals_dense_value_and_gradient(reduction, chunk_size, alpha, beta1, beta2):
    img, txt = _pairs(seed=1)
    hyper = {"temperature": 0.1, "alpha": alpha, "beta1": beta1, "beta2": beta2}
    dense = hn_nce_loss(
        cosine_similarity(img, txt), pos_mask=positive_mask(IDS, IDS), reduction=reduction, **hyper
    )
    tiled = tiled_hn_nce_loss(
        img, txt, img_ids=IDS, chunk_size=chunk_size, reduction=reduction, **hyper
    )
    torch.testing.assert_close(tiled, dense, rtol=0, atol=1e-12)
    weight = torch.linspace(0.5, 1.5, 10, dtype=torch.float64) if reduction == "none" else 1.0
    for g, w in zip(
        _grads(tiled, (img, txt), weight), _grads(dense, (img, txt), weight), strict=True
    ):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-12)


@pytest.mark.parametrize(("alpha", "beta1", "beta2"), SETTINGS)
def test_shards_add_up_to_the_batch_values_and_gradients(alpha, beta1, beta2):
    img, txt = _pairs(seed=3)
    hyper = {"alpha": alpha, "beta1": beta1, "beta2": beta2, "img_ids": IDS, "chunk_size": 4}
    whole = tiled_hn_nce_loss(img, txt, reduction="none", **hyper)
    parts = [
        tiled_hn_nce_loss(img, txt, reduction="none", shard=s, **hyper) for s in ((0, 3), (3, 10))
    ]
    torch.testing.assert_close(torch.cat(parts), whole, rtol=0, atol=1e-12)
    mean_parts = [tiled_hn_nce_loss(img, txt, shard=s, **hyper) for s in ((0, 3), (3, 7), (7, 10))]
    mean = tiled_hn_nce_loss(img, txt, **hyper)
    torch.testing.assert_close(sum(mean_parts), mean, rtol=0, atol=1e-12)
    got = [sum(gs) for gs in zip(*(_grads(p, (img, txt)) for p in mean_parts), strict=True)]
    for g, w in zip(got, _grads(mean, (img, txt)), strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-12)


@pytest.mark.parametrize("betas", [(0.5, 0.5), (0.2, 0.9)])
def test_a_tensor_temperature_gets_the_dense_gradient(betas):
    img, txt = _pairs(seed=4)
    b1, b2 = betas
    tau_t = torch.tensor(0.08, dtype=torch.float64, requires_grad=True)
    tau_d = torch.tensor(0.08, dtype=torch.float64, requires_grad=True)
    tiled = tiled_hn_nce_loss(img, txt, temperature=tau_t, beta1=b1, beta2=b2, chunk_size=3)
    dense = hn_nce_loss(cosine_similarity(img, txt), temperature=tau_d, beta1=b1, beta2=b2)
    (g_t,) = torch.autograd.grad(tiled, tau_t)
    (g_d,) = torch.autograd.grad(dense, tau_d)
    assert g_d.abs() > 1e-3
    torch.testing.assert_close(g_t, g_d, rtol=0, atol=1e-10)


@pytest.mark.parametrize("chunk_size", [None, 4])
def test_the_learnable_temperature_is_clamped_and_gets_its_gradient(chunk_size):
    img, txt = _pairs(seed=7)
    loss = build_loss("hn_nce", learnable_temperature=True, temperature=0.07, chunk_size=chunk_size)
    assert isinstance(loss.log_scale, torch.nn.Parameter)
    assert math.isclose(loss.temperature, 0.07, rel_tol=1e-6)
    out = loss(img.float(), txt.float())
    out.backward()
    tau = torch.tensor(0.07, requires_grad=True)
    want = hn_nce_loss(cosine_similarity(img.float(), txt.float()), temperature=tau)
    want.backward()
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    # d/dt of f(e^{-t}) = f'(tau) * (-tau)
    torch.testing.assert_close(loss.log_scale.grad, -0.07 * tau.grad, rtol=1e-4, atol=1e-6)
    with torch.no_grad():
        loss.log_scale.fill_(10.0)  # scale e^10 > max_scale 100
    loss(img.float(), txt.float())
    assert math.isclose(loss.temperature, 0.01, rel_tol=1e-6)


def test_the_module_builds_by_name_and_from_a_config(tmp_path):
    img, txt = _pairs(seed=8)
    loss = build_loss("hn_nce", beta1=0.3, chunk_size=4)
    assert isinstance(loss, HNNCELoss) and loss_capabilities(loss).local_shards
    assert list(loss.parameters()) == []
    dense = build_loss("hn_nce", beta1=0.3)
    torch.testing.assert_close(loss(img, txt, IDS), dense(img, txt, IDS), rtol=0, atol=1e-12)
    sim = cosine_similarity(img, txt)
    torch.testing.assert_close(
        dense.from_similarity(sim), hn_nce_loss(sim, temperature=0.07, beta1=0.3), rtol=0, atol=0
    )
    overrides = ["loss.name=hn_nce", "loss.alpha=0.5", "loss.beta2=0.25"]
    built = build_run_loss(tiny_config(tmp_path, tmp_path / "run", overrides), None)
    assert isinstance(built, HNNCELoss)
    assert (built.alpha, built.beta1, built.beta2) == (0.5, 0.5, 0.25)


def test_an_anchor_without_negatives_contributes_a_zero_with_finite_gradients():
    img, txt = _pairs(n=4, seed=9)
    ids = [0, 0, 0, 0]
    for alpha in (1.0, 0.0, 0.5):
        out = hn_nce_loss(
            cosine_similarity(img, txt), alpha=alpha, pos_mask=positive_mask(ids, ids)
        )
        tiled = tiled_hn_nce_loss(img, txt, alpha=alpha, beta2=0.1, img_ids=ids, chunk_size=3)
        for value in (out, tiled):
            assert value.item() == 0.0 and value.requires_grad
            grads = _grads(value, (img, txt))
            assert all(torch.isfinite(g).all() and g.abs().max() == 0 for g in grads)


def test_large_logits_stay_finite_in_float32():
    img, txt = _pairs(seed=10)
    x, y = img.detach().float().requires_grad_(), txt.detach().float().requires_grad_()
    for alpha, beta in ((1.0, 2.0), (0.0, 2.0)):
        out = tiled_hn_nce_loss(x, y, temperature=0.005, alpha=alpha, beta1=beta, chunk_size=3)
        dense = hn_nce_loss(
            cosine_similarity(x.double(), y.double()), temperature=0.005, alpha=alpha, beta1=beta
        )
        grads = _grads(out, (x, y))
        assert torch.isfinite(out) and all(torch.isfinite(g).all() for g in grads)
        torch.testing.assert_close(out.double(), dense.detach(), rtol=1e-4, atol=1e-3)


def test_bad_parameters_are_named():
    sim = torch.eye(3, dtype=torch.float64)
    for name, value in (("alpha", -0.1), ("beta1", -1.0), ("beta2", float("nan"))):
        with pytest.raises(ValueError, match=name):
            hn_nce_loss(sim, **{name: value})
        with pytest.raises(ValueError, match=name):
            build_loss("hn_nce", **{name: value})
    with pytest.raises(ValueError, match="temperature"):
        tiled_hn_nce_loss(torch.eye(3), torch.eye(3), temperature=0.0, chunk_size=2)
    with pytest.raises(ValueError, match="max_scale must be >= 1"):
        check_loss_params("hn_nce", {"max_scale": 0.5})
    with pytest.raises(ValueError, match="learnable_temperature must be a bool"):
        build_loss("hn_nce", learnable_temperature=1)
