"""AdaCL: paper identities, naive-loop oracles, an independent GDA (scipy), guards and state."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from scipy.stats import norm

from vlret.losses import (
    AdaCLLoss,
    adacl_anchor,
    adacl_loss,
    adacl_margins,
    available_losses,
    build_loss,
    infonce_loss,
)
from vlret.losses.adacl import GUARDS, clone_log_odds, clone_posterior, clone_region, fit_gda

P_U = 0.03
EPS = math.exp(-7)


def paired_sim(batch: int, *, dim: int = 32, seed: int = 0, dtype=torch.float64) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    img = torch.randn(batch, dim, generator=g, dtype=dtype)
    txt = img + 0.8 * torch.randn(batch, dim, generator=g, dtype=dtype)
    img = img / img.norm(dim=1, keepdim=True)
    txt = txt / txt.norm(dim=1, keepdim=True)
    return img @ txt.t()


# ------------------------------------------------------------------------------------------
# Naive oracles, written independently of the implementation
# ------------------------------------------------------------------------------------------


def naive_adacl_loss(
    sim,
    m1,
    m2,
    pos_mask=None,
    ext_txt=None,
    ext_txt_mask=None,
    ext_img=None,
    ext_img_mask=None,
    tau=1.0,
):
    """Per-index -log p_hat (Eq. 3, negatives exp(s / tau)) in both directions, by loops."""
    s = sim.double().tolist()
    b = len(s)
    pm = pos_mask.tolist() if pos_mask is not None else [[False] * b for _ in range(b)]
    out = []
    for i in range(b):
        pos = math.exp(m1 * (s[i][i] - m2))
        den_row = pos + sum(math.exp(s[i][j] / tau) for j in range(b) if j != i and not pm[i][j])
        den_col = pos + sum(math.exp(s[j][i] / tau) for j in range(b) if j != i and not pm[j][i])
        if ext_txt is not None:
            for k in range(ext_txt.shape[1]):
                if ext_txt_mask is None or bool(ext_txt_mask[i, k]):
                    den_row += math.exp(float(ext_txt[i, k]) / tau)
        if ext_img is not None:
            for k in range(ext_img.shape[0]):
                if ext_img_mask is None or bool(ext_img_mask[k, i]):
                    den_col += math.exp(float(ext_img[k, i]) / tau)
        out.append(-math.log(pos / den_row) - math.log(pos / den_col))
    return torch.tensor(out, dtype=torch.float64)


def oracle_margins(anchor, sigma, p_u=P_U, eps=EPS):
    m1 = math.log(eps * p_u / ((1 - eps) * (1 - p_u))) / (anchor - 1)
    m2 = anchor + math.log((1 - p_u) / (p_u * sigma)) / m1
    return m1, m2


def oracle_anchor(
    sim, pos_mask=None, ext_txt=None, ext_txt_mask=None, selection="median", top_k=None, tau=1.0
):
    """Eq. (7)-(11) by loops, with scipy's normal pdf for the GDA posterior (Eq. 8);
    ``sigma`` sums exp(s / tau) over the anchor row's negatives."""
    s = sim.double().numpy()
    b = s.shape[0]
    pm = pos_mask.numpy() if pos_mask is not None else np.zeros((b, b), bool)
    rows = []
    for i in range(b):
        negs = [s[i, j] for j in range(b) if j != i and not pm[i, j]]
        if ext_txt is not None:
            negs += [
                float(ext_txt[i, k])
                for k in range(ext_txt.shape[1])
                if ext_txt_mask is None or bool(ext_txt_mask[i, k])
            ]
        rows.append(negs)
    # Eq. (7) over the rows with at least two negatives (a variance needs two values).
    eligible = [i for i in range(b) if len(rows[i]) >= 2]
    salient = {i: s[i, i] - sum(rows[i]) / len(rows[i]) for i in eligible}
    i_plus = max(eligible, key=lambda i: salient[i])
    i_minus = min(eligible, key=lambda i: salient[i])
    sal, cln = list(rows[i_plus]), list(rows[i_minus])
    if top_k is not None:
        sal, cln = sorted(sal)[::-1][:top_k], sorted(cln)[::-1][:top_k]
    mu0, sd0, mu1, sd1 = np.mean(sal), np.std(sal), np.mean(cln), np.std(cln)
    pi1 = len(cln) / (len(cln) + len(sal))
    pi0 = 1 - pi1

    def posterior(x):
        c = pi1 * norm.pdf(x, mu1, sd1)
        return c / (c + pi0 * norm.pdf(x, mu0, sd0))

    clones = [(abs(s[i, i] - x), i) for i in range(b) for x in rows[i] if posterior(x) > 0.5]
    clones.sort()
    if selection == "median":
        delta, u = clones[(len(clones) + 1) // 2 - 1]
    elif selection == "min":
        delta, u = clones[0]
    else:
        delta, u = clones[-1]
    anchor = s[u, u]
    sigma = sum(math.exp(x / tau) for x in rows[u])
    return {
        "anchor": anchor,
        "sigma": sigma,
        "row": u,
        "count": len(clones),
        "i_plus": i_plus,
        "i_minus": i_minus,
    }


# ------------------------------------------------------------------------------------------
# Eq. (4) and (6): the closed-form margins
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "anchor, sigma", [(0.7, 50.0), (0.2, 63.0), (-0.3, 4000.0), (0.95, 1.5), (0.5, 0.01)]
)
def test_margins_satisfy_eq4_and_eq6(anchor, sigma):
    m1, m2 = adacl_margins(anchor, sigma)
    assert isinstance(m1, float) and isinstance(m2, float)
    e_anchor = math.exp(m1 * (anchor - m2))
    assert e_anchor / (e_anchor + sigma) == pytest.approx(P_U, abs=1e-6)  # Eq. (4)
    e_one = math.exp(m1 * (1 - m2))
    assert e_one / (e_one + sigma) == pytest.approx(1 - EPS, abs=1e-6)  # Eq. (6)
    assert (m1, m2) == pytest.approx(oracle_margins(anchor, sigma), rel=1e-12)
    assert m1 > 0


def test_margins_other_probabilities_and_tensors():
    m1, m2 = adacl_margins(torch.tensor(0.6), torch.tensor(30.0), p_u=0.2, eps=1e-3)
    assert isinstance(m1, torch.Tensor) and m1.dtype == torch.float32
    a, sig = 0.6, 30.0
    e = math.exp(float(m1) * (a - float(m2)))
    assert e / (e + sig) == pytest.approx(0.2, abs=1e-6)
    e1 = math.exp(float(m1) * (1 - float(m2)))
    assert e1 / (e1 + sig) == pytest.approx(1 - 1e-3, abs=1e-6)


@pytest.mark.parametrize(
    "args, kwargs, name",
    [
        ((1.0, 10.0), {}, "anchor"),
        ((1.5, 10.0), {}, "anchor"),
        ((float("nan"), 10.0), {}, "anchor"),
        ((0.5, 0.0), {}, "sigma_anchor"),
        ((0.5, -1.0), {}, "sigma_anchor"),
        ((0.5, 10.0), {"p_u": 0.0}, "p_u"),
        ((0.5, 10.0), {"p_u": 1.0}, "p_u"),
        ((0.5, 10.0), {"eps": 0.0}, "eps"),
        ((0.5, 10.0), {"p_u": 0.6, "eps": 0.5}, "p_u \\+ eps"),
    ],
)
def test_margins_reject_bad_input(args, kwargs, name):
    with pytest.raises(ValueError, match=name):
        adacl_margins(*args, **kwargs)


# ------------------------------------------------------------------------------------------
# Eq. (3): the loss
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_loss_with_unit_margins_is_infonce_at_temperature_one(reduction):
    sim = paired_sim(9, seed=1)
    pos_mask = torch.zeros(9, 9, dtype=torch.bool)
    pos_mask[0, 3] = pos_mask[3, 0] = True
    for pm in (None, pos_mask):
        got = adacl_loss(sim, m1=1, m2=0, pos_mask=pm, reduction=reduction)
        want = infonce_loss(sim, temperature=1, pos_mask=pm, reduction=reduction)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("tau", [0.05, 0.1, 2.0])
def test_loss_with_negative_temperature_is_infonce_at_that_temperature(tau, reduction):
    # Negatives exp(s_ij / t) and positive m1 (s_ii - m2) with m1 = 1/t, m2 = 0: InfoNCE at t.
    sim = paired_sim(9, seed=2)
    pos_mask = torch.zeros(9, 9, dtype=torch.bool)
    pos_mask[0, 3] = pos_mask[3, 0] = True
    for pm in (None, pos_mask):
        got = adacl_loss(
            sim, m1=1 / tau, m2=0, pos_mask=pm, reduction=reduction, negative_temperature=tau
        )
        want = infonce_loss(sim, temperature=tau, pos_mask=pm, reduction=reduction)
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    # The default is the printed Eq. (3): the same as an explicit temperature of 1.
    torch.testing.assert_close(
        adacl_loss(sim, m1=20.0, m2=0.1), adacl_loss(sim, m1=20.0, m2=0.1, negative_temperature=1)
    )


def test_negative_temperature_scales_every_negative_including_the_queue():
    g = torch.Generator().manual_seed(8)
    sim = paired_sim(6, seed=8)
    pos_mask = torch.zeros(6, 6, dtype=torch.bool)
    pos_mask[1, 4] = pos_mask[4, 1] = True
    ext_txt = torch.rand(6, 7, generator=g, dtype=torch.float64) * 2 - 1
    ext_img = torch.rand(5, 6, generator=g, dtype=torch.float64) * 2 - 1
    ext_txt_mask = torch.rand(6, 7, generator=g) > 0.3
    ext_img_mask = torch.rand(5, 6, generator=g) > 0.3
    m1, m2, tau = 23.5, 0.37, 0.05
    want = naive_adacl_loss(
        sim, m1, m2, pos_mask, ext_txt, ext_txt_mask, ext_img, ext_img_mask, tau=tau
    )
    got = adacl_loss(
        sim,
        m1=m1,
        m2=m2,
        pos_mask=pos_mask,
        extra_neg_txt=ext_txt,
        extra_neg_img=ext_img,
        extra_neg_txt_mask=ext_txt_mask,
        extra_neg_img_mask=ext_img_mask,
        reduction="none",
        negative_temperature=tau,
    )
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    # Half precision in, float32 compute: the finfo.min mask penalty must not overflow when scaled.
    half = adacl_loss(
        sim.half(), m1=m1, m2=m2, pos_mask=pos_mask, negative_temperature=tau, reduction="none"
    )
    assert torch.isfinite(half).all()
    torch.testing.assert_close(
        half.double(),
        naive_adacl_loss(sim.half().double(), m1, m2, pos_mask, tau=tau),
        rtol=1e-4,
        atol=1e-4,
    )


@pytest.mark.parametrize("tau", [0.0, -0.1, float("inf"), float("nan"), True, "0.05"])
def test_loss_rejects_bad_negative_temperature(tau):
    with pytest.raises(ValueError, match="negative_temperature"):
        adacl_loss(paired_sim(4), m1=20.0, m2=0.1, negative_temperature=tau)
    with pytest.raises(ValueError, match="negative_temperature"):
        AdaCLLoss(negative_temperature=tau)
    with pytest.raises(ValueError, match="negative_temperature"):
        adacl_anchor(paired_sim(4), negative_temperature=tau)


def test_loss_matches_naive_loop_with_queue_negatives_and_masks():
    g = torch.Generator().manual_seed(3)
    sim = paired_sim(6, seed=3)
    pos_mask = torch.zeros(6, 6, dtype=torch.bool)
    pos_mask[1, 4] = pos_mask[4, 1] = pos_mask[2, 5] = True
    ext_txt = torch.rand(6, 7, generator=g, dtype=torch.float64) * 2 - 1
    ext_img = torch.rand(5, 6, generator=g, dtype=torch.float64) * 2 - 1
    ext_txt_mask = torch.rand(6, 7, generator=g) > 0.3
    ext_img_mask = torch.rand(5, 6, generator=g) > 0.3
    m1, m2 = 23.5, 0.37
    want = naive_adacl_loss(sim, m1, m2, pos_mask, ext_txt, ext_txt_mask, ext_img, ext_img_mask)
    got = adacl_loss(
        sim,
        m1=m1,
        m2=m2,
        pos_mask=pos_mask,
        extra_neg_txt=ext_txt,
        extra_neg_img=ext_img,
        extra_neg_txt_mask=ext_txt_mask,
        extra_neg_img_mask=ext_img_mask,
        reduction="none",
    )
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    mean = adacl_loss(
        sim,
        m1=m1,
        m2=m2,
        pos_mask=pos_mask,
        extra_neg_txt=ext_txt,
        extra_neg_img=ext_img,
        extra_neg_txt_mask=ext_txt_mask,
        extra_neg_img_mask=ext_img_mask,
    )
    torch.testing.assert_close(mean, want.mean(), rtol=1e-10, atol=1e-10)
    # Without masks every extra entry is a negative.
    got_all = adacl_loss(
        sim, m1=m1, m2=m2, extra_neg_txt=ext_txt, extra_neg_img=ext_img, reduction="sum"
    )
    torch.testing.assert_close(
        got_all, naive_adacl_loss(sim, m1, m2, None, ext_txt, None, ext_img, None).sum()
    )


def test_loss_gradient_matches_finite_differences():
    sim = paired_sim(4, seed=5).requires_grad_(True)
    ext = (torch.rand(4, 3, dtype=torch.float64) - 0.5).requires_grad_(True)
    torch.autograd.gradcheck(
        lambda s, e: adacl_loss(s, m1=7.0, m2=0.2, extra_neg_txt=e, extra_neg_img=e.t()),
        (sim, ext),
    )


def test_loss_half_precision_computes_in_float32():
    sim = paired_sim(8, seed=2, dtype=torch.float32)
    got = adacl_loss(sim.half(), m1=20.0, m2=0.1)
    assert got.dtype == torch.float32 and torch.isfinite(got)
    torch.testing.assert_close(got, adacl_loss(sim.half().float(), m1=20.0, m2=0.1))


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"m1": 0.0, "m2": 0.1}, "m1"),
        ({"m1": -1.0, "m2": 0.1}, "m1"),
        ({"m1": float("inf"), "m2": 0.1}, "m1"),
        ({"m1": 1.0, "m2": float("nan")}, "m2"),
        ({"m1": torch.ones(2), "m2": 0.1}, "m1"),
        ({"m1": 1.0, "m2": 0.1, "reduction": "avg"}, "reduction"),
        ({"m1": 1.0, "m2": 0.1, "extra_neg_txt": torch.zeros(3, 4)}, "extra_neg_txt"),
        ({"m1": 1.0, "m2": 0.1, "extra_neg_img": torch.zeros(4, 3)}, "extra_neg_img"),
        (
            {"m1": 1.0, "m2": 0.1, "extra_neg_txt_mask": torch.ones(4, 2, dtype=torch.bool)},
            "extra_neg_txt",
        ),
        (
            {
                "m1": 1.0,
                "m2": 0.1,
                "extra_neg_txt": torch.zeros(4, 2),
                "extra_neg_txt_mask": torch.ones(4, 3, dtype=torch.bool),
            },
            "extra_neg_txt_mask",
        ),
        (
            {"m1": 1.0, "m2": 0.1, "extra_neg_txt": torch.full((4, 2), float("nan"))},
            "extra_neg_txt",
        ),
    ],
)
def test_loss_rejects_bad_input(kwargs, name):
    with pytest.raises(ValueError, match=name):
        adacl_loss(torch.eye(4), **kwargs)


# ------------------------------------------------------------------------------------------
# Eq. (8)-(10): GDA against scipy
# ------------------------------------------------------------------------------------------


def test_gda_posterior_matches_scipy_norm():
    rng = np.random.default_rng(7)
    salient = rng.normal(0.05, 0.12, size=40)
    clone = rng.normal(0.35, 0.07, size=25)
    fit = fit_gda(torch.from_numpy(salient), torch.from_numpy(clone))
    assert float(fit.mu_salient) == pytest.approx(salient.mean(), rel=1e-12)
    assert float(fit.var_salient) == pytest.approx(salient.var(), rel=1e-12)  # MLE, ddof=0
    assert float(fit.mu_clone) == pytest.approx(clone.mean(), rel=1e-12)
    assert float(fit.var_clone) == pytest.approx(clone.var(), rel=1e-12)
    assert float(fit.prior_clone) == pytest.approx(25 / 65)
    s = np.linspace(-0.6, 1.0, 161)
    pc = (25 / 65) * norm.pdf(s, clone.mean(), clone.std())
    ps = (40 / 65) * norm.pdf(s, salient.mean(), salient.std())
    want = pc / (pc + ps)
    got = clone_posterior(torch.from_numpy(s), fit).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    # Eq. (9) as printed: 1 / (1 + pi0/pi1 * s1/s0 * exp[(s-m1)^2/2s1^2 - (s-m0)^2/2s0^2]).
    eq9 = 1 / (
        1
        + (40 / 25)
        * (clone.std() / salient.std())
        * np.exp(
            (s - clone.mean()) ** 2 / (2 * clone.var())
            - (s - salient.mean()) ** 2 / (2 * salient.var())
        )
    )
    np.testing.assert_allclose(got, eq9, rtol=1e-9, atol=1e-12)
    # Eq. (10): S* is where the log-odds are positive, i.e. the posterior exceeds 1/2.
    lo = clone_log_odds(torch.from_numpy(s), fit).numpy()
    np.testing.assert_array_equal(lo > 0, want > 0.5)


def _random_fit(seed: int):
    rng = np.random.default_rng(seed)
    sd_c, sd_s = rng.uniform(0.02, 0.3, size=2)
    clone = rng.normal(rng.uniform(-0.2, 0.6), sd_c, size=30)
    salient = rng.normal(rng.uniform(-0.2, 0.6), sd_s, size=int(rng.integers(5, 60)))
    return fit_gda(torch.from_numpy(salient), torch.from_numpy(clone))


EXACT_SHIFT = fit_gda(  # equal variances exactly (binary fractions): the region is a half-line
    torch.tensor([0.0, 0.25, 0.5, 1.0], dtype=torch.float64),
    torch.tensor([0.5, 0.75, 1.0, 1.5], dtype=torch.float64),
)


@pytest.mark.parametrize("fit", [_random_fit(seed) for seed in range(8)] + [EXACT_SHIFT])
def test_clone_region_bounds_agree_with_log_odds(fit):
    lo, hi, inside = clone_region(fit)
    s = torch.linspace(-1.5, 2.5, 4001, dtype=torch.float64)
    by_bounds = (s > lo) & (s < hi) if inside else (s < lo) | (s > hi)
    assert torch.equal(by_bounds, clone_log_odds(s, fit) > 0)
    if fit is EXACT_SHIFT:
        assert fit.var_clone == fit.var_salient and hi == math.inf and inside


def test_fit_gda_rejects_empty_sets():
    with pytest.raises(ValueError, match="clone_negatives"):
        fit_gda(torch.ones(3), torch.ones(0))


# ------------------------------------------------------------------------------------------
# Eq. (7)-(11): anchor selection against the loop oracle
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("selection", ["median", "min", "max"])
def test_anchor_matches_oracle(selection):
    sim = paired_sim(12, seed=11)
    found = adacl_anchor(sim, selection=selection)
    want = oracle_anchor(sim, selection=selection)
    assert found.guard is None
    assert found.clone_count == want["count"] > 0
    assert found.row == want["row"]
    assert float(found.anchor) == pytest.approx(want["anchor"], rel=1e-12)
    assert math.exp(float(found.log_sigma_anchor)) == pytest.approx(want["sigma"], rel=1e-12)


def test_anchor_with_queue_pos_mask_and_top_k_matches_oracle():
    g = torch.Generator().manual_seed(4)
    sim = paired_sim(10, seed=4)
    pos_mask = torch.zeros(10, 10, dtype=torch.bool)
    pos_mask[2, 7] = pos_mask[7, 2] = pos_mask[0, 1] = True
    ext = torch.rand(10, 30, generator=g, dtype=torch.float64) * 1.2 - 0.4
    ext_mask = torch.rand(10, 30, generator=g) > 0.2
    for top_k in (None, 6):
        found = adacl_anchor(
            sim, pos_mask=pos_mask, extra_neg_txt=ext, extra_neg_txt_mask=ext_mask, top_k=top_k
        )
        want = oracle_anchor(sim, pos_mask, ext, ext_mask, top_k=top_k)
        assert (found.row, found.clone_count) == (want["row"], want["count"])
        assert float(found.anchor) == pytest.approx(want["anchor"], rel=1e-12)
        assert math.exp(float(found.log_sigma_anchor)) == pytest.approx(want["sigma"], rel=1e-12)


def test_rows_with_fewer_than_two_negatives_are_not_eligible():
    # Row 0 keeps a single negative (column 9) and row 5 none; row 0 has by far the highest
    # salient score, so a code path that let it be S_sln would fit a zero variance.
    sim = paired_sim(10, seed=21)
    sim[0, 0], sim[0, 9] = 0.99, -0.5
    pos_mask = torch.zeros(10, 10, dtype=torch.bool)
    pos_mask[0, 1:9] = True
    pos_mask[5, :] = True
    negatives = (~pos_mask & ~torch.eye(10, dtype=torch.bool)).sum(dim=1)
    assert negatives[0] == 1 and negatives[5] == 0
    found = adacl_anchor(sim, pos_mask=pos_mask)
    want = oracle_anchor(sim, pos_mask)
    assert found.guard is None
    assert (found.salient_row, found.clone_row) == (want["i_plus"], want["i_minus"])
    assert 0 not in (found.salient_row, found.clone_row)
    assert (found.row, found.clone_count) == (want["row"], want["count"])
    assert float(found.anchor) == pytest.approx(want["anchor"], rel=1e-12)
    assert math.exp(float(found.log_sigma_anchor)) == pytest.approx(want["sigma"], rel=1e-12)
    loss = AdaCLLoss()
    loss.from_similarity(sim, pos_mask=pos_mask)
    m1, m2 = oracle_margins(want["anchor"], want["sigma"])
    assert loss.last_stats["updated"]
    assert float(loss.m1) == pytest.approx(m1, rel=1e-6)
    assert float(loss.m2) == pytest.approx(m2, rel=1e-6)


def test_random_anchor_is_a_clone_row_and_seeded():
    sim = paired_sim(12, seed=13)
    picks = []
    for seed in (0, 0, 1, 2, 3):
        gen = torch.Generator().manual_seed(seed)
        picks.append(adacl_anchor(sim, selection="random", generator=gen).row)
    assert picks[0] == picks[1]
    median = adacl_anchor(sim)
    log_odds = clone_log_odds(sim, median.fit)
    off_diag = ~torch.eye(12, dtype=torch.bool)
    clone_rows = set((((log_odds > 0) & off_diag).any(dim=1)).nonzero().flatten().tolist())
    assert set(picks) <= clone_rows


def test_anchor_rejects_bad_selection():
    with pytest.raises(ValueError, match="selection"):
        adacl_anchor(torch.eye(3), selection="mean")
    with pytest.raises(ValueError, match="top_k"):
        adacl_anchor(torch.eye(3), top_k=1)


# ------------------------------------------------------------------------------------------
# The module
# ------------------------------------------------------------------------------------------


def test_module_registered_with_paper_defaults():
    assert "adacl" in available_losses()
    loss = build_loss("adacl", anchor_selection="min")
    assert isinstance(loss, AdaCLLoss) and loss.config.anchor_selection == "min"
    fresh = AdaCLLoss()
    assert float(fresh.m1) == 20.0 and float(fresh.m2) == pytest.approx(0.1)
    assert fresh.config.p_u == 0.03 and fresh.config.eps == pytest.approx(math.exp(-7))
    assert fresh.last_stats["step"] == 0 and fresh.last_stats["guard"] is None
    assert not fresh.m1.requires_grad


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"anchor_selection": "mode"}, "anchor_selection"),
        ({"queue_size": 16}, "embed_dim"),
        ({"queue_size": -1}, "queue_size"),
        ({"margin_momentum": 1.0}, "margin_momentum"),
        ({"m1_init": 0.0}, "m1_init"),
        ({"p_u": 1.5}, "p_u"),
        ({"top_k": 0}, "top_k"),
        ({"max_anchor": 1.5}, "max_anchor"),
        ({"max_m1": 0.0}, "max_m1"),
        ({"max_m1": -5.0}, "max_m1"),
        ({"max_m1": float("inf")}, "max_m1"),
        ({"max_m1": "100"}, "max_m1"),
        ({"seed": 1.5}, "seed"),
        ({"warmup_steps": -1}, "warmup_steps"),
        ({"warmup_steps": 1.5}, "warmup_steps"),
        ({"warmup_steps": True}, "warmup_steps"),
        ({"reduction": "avg"}, "reduction"),
    ],
)
def test_module_rejects_bad_parameters(kwargs, name):
    with pytest.raises(ValueError, match=name):
        AdaCLLoss(**kwargs)


def test_training_step_updates_margins_then_computes_loss():
    sim = paired_sim(12, seed=11)
    loss = AdaCLLoss()
    got = loss.from_similarity(sim)
    want = oracle_anchor(sim)
    m1, m2 = oracle_margins(want["anchor"], want["sigma"])
    assert float(loss.m1) == pytest.approx(m1, rel=1e-6)
    assert float(loss.m2) == pytest.approx(m2, rel=1e-6)
    torch.testing.assert_close(got, naive_adacl_loss(sim, float(loss.m1), float(loss.m2)).mean())
    stats = loss.last_stats
    assert stats["step"] == 1 and stats["updated"] and stats["guard"] is None
    assert stats["anchor"] == pytest.approx(want["anchor"], rel=1e-6)
    assert stats["clone_count"] == want["count"]
    assert all(stats[f"guard_{g}"] == 0 for g in GUARDS)


@pytest.mark.parametrize("tau", [0.05, 0.1])
def test_negative_temperature_margins_keep_eq4_and_eq6_for_the_trained_loss(tau):
    sim = paired_sim(12, seed=11)
    loss = AdaCLLoss(negative_temperature=tau)
    got = loss.from_similarity(sim)
    want = oracle_anchor(sim, tau=tau)
    # The anchor (raw s_uu, its row, S*) does not depend on the temperature; Sigma does.
    plain = oracle_anchor(sim)
    assert (want["row"], want["count"]) == (plain["row"], plain["count"])
    assert want["anchor"] == plain["anchor"] and want["sigma"] > plain["sigma"]
    stats = loss.last_stats
    assert stats["anchor"] == pytest.approx(want["anchor"], rel=1e-12)
    assert stats["log_sigma_anchor"] == pytest.approx(math.log(want["sigma"]), rel=1e-6)
    m1, m2 = float(loss.m1), float(loss.m2)
    assert (m1, m2) == pytest.approx(oracle_margins(want["anchor"], want["sigma"]), rel=1e-6)
    # Eq. (4) and (6) under the loss actually trained (negatives exp(s / tau)).
    u = want["row"]
    negatives = [float(sim[u, k]) / tau for k in range(12) if k != u]
    for score, target in ((want["anchor"], P_U), (1.0, 1 - EPS)):
        logits = torch.tensor([m1 * (score - m2), *negatives], dtype=torch.float64)
        assert float(torch.softmax(logits, 0)[0]) == pytest.approx(target, abs=1e-6)
    torch.testing.assert_close(got, naive_adacl_loss(sim, m1, m2, tau=tau).mean())
    # The functional anchor agrees, and so does the module's update_margins entry point.
    fa = adacl_anchor(sim, negative_temperature=tau)
    assert fa.row == u and fa.log_sigma_anchor == pytest.approx(math.log(want["sigma"]), rel=1e-9)
    other = AdaCLLoss(negative_temperature=tau)
    other.update_margins(sim)
    assert float(other.m1) == m1 and float(other.m2) == pytest.approx(m2, rel=1e-6)
    assert "negative_temperature=" + f"{tau:g}" in repr(loss)


def test_negative_temperature_with_queue_matches_oracle():
    tau = 0.07
    loss = AdaCLLoss(queue_size=20, embed_dim=16, negative_temperature=tau)
    batches = _batches(4, seed=2)
    for img, txt, ids in batches[:3]:
        loss(img, txt, ids)
    img, txt, ids = batches[3]
    q_img, q_txt, q_ids = (
        loss.img_queue.keys.clone(),
        loss.txt_queue.keys.clone(),
        loss.img_queue.ids.clone(),
    )
    img_n = img / img.norm(dim=1, keepdim=True)
    txt_n = txt / txt.norm(dim=1, keepdim=True)
    sim = img_n @ txt_n.t()
    ext_txt, ext_img = img_n @ q_txt.t(), q_img @ txt_n.t()
    allowed = q_ids[None, :] != ids[:, None]
    want = oracle_anchor(sim, None, ext_txt, allowed, tau=tau)
    m1, m2 = oracle_margins(want["anchor"], want["sigma"])
    got = loss(img, txt, ids)
    assert float(loss.m1) == pytest.approx(m1, rel=1e-4)
    assert float(loss.m2) == pytest.approx(m2, rel=1e-4, abs=1e-5)
    naive = naive_adacl_loss(
        sim, float(loss.m1), float(loss.m2), None, ext_txt, allowed, ext_img, allowed.t(), tau=tau
    )
    torch.testing.assert_close(got.double(), naive.mean(), rtol=1e-4, atol=1e-4)


def naive_scaled_negatives_loss(sim, m1, m2):
    """Per-index -log p_hat with every negative logit scaled by m1 too, by loops."""
    s = sim.double().tolist()
    b = len(s)
    out = []
    for i in range(b):
        pos = m1 * (s[i][i] - m2)
        row = [pos] + [m1 * s[i][j] for j in range(b) if j != i]
        col = [pos] + [m1 * s[j][i] for j in range(b) if j != i]
        out.append(sum(-pos + math.log(sum(math.exp(x) for x in xs)) for xs in (row, col)))
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_scaled_negatives_loss_is_infonce_at_temperature_one_over_m1(reduction):
    sim = paired_sim(9, seed=4)
    pos_mask = torch.zeros(9, 9, dtype=torch.bool)
    pos_mask[2, 5] = pos_mask[5, 2] = True
    for tau in (0.05, 0.2):
        for pm in (None, pos_mask):
            got = adacl_loss(
                sim, m1=1 / tau, m2=0, pos_mask=pm, reduction=reduction, scale_negatives=True
            )
            want = infonce_loss(sim, temperature=tau, pos_mask=pm, reduction=reduction)
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    got = adacl_loss(sim, m1=31.0, m2=0.2, scale_negatives=True, reduction="none")
    torch.testing.assert_close(got, naive_scaled_negatives_loss(sim, 31.0, 0.2))
    # A tensor m1 scales the negatives as well (and gets their gradient).
    m1 = torch.tensor(31.0, dtype=torch.float64, requires_grad=True)
    adacl_loss(sim, m1=m1, m2=0.2, scale_negatives=True).backward()
    # The mean's float64 rounding (~1e-14) / 2h and the h^2 truncation stay under 1e-6 of this
    # gradient (8e-5) at h = 1e-4; h = 1e-6 let the rounding reach 3e-6.
    h = 1e-4
    numeric = (
        naive_scaled_negatives_loss(sim, 31.0 + h, 0.2).mean()
        - naive_scaled_negatives_loss(sim, 31.0 - h, 0.2).mean()
    ) / (2 * h)
    assert float(m1.grad) == pytest.approx(float(numeric), rel=1e-5)
    with pytest.raises(ValueError, match="scale_negatives"):
        adacl_loss(sim, m1=20.0, m2=0.1, scale_negatives=True, negative_temperature=0.05)
    with pytest.raises(ValueError, match="scale_negatives"):
        AdaCLLoss(scale_negatives=True, negative_temperature=0.05)
    with pytest.raises(ValueError, match="scale_negatives"):
        AdaCLLoss(scale_negatives=1)


def test_scaled_negatives_margins_keep_eq4_and_eq6_for_the_trained_loss():
    sim = paired_sim(12, seed=11)
    loss = AdaCLLoss(scale_negatives=True)
    got = loss.from_similarity(sim)
    want = oracle_anchor(sim)
    # Eq. (20): m1 depends on the anchor alone, whatever Sigma_anchor is.
    m1, m2 = float(loss.m1), float(loss.m2)
    assert m1 == pytest.approx(oracle_margins(want["anchor"], 1.0)[0], rel=1e-6)
    u = want["row"]
    negatives = [m1 * float(sim[u, k]) for k in range(12) if k != u]
    assert loss.last_stats["log_sigma_anchor"] == pytest.approx(
        float(torch.tensor(negatives, dtype=torch.float64).logsumexp(0)), rel=1e-9
    )
    for score, target in ((want["anchor"], P_U), (1.0, 1 - EPS)):
        logits = torch.tensor([m1 * (score - m2), *negatives], dtype=torch.float64)
        assert float(torch.softmax(logits, 0)[0]) == pytest.approx(target, abs=1e-6)
    torch.testing.assert_close(got, naive_scaled_negatives_loss(sim, m1, m2).mean())
    # Capped m1: Sigma_anchor is re-summed at the capped scale, so Eq. (4) still holds.
    capped = AdaCLLoss(scale_negatives=True, max_m1=0.5 * m1)
    capped.from_similarity(sim)
    c1, c2 = float(capped.m1), float(capped.m2)
    assert c1 == pytest.approx(0.5 * m1) and capped.last_stats["m1_capped"] == 1
    logits = torch.tensor(
        [c1 * (want["anchor"] - c2), *[c1 * float(sim[u, k]) for k in range(12) if k != u]],
        dtype=torch.float64,
    )
    assert float(torch.softmax(logits, 0)[0]) == pytest.approx(P_U, abs=1e-6)
    assert "scale_negatives=True" in repr(loss)


def test_warmup_steps_keep_the_initial_margins_then_update():
    sims = [paired_sim(12, seed=k) for k in (11, 12, 13)]
    loss = AdaCLLoss(warmup_steps=2, m1_init=20.0, m2_init=0.1)
    for k, sim in enumerate(sims[:2]):
        got = loss.from_similarity(sim)
        torch.testing.assert_close(got, naive_adacl_loss(sim, 20.0, float(loss.m2)).mean())
        assert float(loss.m1) == 20.0 and float(loss.m2) == pytest.approx(0.1)
        stats = loss.last_stats
        assert stats["step"] == k + 1 and stats["warmup"]
        assert not stats["updated"] and stats["guard"] is None and stats["anchor"] is None
        assert all(stats[f"guard_{g}"] == 0 for g in GUARDS)
    # A checkpoint taken inside the warm-up resumes it; the third batch updates as usual.
    restored = AdaCLLoss(warmup_steps=2)
    restored.load_state_dict(copy.deepcopy(loss.state_dict()))
    fresh = AdaCLLoss()
    fresh.from_similarity(sims[2])
    for module in (loss, restored):
        got = module.from_similarity(sims[2])
        assert (float(module.m1), float(module.m2)) == (float(fresh.m1), float(fresh.m2))
        assert module.last_stats["updated"] and not module.last_stats["warmup"]
        assert module.last_stats["step"] == 3
        torch.testing.assert_close(
            got, naive_adacl_loss(sims[2], *map(float, (fresh.m1, fresh.m2))).mean()
        )
    # Eval-mode calls do not count towards the warm-up.
    held = AdaCLLoss(warmup_steps=1).eval()
    held.from_similarity(sims[0])
    assert held.steps == 0 and not held.last_stats["warmup"]


def test_eval_mode_keeps_margins():
    loss = AdaCLLoss().eval()
    sim = paired_sim(8, seed=1)
    got = loss.from_similarity(sim)
    assert float(loss.m1) == 20.0 and int(loss.steps) == 0
    torch.testing.assert_close(got, adacl_loss(sim, m1=20.0, m2=float(torch.tensor(0.1))))


def test_no_gradient_flows_through_margins():
    sim = paired_sim(10, seed=6).requires_grad_(True)
    loss = AdaCLLoss()
    loss.from_similarity(sim).backward()
    ref = sim.detach().clone().requires_grad_(True)
    adacl_loss(ref, m1=float(loss.m1), m2=float(loss.m2)).backward()
    torch.testing.assert_close(sim.grad, ref.grad)


def test_margin_momentum_smooths_updates():
    sim = paired_sim(12, seed=11)
    raw = AdaCLLoss()
    raw.from_similarity(sim)
    smooth = AdaCLLoss(margin_momentum=0.75)
    smooth.from_similarity(sim)
    assert float(smooth.m1) == pytest.approx(0.75 * 20 + 0.25 * float(raw.m1), rel=1e-6)
    assert float(smooth.m2) == pytest.approx(0.75 * 0.1 + 0.25 * float(raw.m2), rel=1e-5)


def _assert_guard(loss: AdaCLLoss, sim: torch.Tensor, guard: str, **kwargs) -> None:
    before = (float(loss.m1), float(loss.m2))
    out = loss.from_similarity(sim, **kwargs)
    assert torch.isfinite(out)
    assert (float(loss.m1), float(loss.m2)) == before
    stats = loss.last_stats
    assert stats["guard"] == guard and not stats["updated"]
    assert stats[f"guard_{guard}"] == 1
    assert sum(stats[f"guard_{g}"] for g in GUARDS) == 1


def test_guard_degenerate_variance():
    sim = torch.full((4, 4), 0.3, dtype=torch.float64)
    sim.fill_diagonal_(0.9)
    _assert_guard(AdaCLLoss(), sim, "degenerate_variance")
    # Two pairs: one negative per row, no variance to estimate.
    _assert_guard(AdaCLLoss(), torch.tensor([[0.9, 0.1], [0.2, 0.8]]), "degenerate_variance")


def test_guard_empty_clone_set():
    # Every row has the same positive and the same negatives in the same order: the salient
    # and clone rows coincide, the two Gaussians are identical and nothing is a clone.
    p, a, b = 0.8, 0.2, 0.5
    sim = torch.tensor([[p, a, b], [a, p, b], [a, b, p]], dtype=torch.float64)
    loss = AdaCLLoss()
    _assert_guard(loss, sim, "empty_clone_set")
    assert loss.last_stats["clone_count"] == 0 and loss.last_stats["anchor"] is None


def test_guard_anchor_at_least_one():
    sim = paired_sim(10, seed=2)
    sim.fill_diagonal_(1.0)
    loss = AdaCLLoss()
    _assert_guard(loss, sim, "anchor_ge_one")
    assert loss.last_stats["anchor"] == 1.0 and loss.last_stats["clone_count"] > 0
    # A stricter bound refuses near-singular anchors too.
    sim = paired_sim(12, seed=11)
    anchor = oracle_anchor(sim)["anchor"]
    _assert_guard(AdaCLLoss(max_anchor=anchor - 1e-9), sim, "anchor_ge_one")
    accepted = AdaCLLoss(max_anchor=anchor + 1e-9)
    accepted.from_similarity(sim)
    assert accepted.last_stats["updated"]


def test_max_m1_caps_the_scale_and_keeps_eq4():
    # Positives at 0.995: the paper's rule gives m1 = 10.47 / 0.005 ~ 2100.
    sim = paired_sim(12, seed=11)
    sim.fill_diagonal_(0.995)
    free = AdaCLLoss()
    free.from_similarity(sim)
    assert float(free.m1) > 1000 and free.last_stats["m1_capped"] == 0
    capped = AdaCLLoss(max_m1=100.0)
    capped.from_similarity(sim)
    stats = capped.last_stats
    assert stats["updated"] and stats["guard"] is None and stats["m1_capped"] == 1
    assert float(capped.m1) == 100.0
    # Same anchor; m2 re-derived so that the anchor's probability (Eq. 4) is still p_u.
    assert stats["anchor"] == free.last_stats["anchor"] == pytest.approx(0.995)
    m1, m2 = float(capped.m1), float(capped.m2)
    e_anchor = math.exp(m1 * (stats["anchor"] - m2))
    p_anchor = e_anchor / (e_anchor + math.exp(stats["log_sigma_anchor"]))
    assert p_anchor == pytest.approx(P_U, abs=1e-5)
    # Below the cap nothing changes.
    plain = paired_sim(12, seed=3)
    a, b = AdaCLLoss(), AdaCLLoss(max_m1=1e4)
    a.from_similarity(plain)
    b.from_similarity(plain)
    assert (float(a.m1), float(a.m2)) == (float(b.m1), float(b.m2))
    assert b.last_stats["m1_capped"] == 0
    # The counter survives a checkpoint.
    restored = AdaCLLoss(max_m1=100.0)
    restored.load_state_dict(capped.state_dict())
    assert restored.last_stats["m1_capped"] == 1


def test_guard_nonfinite_margins():
    # Raw dot products spanning 1e20: m2 = anchor + (log(1-p)/p - log Sigma) / m1 is about
    # -1e39, beyond float32, so the buffers would become -inf.
    g = torch.Generator().manual_seed(0)
    sim = 1e20 * (1 + 0.1 * torch.rand(6, 6, generator=g))
    sim.fill_diagonal_(-1e20)
    loss = AdaCLLoss()
    _assert_guard(loss, sim, "nonfinite_margins")
    assert loss.last_stats["clone_count"] > 0


def test_guard_counters_accumulate_and_recover():
    loss = AdaCLLoss()
    bad = torch.full((4, 4), 0.3, dtype=torch.float64)
    bad.fill_diagonal_(0.9)
    loss.from_similarity(bad)
    loss.from_similarity(bad)
    loss.from_similarity(paired_sim(12, seed=11))
    stats = loss.last_stats
    assert stats["guard_degenerate_variance"] == 2 and stats["updated"] and stats["step"] == 3


def _batches(n, batch=8, dim=16, seed=0, id_period=3):
    g = torch.Generator().manual_seed(seed)
    out = []
    for k in range(n):
        img = torch.randn(batch, dim, generator=g)
        txt = img + 0.7 * torch.randn(batch, dim, generator=g)
        ids = torch.arange(batch) + batch * (k % id_period)
        out.append((img, txt, ids))
    return out


def test_module_with_queue_matches_oracle_and_masks_ids():
    loss = AdaCLLoss(queue_size=20, embed_dim=16)
    batches = _batches(4)
    for img, txt, ids in batches[:3]:
        loss(img, txt, ids)
    # The queue holds 20 of the 24 enqueued rows; the next batch repeats the first ids.
    img, txt, ids = batches[3]
    q_img, q_txt = loss.img_queue.keys.clone(), loss.txt_queue.keys.clone()
    q_ids = loss.img_queue.ids.clone()
    assert int(loss.img_queue.ptr) == 24 % 20 and bool(loss.img_queue.valid.all())
    img_n = img / img.norm(dim=1, keepdim=True)
    txt_n = txt / txt.norm(dim=1, keepdim=True)
    sim = img_n @ txt_n.t()
    ext_txt, ext_img = img_n @ q_txt.t(), q_img @ txt_n.t()
    allowed = q_ids[None, :] != ids[:, None]  # an image's own captions are never negatives
    assert (~allowed).sum() > 0
    want = oracle_anchor(sim, None, ext_txt, allowed)
    m1, m2 = oracle_margins(want["anchor"], want["sigma"])
    got = loss(img, txt, ids)
    assert float(loss.m1) == pytest.approx(m1, rel=1e-4)
    assert float(loss.m2) == pytest.approx(m2, rel=1e-4, abs=1e-5)
    naive = naive_adacl_loss(
        sim, float(loss.m1), float(loss.m2), None, ext_txt, allowed, ext_img, allowed.t()
    )
    torch.testing.assert_close(got.double(), naive.mean(), rtol=1e-4, atol=1e-4)
    # The batch was enqueued after the loss, at the pointer.
    slots = (torch.arange(8) + 4) % 20
    torch.testing.assert_close(loss.img_queue.keys[slots], img_n)
    torch.testing.assert_close(loss.txt_queue.ids[slots], ids)


def test_gradient_accumulation_over_two_steps():
    loss = AdaCLLoss(queue_size=16, embed_dim=16)
    (img1, txt1, ids1), (img2, txt2, ids2) = _batches(2)
    img1.requires_grad_(True)
    img2.requires_grad_(True)
    total = loss(img1, txt1, ids1) + loss(img2, txt2, ids2)
    total.backward()  # the in-place margin and queue updates must not break the first graph
    assert torch.isfinite(img1.grad).all() and torch.isfinite(img2.grad).all()


def test_momentum_keys_are_enqueued():
    loss = AdaCLLoss(queue_size=8, embed_dim=16)
    img, txt, ids = _batches(1)[0]
    keys = 3 * torch.randn(8, 16)
    loss(img, txt, ids, img_keys=keys, txt_keys=keys)
    torch.testing.assert_close(loss.img_queue.keys, keys / keys.norm(dim=1, keepdim=True))
    with pytest.raises(ValueError, match="img_keys"):
        loss(img, txt, ids, img_keys=torch.zeros(3, 16))
    with pytest.raises(ValueError, match="queue"):
        AdaCLLoss()(img, txt, ids, img_keys=keys)


def test_gathered_flag_changes_nothing_in_a_single_process():
    # gathered=True only skips the queue's all-gather, a no-op without torch.distributed.
    plain = AdaCLLoss(queue_size=12, embed_dim=16)
    flagged = AdaCLLoss(queue_size=12, embed_dim=16)
    keys = torch.randn(8, 16)
    for img, txt, ids in _batches(3, seed=4):
        a = plain(img, txt, ids, img_keys=keys, txt_keys=keys)
        b = flagged(img, txt, ids, img_keys=keys, txt_keys=keys, gathered=True)
        assert torch.equal(a, b)
    for name, value in plain.state_dict().items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, flagged.state_dict()[name]), name
    img, txt, ids = _batches(1)[0]
    assert torch.equal(AdaCLLoss()(img, txt, ids), AdaCLLoss()(img, txt, ids, gathered=True))
    with pytest.raises(ValueError, match="gathered"):
        plain(img, txt, ids, gathered=1)


def test_state_dict_round_trip_continues_identically():
    loss = AdaCLLoss(queue_size=12, embed_dim=16)
    batches = _batches(5, seed=9)
    for img, txt, ids in batches[:3]:
        loss(img, txt, ids)
    restored = AdaCLLoss(queue_size=12, embed_dim=16)
    restored.load_state_dict(copy.deepcopy(loss.state_dict()))
    assert restored.last_stats == loss.last_stats
    for img, txt, ids in batches[3:]:
        a, b = loss(img, txt, ids), restored(img, txt, ids)
        assert torch.equal(a, b)
    state, restored_state = loss.state_dict(), restored.state_dict()
    assert state.keys() == restored_state.keys() and "_extra_state" in state
    for name, value in state.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, restored_state[name]), name
        else:
            assert str(value) == str(restored_state[name]), name  # str: NaN == NaN
    assert restored.last_stats == loss.last_stats


def test_deterministic_under_a_seed():
    def run(selection):
        torch.manual_seed(123)
        loss = AdaCLLoss(anchor_selection=selection, queue_size=10, embed_dim=16)
        history = []
        for img, txt, ids in _batches(4, seed=5):
            history.append((float(loss(img, txt, ids)), loss.last_stats))
        return history

    for selection in ("median", "random"):
        assert run(selection) == run(selection)


def _random_run(loss: AdaCLLoss, batches) -> list[float]:
    anchors = []
    for img, txt, ids in batches:
        loss(img, txt, ids)
        anchors.append(loss.last_stats["anchor"])
    return anchors


def test_random_anchor_uses_its_own_generator_not_the_global_rng():
    batches = _batches(4, seed=5)
    torch.manual_seed(7)
    before = torch.get_rng_state()
    first = _random_run(AdaCLLoss(anchor_selection="random", seed=3), batches)
    assert torch.equal(torch.get_rng_state(), before)  # the training stream is not shifted
    torch.manual_seed(12345)  # the global seed plays no part
    assert _random_run(AdaCLLoss(anchor_selection="random", seed=3), batches) == first
    others = [_random_run(AdaCLLoss(anchor_selection="random", seed=k), batches) for k in (4, 5)]
    assert any(run != first for run in others)


def test_random_draws_resume_from_a_checkpoint():
    batches = _batches(8, seed=6)
    loss = AdaCLLoss(anchor_selection="random", seed=11)
    _random_run(loss, batches[:4])
    state = copy.deepcopy(loss.state_dict())
    assert isinstance(state["_extra_state"]["rng_state"], torch.Tensor)
    continued = _random_run(loss, batches[4:])
    restored = AdaCLLoss(anchor_selection="random", seed=99)  # the saved state wins
    restored.load_state_dict(state)
    assert _random_run(restored, batches[4:]) == continued
    fresh = AdaCLLoss(anchor_selection="random", seed=11)  # same seed, no state: other draws
    assert _random_run(fresh, batches[4:]) != continued


def test_extra_state_from_before_the_generator_still_loads():
    loss = AdaCLLoss()
    loss.from_similarity(paired_sim(12, seed=11))
    state = loss.state_dict()
    for key in ("rng_state", "m1_capped"):
        del state["_extra_state"][key]
    restored = AdaCLLoss()
    restored.load_state_dict(state)
    assert restored.last_stats == loss.last_stats
    state["_extra_state"]["bogus"] = 1
    with pytest.raises(ValueError, match="extra state"):
        restored.load_state_dict(state)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("selection", ["median", "max"])
def test_cuda_matches_cpu(selection):
    def run(device):
        torch.manual_seed(0)
        loss = AdaCLLoss(anchor_selection=selection, queue_size=24, embed_dim=16).to(device)
        out = []
        for img, txt, ids in _batches(4, seed=2):
            img = img.double().to(device).requires_grad_(True)
            value = loss(img, txt.double().to(device), ids.to(device))
            value.backward()
            out.append((float(value), loss.last_stats, img.grad.cpu()))
        return out

    for (v_gpu, s_gpu, g_gpu), (v_cpu, s_cpu, g_cpu) in zip(run("cuda"), run("cpu"), strict=True):
        assert v_gpu == pytest.approx(v_cpu, rel=1e-6)
        assert s_gpu["clone_count"] == s_cpu["clone_count"]
        assert s_gpu["m1"] == pytest.approx(s_cpu["m1"], rel=1e-5)
        torch.testing.assert_close(g_gpu, g_cpu, rtol=1e-5, atol=1e-7)
