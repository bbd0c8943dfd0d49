"""CMPM against a naive per-anchor loop (the paper's projection and the cosine form), and its
tiled form."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from train_helpers import tiny_config
from vlret.losses import build_loss, loss_capabilities
from vlret.losses.cmpm import CMPMLoss, cmpm_loss, tiled_cmpm_loss
from vlret.losses.registry import check_loss_params
from vlret.run.loss_builder import build_run_loss
from vlret.similarity import cosine_similarity, positive_mask

IDS = [0, 1, 1, 2, 3, 4, 4, 4, 5, 6]


def _pairs(n=10, dim=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    img = 2.0 * torch.randn(n, dim, generator=gen, dtype=torch.float64)
    txt = img + 1.5 * torch.randn(n, dim, generator=gen, dtype=torch.float64)
    return img.requires_grad_(), txt.requires_grad_()


def _norm(v):
    return math.sqrt(sum(float(a) ** 2 for a in v))


def _naive(img, txt, ids, *, scale=1.0, eps=1e-8, target_norm="l1", cosine=False):
    """Eqs. 1-5 one anchor at a time in Python floats: the anchor (normalised too when
    ``cosine``) projected on each normalised candidate, softmax, KL against the matches."""
    n = len(ids)
    out = [0.0] * n
    for anchors, cands in ((img, txt), (txt, img)):
        for i in range(n):
            a = [float(v) for v in anchors[i]]
            if cosine:
                a = [v / _norm(anchors[i]) for v in a]
            logits = []
            for j in range(n):
                c = [float(v) / _norm(cands[j]) for v in cands[j]]
                logits.append(scale * sum(u * w for u, w in zip(a, c, strict=True)))
            top = max(logits)
            total = sum(math.exp(v - top) for v in logits)
            matches = sum(1 for j in range(n) if ids[j] == ids[i])
            q_match = 1 / matches if target_norm == "l1" else 1 / math.sqrt(matches)
            for j in range(n):
                p = math.exp(logits[j] - top) / total
                q = q_match if ids[j] == ids[i] else 0.0
                out[i] += p * math.log(p / (q + eps))
    return torch.tensor(out, dtype=torch.float64)


def _projections(img, txt):
    """The paper's two matrices, laid out rows images, columns texts."""
    i2t = img @ F.normalize(txt, dim=1).t()
    t2i = F.normalize(img, dim=1) @ txt.t()  # [i, j] = y_j . xbar_i
    return i2t, t2i


@pytest.mark.parametrize("with_ids", [False, True])
@pytest.mark.parametrize("target_norm", ["l1", "l2"])
def test_dense_projection_form_equals_the_naive_loop(with_ids, target_norm):
    img, txt = _pairs()
    ids = IDS if with_ids else list(range(10))
    want = _naive(img.detach(), txt.detach(), ids, target_norm=target_norm)
    i2t, t2i = _projections(img, txt)
    mask = positive_mask(ids, ids)
    got = cmpm_loss(
        i2t, sim_t2i=t2i, pos_mask=mask, target_norm=target_norm, reduction="none"
    ).detach()
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    module = build_loss("cmpm", target_norm=target_norm, reduction="none")
    torch.testing.assert_close(module(img, txt, ids).detach(), want, rtol=0, atol=1e-12)
    mean = build_loss("cmpm", target_norm=target_norm)(img, txt, ids)
    torch.testing.assert_close(mean.detach(), want.mean(), rtol=0, atol=1e-12)


@pytest.mark.parametrize("with_ids", [False, True])
def test_cosine_form_with_a_scale_equals_the_naive_loop(with_ids):
    img, txt = _pairs(seed=1)
    ids = IDS if with_ids else list(range(10))
    want = _naive(img.detach(), txt.detach(), ids, scale=20.0, eps=1e-6, cosine=True)
    module = build_loss("cmpm", normalize=True, scale=20.0, eps=1e-6, reduction="none")
    torch.testing.assert_close(module(img, txt, ids).detach(), want, rtol=0, atol=1e-12)
    sim = cosine_similarity(img, txt).detach()
    got = cmpm_loss(sim, scale=20.0, eps=1e-6, pos_mask=positive_mask(ids, ids), reduction="none")
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_matches_share_the_target_mass_and_one_match_makes_the_norms_agree():
    # Equal logits and every pair a match: p = q = 1/n, KL = log((1/n) / (1/n + eps)) per row.
    sim = torch.zeros(4, 4, dtype=torch.float64)
    every = torch.ones(4, 4, dtype=torch.bool)
    got = cmpm_loss(sim, pos_mask=every, eps=1e-3, reduction="sum")
    assert abs(got.item() - 8 * math.log(0.25 / (0.25 + 1e-3))) < 1e-12
    # The diagonal alone: 3/4 of p on non-matches (q = 0), 1/4 on the match (q = 1).
    alone = 8 * (0.75 * math.log(0.25 / 1e-3) + 0.25 * math.log(0.25 / (1 + 1e-3)))
    assert abs(cmpm_loss(sim, eps=1e-3, reduction="sum").item() - alone) < 1e-12
    img, txt = _pairs(seed=2)
    sim = cosine_similarity(img, txt).detach()
    l1 = cmpm_loss(sim, scale=5.0, reduction="none")
    l2 = cmpm_loss(sim, scale=5.0, target_norm="l2", reduction="none")
    torch.testing.assert_close(l1, l2, rtol=0, atol=0)
    with_ids = positive_mask(IDS, IDS)
    assert not torch.allclose(
        cmpm_loss(sim, scale=5.0, pos_mask=with_ids),
        cmpm_loss(sim, scale=5.0, pos_mask=with_ids, target_norm="l2"),
    )


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("chunk_size", [1, 3, 16])
def test_tiled_equals_dense_value_and_gradient(normalize, reduction, chunk_size):
    img, txt = _pairs(seed=3)
    scale = torch.tensor(4.0 if normalize else 0.8, dtype=torch.float64, requires_grad=True)
    if normalize:
        sim = cosine_similarity(img, txt)
        kwargs = {"sim_t2i": None}
    else:
        sim, t2i = _projections(img, txt)
        kwargs = {"sim_t2i": t2i}
    mask = positive_mask(IDS, IDS)
    dense = cmpm_loss(sim, scale=scale, pos_mask=mask, reduction=reduction, **kwargs)
    tiled = tiled_cmpm_loss(
        img,
        txt,
        scale=scale,
        img_ids=IDS,
        chunk_size=chunk_size,
        reduction=reduction,
        normalize=normalize,
    )
    torch.testing.assert_close(tiled, dense, rtol=0, atol=1e-12)
    weight = torch.linspace(0.5, 1.5, 10, dtype=torch.float64) if reduction == "none" else 1.0
    got = torch.autograd.grad((tiled * weight).sum(), (img, txt, scale))
    want = torch.autograd.grad((dense * weight).sum(), (img, txt, scale))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-12)


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_shards_add_up_to_the_batch_values_and_gradients(normalize, reduction):
    img, txt = _pairs(seed=4)
    loss = build_loss("cmpm", chunk_size=4, normalize=normalize, scale=2.0, reduction=reduction)
    assert loss_capabilities(loss).local_shards
    whole = loss(img, txt, IDS, IDS)
    parts = [loss(img, txt, IDS, IDS, shard=s) for s in ((0, 3), (3, 10))]
    joined = torch.cat(parts) if reduction == "none" else sum(parts)
    torch.testing.assert_close(joined, whole, rtol=0, atol=1e-12)
    got = torch.autograd.grad(sum(p.sum() for p in parts), (img, txt))
    want = torch.autograd.grad(whole.sum(), (img, txt))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-12)
    dense = build_loss("cmpm", normalize=normalize, scale=2.0, reduction=reduction)
    torch.testing.assert_close(dense(img, txt, IDS, IDS), whole, rtol=0, atol=1e-12)


def test_from_similarity_uses_one_matrix_for_both_directions():
    img, txt = _pairs(seed=5)
    sim = cosine_similarity(img, txt).detach()
    loss = CMPMLoss(scale=7.0)
    want = cmpm_loss(sim, scale=7.0, sim_t2i=sim)
    torch.testing.assert_close(loss.from_similarity(sim), want, rtol=0, atol=0)


def test_builds_by_name_and_from_a_config(tmp_path):
    loss = build_loss("cmpm")
    assert (loss.scale, loss.eps, loss.target_norm, loss.normalize) == (1.0, 1e-8, "l1", False)
    overrides = ["loss.name=cmpm", "loss.normalize=true", "loss.scale=20.0", "loss.chunk_size=8"]
    built = build_run_loss(tiny_config(tmp_path, tmp_path / "run", overrides), None)
    assert isinstance(built, CMPMLoss) and built.normalize and built.scale == 20.0
    assert built.chunk_size == 8


def test_bad_arguments_are_named():
    sim = torch.eye(3, dtype=torch.float64)
    for params, words in (
        ({"eps": 0.0}, "eps must be > 0"),
        ({"scale": -1.0}, "scale must be > 0"),
        ({"target_norm": "l3"}, "target_norm must be one of"),
    ):
        with pytest.raises(ValueError, match=words):
            check_loss_params("cmpm", params)
        with pytest.raises(ValueError, match=words):
            build_loss("cmpm", **params)
    with pytest.raises(ValueError, match="eps"):
        cmpm_loss(sim, eps=0.0)
    with pytest.raises(ValueError, match="target_norm"):
        cmpm_loss(sim, target_norm="sum")
    with pytest.raises(ValueError, match="sim_t2i must have the shape of sim"):
        cmpm_loss(sim, sim_t2i=torch.eye(2, dtype=torch.float64))
    with pytest.raises(ValueError, match="sim_t2i"):
        cmpm_loss(sim, sim_t2i=torch.full((3, 3), float("nan")))
    with pytest.raises(ValueError, match="shard= needs the tiled form"):
        build_loss("cmpm")(sim, sim, shard=(0, 1))


def test_half_precision_embeddings_compute_in_float32():
    img, txt = _pairs(seed=6)
    loss = build_loss("cmpm")
    half = loss(img.detach().half(), txt.detach().half())
    assert half.dtype == torch.float32 and torch.isfinite(half)
    full = loss(img.detach().half().double(), txt.detach().half().double())
    assert abs(half.item() - full.item()) < 1e-4 * abs(full.item())
