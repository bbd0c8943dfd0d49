"""The polynomial losses (issue 29): SSP as released (wayne980/PolyLoss) and RSP (Unified Eq. 25
reading), against naive per-anchor loops in float64, at their selection edges, tiled == dense,
Unified Eq. (25) at a finite gamma, parameter errors and the Unified Table 3/7 configs."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from vlret.losses import (
    build_loss,
    polynomial_weights,
    rsp_loss,
    rsp_unified_loss,
    ssp_loss,
    tiled_rsp_loss,
    tiled_ssp_loss,
    triplet_loss,
    unified_loss,
)
from vlret.run.config import load_config
from vlret.similarity import cosine_similarity, positive_mask

F64 = torch.float64
SSP = {"a2": 0.2, "a1": -0.7, "a0": 0.5, "b2": 0.9, "b1": -0.4, "b0": 0.03}

# ----------------------------------------------------------------------------- naive oracles


def _anchors(sim, pos):
    """Each anchor's positive and list of negatives, image anchors then text anchors."""
    s = sim.tolist()
    b = len(s)
    for rows, match in ((s, pos), ([list(c) for c in zip(*s, strict=True)], pos.t())):
        for i in range(b):
            negs = [rows[i][j] for j in range(b) if j != i and not bool(match[i, j])]
            yield i, rows[i][i], negs


def naive_ssp(
    sim, pos=None, *, margin=0.2, max_positive=1 - 1e-5, per_index=False, hardest=True, **c
):
    """The release's loop, read literally: per row then per column, the positive kept when
    below the threshold, the informative negatives those with s + m > p, the largest of them
    (``hardest=False``: every informative negative, vlret's all-negatives warm-up)."""
    c = {**SSP, **c}
    b = sim.shape[0]
    pos = torch.eye(b, dtype=torch.bool) if pos is None else pos
    out = [0.0] * b
    for i, p, negs in _anchors(sim, pos):
        if not p < max_positive:
            continue
        informative = [n for n in negs if n + margin > p]
        if not informative:
            continue
        out[i] += max(c["a2"] * p * p + c["a1"] * p + c["a0"], 0.0)
        for n in [max(informative)] if hardest else informative:
            out[i] += max(c["b2"] * n * n + c["b1"] * n + c["b0"], 0.0)
    return out if per_index else sum(out) / b


def naive_rsp(sim, pos=None, *, margin=0.2, c1=1.0, c2=0.5):
    """Per anchor: the informative relative similarities r = s - p with r + m > 0, the largest,
    [(c1 + c2 r) r + m]_+; summed."""
    b = sim.shape[0]
    pos = torch.eye(b, dtype=torch.bool) if pos is None else pos
    total = 0.0
    for _, p, negs in _anchors(sim, pos):
        informative = [n - p for n in negs if (n - p) + margin > 0]
        if informative:
            r = max(informative)
            total += max((c1 + c2 * r) * r + margin, 0.0)
    return total


def naive_eq25(sim, *, c1, c2, margin, gamma):
    """Unified Eq. (25) at a finite gamma, written out."""
    s = sim.tolist()
    b = len(s)

    def g(r):
        return (c1 + c2 * r) * r

    total = 0.0
    for i in range(b):
        rows = sum(math.exp(gamma * (g(s[i][j] - s[i][i]) + margin)) for j in range(b) if j != i)
        cols = sum(math.exp(gamma * (g(s[j][i] - s[i][i]) + margin)) for j in range(b) if j != i)
        total += math.log1p(rows) + math.log1p(cols)
    return total / gamma


def _sim(b, seed, scale=0.6):
    g = torch.Generator().manual_seed(seed)
    noise = (torch.rand(b, b, generator=g, dtype=F64) * 2 - 1) * scale
    return noise + torch.eye(b, dtype=F64) * 0.3


# ----------------------------------------------------------------------------- SSP


@pytest.mark.parametrize("seed", range(4))
def test_ssp_equals_the_released_loop(seed):
    sim = _sim(7, seed)
    assert ssp_loss(sim).item() == pytest.approx(naive_ssp(sim), abs=1e-12)
    assert ssp_loss(sim, reduction="sum").item() == pytest.approx(7 * naive_ssp(sim), abs=1e-12)
    terms = ssp_loss(sim, reduction="none")
    torch.testing.assert_close(terms, torch.tensor(naive_ssp(sim, per_index=True), dtype=F64))
    other = {"a2": 0.5, "a1": -0.1, "a0": 0.2, "b2": -0.3, "b1": 0.8, "b0": 0.1}
    got = ssp_loss(sim, margin=0.35, **other).item()
    assert got == pytest.approx(naive_ssp(sim, margin=0.35, **other), abs=1e-12)


def test_ssp_some_anchors_are_not_informative_in_the_random_cases():
    # the oracle comparisons above are not vacuous: rows are both kept and dropped
    sim = _sim(7, 0)
    kept = [
        i
        for i, p, negs in _anchors(sim, torch.eye(7, dtype=torch.bool))
        if any(n + 0.2 > p for n in negs)
    ]
    assert 0 < len(kept) < 14


def test_ssp_positive_threshold_edge():
    """A positive exactly at 1 - 1e-5 drops its anchor (image row and text column); one ulp
    below it keeps them."""
    at = 1 - 1e-5
    below = math.nextafter(at, 0.0)
    base = torch.tensor([[0.0, 0.9, 0.1], [0.3, 0.6, 0.2], [0.1, 0.5, 0.7]], dtype=F64)
    for p0, kept in ((at, False), (below, True)):
        sim = base.clone()
        sim[0, 0] = p0
        sim[0, 1] = sim[1, 0] = p0 - 0.1  # informative for anchor 0 both ways
        got = ssp_loss(sim, reduction="none")
        assert got.tolist() == pytest.approx(naive_ssp(sim, per_index=True), abs=1e-12)
        assert (got[0].item() > 0) is kept
    # the threshold is a parameter: with it raised, the anchor at 1 - 1e-5 counts
    sim[0, 0] = at
    assert ssp_loss(sim, max_positive=1.5, reduction="none")[0].item() > 0


def test_ssp_negative_at_the_margin_edge():
    """A negative exactly at p - m is not informative (the release's strict s + m > p); the
    next one whose s + m exceeds p (one ulp of p above) is, and is then the one used. Dyadic
    values make s + m exact."""
    p, m = 0.5, 0.25
    for n, kept in ((p - m, False), (math.nextafter(p, 1.0) - m, True)):
        sim = torch.tensor([[p, n, -0.5], [-0.5, p, -0.5], [-0.5, -0.5, p]], dtype=F64)
        rows = ssp_loss(sim, margin=m, reduction="none")
        expected = naive_ssp(sim, margin=m, per_index=True)
        assert rows.tolist() == pytest.approx(expected, abs=1e-12)
        # image anchor 0 and text anchor 1 see n; nobody else has an informative negative
        assert (rows[0].item() > 0, rows[1].item() > 0, rows[2].item()) == (kept, kept, 0.0)
        if kept:
            poly_p = 0.2 * p * p - 0.7 * p + 0.5
            poly_n = max(0.9 * n * n - 0.4 * n + 0.03, 0.0)
            assert rows[0].item() == pytest.approx(poly_p + poly_n, abs=1e-12)


def test_ssp_anchor_without_informative_negative_gives_nothing_and_no_gradient():
    sim = torch.tensor([[0.9, 0.1, 0.0], [0.8, 0.5, 0.2], [0.0, 0.45, 0.4]], dtype=F64)
    sim.requires_grad_(True)
    terms = ssp_loss(sim, reduction="none")
    # image 0: negatives 0.1, 0.0 vs p=0.9 (none within 0.2); text 0: 0.8 vs 0.9 informative
    assert terms.tolist() == pytest.approx(naive_ssp(sim.detach(), per_index=True), abs=1e-12)
    terms.sum().backward()
    assert sim.grad[0, 1].item() == 0.0 and sim.grad[0, 2].item() == 0.0
    assert sim.grad[1, 0].item() != 0.0  # text 0's hardest negative


def test_ssp_ties_among_negatives_take_the_value_once_and_the_gradient_to_the_first():
    sim = torch.tensor(
        [[0.5, 0.45, 0.45, 0.1], [0.0, 0.6, 0.1, 0.2], [0.1, 0.0, 0.7, 0.6], [0.0, 0.1, 0.2, 0.8]],
        dtype=F64,
        requires_grad=True,
    )
    loss = ssp_loss(sim, reduction="sum")
    assert loss.item() == pytest.approx(4 * naive_ssp(sim.detach()), abs=1e-12)
    loss.backward()
    assert sim.grad[0, 1].item() != 0.0 and sim.grad[0, 2].item() == 0.0


def test_ssp_ids_with_several_positives():
    """Equal ids: the other matches are neither negatives nor pulled; only s_ii is the positive."""
    sim = _sim(6, 11)
    sim[0, 1] = sim[1, 0] = 0.95  # a further match, higher than every negative
    ids = [0, 0, 1, 2, 2, 3]
    mask = positive_mask(ids, ids)
    got = ssp_loss(sim, pos_mask=mask, reduction="none")
    assert got.tolist() == pytest.approx(naive_ssp(sim, mask, per_index=True), abs=1e-12)
    assert not torch.allclose(got, ssp_loss(sim, reduction="none"))  # the mask matters here
    # the module from embeddings with ids is the function on their cosines with that mask
    g = torch.Generator().manual_seed(3)
    img, txt = torch.randn(6, 5, generator=g, dtype=F64), torch.randn(6, 5, generator=g, dtype=F64)
    module = build_loss("ssp")(img, txt, ids)
    cos = cosine_similarity(img, txt)
    assert module.item() == pytest.approx(naive_ssp(cos, mask), abs=1e-12)


# ----------------------------------------------------------------------------- RSP


@pytest.mark.parametrize("seed", range(4))
def test_rsp_equals_the_naive_loop(seed):
    sim = _sim(7, seed)
    assert rsp_loss(sim).item() == pytest.approx(naive_rsp(sim), abs=1e-12)
    got = rsp_loss(sim, margin=0.3, c1=0.7, c2=-0.4).item()
    assert got == pytest.approx(naive_rsp(sim, margin=0.3, c1=0.7, c2=-0.4), abs=1e-12)
    ids = [0, 1, 1, 2, 3, 3, 4]
    mask = positive_mask(ids, ids)
    assert rsp_loss(sim, pos_mask=mask).item() == pytest.approx(naive_rsp(sim, mask), abs=1e-12)


def test_rsp_with_a_constant_weight_is_triplet_hn():
    sim = _sim(8, 5)
    torch.testing.assert_close(rsp_loss(sim, c1=1.0, c2=0.0), triplet_loss(sim), rtol=0, atol=1e-13)


def test_rsp_informative_edge():
    """r + m == 0 exactly is not informative (the hinge would give (c1 + c2 r) r + m > 0 there
    for c2 > 0); one ulp of p above is. Dyadic values: r = -0.25, m = 0.25."""
    p, m = 0.5, 0.25
    for n, kept in ((0.25, False), (math.nextafter(p, 1.0) - m, True)):
        sim = torch.tensor([[p, n, -0.5], [-0.5, p, -0.5], [-0.5, -0.5, p]], dtype=F64)
        terms = rsp_loss(sim, margin=m, reduction="none")
        assert (terms[0].item() > 0) is kept
        assert terms.sum().item() == pytest.approx(naive_rsp(sim, margin=m), abs=1e-12)


# ----------------------------------------------------------------------------- tiled == dense

PAIRS = [(ssp_loss, tiled_ssp_loss), (rsp_loss, tiled_rsp_loss)]


def _embeddings(b, d, seed):
    g = torch.Generator().manual_seed(seed)
    img = torch.randn(b, d, generator=g, dtype=F64, requires_grad=True)
    txt = (img.detach() + 0.8 * torch.randn(b, d, generator=g, dtype=F64)).requires_grad_(True)
    return img, txt


@pytest.mark.parametrize(("dense", "tiled"), PAIRS)
@pytest.mark.parametrize("chunk", [1, 3, 9])
@pytest.mark.parametrize("ids", [None, [0, 1, 1, 2, 3, 4, 4, 5, 6]])
def test_tiled_equals_dense_values_and_gradients(dense, tiled, chunk, ids):
    img, txt = _embeddings(9, 6, 7)
    mask = None if ids is None else positive_mask(ids, ids)
    want = dense(cosine_similarity(img, txt), pos_mask=mask, reduction="none")
    g_want = torch.autograd.grad(want.sum(), (img, txt))
    got = tiled(img, txt, img_ids=ids, chunk_size=chunk, reduction="none")
    g_got = torch.autograd.grad(got.sum(), (img, txt))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    for a, b in zip(g_got, g_want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
    assert want.abs().sum() > 0


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("ids", [None, [0, 1, 1, 2, 3, 4, 4, 5, 6]])
def test_ssp_all_negatives_against_the_loop_and_tiled(seed, ids):
    """``hardest=False`` (the warm-up): every informative negative's polynomial, dense against
    the naive loop, tiled (streamed rows, recomputed in the backward) against dense."""
    img, txt = _embeddings(9, 6, seed)
    mask = None if ids is None else positive_mask(ids, ids)
    sim = cosine_similarity(img, txt)
    want = ssp_loss(sim, pos_mask=mask, hardest=False, reduction="none")
    loop = naive_ssp(sim.detach(), mask, per_index=True, hardest=False)
    torch.testing.assert_close(want, torch.tensor(loop, dtype=F64), rtol=0, atol=1e-12)
    assert not torch.allclose(want, ssp_loss(sim, pos_mask=mask, reduction="none"))
    g_want = torch.autograd.grad(want.sum(), (img, txt))
    for chunk in (1, 4):
        got = tiled_ssp_loss(
            img, txt, img_ids=ids, chunk_size=chunk, hardest=False, reduction="none"
        )
        g_got = torch.autograd.grad(got.sum(), (img, txt))
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
        for a, b in zip(g_got, g_want, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
    parts = sum(
        tiled_ssp_loss(img, txt, img_ids=ids, chunk_size=3, hardest=False, shard=s)
        for s in ((0, 4), (4, 9))
    )
    torch.testing.assert_close(parts, want.sum() / 9, rtol=0, atol=1e-12)


def test_ssp_takes_the_all_negatives_warm_up():
    from vlret.losses import loss_capabilities

    assert loss_capabilities("ssp").all_negatives_warmup
    loss = build_loss("ssp")
    img, txt = _embeddings(6, 4, 1)
    loss.set_all_negatives(True)
    warm = loss(img, txt)
    loss.set_all_negatives(False)
    sim = cosine_similarity(img, txt)
    torch.testing.assert_close(warm, ssp_loss(sim, hardest=False), rtol=0, atol=1e-12)
    torch.testing.assert_close(loss(img, txt), ssp_loss(sim), rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["ssp", "rsp"])
def test_shards_add_up_to_the_batch(name):
    img, txt = _embeddings(8, 5, 2)
    whole = build_loss(name, chunk_size=3)(img, txt)
    parts = sum(build_loss(name, chunk_size=3)(img, txt, shard=s) for s in ((0, 3), (3, 8)))
    torch.testing.assert_close(parts, whole, rtol=0, atol=1e-12)
    dense = build_loss(name)(img, txt)
    torch.testing.assert_close(whole, dense, rtol=0, atol=1e-12)


@pytest.mark.parametrize(("dense", "tiled"), PAIRS)
def test_gradcheck(dense, tiled):
    sim = _sim(4, 9).requires_grad_(True)
    assert dense(sim.detach()).item() > 0
    assert torch.autograd.gradcheck(lambda s: dense(s), (sim,))
    img, txt = _embeddings(4, 3, 4)
    assert torch.autograd.gradcheck(lambda x, y: tiled(x, y, chunk_size=3), (img, txt))


# ----------------------------------------------------------------------------- Unified Eq. 24-25


@pytest.mark.parametrize("seed", range(3))
def test_rsp_unified_loss_is_eq25(seed):
    sim = _sim(6, seed)
    got = rsp_unified_loss(sim, c1=1.0, c2=0.5, margin=0.2, gamma=10.0)
    want = naive_eq25(sim, c1=1.0, c2=0.5, margin=0.2, gamma=10.0)
    assert got.item() == pytest.approx(want, abs=1e-12)


def test_unified_loss_with_polynomial_weights_is_eq25_where_one_matrix_serves_both_ways():
    """Eq. (24) takes one weight per pair; RSP's relative weights coincide in both directions
    when the positives are equal, and are the constant c1 when c2 = 0."""
    sim = _sim(6, 4)
    sim.diagonal().fill_(0.4)
    weights = polynomial_weights(sim, c1=1.0, c2=0.5)
    torch.testing.assert_close(weights, polynomial_weights(sim, c1=1.0, c2=0.5, anchors="texts"))
    got = unified_loss(sim - 0.4, weights=weights, margin=0.2, gamma=10.0)
    assert got.item() == pytest.approx(
        naive_eq25(sim, c1=1.0, c2=0.5, margin=0.2, gamma=10.0), abs=1e-12
    )
    free = _sim(6, 5)
    constant = polynomial_weights(free, c1=0.8, c2=0.0)
    got = unified_loss(free, weights=constant, margin=0.2, gamma=10.0)
    assert got.item() == pytest.approx(
        naive_eq25(free, c1=0.8, c2=0.0, margin=0.2, gamma=10.0), abs=1e-12
    )


def test_polynomial_weights_give_g_of_the_relative_similarity():
    sim = _sim(5, 6)
    p = sim.diagonal()
    rows = polynomial_weights(sim, c1=0.9, c2=0.3) * (sim - p[:, None])
    cols = polynomial_weights(sim, c1=0.9, c2=0.3, anchors="texts") * (sim - p[None, :])
    s = sim.tolist()
    for i in range(5):
        for j in range(5):
            r, q = s[i][j] - s[i][i], s[i][j] - s[j][j]
            assert rows[i, j].item() == pytest.approx((0.9 + 0.3 * r) * r, abs=1e-15)
            assert cols[i, j].item() == pytest.approx((0.9 + 0.3 * q) * q, abs=1e-15)


def test_eq25_tends_to_rsp_as_gamma_grows():
    """Where every anchor is informative and G increases, (1/gamma) log(1 + sum e^{gamma x})
    is within log(B) / gamma of max(x)_+ per anchor."""
    g = torch.Generator().manual_seed(8)
    sim = (torch.rand(5, 5, generator=g, dtype=F64) - 0.5) * 0.1  # |r| <= 0.1 < m
    gamma = 1e4
    bound = 2 * 5 * math.log(5) / gamma
    got = rsp_unified_loss(sim, gamma=gamma).item()
    assert abs(got - rsp_loss(sim).item()) <= bound
    assert rsp_loss(sim).item() > 1.0


# ----------------------------------------------------------------------------- parameters


@pytest.mark.parametrize(
    ("name", "param", "value", "words"),
    [
        ("ssp", "margin", -0.1, "margin must be >= 0"),
        ("ssp", "a2", "x", "a2 must be a finite number"),
        ("ssp", "b0", float("inf"), "b0 must be a finite number"),
        ("ssp", "max_positive", float("nan"), "max_positive must be a finite number"),
        ("ssp", "reduction", "avg", "reduction must be one of"),
        ("ssp", "chunk_size", 0, "chunk_size must be >= 1"),
        ("rsp", "c1", 0.0, "c1 must be > 0"),
        ("rsp", "c2", None, "c2 must be a finite number"),
        ("rsp", "margin", float("nan"), "margin must be a finite number"),
    ],
)
def test_bad_parameters_are_named(name, param, value, words):
    with pytest.raises(ValueError, match=words):
        build_loss(name, **{param: value})


def test_bad_arguments_of_the_functions_are_named():
    sim = _sim(4, 0)
    with pytest.raises(ValueError, match="a1 must be a finite number"):
        ssp_loss(sim, a1=float("nan"))
    with pytest.raises(ValueError, match="margin must be >= 0"):
        rsp_loss(sim, margin=-1.0)
    with pytest.raises(ValueError, match="anchors must be one of"):
        polynomial_weights(sim, anchors="rows")
    with pytest.raises(ValueError, match="gamma must be a positive finite number, got 0.0"):
        rsp_unified_loss(sim, gamma=0.0)
    with pytest.raises(ValueError, match="chunk_size"):
        tiled_ssp_loss(sim, sim, chunk_size=0)


# ----------------------------------------------------------------------------- configs

CONFIGS = Path(__file__).resolve().parents[2] / "src" / "vlret" / "configs"
SHIPPED = sorted(p for p in CONFIGS.glob("*.toml") if "ssp" in p.stem or "rsp" in p.stem)


def test_the_unified_table_rows_are_shipped():
    assert {p.stem for p in SHIPPED} == {
        "scan_i2t_f30k_ssp",
        "scan_t2i_f30k_ssp",
        "scan_i2t_f30k_rsp",
        "scan_t2i_f30k_rsp",
        "bfan_equal_f30k_ssp",
        "bfan_prob_f30k_ssp",
    }


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_configs_load_build_their_loss_and_differ_from_triplet_only_in_the_loss(path):
    cfg = load_config(path)
    method = "ssp" if path.stem.endswith("ssp") else "rsp"
    assert cfg.loss.name == method
    loss = build_loss(cfg.loss.name, **cfg.loss.params)
    assert loss.config == type(loss).Params()  # the defaults: the release's / the reading's
    triplet = load_config(CONFIGS / path.name.replace(method, "triplet"))
    mine, theirs = cfg.to_dict(), triplet.to_dict()
    for section in ("data", "model", "optim", "train"):
        assert mine[section] == theirs[section], section
    assert mine["output_dir"] == theirs["output_dir"].replace("triplet", method)
