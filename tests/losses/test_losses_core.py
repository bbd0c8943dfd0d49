"""Triplet, InfoNCE and Unified losses against naive loops and the Unified paper's identities."""

from __future__ import annotations

import math

import pytest
import torch

from vlret.losses import (
    InfoNCELoss,
    TripletLoss,
    UnifiedLoss,
    available_losses,
    build_loss,
    infonce_loss,
    triplet_loss,
    unified_loss,
)

# ----------------------------------------------------------------------------- naive oracles


def _negatives(b, pos_mask, i, j):
    return i != j and not (pos_mask is not None and bool(pos_mask[i, j]))


def naive_triplet(sim, margin, hardest, pos_mask):
    b = sim.shape[0]
    img_terms, txt_terms = [], []
    for i in range(b):
        row = [
            max(margin + sim[i, j] - sim[i, i], sim.new_zeros(()))
            for j in range(b)
            if _negatives(b, pos_mask, i, j)
        ]
        col = [
            max(margin + sim[j, i] - sim[i, i], sim.new_zeros(()))
            for j in range(b)
            if _negatives(b, pos_mask, j, i)
        ]
        agg = (lambda xs: max(xs) if xs else sim.new_zeros(())) if hardest else sum
        img_terms.append(agg(row) if row else sim.new_zeros(()))
        txt_terms.append(agg(col) if col else sim.new_zeros(()))
    return torch.stack(img_terms) + torch.stack(txt_terms)


def naive_infonce(sim, temperature, pos_mask):
    """Cross-entropy as in Eq. (3): -log softmax of the positive among positive + negatives."""
    b = sim.shape[0]
    out = []
    for i in range(b):
        row = [sim[i, i] / temperature] + [
            sim[i, j] / temperature for j in range(b) if _negatives(b, pos_mask, i, j)
        ]
        col = [sim[i, i] / temperature] + [
            sim[j, i] / temperature for j in range(b) if _negatives(b, pos_mask, j, i)
        ]
        ce_row = -(row[0] - torch.log(sum(torch.exp(x) for x in row)))
        ce_col = -(col[0] - torch.log(sum(torch.exp(x) for x in col)))
        out.append(ce_row + ce_col)
    return torch.stack(out)


def naive_unified(sim, margin, gamma, pos_mask, weights=None, margins=None):
    b = sim.shape[0]
    w = torch.ones_like(sim) if weights is None else weights
    out = []
    for i in range(b):
        m = margin if margins is None else margins[i]
        srow = sum(
            (
                torch.exp(gamma * (w[i, j] * sim[i, j] - w[i, i] * sim[i, i] + m))
                for j in range(b)
                if _negatives(b, pos_mask, i, j)
            ),
            sim.new_zeros(()),
        )
        scol = sum(
            (
                torch.exp(gamma * (w[j, i] * sim[j, i] - w[i, i] * sim[i, i] + m))
                for j in range(b)
                if _negatives(b, pos_mask, j, i)
            ),
            sim.new_zeros(()),
        )
        out.append((torch.log(1 + srow) + torch.log(1 + scol)) / gamma)
    return torch.stack(out)


def random_batch(b, seed, mask_prob=0.15):
    g = torch.Generator().manual_seed(seed)
    x = torch.nn.functional.normalize(torch.randn(b, 6, generator=g, dtype=torch.float64), dim=1)
    y = torch.nn.functional.normalize(torch.randn(b, 6, generator=g, dtype=torch.float64), dim=1)
    sim = x @ y.t()
    mask = torch.rand(b, b, generator=g) < mask_prob
    return sim, mask


def assert_value_and_grad(fn, oracle, sim):
    a = sim.clone().requires_grad_(True)
    b = sim.clone().requires_grad_(True)
    va, vb = fn(a), oracle(b)
    torch.testing.assert_close(va, vb, rtol=1e-10, atol=1e-10)
    va.sum().backward()
    vb.sum().backward()
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-9, atol=1e-10)


# ----------------------------------------------------------------------------- oracles


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("use_mask", [False, True])
@pytest.mark.parametrize("hardest", [True, False])
def test_triplet_matches_naive_loop(seed, use_mask, hardest):
    sim, mask = random_batch(7, seed)
    mask = mask if use_mask else None
    assert_value_and_grad(
        lambda s: triplet_loss(s, margin=0.3, hardest=hardest, pos_mask=mask, reduction="none"),
        lambda s: naive_triplet(s, 0.3, hardest, mask),
        sim,
    )


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("use_mask", [False, True])
def test_infonce_matches_naive_loop(seed, use_mask):
    sim, mask = random_batch(6, seed)
    mask = mask if use_mask else None
    assert_value_and_grad(
        lambda s: infonce_loss(s, temperature=0.1, pos_mask=mask, reduction="none"),
        lambda s: naive_infonce(s, 0.1, mask),
        sim,
    )


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("use_mask", [False, True])
@pytest.mark.parametrize("form", ["plain", "weights", "margins"])
def test_unified_matches_naive_loop(seed, use_mask, form):
    sim, mask = random_batch(6, seed)
    mask = mask if use_mask else None
    g = torch.Generator().manual_seed(100 + seed)
    weights = (
        torch.rand(6, 6, generator=g, dtype=torch.float64) + 0.5 if form == "weights" else None
    )
    margins = torch.rand(6, generator=g, dtype=torch.float64) * 0.4 if form == "margins" else None
    assert_value_and_grad(
        lambda s: unified_loss(
            s,
            margin=0.2,
            gamma=8.0,
            pos_mask=mask,
            weights=weights,
            margins=margins,
            reduction="none",
        ),
        lambda s: naive_unified(s, 0.2, 8.0, mask, weights, margins),
        sim,
    )


def test_unified_weights_receive_gradient():
    sim, _ = random_batch(5, 3)
    w = torch.full((5, 5), 1.1, dtype=torch.float64, requires_grad=True)
    unified_loss(sim, weights=w, gamma=10.0).backward()
    assert w.grad is not None and torch.isfinite(w.grad).all() and w.grad.abs().sum() > 0


@pytest.mark.parametrize("reduction", ["sum", "mean", "none"])
def test_reductions_are_consistent(reduction):
    sim, mask = random_batch(6, 9)
    for fn in (triplet_loss, infonce_loss, unified_loss):
        none = fn(sim, pos_mask=mask, reduction="none")
        assert none.shape == (6,)
        out = fn(sim, pos_mask=mask, reduction=reduction)
        expected = {"sum": none.sum(), "mean": none.mean(), "none": none}[reduction]
        torch.testing.assert_close(out, expected)


# ----------------------------------------------------------------------------- identities


@pytest.mark.parametrize("use_mask", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_unified_tends_to_triplet_hn(use_mask, seed):
    """Eq. (6): gamma -> inf turns the Unified loss into Triplet-HN."""
    b = 16
    sim, mask = random_batch(b, seed)
    mask = mask if use_mask else None
    hn = triplet_loss(sim, margin=0.2, hardest=True, pos_mask=mask)
    uni = unified_loss(sim, margin=0.2, gamma=1e5, pos_mask=mask)
    assert abs(float(uni - hn)) <= 1e-3 * b
    # and the gap shrinks as gamma grows
    gaps = [abs(float(unified_loss(sim, gamma=g, pos_mask=mask) - hn)) for g in (10, 100, 1000)]
    assert gaps[0] > gaps[1] > gaps[2]


@pytest.mark.parametrize("gamma", [1.0, 20.0, 60.0])
@pytest.mark.parametrize("use_mask", [False, True])
def test_gamma_unified_at_zero_margin_is_infonce(gamma, use_mask):
    """Eq. (7): gamma * L_unified(m=0) == L_VLC with temperature 1/gamma (summed)."""
    sim, mask = random_batch(9, 4)
    mask = mask if use_mask else None
    lhs = gamma * unified_loss(sim, margin=0.0, gamma=gamma, pos_mask=mask)
    rhs = infonce_loss(sim, temperature=1.0 / gamma, pos_mask=mask, reduction="sum")
    torch.testing.assert_close(lhs, rhs, rtol=1e-12, atol=1e-12)


def test_infonce_is_cross_entropy():
    """Eq. (3) is torch's cross-entropy in both directions (no extra positives)."""
    sim, _ = random_batch(8, 5)
    labels = torch.arange(8)
    ce = torch.nn.functional.cross_entropy(sim / 0.07, labels, reduction="sum")
    ce = ce + torch.nn.functional.cross_entropy(sim.t() / 0.07, labels, reduction="sum")
    torch.testing.assert_close(infonce_loss(sim, temperature=0.07, reduction="sum"), ce)


@pytest.mark.parametrize(
    "fn",
    [
        lambda s: triplet_loss(s, hardest=False, margin=0.25),
        lambda s: infonce_loss(s, temperature=0.3),
        lambda s: unified_loss(s, gamma=5.0),
        lambda s: unified_loss(s, gamma=5.0, margins=torch.linspace(0, 0.3, 5, dtype=s.dtype)),
    ],
)
def test_gradcheck(fn):
    sim, _ = random_batch(5, 11)
    assert torch.autograd.gradcheck(fn, (sim.clone().requires_grad_(True),))


# ----------------------------------------------------------------------------- numerics


@pytest.mark.parametrize("gamma", [1e2, 1e3, 1e4])
def test_unified_large_gamma_finite_in_float32(gamma):
    sim, mask = random_batch(32, 2)
    s = sim.float().requires_grad_(True)
    loss = unified_loss(s, gamma=gamma, pos_mask=mask)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(s.grad).all()
    hn = triplet_loss(sim.float(), pos_mask=mask)
    assert abs(float(loss.detach() - hn)) <= 32 * 2 * math.log(32) / gamma + 1e-3


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", ["triplet", "infonce", "unified"])
def test_half_precision_inputs(dtype, name):
    sim, mask = random_batch(16, 6)
    s = sim.to(dtype).requires_grad_(True)
    fn = {"triplet": triplet_loss, "infonce": infonce_loss, "unified": unified_loss}[name]
    loss = fn(s, pos_mask=mask)
    assert loss.dtype == torch.float32
    loss.backward()
    assert s.grad.dtype == dtype and torch.isfinite(s.grad.float()).all()
    ref = fn(s.detach().double(), pos_mask=mask)
    torch.testing.assert_close(loss.double(), ref, rtol=1e-5, atol=1e-5)
    if name == "unified":
        s2 = sim.to(dtype).requires_grad_(True)
        big = unified_loss(s2, gamma=1e4, pos_mask=mask)
        big.backward()
        assert torch.isfinite(big) and torch.isfinite(s2.grad.float()).all()


@pytest.mark.parametrize("fn", [triplet_loss, infonce_loss, unified_loss])
def test_rows_without_negatives_give_attached_zero(fn):
    sim = torch.tensor([[0.9, 0.1], [0.2, 0.8]], requires_grad=True)
    all_positive = torch.ones(2, 2, dtype=torch.bool)
    loss = fn(sim, pos_mask=all_positive)
    assert float(loss.detach()) == 0.0 and loss.requires_grad
    loss.backward()
    assert torch.equal(sim.grad, torch.zeros(2, 2))


def test_pos_mask_entries_are_neither_pushed_nor_pulled():
    sim, _ = random_batch(5, 8)
    mask = torch.zeros(5, 5, dtype=torch.bool)
    mask[0, 3] = True
    for fn in (
        lambda s: triplet_loss(s, hardest=False, pos_mask=mask),
        lambda s: infonce_loss(s, pos_mask=mask),
        lambda s: unified_loss(s, pos_mask=mask),
    ):
        s = sim.clone().requires_grad_(True)
        fn(s).backward()
        assert float(s.grad[0, 3]) == 0.0


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize("fn", [triplet_loss, infonce_loss, unified_loss])
def test_bad_inputs_raise_named_errors(fn):
    good = torch.eye(3)
    cases = [
        (torch.zeros(3, 4), "square"),
        (torch.zeros(3), "2-D"),
        (torch.ones(1, 1), "batch size"),
        (torch.tensor([[0.0, float("nan")], [0.0, 0.0]]), "NaN"),
        (torch.tensor([[0.0, float("inf")], [0.0, 0.0]]), "inf"),
    ]
    for sim, message in cases:
        with pytest.raises(ValueError, match=message):
            fn(sim)
    with pytest.raises(ValueError, match="pos_mask.*shape"):
        fn(good, pos_mask=torch.zeros(2, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="pos_mask.*dtype"):
        fn(good, pos_mask=torch.zeros(3, 3))
    with pytest.raises(ValueError, match="reduction"):
        fn(good, reduction="avg")


def test_parameter_errors():
    sim = torch.eye(3)
    with pytest.raises(ValueError, match="temperature"):
        infonce_loss(sim, temperature=0.0)
    with pytest.raises(ValueError, match="gamma"):
        unified_loss(sim, gamma=-1.0)
    with pytest.raises(ValueError, match="margin"):
        triplet_loss(sim, margin=float("nan"))
    with pytest.raises(ValueError, match="weights"):
        unified_loss(sim, weights=torch.ones(2, 2))
    with pytest.raises(ValueError, match="margins"):
        unified_loss(sim, margins=torch.ones(3, 1))
    with pytest.raises(ValueError, match="margins"):
        unified_loss(sim, margins=torch.tensor([0.1, float("nan"), 0.2]))


# ----------------------------------------------------------------------------- modules


def test_modules_normalise_and_match_functions():
    g = torch.Generator().manual_seed(0)
    img, txt = torch.randn(6, 5, generator=g), torch.randn(6, 5, generator=g)
    sim = torch.nn.functional.normalize(img, dim=1) @ torch.nn.functional.normalize(txt, dim=1).t()
    torch.testing.assert_close(TripletLoss()(img, txt), triplet_loss(sim))
    torch.testing.assert_close(InfoNCELoss()(img, txt), infonce_loss(sim))
    torch.testing.assert_close(UnifiedLoss()(img, txt), unified_loss(sim))
    raw = UnifiedLoss(normalize=False)(img, txt)
    torch.testing.assert_close(raw, unified_loss(img @ txt.t()))


def test_module_ids_build_pos_mask():
    g = torch.Generator().manual_seed(1)
    img, txt = torch.randn(4, 5, generator=g), torch.randn(4, 5, generator=g)
    ids = ["a", "b", "a", "c"]  # texts 0 and 2 describe the same image
    mask = torch.tensor([[1, 0, 1, 0], [0, 1, 0, 0], [1, 0, 1, 0], [0, 0, 0, 1]], dtype=torch.bool)
    loss = TripletLoss(hardest=False)
    torch.testing.assert_close(loss(img, txt, img_ids=ids), loss(img, txt, ids, ids))
    sim = torch.nn.functional.normalize(img, dim=1) @ torch.nn.functional.normalize(txt, dim=1).t()
    torch.testing.assert_close(loss(img, txt, img_ids=ids), loss.from_similarity(sim, mask))
    tids = torch.tensor([7, 8, 7, 9])
    torch.testing.assert_close(loss(img, txt, tids), loss.from_similarity(sim, mask))


def test_module_input_errors():
    loss = UnifiedLoss()
    with pytest.raises(ValueError, match="same shape"):
        loss(torch.randn(4, 5), torch.randn(3, 5))
    with pytest.raises(ValueError, match="img_ids"):
        loss(torch.randn(4, 5), torch.randn(4, 5), img_ids=[1, 2, 3])
    with pytest.raises(ValueError, match="without img_ids"):
        loss(torch.randn(4, 5), torch.randn(4, 5), txt_ids=[1, 2, 3, 4])


def test_unified_module_weights_and_margins():
    sim, _ = random_batch(5, 3)
    margins = torch.linspace(0.0, 0.4, 5, dtype=torch.float64)
    out = UnifiedLoss(gamma=7.0).from_similarity(sim, margins=margins)
    torch.testing.assert_close(out, unified_loss(sim, gamma=7.0, margins=margins))


def test_learnable_temperature_is_clamped_like_clip():
    loss = InfoNCELoss(temperature=0.05, learnable_temperature=True)
    assert math.isclose(loss.temperature, 0.05, rel_tol=1e-6)
    assert isinstance(loss.log_scale, torch.nn.Parameter)
    sim, _ = random_batch(6, 0)
    out = loss.from_similarity(sim.float())
    out.backward()
    assert loss.log_scale.grad is not None and loss.log_scale.grad != 0
    torch.testing.assert_close(out, infonce_loss(sim.float(), temperature=0.05))
    with torch.no_grad():
        loss.log_scale.fill_(10.0)  # scale e^10 > 100
    loss.from_similarity(sim.float())
    assert math.isclose(loss.temperature, 0.01, rel_tol=1e-6)
    assert math.isclose(float(loss.log_scale.detach()), math.log(100), rel_tol=1e-6)


# ----------------------------------------------------------------------------- registry


def test_registry():
    assert {"triplet", "infonce", "unified"} <= set(available_losses())
    loss = build_loss("unified", gamma=50.0, margin=0.1)
    assert isinstance(loss, UnifiedLoss) and loss.gamma == 50.0 and loss.margin == 0.1
    with pytest.raises(ValueError, match="available losses: .*infonce.*triplet"):
        build_loss("contrastive")
    with pytest.raises(ValueError, match="unknown parameter.*gama.*valid: margin=0.2, gamma=60.0"):
        build_loss("unified", gama=3)
    with pytest.raises(ValueError, match="reduction"):
        build_loss("triplet", reduction="avg")


# ----------------------------------------------------------------------------- chunk_size


@pytest.mark.parametrize(
    "name, params",
    [
        ("triplet", {"hardest": True}),
        ("triplet", {"hardest": False, "reduction": "mean"}),
        ("infonce", {"temperature": 0.1}),
        ("infonce", {"learnable_temperature": True}),
        ("unified", {"gamma": 30.0, "reduction": "none"}),
        ("goal", {}),
        ("goal", {"triplet_weight": "nca", "pair_weight": "lin-ms", "reduction": "mean"}),
    ],
)
def test_chunk_size_switches_modules_to_the_tiled_form(name, params):
    g = torch.Generator().manual_seed(7)
    img = torch.randn(23, 6, generator=g, dtype=torch.float64)
    txt = torch.randn(23, 6, generator=g, dtype=torch.float64)
    ids = torch.arange(23) // 2  # pairs of captions share an image
    dense, tiled = build_loss(name, **params), build_loss(name, chunk_size=5, **params)
    tiled.load_state_dict(dense.state_dict())
    outs, grads = [], []
    for module in (dense, tiled):
        a, b = img.clone().requires_grad_(True), txt.clone().requires_grad_(True)
        out = module(a, b, img_ids=ids)
        out.sum().backward()
        outs.append(out.detach())
        grads.append((a.grad, b.grad))
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-10, atol=1e-10)
    for ga, gb in zip(grads[0], grads[1], strict=True):
        torch.testing.assert_close(ga, gb, rtol=1e-9, atol=1e-10)


def test_chunk_size_errors():
    with pytest.raises(ValueError, match="chunk_size"):
        TripletLoss(chunk_size=0)
    with pytest.raises(ValueError, match="chunk_size"):
        build_loss("infonce", chunk_size=2.5)
    # Seeded float64: the tiled and dense forms agree to float64 rounding on any CPU.
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    with pytest.raises(ValueError, match="weights"):
        UnifiedLoss(chunk_size=2)(x, x, weights=torch.ones(4, 4))
    margins = torch.full((4,), 0.1, dtype=torch.float64)
    torch.testing.assert_close(
        UnifiedLoss(chunk_size=3)(x, x.flip(0), margins=margins),
        UnifiedLoss()(x, x.flip(0), margins=margins),
        rtol=0,
        atol=1e-10,
    )


def test_chunk_size_on_a_loss_without_tiled_form_is_a_clear_error():
    from vlret.losses import PairLoss

    class DenseOnly(PairLoss):
        def from_similarity(self, sim, pos_mask=None):
            return sim.sum()

    x = torch.randn(4, 3)
    assert torch.isfinite(DenseOnly(reduction="sum")(x, x))
    # chunk_size is declared by the families with a tiled form only: refused when built
    with pytest.raises(ValueError, match="'DenseOnly' has no tiled form"):
        DenseOnly(reduction="sum", chunk_size=2)
