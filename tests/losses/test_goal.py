"""GOAL gradient objectives against a naive double-loop oracle written from the paper's equations,
the triplet-loss equivalence, grad_output handling (loss weights, AMP scaling, DDP), errors."""

from __future__ import annotations

import gc
import math
import os
import tempfile

import pytest
import torch
import torch.nn.functional as F

from vlret.losses import (
    PAIR_WEIGHTS,
    TRIPLET_WEIGHTS,
    GoalFunction,
    GoalObjective,
    available_losses,
    build_loss,
    goal_objective,
    goal_pair_weights,
    goal_triplet_weight,
    triplet_loss,
)

COMBOS = [(t, p) for t in TRIPLET_WEIGHTS for p in PAIR_WEIGHTS]
DEFAULTS = dict(margin=0.2, tau=10.0, alpha=2.0, beta=10.0, lam=0.5, epsilon=0.1, circle_offset=0.5)
CUSTOM = dict(margin=0.3, tau=4.0, alpha=3.0, beta=7.0, lam=0.3, epsilon=0.4, circle_offset=0.2)

# ----------------------------------------------------------------------------- naive oracle


def _sigmoid_inv(x):
    """1 / (1 + exp(x)), the form every weight of the paper is written in."""
    return 1.0 / (1.0 + math.exp(x))


def naive_goal_grad(sim, tw, pw, hp, pos_mask=None, index_weights=None):
    """dL/dS by loops over anchors, straight from Eq. (5), (7)-(13) of the paper."""
    s = sim.tolist()
    b = len(s)
    mask = pos_mask.tolist() if pos_mask is not None else [[False] * b for _ in range(b)]
    grad = [[0.0] * b for _ in range(b)]
    positives = [s[k][k] for k in range(b)]
    for direction in ("i2t", "t2i"):
        for a in range(b):
            if direction == "i2t":
                cands = [c for c in range(b) if c != a and not mask[a][c]]
                score = {c: s[a][c] for c in cands}
            else:
                cands = [c for c in range(b) if c != a and not mask[c][a]]
                score = {c: s[c][a] for c in cands}
            if not cands:
                continue
            n = max(cands, key=lambda c: score[c])
            p, sn = s[a][a], score[n]
            if tw == "con":
                t = 1.0 if hp["margin"] + sn - p > 0 else 0.0
            elif tw == "nca":
                t = _sigmoid_inv(hp["tau"] * (p - sn))
            else:
                t = _sigmoid_inv(hp["tau"] * (p * (2 - p) - sn**2 - hp["circle_offset"]))
            rel_pos = [r for r in positives if r < sn + hp["epsilon"]]
            # Eq. (12): N's bound is min{S_xy, R} - epsilon over the relative positives R.
            rel_neg = [score[c] for c in cands if score[c] > min(p, *positives) - hp["epsilon"]]
            al, be, lam = hp["alpha"], hp["beta"], hp["lam"]
            if pw == "con":
                wp, wn = 1.0, 1.0
            elif pw == "lin":
                wp, wn = max(1 - p, 0.0), max(sn, 0.0)
            elif pw == "sig":
                wp, wn = _sigmoid_inv(al * (p - lam)), _sigmoid_inv(-be * (sn - lam))
            elif pw == "sig-ms":
                mp = sum(math.exp(al * (p - r)) for r in rel_pos) / len(rel_pos) if rel_pos else 1
                mn = sum(math.exp(-be * (sn - r)) for r in rel_neg) / len(rel_neg) if rel_neg else 1
                wp = 1 / (mp + math.exp(al * (p - lam)))
                wn = 1 / (mn + math.exp(-be * (sn - lam)))
            else:
                mp = sum(p - r for r in rel_pos) / len(rel_pos) if rel_pos else 0.0
                mn = sum(sn - r for r in rel_neg) / len(rel_neg) if rel_neg else 0.0
                wp, wn = max((1 - mp) * (1 - p), 0.0), max((1 + mn) * sn, 0.0)
            w = 1.0 if index_weights is None else float(index_weights[a])
            if direction == "i2t":
                grad[a][n] += w * t * wn
            else:
                grad[n][a] += w * t * wn
            grad[a][a] -= w * t * wp
    return torch.tensor(grad, dtype=torch.float64)


def cosine_batch(b=7, d=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = F.normalize(torch.randn(b, d, generator=g, dtype=torch.float64), dim=1)
    y = F.normalize(x + 0.6 * torch.randn(b, d, generator=g, dtype=torch.float64), dim=1)
    return x @ y.t()


def dup_mask(b):
    ids = torch.arange(b) // 2  # pairs of captions of one image
    return ids[:, None] == ids[None, :]


def goal_grad(sim, **kw):
    sim = sim.detach().clone().requires_grad_(True)
    goal_objective(sim, **kw).backward()
    return sim.grad


# ----------------------------------------------------------------------------- oracle tests


@pytest.mark.parametrize("tw,pw", COMBOS)
@pytest.mark.parametrize("params", ["defaults", "custom"])
@pytest.mark.parametrize("use_mask", [False, True])
def test_gradient_matches_naive_oracle(tw, pw, params, use_mask):
    hp = DEFAULTS if params == "defaults" else CUSTOM
    for seed in (0, 1):
        sim = cosine_batch(seed=seed)
        mask = dup_mask(7) if use_mask else None
        got = goal_grad(sim, triplet_weight=tw, pair_weight=pw, pos_mask=mask, **hp)
        want = naive_goal_grad(sim, tw, pw, hp, pos_mask=mask)
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
        assert got.abs().sum() > 0


def test_ms_relative_terms_are_exercised():
    """The oracle data really has non-empty, non-trivial MS selection sets."""
    sim = cosine_batch(seed=0)
    plain = goal_grad(sim, triplet_weight="con", pair_weight="sig", **CUSTOM)
    ms = goal_grad(sim, triplet_weight="con", pair_weight="sig-ms", **CUSTOM)
    lin = goal_grad(sim, triplet_weight="con", pair_weight="lin", **CUSTOM)
    lin_ms = goal_grad(sim, triplet_weight="con", pair_weight="lin-ms", **CUSTOM)
    assert not torch.allclose(plain, ms) and not torch.allclose(lin, lin_ms)


def test_ms_negative_set_is_bounded_by_the_lowest_relative_positive():
    """Eq. (12): N = {negatives > min(S_xy, R) - epsilon}, R = the batch's positive scores.

    Row 0 has p = 0.9 but the lowest diagonal entry is 0.3, so N's bound is 0.2, not
    p - epsilon = 0.8: both of row 0's negatives (0.5, 0.25) are in N. Only row 0's triplet
    touches S[0, 1] (text 1's hinge 0.45 + 0.5 - 1.0 is negative).
    """
    sim = torch.tensor([[0.9, 0.5, 0.25], [0.0, 1.0, 0.28], [0.0, 0.1, 0.3]], dtype=torch.float64)
    kw = dict(triplet_weight="con", margin=0.45, epsilon=0.1, beta=10.0, lam=0.5)
    lin = goal_grad(sim, pair_weight="lin-ms", **kw)[0, 1]
    m_lin = ((0.5 - 0.5) + (0.5 - 0.25)) / 2
    assert lin.item() == pytest.approx((1 + m_lin) * 0.5, abs=1e-15)  # p - eps reading: 0.5
    sig = goal_grad(sim, pair_weight="sig-ms", **kw)[0, 1]
    m_sig = (1.0 + math.exp(-10.0 * (0.5 - 0.25))) / 2
    assert sig.item() == pytest.approx(1 / (m_sig + math.exp(-10.0 * (0.5 - 0.5))), abs=1e-15)


@pytest.mark.parametrize("tw,pw", [("con", "con"), ("cir", "sig-ms"), ("nca", "lin-ms")])
def test_reduction_none_takes_per_index_gradient(tw, pw):
    sim = cosine_batch(seed=3).requires_grad_(True)
    mask = dup_mask(7)
    out = goal_objective(sim, triplet_weight=tw, pair_weight=pw, pos_mask=mask, reduction="none")
    assert out.shape == (7,)
    v = torch.linspace(-1.0, 2.0, 7, dtype=torch.float64)
    out.backward(v)
    want = naive_goal_grad(sim.detach(), tw, pw, DEFAULTS, pos_mask=mask, index_weights=v)
    torch.testing.assert_close(sim.grad, want, rtol=1e-10, atol=1e-12)


def test_mean_is_sum_over_batch():
    sim = cosine_batch(seed=4)
    total = goal_objective(sim)
    mean = goal_objective(sim, reduction="mean")
    torch.testing.assert_close(mean, total / 7)
    torch.testing.assert_close(goal_grad(sim, reduction="mean"), goal_grad(sim) / 7)


# ----------------------------------------------------------------------------- paper identities


@pytest.mark.parametrize("use_mask", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_con_con_is_exactly_the_triplet_loss_gradient_off_ties(use_mask, seed):
    """Table 2 / Eq. (4)-(5): (T^con, P^con) == d triplet_loss(hardest, sum) / dS on random
    data, where hardest negatives are unique and no hinge is exactly 0 (see the next test)."""
    sim = cosine_batch(b=9, d=4, seed=seed)
    mask = dup_mask(9) if use_mask else None
    ref = sim.clone().requires_grad_(True)
    triplet_loss(ref, margin=0.2, hardest=True, pos_mask=mask, reduction="sum").backward()
    got = goal_grad(sim, triplet_weight="con", pair_weight="con", margin=0.2, pos_mask=mask)
    torch.testing.assert_close(got, ref.grad, rtol=0, atol=0)
    # ... and the forward value is that triplet loss.
    for reduction in ("sum", "mean", "none"):
        torch.testing.assert_close(
            goal_objective(sim, pos_mask=mask, reduction=reduction),
            triplet_loss(sim, hardest=True, pos_mask=mask, reduction=reduction),
        )


def test_con_con_at_ties_and_zero_hinges_is_another_subgradient():
    """Where triplet_loss(hardest) is not differentiable the two gradients differ, both valid.

    Row 0's two hardest negatives tie at 0.5. With margin 0.5 the hinge is active: autograd
    through amax splits the unit weight 1/2, 1/2 over the tie; GOAL gives all of it to the one
    negative max() returns. With margin 0.25 the hinge is exactly 0: T^con (strict Heaviside)
    is 0, while autograd passes 1/4 (amax splits over the row's four zero hinges) to each tied
    negative and -1/2 to the positive. Dyadic values make the ties exact.
    """
    sim = torch.tensor(
        [
            [0.75, 0.5, 0.5, 0.0],
            [0.0, 0.875, 0.0, 0.0],
            [0.0, 0.0, 0.875, 0.0],
            [0.0] * 3 + [0.875],
        ],
        dtype=torch.float64,
    )
    tie = [(0, 1), (0, 2)]

    def both(margin):
        ref = sim.clone().requires_grad_(True)
        triplet_loss(ref, margin=margin, hardest=True, reduction="sum").backward()
        return ref.grad, goal_grad(sim, triplet_weight="con", pair_weight="con", margin=margin)

    tri, goal = both(0.5)
    # Texts 1 and 2 also have S[0, 1], S[0, 2] as their violating hardest negatives (+1 each).
    assert sorted(tri[i, j].item() for i, j in tie) == [1.5, 1.5]
    assert sorted(goal[i, j].item() for i, j in tie) == [1.0, 2.0]
    off_tie = torch.ones(4, 4, dtype=torch.bool)
    off_tie[0, 1] = off_tie[0, 2] = False
    torch.testing.assert_close(goal[off_tie], tri[off_tie], rtol=0, atol=0)
    assert goal[0, 0].item() == tri[0, 0].item() == -1.0

    tri, goal = both(0.25)
    assert torch.count_nonzero(goal) == 0
    assert [tri[0, 0].item(), tri[0, 1].item(), tri[0, 2].item()] == [-0.5, 0.25, 0.25]
    assert torch.count_nonzero(tri) == 3


def test_weight_functions_follow_the_equations():
    p = torch.tensor([0.3, 0.5, 0.8], dtype=torch.float64)
    n = torch.tensor([0.4, 0.5, 0.1], dtype=torch.float64)
    # Eq. (5): the Heaviside of m + s_n - p.
    assert goal_triplet_weight("con", p, n, margin=0.2).tolist() == [1.0, 1.0, 0.0]
    # Eq. (7) at p == s_n is 1/2; Eq. (8) with circle_offset=0 is the printed formula.
    assert goal_triplet_weight("nca", p, n, tau=10.0)[1] == 0.5
    want = [
        _sigmoid_inv(10 * (a * (2 - a) - b * b))
        for a, b in zip(p.tolist(), n.tolist(), strict=True)
    ]
    torch.testing.assert_close(
        goal_triplet_weight("cir", p, n, tau=10.0, circle_offset=0.0),
        torch.tensor(want, dtype=torch.float64),
    )
    # Offset 0.5: the T^cir = 1/2 circle is tangent to T^nca's p = s_n line at (0.5, 0.5).
    half = torch.tensor(0.5, dtype=torch.float64)
    assert goal_triplet_weight("cir", half, half, circle_offset=0.5) == 0.5
    # Eq. (11) at p = s_n = lambda is 1/2; MS with m = 1 is sig, lin-MS with m = 0 is lin.
    sig = goal_pair_weights("sig", half, half)
    assert sig[0] == 0.5 and sig[1] == 0.5
    for plain, ms, neutral in (("sig", "sig-ms", 1.0), ("lin", "lin-ms", 0.0)):
        a = goal_pair_weights(plain, p, n)
        b = goal_pair_weights(ms, p, n, ms_pos=neutral, ms_neg=neutral)
        torch.testing.assert_close(a, b)
    # Fig. 3, m = 0.1: sig-MS's maximum weight grows to 1/m.
    big = goal_pair_weights(
        "sig-ms", torch.tensor(-50.0), torch.tensor(50.0), ms_pos=0.1, ms_neg=0.1
    )
    torch.testing.assert_close(torch.stack(big), torch.tensor([10.0, 10.0]))
    lin_ms = goal_pair_weights("lin-ms", p, n, ms_pos=0.1, ms_neg=0.1)
    torch.testing.assert_close(lin_ms[0], 0.9 * (1 - p))
    torch.testing.assert_close(lin_ms[1], 1.1 * n)


# ----------------------------------------------------------------------------- grad_output


def test_loss_weight_scales_the_gradient():
    sim = cosine_batch(seed=5)
    base = goal_grad(sim)
    s2 = sim.clone().requires_grad_(True)
    (0.37 * goal_objective(s2)).backward()
    torch.testing.assert_close(s2.grad, 0.37 * base)
    s3 = sim.clone().requires_grad_(True)
    (goal_objective(s3) * 0.0).backward()
    assert torch.count_nonzero(s3.grad) == 0


def test_amp_scale_is_exact_and_gradscaler_unscales():
    torch.manual_seed(0)
    x = torch.randn(16, 8)
    y = torch.randn(16, 8)
    net = torch.nn.Linear(8, 8)
    loss_fn = GoalObjective()

    def grads(scale):
        net.zero_grad()
        out = loss_fn(net(x), net(y))
        (out * scale).backward()
        return [p.grad.clone() for p in net.parameters()]

    ref = grads(1.0)
    for g, r in zip(grads(2.0**16), ref, strict=True):
        torch.testing.assert_close(g, r * 2.0**16, rtol=0, atol=0)

    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    net.zero_grad()
    scaler.scale(loss_fn(net(x), net(y))).backward()
    scaler.unscale_(opt)
    for p, r in zip(net.parameters(), ref, strict=True):
        torch.testing.assert_close(p.grad, r, rtol=0, atol=0)


def test_autocast_bfloat16_embeddings():
    torch.manual_seed(1)
    x = torch.randn(32, 16, requires_grad=True)
    y = torch.randn(32, 16, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        sim = F.normalize(x, dim=1) @ F.normalize(y, dim=1).t()
        assert sim.dtype == torch.bfloat16
        out = goal_objective(sim)
    out.backward()
    assert out.dtype == torch.float32
    assert x.grad.dtype == torch.float32 and torch.isfinite(x.grad).all()
    assert x.grad.abs().sum() > 0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_sim_computes_in_float32(dtype):
    sim = cosine_batch(b=8, d=4, seed=6).to(dtype)
    half = sim.clone().requires_grad_(True)
    goal_objective(half).backward()
    assert half.grad.dtype == dtype
    ref = goal_grad(sim.float())
    torch.testing.assert_close(half.grad.float(), ref, rtol=1e-2, atol=1e-2)


def test_embedding_gradient_is_chain_rule_through_s():
    torch.manual_seed(2)
    x = torch.randn(10, 6, dtype=torch.float64, requires_grad=True)
    y = torch.randn(10, 6, dtype=torch.float64, requires_grad=True)
    ids = torch.tensor([0, 0, 1, 2, 3, 4, 5, 6, 7, 8])
    GoalObjective(pair_weight="lin-ms")(x, y, img_ids=ids).backward()
    gx, gy = x.grad.clone(), y.grad.clone()
    x.grad = y.grad = None
    sim = F.normalize(x, dim=1) @ F.normalize(y, dim=1).t()
    mask = ids[:, None] == ids[None, :]
    dlds = goal_grad(sim.detach(), pair_weight="lin-ms", pos_mask=mask)
    (sim * dlds).sum().backward()
    torch.testing.assert_close(gx, x.grad)
    torch.testing.assert_close(gy, y.grad)


def test_pos_mask_entries_get_no_gradient():
    sim = cosine_batch(b=8, seed=7)
    sim[0, 1] = sim[1, 0] = 0.99  # would be the hardest negatives without the mask
    mask = dup_mask(8)
    for tw, pw in COMBOS:
        g = goal_grad(sim, triplet_weight=tw, pair_weight=pw, pos_mask=mask)
        off = mask & ~torch.eye(8, dtype=torch.bool)
        assert torch.count_nonzero(g[off]) == 0


def test_no_negatives_gives_attached_zero():
    sim = cosine_batch(b=4).requires_grad_(True)
    out = goal_objective(sim, pos_mask=torch.ones(4, 4, dtype=torch.bool))
    assert out.requires_grad and float(out.detach()) == 0.0
    out.backward()
    assert torch.count_nonzero(sim.grad) == 0


def test_large_unnormalised_scores_stay_finite():
    torch.manual_seed(3)
    sim = (40 * torch.randn(16, 16)).requires_grad_(True)
    for tw, pw in COMBOS:
        sim.grad = None
        goal_objective(sim, triplet_weight=tw, pair_weight=pw).backward()
        assert torch.isfinite(sim.grad).all(), (tw, pw)


def test_double_backward_is_refused():
    sim = cosine_batch(b=4).requires_grad_(True)
    (g,) = torch.autograd.grad(goal_objective(sim), sim, create_graph=True)
    with pytest.raises(RuntimeError):
        g.sum().backward()


# ----------------------------------------------------------------------------- module, registry


def test_module_matches_function_and_registry():
    assert "goal" in available_losses()
    loss = build_loss("goal", triplet_weight="nca", pair_weight="lin", tau=5.0)
    assert isinstance(loss, GoalObjective)
    assert "triplet_weight='nca'" in repr(loss)
    sim = cosine_batch(seed=8)
    torch.testing.assert_close(
        goal_grad(sim, triplet_weight="nca", pair_weight="lin", tau=5.0),
        _module_grad(loss, sim),
    )


def _module_grad(module, sim):
    sim = sim.detach().clone().requires_grad_(True)
    module.from_similarity(sim).backward()
    return sim.grad


def test_goal_function_apply_directly():
    from vlret.losses.goal import GoalParams

    sim = cosine_batch(seed=9).requires_grad_(True)
    negatives = ~torch.eye(7, dtype=torch.bool)
    GoalFunction.apply(
        sim, negatives, GoalParams(triplet_weight="con", pair_weight="con")
    ).backward()
    torch.testing.assert_close(
        sim.grad, goal_grad(sim.detach(), triplet_weight="con", pair_weight="con")
    )


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        (dict(triplet_weight="circle"), "(cir, sig-ms)"),
        (dict(pair_weight="sig_ms"), "pair_weight"),
        (dict(tau=0.0), "tau"),
        (dict(alpha=-1.0), "alpha"),
        (dict(beta=float("inf")), "beta"),
        (dict(epsilon=-0.1), "epsilon"),
        (dict(lam=float("nan")), "lam"),
        (dict(circle_offset=float("nan")), "circle_offset"),
        (dict(reduction="avg"), "reduction"),
    ],
)
def test_bad_parameters_raise(kwargs, needle):
    sim = cosine_batch(b=4)
    with pytest.raises(ValueError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        goal_objective(sim, **kwargs)
    with pytest.raises(ValueError):
        build_loss("goal", **kwargs)


def test_unknown_combination_lists_all_fifteen():
    with pytest.raises(ValueError) as exc:
        goal_objective(cosine_batch(b=4), triplet_weight="tri", pair_weight="lin")
    msg = str(exc.value)
    for t, p in COMBOS:
        assert f"({t}, {p})" in msg


@pytest.mark.parametrize(
    "sim,needle",
    [
        (torch.zeros(3, 4), "square"),
        (torch.zeros(3), "2-D"),
        (torch.tensor([[0.1, float("nan")], [0.2, 0.3]]), "NaN"),
        (torch.zeros(1, 1), "at least 2"),
        (torch.zeros(3, 3, dtype=torch.long), "floating"),
    ],
)
def test_bad_similarity_raises(sim, needle):
    with pytest.raises(ValueError, match=needle):
        goal_objective(sim)


def test_bad_pos_mask_raises():
    with pytest.raises(ValueError, match="pos_mask"):
        goal_objective(torch.zeros(3, 3), pos_mask=torch.zeros(3, 3))


# ----------------------------------------------------------------------------- DDP


class _TwoTower(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.img = torch.nn.Linear(6, 5, dtype=torch.float64)
        self.txt = torch.nn.Linear(6, 5, dtype=torch.float64)

    def forward(self, x, y):
        return self.img(x), self.txt(y)


def _ddp_data():
    g = torch.Generator().manual_seed(11)
    return torch.randn(2, 8, 6, generator=g, dtype=torch.float64), torch.randn(
        2, 8, 6, generator=g, dtype=torch.float64
    )


def _ddp_worker(rank, world, init_file, out_file):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(_TwoTower())
        xs, ys = _ddp_data()
        loss = 0.5 * GoalObjective()(*model(xs[rank], ys[rank]))
        loss.backward()
        if rank == 0:
            torch.save([p.grad for p in model.module.parameters()], out_file)
        # A DDP wrapper alive at exit sometimes aborts the process (torch 2.13, gloo).
        del model
        gc.collect()
    finally:
        dist.destroy_process_group()


def test_distributed_data_parallel_averages_goal_gradients():
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "init")
        out_file = os.path.join(tmp, "grads.pt")
        mp.spawn(_ddp_worker, args=(2, init_file, out_file), nprocs=2, join=True)
        ddp_grads = torch.load(out_file)
    torch.manual_seed(0)
    model = _TwoTower()
    xs, ys = _ddp_data()
    for r in range(2):
        (0.5 * GoalObjective()(*model(xs[r], ys[r]))).backward()
    for got, p in zip(ddp_grads, model.parameters(), strict=True):
        torch.testing.assert_close(got, p.grad / 2)
