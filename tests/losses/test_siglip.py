"""SigLIP against a naive per-pair loop, open_clip's loss as documented, and its tiled form."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from train_helpers import tiny_config
from vlret.losses import build_loss, loss_capabilities
from vlret.losses.registry import check_loss_params
from vlret.losses.siglip import SigLIPLoss, siglip_loss, tiled_siglip_loss
from vlret.run.loss_builder import build_run_loss
from vlret.similarity import cosine_similarity, positive_mask

IDS = [0, 1, 1, 2, 3, 4, 4, 4, 5, 6]


def _pairs(n=10, dim=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    img = torch.randn(n, dim, generator=gen, dtype=torch.float64)
    txt = img + 0.7 * torch.randn(n, dim, generator=gen, dtype=torch.float64)
    return img.requires_grad_(), txt.requires_grad_()


def _naive(sim, ids, scale, bias):
    """Eq. 1 one pair at a time in Python floats: row i's sum of log(1 + exp(-z_ij l_ij))."""
    n = sim.shape[0]
    out = []
    for i in range(n):
        total = 0.0
        for j in range(n):
            z = 1.0 if ids[i] == ids[j] else -1.0
            logit = scale * float(sim[i, j]) + bias
            total += math.log1p(math.exp(-z * logit))
        out.append(total)
    return torch.tensor(out, dtype=torch.float64)


def _open_clip_as_documented(image_features, text_features, logit_scale, logit_bias):
    """open_clip's SigLipLoss written from its description: logits = logit_scale * img @ txt.T
    + logit_bias, labels = 2 * eye - 1, loss = -logsigmoid(labels * logits).sum() / B."""
    n = image_features.shape[0]
    logits = logit_scale * image_features @ text_features.t() + logit_bias
    labels = 2 * torch.eye(n, dtype=logits.dtype) - 1
    return -F.logsigmoid(labels * logits).sum() / n


@pytest.mark.parametrize("with_ids", [False, True])
@pytest.mark.parametrize(("scale", "bias"), [(10.0, -10.0), (3.0, 0.5)])
def test_dense_equals_the_naive_loop(with_ids, scale, bias):
    img, txt = _pairs()
    ids = IDS if with_ids else list(range(10))
    sim = cosine_similarity(img, txt).detach()
    mask = positive_mask(ids, ids)
    got = siglip_loss(sim, scale=scale, bias=bias, pos_mask=mask, reduction="none")
    want = _naive(sim, ids, scale, bias)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    mean = siglip_loss(sim, scale=scale, bias=bias, pos_mask=mask)
    total = siglip_loss(sim, scale=scale, bias=bias, pos_mask=mask, reduction="sum")
    torch.testing.assert_close(total, want.sum(), rtol=0, atol=1e-12)
    torch.testing.assert_close(mean, want.sum() / 10, rtol=0, atol=1e-12)


def test_further_positives_are_positives():
    """An equal id turns the pair's term from log(1 + e^l) into log(1 + e^-l)."""
    sim = torch.tensor([[0.9, 0.2], [0.3, 0.8]], dtype=torch.float64)
    both = siglip_loss(sim, scale=2.0, bias=-1.0, pos_mask=torch.ones(2, 2, dtype=torch.bool))
    want = sum(math.log1p(math.exp(-(2.0 * s - 1.0))) for s in (0.9, 0.2, 0.3, 0.8)) / 2
    assert abs(both.item() - want) < 1e-12


def test_module_mean_is_open_clips_siglip_loss_on_normalised_features():
    img, txt = _pairs(seed=5)
    # 1.25 and -4 are exact in the float32 parameters, so .double() keeps their values.
    loss = SigLIPLoss(log_scale=1.25, bias=-4.0).double()
    got = loss(img, txt)
    # open_clip: the model normalises, stores log-scale t as logit_scale, passes its exp.
    t = torch.tensor(1.25, dtype=torch.float64, requires_grad=True)
    b = torch.tensor(-4.0, dtype=torch.float64, requires_grad=True)
    want = _open_clip_as_documented(F.normalize(img, dim=1), F.normalize(txt, dim=1), t.exp(), b)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    g_got = torch.autograd.grad(got, (img, txt, loss.log_scale, loss.bias))
    g_want = torch.autograd.grad(want, (img, txt, t, b))
    for g, w in zip(g_got, g_want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-12)


def test_learnable_parameters_get_the_analytic_gradient():
    """dL/db = (1/B) sum_ij -z_ij sigmoid(-z_ij l_ij), dL/dt = same weights times e^t s_ij."""
    img, txt = _pairs(seed=6)
    sim = cosine_similarity(img, txt).detach()
    t = torch.tensor(math.log(10.0), dtype=torch.float64, requires_grad=True)
    b = torch.tensor(-10.0, dtype=torch.float64, requires_grad=True)
    mask = positive_mask(IDS, IDS)
    loss = siglip_loss(sim, scale=t.exp(), bias=b, pos_mask=mask)
    g_t, g_b = torch.autograd.grad(loss, (t, b))
    z = mask.double() * 2 - 1
    weight = -z * torch.sigmoid(-z * (10.0 * sim - 10.0))
    assert abs(g_b.item() - weight.sum().item() / 10) < 1e-12
    assert abs(g_t.item() - (weight * 10.0 * sim).sum().item() / 10) < 1e-12


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("chunk_size", [1, 3, 16])
def test_tiled_equals_dense_value_and_gradient(reduction, chunk_size):
    img, txt = _pairs(seed=1)
    t = torch.tensor(1.9, dtype=torch.float64, requires_grad=True)
    b = torch.tensor(-3.0, dtype=torch.float64, requires_grad=True)
    dense = siglip_loss(
        cosine_similarity(img, txt),
        scale=t.exp(),
        bias=b,
        pos_mask=positive_mask(IDS, IDS),
        reduction=reduction,
    )
    tiled = tiled_siglip_loss(
        img, txt, scale=t.exp(), bias=b, img_ids=IDS, chunk_size=chunk_size, reduction=reduction
    )
    torch.testing.assert_close(tiled, dense, rtol=0, atol=1e-12)
    weight = torch.linspace(0.5, 1.5, 10, dtype=torch.float64) if reduction == "none" else 1.0
    got = torch.autograd.grad((tiled * weight).sum(), (img, txt, t, b))
    want = torch.autograd.grad((dense * weight).sum(), (img, txt, t, b))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-12)


def test_raw_dot_products_with_normalize_false():
    img, txt = _pairs(seed=7)
    dense = siglip_loss(img @ txt.t(), scale=0.5, bias=1.0)
    tiled = tiled_siglip_loss(img, txt, scale=0.5, bias=1.0, chunk_size=4, normalize=False)
    torch.testing.assert_close(tiled, dense, rtol=0, atol=1e-12)
    fixed = {"learnable_scale": False, "learnable_bias": False}  # floats: log(0.5) kept exact
    module = build_loss("siglip", log_scale=math.log(0.5), bias=1.0, normalize=False, **fixed)
    torch.testing.assert_close(module(img, txt), dense, rtol=0, atol=1e-12)


@pytest.mark.parametrize("reduction", ["sum", "none"])
def test_shards_add_up_to_the_batch_values_and_gradients(reduction):
    img, txt = _pairs(seed=3)
    loss = build_loss("siglip", chunk_size=4, reduction=reduction).double()
    assert loss_capabilities(loss).local_shards
    whole = loss(img, txt, IDS, IDS)
    parts = [loss(img, txt, IDS, IDS, shard=s) for s in ((0, 3), (3, 10))]
    joined = torch.cat(parts) if reduction == "none" else sum(parts)
    torch.testing.assert_close(joined, whole, rtol=0, atol=1e-12)
    params = (img, txt, loss.log_scale, loss.bias)
    got = torch.autograd.grad(sum(p.sum() for p in parts), params)
    want = torch.autograd.grad(whole.sum(), params)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-12)


def test_shard_means_add_up_to_the_batch_mean_and_the_dense_module():
    img, txt = _pairs(seed=4)
    tiled = build_loss("siglip", chunk_size=3).double()
    whole = tiled(img, txt)
    parts = sum(tiled(img, txt, shard=s) for s in ((0, 5), (5, 10)))
    torch.testing.assert_close(parts, whole, rtol=0, atol=1e-12)
    dense = build_loss("siglip").double()
    torch.testing.assert_close(whole, dense(img, txt), rtol=0, atol=1e-12)


def test_fixed_parameters_are_floats_and_config_checks_name_the_parameter():
    loss = build_loss("siglip", learnable_scale=False, learnable_bias=False, log_scale=0.0)
    assert list(loss.parameters()) == []
    assert loss.log_scale == 0.0 and loss.bias == -10.0
    learnable = build_loss("siglip")
    assert {n for n, _ in learnable.named_parameters()} == {"log_scale", "bias"}
    assert abs(learnable.log_scale.item() - math.log(10.0)) < 1e-6
    check_loss_params("siglip", {"bias": 0.0, "learnable_bias": False})
    with pytest.raises(ValueError, match="learnable_scale must be a bool"):
        build_loss("siglip", learnable_scale=1)
    with pytest.raises(ValueError, match="bias must be a finite number"):
        check_loss_params("siglip", {"bias": float("nan")})
    sim = torch.eye(3, dtype=torch.float64)
    with pytest.raises(ValueError, match="scale"):
        siglip_loss(sim, scale=0.0)
    with pytest.raises(ValueError, match="bias"):
        siglip_loss(sim, bias=float("inf"))
    with pytest.raises(ValueError, match="reduction"):
        siglip_loss(sim, reduction="avg")


def test_large_logits_stay_finite_in_float32():
    sim = torch.tensor([[1.0, -1.0], [-1.0, 1.0]], requires_grad=True)
    out = siglip_loss(sim, scale=1e4, bias=0.0)
    out.backward()
    assert torch.isfinite(out) and out.item() == 0.0 and torch.isfinite(sim.grad).all()
    wrong = siglip_loss(-sim.detach(), scale=1e4, bias=0.0)  # every pair on the wrong side
    assert abs(wrong.item() - 2e4) < 1.0


def test_builds_from_a_config(tmp_path):
    overrides = ["loss.name=siglip", "loss.learnable_bias=false", "loss.bias=-5.0"]
    built = build_run_loss(tiny_config(tmp_path, tmp_path / "run", overrides), None)
    assert isinstance(built, SigLIPLoss) and built.bias == -5.0
    assert [n for n, _ in built.named_parameters()] == ["log_scale"]
