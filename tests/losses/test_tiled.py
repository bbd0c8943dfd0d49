"""Tiled (O(B)-memory) losses against the dense functions they must equal, value and gradient."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from vlret.losses import (
    adacl_loss,
    goal_objective,
    infonce_loss,
    tiled_adacl_loss,
    tiled_goal_objective,
    tiled_infonce_loss,
    tiled_triplet_loss,
    tiled_unified_loss,
    triplet_loss,
    unified_loss,
)
from vlret.losses.goal import PAIR_WEIGHTS, TRIPLET_WEIGHTS
from vlret.similarity import cosine_similarity, positive_mask

REDUCTIONS = ("sum", "mean", "none")

# name -> (tiled function, dense function on sim, shared keyword arguments)
LOSSES = {
    "infonce": (tiled_infonce_loss, infonce_loss, {"temperature": 0.07}),
    "unified": (tiled_unified_loss, unified_loss, {"margin": 0.2, "gamma": 60.0}),
    "triplet_hardest": (tiled_triplet_loss, triplet_loss, {"margin": 0.2, "hardest": True}),
    "triplet_sum": (tiled_triplet_loss, triplet_loss, {"margin": 0.2, "hardest": False}),
    "adacl": (tiled_adacl_loss, adacl_loss, {"m1": 20.0, "m2": 0.1}),
    # Defaults: the paper's best (cir, sig-ms); every combination is tested further down.
    "goal": (tiled_goal_objective, goal_objective, {}),
}
# GOAL prescribes a gradient that is not the derivative of its (monitoring) value.
DIFFERENTIABLE = sorted(name for name in LOSSES if name != "goal")
#: The logit scale of each loss above (1 / temperature, gamma, m1, GOAL's tau and beta): how
#: many times it magnifies an error in a cosine.
LOGIT_SCALE = {
    "infonce": 1 / 0.07,
    "unified": 60.0,
    "triplet_hardest": 1.0,
    "triplet_sum": 1.0,
    "adacl": 20.0,
    "goal": 10.0,
}
EPS32 = torch.finfo(torch.float32).eps


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Many tiny ops: on shared cores, OpenMP spin-waits cost 5x more than a second thread saves."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _embeddings(batch, dim=16, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    img = torch.randn(batch, dim, generator=gen, dtype=torch.float64).to(dtype)
    txt = torch.randn(batch, dim, generator=gen, dtype=torch.float64).to(dtype)
    return img.requires_grad_(), txt.requires_grad_()


def _group_ids(batch):
    """Several texts of the same image: image ids 0,0,0,1,1,2,2,2,3,... (groups of 1 to 3)."""
    return torch.tensor([i // 3 if i % 7 else i // 2 for i in range(batch)])


def _dense(name, img, txt, ids=None, normalize=True, **kw):
    _, dense_fn, defaults = LOSSES[name]
    sim = cosine_similarity(img, txt) if normalize else img @ txt.t()
    pos_mask = None if ids is None else positive_mask(ids, ids)
    return dense_fn(sim, pos_mask=pos_mask, **{**defaults, **kw})


def _tiled(name, img, txt, ids=None, **kw):
    tiled_fn, _, defaults = LOSSES[name]
    return tiled_fn(img, txt, img_ids=ids, **{**defaults, **kw})


def _value_and_grads(loss, inputs, reduction, seed=1):
    """The loss and the gradients of a fixed random projection of it w.r.t. ``inputs``."""
    if reduction == "none":
        gen = torch.Generator().manual_seed(seed)
        weight = torch.randn(loss.shape, generator=gen, dtype=torch.float64).to(loss.dtype)
        target = (loss * weight).sum()
    else:
        target = loss * 1.7
    grads = torch.autograd.grad(target, inputs)
    return loss.detach(), grads


def _assert_close(got, want, rtol, atol):
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol)


def _float32_rounding(scale):
    """What float32 rounding alone moves a loss or gradient by, relative to its largest entry:
    a float32 cosine is a few eps32 off, logits ``scale * s`` magnify that ``scale`` times, and
    the float32 operations after them add a few eps32 more."""
    return (scale + 8) * EPS32


def _assert_float32_near_truth(got, truth, scale):
    """``got`` (float32) within 4x float32 rounding of the float64 ``truth`` (errors seen: at
    most half the rounding bound, on AVX2, default and MKL-compatible kernels and with inputs
    jittered by 4 ulps)."""
    atol = 4 * _float32_rounding(scale) * truth.abs().max().item()
    _assert_close(got.double(), truth, rtol=0, atol=atol)


def _truth(result_fn, img, txt, reduction):
    """``result_fn`` on the float64 copies of float32 inputs: the truth they are judged by."""
    i64, t64 = (t.detach().double().requires_grad_() for t in (img, txt))
    return _value_and_grads(result_fn(i64, t64), (i64, t64), reduction)


# ----------------------------------------------------------------------------- equality with dense


@pytest.mark.parametrize("name", sorted(LOSSES))
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("with_ids", [False, True])
def test_float64_equals_dense(name, reduction, with_ids):
    img, txt = _embeddings(37)
    ids = _group_ids(37) if with_ids else None
    want = _value_and_grads(_dense(name, img, txt, ids, reduction=reduction), (img, txt), reduction)
    got = _value_and_grads(
        _tiled(name, img, txt, ids, reduction=reduction, chunk_size=8), (img, txt), reduction
    )
    _assert_close(got[0], want[0], rtol=0, atol=1e-10)
    for g, w in zip(got[1], want[1], strict=True):
        _assert_close(g, w, rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", sorted(LOSSES))
@pytest.mark.parametrize("reduction", ["sum", "none"])
def test_float32_equals_dense(name, reduction):
    """Tiled and dense float32 both within float32 rounding of the float64 truth (two float32
    results compared with each other would test the CPU's summation order)."""
    img, txt = _embeddings(37, dim=32, dtype=torch.float32, seed=3)
    ids = _group_ids(37)
    truth = _truth(lambda a, b: _dense(name, a, b, ids, reduction=reduction), img, txt, reduction)
    dense = _value_and_grads(
        _dense(name, img, txt, ids, reduction=reduction), (img, txt), reduction
    )
    tiled = _value_and_grads(
        _tiled(name, img, txt, ids, reduction=reduction, chunk_size=8), (img, txt), reduction
    )
    for got in (dense, tiled):
        for g, w in zip((got[0], *got[1]), (truth[0], *truth[1]), strict=True):
            _assert_float32_near_truth(g, w, LOGIT_SCALE[name])


@pytest.mark.parametrize("name", ["infonce", "unified"])
@pytest.mark.parametrize("temperature", [0.05, 0.01])
def test_float32_tiled_is_as_accurate_as_dense(name, temperature):
    """Against float64 truth, the tiled float32 error is within 2x the dense float32 error plus
    float32 rounding (the two errors alone are random: their ratio reached 1.8).

    temperature 0.05 takes the one-exponential path with the norm bound as shift, 0.01
    (``c = 100``, CLIP's largest scale) the strip-maximum shift; Unified's gamma 60 the latter.
    """
    img, txt = _embeddings(61, dim=32, dtype=torch.float32, seed=5)
    ids = _group_ids(61)
    kw = {"temperature": temperature} if name == "infonce" else {}
    i64, t64 = (t.detach().double().requires_grad_() for t in (img, txt))
    truth = _value_and_grads(
        _dense(name, i64, t64, ids, reduction="none", **kw), (i64, t64), "none"
    )
    dense = _value_and_grads(
        _dense(name, img, txt, ids, reduction="none", **kw), (img, txt), "none"
    )
    tiled = _value_and_grads(
        _tiled(name, img, txt, ids, reduction="none", chunk_size=16, **kw), (img, txt), "none"
    )

    def error(result):
        return [
            (r.double() - t).abs().max().item()
            for r, t in zip((result[0], *result[1]), (truth[0], *truth[1]), strict=True)
        ]

    rounding = _float32_rounding(60.0 if name == "unified" else 1 / temperature)
    scales = [t.abs().max().item() for t in (truth[0], *truth[1])]
    for got, want, scale in zip(error(tiled), error(dense), scales, strict=True):
        assert got <= 2 * want + rounding * scale


@pytest.mark.parametrize("chunk_size", [8, 64])
def test_backward_twice_with_retain_graph_gives_the_same_gradient(chunk_size):
    """chunk 64 >= B keeps the forward's strip for the backward; it must not be consumed."""
    img, txt = _embeddings(37)
    loss = tiled_infonce_loss(img, txt, temperature=0.07, chunk_size=chunk_size)
    first = torch.autograd.grad(loss, (img, txt), retain_graph=True)
    second = torch.autograd.grad(loss, (img, txt))
    want = torch.autograd.grad(
        infonce_loss(cosine_similarity(img, txt), temperature=0.07), (img, txt)
    )
    for a, b, w in zip(first, second, want, strict=True):
        assert torch.equal(a, b)
        _assert_close(a, w, rtol=0, atol=1e-10)


def test_one_exponential_and_careful_strips_mix_in_one_call(monkeypatch):
    """A huge gamma: a tightly clustered strip takes the fast path, a spread one the careful.

    float64 floor: row/column sums of ``exp(c s - K)`` must stay above ~e^-668, so with
    ``c = 1000`` only a strip whose similarities lie within ~0.6 of each other is fast.
    """
    import vlret.losses._tiling.lse as tiling

    calls = []
    careful = tiling._careful_tile
    monkeypatch.setattr(tiling, "_careful_tile", lambda *a: calls.append(a[3]) or careful(*a))
    gen = torch.Generator().manual_seed(7)
    u, v = torch.randn(2, 8, generator=gen, dtype=torch.float64)
    txt = u + 0.01 * torch.randn(16, 8, generator=gen, dtype=torch.float64)
    img = torch.cat(
        [
            v + 0.01 * torch.randn(8, 8, generator=gen, dtype=torch.float64),
            torch.randn(8, 8, generator=gen, dtype=torch.float64),
        ]
    )
    img.requires_grad_(True)
    txt.requires_grad_(True)
    kw = {"margin": 0.1, "gamma": 1000.0, "reduction": "none"}
    want = _value_and_grads(unified_loss(cosine_similarity(img, txt), **kw), (img, txt), "none")
    got = _value_and_grads(tiled_unified_loss(img, txt, chunk_size=8, **kw), (img, txt), "none")
    assert calls == [8]  # the spread second strip only
    _assert_close(got[0], want[0], rtol=0, atol=1e-10)
    for g, w in zip(got[1], want[1], strict=True):
        _assert_close(g, w, rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", sorted(LOSSES))
@pytest.mark.parametrize("chunk_size", [1, 5, 37, 100])
def test_any_chunk_size_and_raw_dot_products(name, chunk_size):
    img, txt = _embeddings(11, dim=4, seed=4)
    with torch.no_grad():
        img.mul_(0.3), txt.mul_(0.3)  # raw dot products of a sane size for gamma=60
    ids = ["a", "b", "a", "c", "d", "b", "e", "f", "g", "h", "a"]  # string ids work too
    mask_ids = torch.tensor([ord(c) for c in ids])
    want = _value_and_grads(_dense(name, img, txt, mask_ids, normalize=False), (img, txt), "sum")
    got = _value_and_grads(
        _tiled(name, img, txt, ids, normalize=False, chunk_size=chunk_size), (img, txt), "sum"
    )
    _assert_close(got[0], want[0], rtol=0, atol=1e-10)
    for g, w in zip(got[1], want[1], strict=True):
        _assert_close(g, w, rtol=0, atol=1e-10)


def test_separate_txt_ids():
    img, txt = _embeddings(9, seed=5)
    img_ids, txt_ids = torch.arange(9) // 2, torch.tensor([0, 0, 1, 1, 2, 9, 3, 3, 4])
    sim = cosine_similarity(img, txt)
    want = infonce_loss(sim, temperature=0.1, pos_mask=positive_mask(img_ids, txt_ids))
    got = tiled_infonce_loss(
        img, txt, temperature=0.1, img_ids=img_ids, txt_ids=txt_ids, chunk_size=4
    )
    _assert_close(got, want, rtol=0, atol=1e-10)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_unified_per_anchor_margins_with_gradient(reduction):
    img, txt = _embeddings(37, seed=6)
    ids = _group_ids(37)
    margins = torch.rand(37, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    margins = (0.4 * margins).requires_grad_()
    inputs = (img, txt, margins)
    dense = _dense("unified", img, txt, ids, margins=margins, reduction=reduction)
    tiled = _tiled("unified", img, txt, ids, margins=margins, reduction=reduction, chunk_size=8)
    want, got = (
        _value_and_grads(dense, inputs, reduction),
        _value_and_grads(tiled, inputs, reduction),
    )
    _assert_close(got[0], want[0], rtol=0, atol=1e-10)
    for g, w in zip(got[1], want[1], strict=True):
        _assert_close(g, w, rtol=0, atol=1e-10)


def test_infonce_learnable_temperature_gets_its_gradient():
    img, txt = _embeddings(37, seed=7)
    log_scale = torch.tensor(2.5, dtype=torch.float64, requires_grad=True)
    inputs = (img, txt, log_scale)
    dense = _dense("infonce", img, txt, temperature=torch.exp(-log_scale))
    tiled = _tiled("infonce", img, txt, temperature=torch.exp(-log_scale), chunk_size=8)
    want, got = _value_and_grads(dense, inputs, "mean"), _value_and_grads(tiled, inputs, "mean")
    for g, w in zip((got[0], *got[1]), (want[0], *want[1]), strict=True):
        _assert_close(g, w, rtol=0, atol=1e-10)


def test_unified_margin_zero_is_infonce_identity():
    """Unified Eq. (7): gamma * unified(m=0) == infonce(tau = 1/gamma, sum)."""
    img, txt = _embeddings(20, seed=8)
    uni = tiled_unified_loss(img, txt, margin=0.0, gamma=20.0, chunk_size=6)
    nce = tiled_infonce_loss(img, txt, temperature=1 / 20.0, chunk_size=6, reduction="sum")
    _assert_close(20.0 * uni, nce, rtol=0, atol=1e-10)


# ----------------------------------------------------------------------------- edge cases


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_rows_without_negatives_give_graph_attached_zero(name):
    img, txt = _embeddings(10, seed=9)
    ids = torch.zeros(10, dtype=torch.long)  # every pair positive: nothing to learn from
    loss = _tiled(name, img, txt, ids, chunk_size=3)
    assert loss.requires_grad and loss.item() == 0.0
    grads = torch.autograd.grad(loss, (img, txt))
    assert all(bool((g == 0).all()) for g in grads)


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_some_rows_without_negatives(name):
    img, txt = _embeddings(9, seed=10)
    # Every text but the last belongs to image group 0, so rows 0..7 have one negative column
    # and text columns 0..7 have one negative row; row 8 and column 8 have eight.
    ids = torch.tensor([0] * 8 + [1])
    want = _value_and_grads(_dense(name, img, txt, ids, reduction="none"), (img, txt), "none")
    got = _value_and_grads(
        _tiled(name, img, txt, ids, reduction="none", chunk_size=4), (img, txt), "none"
    )
    for g, w in zip((got[0], *got[1]), (want[0], *want[1]), strict=True):
        _assert_close(g, w, rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", sorted(LOSSES))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_is_computed_in_float32(name, dtype):
    img, txt = _embeddings(37, dim=32, dtype=dtype, seed=11)
    loss = _tiled(name, img, txt, _group_ids(37), chunk_size=8)
    assert loss.dtype == torch.float32
    g_img, g_txt = torch.autograd.grad(loss, (img, txt))
    assert g_img.dtype == dtype and g_txt.dtype == dtype
    # Identical to the dense form on the same values upcast to float32.
    img32, txt32 = (t.detach().float().requires_grad_() for t in (img, txt))
    want = _dense(name, img32, txt32, _group_ids(37))
    w_img, w_txt = torch.autograd.grad(want, (img32, txt32))
    _assert_close(loss, want, rtol=1e-5, atol=1e-6)
    _assert_close(g_img.float(), w_img.to(dtype).float(), rtol=1e-2, atol=1e-3)
    _assert_close(g_txt.float(), w_txt.to(dtype).float(), rtol=1e-2, atol=1e-3)


def _orthogonal(v, seed):
    w = torch.randn(v.shape, generator=torch.Generator().manual_seed(seed), dtype=v.dtype)
    return w - (w @ v) / (v @ v) * v


def test_hardest_tie_sends_gradient_to_lowest_index():
    img, txt = _embeddings(6, dim=5, seed=12)
    with torch.no_grad():
        # Image 0's hardest negatives are texts 2 and 4, tied; text 1's are images 3 and 5.
        txt[2] = 3 * img[0]
        txt[4] = txt[2] + _orthogonal(img[0], 1)
        img[3] = 3 * txt[1]
        img[5] = img[3] + _orthogonal(txt[1], 2)
    kwargs = {"margin": 0.2, "chunk_size": 4, "normalize": False}
    loss = tiled_triplet_loss(img, txt, **kwargs)
    dense = _dense("triplet_hardest", img, txt, normalize=False)
    _assert_close(loss, dense, rtol=0, atol=1e-10)
    got = torch.autograd.grad(loss, (img, txt))
    # Break both ties in favour of the lower index: the gradient is continuous there.
    with torch.no_grad():
        img_moved, txt_moved = img.detach().clone(), txt.detach().clone()
        txt_moved[4] -= 1e-9 * img[0]
        img_moved[5] -= 1e-9 * txt[1]
    inputs = (img_moved.requires_grad_(), txt_moved.requires_grad_())
    want = torch.autograd.grad(_dense("triplet_hardest", *inputs, normalize=False), inputs)
    for g, w in zip(got, want, strict=True):
        _assert_close(g, w, rtol=0, atol=1e-6)
    # The dense amax splits a tied gradient evenly instead; only the value is shared.
    split = torch.autograd.grad(dense, (img, txt))
    assert not torch.allclose(split[1], got[1])


@pytest.mark.parametrize("name", DIFFERENTIABLE)
def test_gradcheck(name):
    img, txt = _embeddings(5, dim=3, seed=13)
    ids = torch.tensor([0, 0, 1, 2, 2])
    kwargs = {"gamma": 5.0} if name == "unified" else {}
    kwargs = {**kwargs, "margin": 0.5} if name.startswith("triplet") else kwargs

    def fn(a, b):
        return _tiled(name, a, b, ids, reduction="none", chunk_size=2, **kwargs)

    assert torch.autograd.gradcheck(fn, (img, txt), eps=1e-6, atol=1e-7)


# ----------------------------------------------------------------------------- AdaCL


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_adacl_tensor_margins_get_their_gradient(reduction):
    img, txt = _embeddings(37, seed=15)
    ids = _group_ids(37)
    m1 = torch.tensor(12.0, dtype=torch.float64, requires_grad=True)
    m2 = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    inputs = (img, txt, m1, m2)
    dense = _dense("adacl", img, txt, ids, m1=m1, m2=m2, reduction=reduction)
    tiled = _tiled("adacl", img, txt, ids, m1=m1, m2=m2, reduction=reduction, chunk_size=8)
    want, got = (
        _value_and_grads(dense, inputs, reduction),
        _value_and_grads(tiled, inputs, reduction),
    )
    for g, w in zip((got[0], *got[1]), (want[0], *want[1]), strict=True):
        _assert_close(g, w, rtol=0, atol=1e-10)


def test_adacl_unit_margins_are_infonce_at_temperature_one():
    img, txt = _embeddings(20, seed=16)
    ada = tiled_adacl_loss(img, txt, m1=1.0, m2=0.0, chunk_size=6)
    nce = tiled_infonce_loss(img, txt, temperature=1.0, chunk_size=6)
    _assert_close(ada, nce, rtol=0, atol=1e-10)


# ----------------------------------------------------------------------------- GOAL


def _paired(batch, noise, seed):
    """Texts near their images: with noise 0.7 and epsilon 0.1 about half the anchors have
    empty MS sets P and N, the rest non-empty ones (both branches of Eq. 12-13)."""
    gen = torch.Generator().manual_seed(seed)
    img = torch.randn(batch, 16, generator=gen, dtype=torch.float64)
    txt = img + noise * torch.randn(batch, 16, generator=gen, dtype=torch.float64)
    return img.requires_grad_(), txt.requires_grad_()


@pytest.mark.parametrize("triplet_weight", TRIPLET_WEIGHTS)
@pytest.mark.parametrize("pair_weight", PAIR_WEIGHTS)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("paired", [False, True])
def test_goal_every_combination_equals_dense(triplet_weight, pair_weight, reduction, paired):
    img, txt = _paired(37, 0.7, seed=17) if paired else _embeddings(37, seed=17)
    ids = _group_ids(37)
    kw = {"triplet_weight": triplet_weight, "pair_weight": pair_weight, "reduction": reduction}
    want = _value_and_grads(_dense("goal", img, txt, ids, **kw), (img, txt), reduction)
    got = _value_and_grads(_tiled("goal", img, txt, ids, chunk_size=8, **kw), (img, txt), reduction)
    _assert_close(got[0], want[0], rtol=0, atol=1e-10)
    for g, w in zip(got[1], want[1], strict=True):
        assert bool(g.abs().max() > 0)
        _assert_close(g, w, rtol=0, atol=1e-10)


@pytest.mark.parametrize("triplet_weight", TRIPLET_WEIGHTS)
@pytest.mark.parametrize("pair_weight", PAIR_WEIGHTS)
def test_goal_every_combination_float32(triplet_weight, pair_weight):
    img, txt = (t.detach().float().requires_grad_() for t in _paired(37, 0.7, seed=19))
    ids = _group_ids(37)
    kw = {"triplet_weight": triplet_weight, "pair_weight": pair_weight}
    truth = _truth(lambda a, b: _dense("goal", a, b, ids, **kw), img, txt, "sum")
    got = _value_and_grads(_tiled("goal", img, txt, ids, chunk_size=8, **kw), (img, txt), "sum")
    for g, w in zip((got[0], *got[1]), (truth[0], *truth[1]), strict=True):
        _assert_float32_near_truth(g, w, LOGIT_SCALE["goal"])


@pytest.mark.parametrize("pair_weight", ["lin-ms", "sig-ms"])
def test_goal_ms_parameters_and_raw_dot_products(pair_weight):
    img, txt = _paired(23, 0.7, seed=18)
    ids = torch.arange(23) // 4
    kw = {
        "triplet_weight": "nca",
        "pair_weight": pair_weight,
        "margin": 0.1,
        "tau": 4.0,
        "alpha": 3.0,
        "beta": 7.0,
        "lam": 0.3,
        "epsilon": 0.25,
        "reduction": "none",
    }
    with torch.no_grad():
        img.mul_(0.3), txt.mul_(0.3)
    want = _value_and_grads(
        _dense("goal", img, txt, ids, normalize=False, **kw), (img, txt), "none"
    )
    got = _value_and_grads(
        _tiled("goal", img, txt, ids, normalize=False, chunk_size=5, **kw), (img, txt), "none"
    )
    for g, w in zip((got[0], *got[1]), (want[0], *want[1]), strict=True):
        _assert_close(g, w, rtol=0, atol=1e-10)


def test_goal_tie_picks_the_lowest_index_like_dense_max():
    img, txt = _embeddings(6, dim=5, seed=12)
    with torch.no_grad():
        # Image 0's hardest negatives are texts 2 and 4, tied; text 1's are images 3 and 5.
        txt[2] = 3 * img[0]
        txt[4] = txt[2] + _orthogonal(img[0], 1)
        img[3] = 3 * txt[1]
        img[5] = img[3] + _orthogonal(txt[1], 2)
    kw = {"triplet_weight": "con", "pair_weight": "con", "margin": 0.2, "normalize": False}
    dense = _dense("goal", img, txt, **kw)
    tiled = _tiled("goal", img, txt, chunk_size=4, **kw)
    _assert_close(tiled, dense, rtol=0, atol=1e-10)
    got = torch.autograd.grad(tiled, (img, txt))
    want = torch.autograd.grad(dense, (img, txt))
    for g, w in zip(got, want, strict=True):
        _assert_close(g, w, rtol=0, atol=1e-10)


def test_bad_arguments_raise():
    img, txt = _embeddings(4)
    with pytest.raises(ValueError, match="chunk_size"):
        tiled_infonce_loss(img, txt, chunk_size=0)
    with pytest.raises(ValueError, match="chunk_size"):
        tiled_infonce_loss(img, txt, chunk_size=2.0)
    with pytest.raises(ValueError, match="reduction"):
        tiled_infonce_loss(img, txt, chunk_size=2, reduction="avg")
    with pytest.raises(ValueError, match="txt_ids given without img_ids"):
        tiled_triplet_loss(img, txt, chunk_size=2, txt_ids=torch.arange(4))
    with pytest.raises(ValueError, match="img_ids must have one id per row"):
        tiled_triplet_loss(img, txt, chunk_size=2, img_ids=torch.arange(3))
    with pytest.raises(ValueError, match="margins must be a"):
        tiled_unified_loss(img, txt, chunk_size=2, margins=torch.zeros(3))
    with pytest.raises(ValueError, match="at least 2"):
        tiled_unified_loss(img[:1], txt[:1], chunk_size=2)
    with pytest.raises(ValueError, match="temperature"):
        tiled_infonce_loss(img, txt, chunk_size=2, temperature=-1.0)
    with pytest.raises(ValueError, match="NaN or inf"):
        tiled_infonce_loss(img.detach() * float("nan"), txt, chunk_size=2)
    with pytest.raises(ValueError, match="same shape"):
        tiled_infonce_loss(img, txt[:3], chunk_size=2)
    with pytest.raises(ValueError, match="m1 must be a positive"):
        tiled_adacl_loss(img, txt, m1=0.0, m2=0.1, chunk_size=2)
    with pytest.raises(ValueError, match="m2 must be a scalar"):
        tiled_adacl_loss(img, txt, m1=1.0, m2=torch.zeros(2), chunk_size=2)
    with pytest.raises(ValueError, match="m2 must be a finite"):
        tiled_adacl_loss(img, txt, m1=1.0, m2=float("inf"), chunk_size=2)
    with pytest.raises(ValueError, match="pair_weight='ms'"):
        tiled_goal_objective(img, txt, pair_weight="ms", chunk_size=2)
    with pytest.raises(ValueError, match="epsilon"):
        tiled_goal_objective(img, txt, epsilon=-0.1, chunk_size=2)


# ----------------------------------------------------------------------------- memory


class _LargestAllocation(TorchDispatchMode):
    """Records the largest tensor any aten op returns (forward and backward alike)."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_spy_sees_the_dense_matrix():
    img, txt = _embeddings(64, dim=8, dtype=torch.float32)
    with _LargestAllocation() as spy:
        _dense("infonce", img, txt).backward()
    assert spy.largest >= 64 * 64


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_forward_backward_never_allocates_batch_squared(name):
    batch, dim, chunk = 4096, 64, 256
    img, txt = _embeddings(batch, dim=dim, dtype=torch.float32, seed=14)
    ids = torch.arange(batch) // 2
    with _LargestAllocation() as spy:
        _tiled(name, img, txt, ids, chunk_size=chunk).backward()
    assert img.grad is not None and txt.grad is not None
    assert spy.largest <= chunk * batch < batch * batch


# ----------------------------------------------------------------------------- local anchors

ANCHOR_LOSSES = ["infonce", "unified", "triplet_hardest", "triplet_sum", "goal"]


def _split_sum(name, img, txt, ids, parts, **kw):
    """The loss as the sum of its local-anchor pieces, e.g. one per rank."""
    bounds = [0, *parts, img.shape[0]]
    spans = zip(bounds[:-1], bounds[1:], strict=True)
    pieces = [_tiled(name, img, txt, ids, shard=span, **kw) for span in spans]
    return torch.cat(pieces) if kw.get("reduction") == "none" else sum(pieces)


@pytest.mark.parametrize("name", ANCHOR_LOSSES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("with_ids", [False, True])
def test_local_anchor_pieces_sum_to_the_dense_loss(name, reduction, with_ids):
    img, txt = _embeddings(37)
    ids = _group_ids(37) if with_ids else None
    want = _value_and_grads(_dense(name, img, txt, ids, reduction=reduction), (img, txt), reduction)
    got = _value_and_grads(
        _split_sum(name, img, txt, ids, [10, 11, 30], reduction=reduction, chunk_size=4),
        (img, txt),
        reduction,
    )
    _assert_close(got[0], want[0], rtol=0, atol=1e-10)
    for g, w in zip(got[1], want[1], strict=True):
        _assert_close(g, w, rtol=0, atol=1e-10)


def test_local_anchors_learnable_temperature_and_margins_get_their_gradients():
    img, txt = _embeddings(23)
    ids = _group_ids(23)
    temp = torch.tensor(0.07, dtype=torch.float64, requires_grad=True)
    want = torch.autograd.grad(
        infonce_loss(
            cosine_similarity(img, txt), temperature=temp, pos_mask=positive_mask(ids, ids)
        ),
        temp,
    )
    loss = sum(
        tiled_infonce_loss(img, txt, temperature=temp, img_ids=ids, chunk_size=3, shard=span)
        for span in [(0, 7), (7, 23)]
    )
    _assert_close(torch.autograd.grad(loss, temp)[0], want[0], rtol=0, atol=1e-10)
    margins = torch.rand(23, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    margins.requires_grad_(True)
    dense = unified_loss(cosine_similarity(img, txt), margins=margins, gamma=30.0)
    tiled = sum(
        tiled_unified_loss(img, txt, margins=margins, gamma=30.0, chunk_size=5, shard=span)
        for span in [(0, 12), (12, 23)]
    )
    _assert_close(tiled, dense, rtol=0, atol=1e-10)
    _assert_close(
        torch.autograd.grad(tiled, margins)[0],
        torch.autograd.grad(dense, margins)[0],
        rtol=0,
        atol=1e-10,
    )


def test_local_anchors_float32_large_scale_and_rows_without_negatives():
    """c = 100 (CLIP's largest scale) in float32; anchors whose candidates are all positive."""
    img, txt = _embeddings(40, dim=32, dtype=torch.float32, seed=9)
    ids = torch.tensor([0] * 3 + list(range(1, 38)))
    kw = {"temperature": 0.01, "reduction": "none"}
    truth = _truth(lambda a, b: _dense("infonce", a, b, ids, **kw), img, txt, "none")
    got = _value_and_grads(
        _split_sum("infonce", img, txt, ids, [20], chunk_size=7, **kw), (img, txt), "none"
    )
    for g, w in zip((got[0], *got[1]), (truth[0], *truth[1]), strict=True):
        _assert_float32_near_truth(g, w, 100.0)
    lonely = torch.zeros(4, dtype=torch.long)  # every pair shares one id: no negatives at all
    x, y = _embeddings(4)
    out = tiled_infonce_loss(x, y, img_ids=lonely, chunk_size=2, shard=(1, 3), reduction="none")
    assert torch.equal(out.detach(), torch.zeros(2, dtype=torch.float64))
    assert all(torch.isfinite(g).all() for g in torch.autograd.grad(out.sum(), (x, y)))


@pytest.mark.parametrize("triplet_weight", sorted(TRIPLET_WEIGHTS))
@pytest.mark.parametrize("pair_weight", sorted(PAIR_WEIGHTS))
def test_goal_local_anchor_pieces_equal_dense_for_every_combination(triplet_weight, pair_weight):
    """The MS sets use every positive of the batch, not only the piece's."""
    img, txt = _embeddings(29, seed=4)
    ids = _group_ids(29)
    kw = {"triplet_weight": triplet_weight, "pair_weight": pair_weight, "reduction": "none"}
    want = _value_and_grads(_dense("goal", img, txt, ids, **kw), (img, txt), "none")
    got = _value_and_grads(
        _split_sum("goal", img, txt, ids, [9, 20], chunk_size=4, **kw), (img, txt), "none"
    )
    _assert_close(got[0], want[0], rtol=0, atol=1e-10)
    for g, w in zip(got[1], want[1], strict=True):
        _assert_close(g, w, rtol=0, atol=1e-10)


def test_a_shard_needs_the_tiled_form():
    from vlret.losses import InfoNCELoss

    img, txt = _embeddings(8)
    with pytest.raises(ValueError, match="needs the tiled form"):
        InfoNCELoss()(img, txt, shard=(0, 4))


@pytest.mark.parametrize("shard", [(3, 3), (-1, 2), (0, 38), (2,), [0.0, 1.0], "0:2"])
def test_bad_shard_raises(shard):
    img, txt = _embeddings(37)
    with pytest.raises(ValueError, match="shard"):
        tiled_infonce_loss(img, txt, chunk_size=4, shard=shard)
