"""Circle, multi-similarity, binomial deviance and hard-negative NCA: naive loops, and which of
them have exactly the gradient of their GOAL cell (Table 1), in float64."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from vlret.losses import (
    BinomialDevianceLoss,
    CircleLoss,
    MultiSimilarityLoss,
    NCAHardLoss,
    available_losses,
    binomial_deviance_loss,
    build_loss,
    circle_loss,
    goal_objective,
    multi_similarity_loss,
    nca_hard_loss,
)

FUNCTIONS = {
    "circle": circle_loss,
    "multi_similarity": multi_similarity_loss,
    "binomial_deviance": binomial_deviance_loss,
    "nca_hard": nca_hard_loss,
}

# ----------------------------------------------------------------------------- naive oracles


def _anchor_lines(s, mask, hardest):
    """(positive, [negatives]) per anchor and direction, as python floats."""
    b = len(s)
    out = []
    for direction in ("i2t", "t2i"):
        for a in range(b):
            if direction == "i2t":
                negs = [s[a][c] for c in range(b) if c != a and not mask[a][c]]
            else:
                negs = [s[c][a] for c in range(b) if c != a and not mask[c][a]]
            if hardest and negs:
                negs = [max(negs)]
            out.append((a, s[a][a], negs))
    return out


def _per_index(sim, pos_mask, hardest, term):
    s = sim.tolist()
    b = len(s)
    mask = pos_mask.tolist() if pos_mask is not None else [[False] * b for _ in range(b)]
    per = [0.0] * b
    for a, p, negs in _anchor_lines(s, mask, hardest):
        per[a] += term(p, negs)
    return torch.tensor(per, dtype=torch.float64)


def naive_circle(sim, m, gamma, hardest, pos_mask=None):
    def term(p, negs):
        ap = max(1 + m - p, 0.0)
        inner = sum(math.exp(gamma * max(x + m, 0.0) * (x - m)) for x in negs)
        return math.log(1 + inner * math.exp(-gamma * ap * (p - (1 - m))))

    return _per_index(sim, pos_mask, hardest, term)


def naive_ms(sim, alpha, beta, lam, eps, hardest, pos_mask=None):
    """MS loss with MS mining (Wang et al.): keep negatives with s + eps > p and the positive if
    p - eps < max negative; an anchor with an empty set contributes nothing."""

    def term(p, negs):
        mined = [x for x in negs if x + eps > p]
        pos = [p] if negs and p - eps < max(negs) else []
        if not mined or not pos:
            return 0.0
        return (
            math.log(1 + sum(math.exp(-alpha * (x - lam)) for x in pos)) / alpha
            + math.log(1 + sum(math.exp(beta * (x - lam)) for x in mined)) / beta
        )

    return _per_index(sim, pos_mask, hardest, term)


def naive_bd(sim, alpha, beta, lam, hardest, pos_mask=None):
    def term(p, negs):
        return math.log(1 + math.exp(-alpha * (p - lam))) / alpha + sum(
            math.log(1 + math.exp(beta * (x - lam))) / beta for x in negs
        )

    return _per_index(sim, pos_mask, hardest, term)


def naive_nca(sim, tau, pos_mask=None):
    """Eq. (6): -log(e^{tau p} / (e^{tau p} + e^{tau s_n}))."""

    def term(p, negs):
        if not negs:
            return 0.0
        sn = max(negs)
        return -math.log(math.exp(tau * p) / (math.exp(tau * p) + math.exp(tau * sn)))

    return _per_index(sim, pos_mask, True, term)


def cosine_batch(b=7, d=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = F.normalize(torch.randn(b, d, generator=g, dtype=torch.float64), dim=1)
    y = F.normalize(x + 0.6 * torch.randn(b, d, generator=g, dtype=torch.float64), dim=1)
    return x @ y.t()


def dup_mask(b):
    ids = torch.arange(b) // 2
    return ids[:, None] == ids[None, :]


def grad_of(fn, sim, **kw):
    sim = sim.detach().clone().requires_grad_(True)
    fn(sim, **kw).backward()
    return sim.grad


# ----------------------------------------------------------------------------- values


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("use_mask", [False, True])
@pytest.mark.parametrize("hardest", [False, True])
def test_values_match_naive_loops(seed, use_mask, hardest):
    sim = cosine_batch(seed=seed)
    mask = dup_mask(7) if use_mask else None
    kw = dict(pos_mask=mask, hardest=hardest, reduction="none")
    torch.testing.assert_close(
        circle_loss(sim, margin=0.25, gamma=16.0, **kw),
        naive_circle(sim, 0.25, 16.0, hardest, mask),
    )
    torch.testing.assert_close(
        multi_similarity_loss(sim, alpha=2.0, beta=10.0, lam=0.5, epsilon=0.1, **kw),
        naive_ms(sim, 2.0, 10.0, 0.5, 0.1, hardest, mask),
    )
    torch.testing.assert_close(
        multi_similarity_loss(sim, alpha=2.0, beta=50.0, lam=1.0, epsilon=0.3, **kw),
        naive_ms(sim, 2.0, 50.0, 1.0, 0.3, hardest, mask),
    )
    torch.testing.assert_close(
        binomial_deviance_loss(sim, alpha=2.0, beta=10.0, lam=0.5, **kw),
        naive_bd(sim, 2.0, 10.0, 0.5, hardest, mask),
    )
    torch.testing.assert_close(
        nca_hard_loss(sim, tau=10.0, pos_mask=mask, reduction="none"), naive_nca(sim, 10.0, mask)
    )


def test_ms_mining_is_exercised():
    """The test data has anchors whose MS sets are empty and anchors with several negatives."""
    sim = cosine_batch(seed=0)
    per = naive_ms(sim, 2.0, 10.0, 0.5, 0.1, False)
    assert (per == 0).any() and (per > 0).any()


@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_reductions(name):
    fn = FUNCTIONS[name]
    sim = cosine_batch(seed=2)
    none = fn(sim, reduction="none")
    torch.testing.assert_close(fn(sim, reduction="sum"), none.sum())
    torch.testing.assert_close(fn(sim, reduction="mean"), none.mean())
    assert fn(sim).shape == ()  # default "sum" like VSE++


def test_circle_alphas_are_constants_for_the_gradient():
    """dL/ds_j = gamma alpha_n^j w_j, dL/dp = -gamma alpha_p sum_j w_j (w = softmax with the 1)."""
    sim = cosine_batch(b=5, seed=3)
    m, gamma = 0.25, 8.0
    got = grad_of(circle_loss, sim, margin=m, gamma=gamma)
    s = sim.tolist()
    want = [[0.0] * 5 for _ in range(5)]
    for direction in ("i2t", "t2i"):
        for a in range(5):
            cells = [(a, c) if direction == "i2t" else (c, a) for c in range(5) if c != a]
            p = s[a][a]
            ap = max(1 + m - p, 0.0)
            z = [gamma * (max(s[i][j] + m, 0) * (s[i][j] - m) - ap * (p - 1 + m)) for i, j in cells]
            denom = 1 + sum(math.exp(v) for v in z)
            for (i, j), v in zip(cells, z, strict=True):
                w = math.exp(v) / denom
                want[i][j] += gamma * max(s[i][j] + m, 0) * w
                want[a][a] -= gamma * ap * w
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64))


# ----------------------------------------------------------------------------- GOAL equivalences


@pytest.mark.parametrize("tau", [1.0, 10.0, 32.0])
@pytest.mark.parametrize("use_mask", [False, True])
def test_nca_hard_is_tau_times_goal_nca_con(tau, use_mask):
    """d l^nca / dS = tau * GOAL(T^nca, P^con): the constant is tau (Eq. 6 -> Eq. 7)."""
    sim = cosine_batch(b=8, seed=4)
    mask = dup_mask(8) if use_mask else None
    ref = grad_of(nca_hard_loss, sim, tau=tau, pos_mask=mask)
    got = grad_of(
        goal_objective, sim, triplet_weight="nca", pair_weight="con", tau=tau, pos_mask=mask
    )
    torch.testing.assert_close(ref, tau * got, rtol=1e-12, atol=1e-12)


def _positive_sims(b=8, seed=5):
    """Similarities in (0.05, 0.95): every hardest negative is >= 0, as Circle's alpha_n needs."""
    g = torch.Generator().manual_seed(seed)
    return 0.05 + 0.9 * torch.rand(b, b, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("gamma", [4.0, 10.0, 40.0])
@pytest.mark.parametrize("use_mask", [False, True])
def test_circle_hardest_m0_is_gamma_times_goal_cir_lin_offset_1(gamma, use_mask):
    """Circle loss (hardest negative, m = 0): z = gamma (s_n^2 + (1 - p)^2), so its gradient is
    gamma * GOAL(T^cir with circle_offset=1, P^lin) with tau = gamma."""
    sim = _positive_sims()
    mask = dup_mask(8) if use_mask else None
    ref = grad_of(circle_loss, sim, margin=0.0, gamma=gamma, hardest=True, pos_mask=mask)
    got = grad_of(
        goal_objective,
        sim,
        triplet_weight="cir",
        pair_weight="lin",
        tau=gamma,
        circle_offset=1.0,
        pos_mask=mask,
    )
    torch.testing.assert_close(ref, gamma * got, rtol=1e-12, atol=1e-12)
    # With Eq. (8)'s offset 0 or the code's 0.5 it is not Circle loss's gradient.
    for offset in (0.0, 0.5):
        other = grad_of(
            goal_objective,
            sim,
            triplet_weight="cir",
            pair_weight="lin",
            tau=gamma,
            circle_offset=offset,
            pos_mask=mask,
        )
        assert not torch.allclose(ref, gamma * other)


@pytest.mark.parametrize("epsilon", [0.05, 0.1, 0.3])
@pytest.mark.parametrize("use_mask", [False, True])
def test_ms_hardest_is_goal_con_sig_with_margin_epsilon(epsilon, use_mask):
    """MS with only the hardest negative: the mining is the Heaviside of eps + s_n - p and the
    pair gradients are exactly P^sig, so d MS / dS = GOAL(T^con with margin=eps, P^sig)."""
    sim = cosine_batch(b=8, seed=6)
    mask = dup_mask(8) if use_mask else None
    kw = dict(alpha=2.0, beta=10.0, lam=0.5)
    ref = grad_of(multi_similarity_loss, sim, epsilon=epsilon, hardest=True, pos_mask=mask, **kw)
    got = grad_of(
        goal_objective,
        sim,
        triplet_weight="con",
        pair_weight="sig",
        margin=epsilon,
        pos_mask=mask,
        **kw,
    )
    torch.testing.assert_close(ref, got, rtol=1e-12, atol=1e-12)


def test_ms_full_is_not_goal_con_sig_ms():
    """The MS loss (all mined negatives) spreads gradient over every mined negative and sums
    its relative terms; GOAL's P^sig-ms averages them and only moves the hardest negative."""
    sim = cosine_batch(b=8, seed=6)
    ref = grad_of(multi_similarity_loss, sim, epsilon=0.3)
    got = grad_of(
        goal_objective, sim, triplet_weight="con", pair_weight="sig-ms", epsilon=0.3, margin=0.3
    )
    assert not torch.allclose(ref, got)


def test_binomial_deviance_hardest_is_goal_con_sig_when_every_triplet_is_active():
    sim = cosine_batch(b=8, seed=7)
    kw = dict(alpha=2.0, beta=10.0, lam=0.5)
    ref = grad_of(binomial_deviance_loss, sim, hardest=True, **kw)
    got = grad_of(goal_objective, sim, triplet_weight="con", pair_weight="sig", margin=2.0, **kw)
    torch.testing.assert_close(ref, got, rtol=1e-12, atol=1e-12)
    # With the usual margin T^con gates off the satisfied triplets; BD still pushes them.
    gated = grad_of(goal_objective, sim, triplet_weight="con", pair_weight="sig", margin=0.2, **kw)
    assert not torch.allclose(ref, gated)


# ----------------------------------------------------------------------------- numerics, errors


@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_rows_without_negatives_give_attached_zero(name):
    fn = FUNCTIONS[name]
    sim = cosine_batch(b=4).requires_grad_(True)
    mask = torch.ones(4, 4, dtype=torch.bool)
    out = fn(sim, pos_mask=mask)
    assert out.requires_grad
    out.backward()
    assert torch.isfinite(sim.grad).all()
    if name != "binomial_deviance":  # BD is a pair loss: it still pulls the positives
        assert float(out.detach()) == 0.0 and torch.count_nonzero(sim.grad) == 0
    else:
        assert torch.count_nonzero(sim.grad - torch.diag(sim.grad.diagonal())) == 0


@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_pos_mask_entries_are_neither_pushed_nor_pulled(name):
    sim = cosine_batch(b=8, seed=8)
    mask = dup_mask(8)
    g = grad_of(FUNCTIONS[name], sim, pos_mask=mask)
    off = mask & ~torch.eye(8, dtype=torch.bool)
    assert torch.count_nonzero(g[off]) == 0 and g.abs().sum() > 0


@pytest.mark.parametrize("name", list(FUNCTIONS))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision(name, dtype):
    fn = FUNCTIONS[name]
    sim = cosine_batch(b=8, seed=9).to(dtype).requires_grad_(True)
    out = fn(sim)
    assert out.dtype == torch.float32
    out.backward()
    assert sim.grad.dtype == dtype and torch.isfinite(sim.grad).all()
    torch.testing.assert_close(out, fn(sim.detach().float()))


@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_large_scores_stay_finite(name):
    sim = (30 * torch.randn(12, 12, generator=torch.Generator().manual_seed(0))).requires_grad_()
    out = FUNCTIONS[name](sim)
    out.backward()
    assert torch.isfinite(out) and torch.isfinite(sim.grad).all()


def test_modules_registry_and_embeddings():
    classes = {
        "circle": CircleLoss,
        "multi_similarity": MultiSimilarityLoss,
        "binomial_deviance": BinomialDevianceLoss,
        "nca_hard": NCAHardLoss,
    }
    torch.manual_seed(0)
    x = torch.randn(9, 5, dtype=torch.float64)
    y = torch.randn(9, 5, dtype=torch.float64)
    ids = torch.tensor([0, 0, 1, 2, 3, 4, 5, 6, 7])
    sim = F.normalize(x, dim=1) @ F.normalize(y, dim=1).t()
    mask = ids[:, None] == ids[None, :]
    for name, cls in classes.items():
        assert name in available_losses()
        module = build_loss(name, reduction="mean")
        assert isinstance(module, cls) and "reduction='mean'" in repr(module)
        torch.testing.assert_close(
            module(x, y, img_ids=ids), FUNCTIONS[name](sim, pos_mask=mask, reduction="mean")
        )
    hard = build_loss("circle", hardest=True, margin=0.1, gamma=20.0)
    torch.testing.assert_close(
        hard.from_similarity(sim), circle_loss(sim, hardest=True, margin=0.1, gamma=20.0)
    )


@pytest.mark.parametrize(
    "name,kwargs,needle",
    [
        ("circle", dict(gamma=0.0), "gamma"),
        ("circle", dict(margin=float("nan")), "margin"),
        ("multi_similarity", dict(alpha=-2.0), "alpha"),
        ("multi_similarity", dict(epsilon=-0.1), "epsilon"),
        ("binomial_deviance", dict(beta=0.0), "beta"),
        ("binomial_deviance", dict(lam=float("inf")), "lam"),
        ("nca_hard", dict(tau=-1.0), "tau"),
        ("nca_hard", dict(reduction="avg"), "reduction"),
    ],
)
def test_bad_parameters_raise(name, kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        FUNCTIONS[name](cosine_batch(b=4), **kwargs)
    with pytest.raises(ValueError, match=needle):
        build_loss(name, **kwargs)


@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_bad_similarity_raises(name):
    fn = FUNCTIONS[name]
    with pytest.raises(ValueError, match="square"):
        fn(torch.zeros(3, 4))
    with pytest.raises(ValueError, match="NaN"):
        fn(torch.tensor([[0.1, float("nan")], [0.2, 0.3]]))
    with pytest.raises(ValueError, match="pos_mask"):
        fn(torch.zeros(3, 3), pos_mask=torch.ones(2, 2, dtype=torch.bool))
