"""The native smooth-rank kernel against a float64 truth, the PyTorch path, and its build cache.

The kernel computes in float32. Its ranks and gradients are compared with the float64
computation of the same float32 inputs under a tolerance derived from the float32 steps:

* the scaled row ``x = m * scale`` is rounded (relative ``eps``), so a pair's difference is
  off by at most ``eps (|x_j| + |x_k|) + eps |d|`` <= ``3 eps X`` (``X = max |x|``), plus
  ``160 eps`` on the kernel's separable path (``exp(x - mean)`` rounds arguments of at most
  80 each); a sigmoid moves by a quarter of that at most (its slope is <= 1/4), its
  derivative by ``0.1`` times it (``|sigma''| <= 0.0963``);
* each sigmoid and derivative is evaluated to a few roundings (``exp``, reciprocal, product:
  ``8 eps`` covers them);
* a rank sums ``n`` terms, each sum rounded relative to the running total (<= ``n``).

So ``|rank error| <= n (3 eps X / 4 + 48 eps) + n * n * eps`` and ``|grad error| <= scale * n
* 2 G (0.3 eps X + 18 eps + n eps / 4)`` (``G = max |g|``), both far below what a wrong
formula gives (errors of order 1 in a rank).
"""

from __future__ import annotations

import os
import warnings

import pytest
import torch

from vlret import _native
from vlret.losses import VisualSemanticLoss, smooth_rank, visual_semantic_loss
from vlret.losses.params import ParamError

EPS = torch.finfo(torch.float32).eps

needs_compiler = pytest.mark.skipif(
    _native.compiler() is None or not _native.enabled(),
    reason="no C compiler (or VLRET_NATIVE=0): the native kernel cannot be built here",
)


@pytest.fixture(autouse=True)
def _fresh_native_state():
    _native.forget()
    yield
    _native.forget()


def rank64(m: torch.Tensor, tau: float, descending: bool = True) -> torch.Tensor:
    """Eq. (4) in float64 all at once (the clamp at +-50 included), differentiable."""
    scale = (1.0 if descending else -1.0) / tau
    x = m.double() * scale
    sig = torch.sigmoid((x[:, None, :] - x[:, :, None]).clamp(-50, 50))
    off = ~torch.eye(m.shape[1], dtype=torch.bool)
    return 1 + (sig * off).sum(-1)


def rank64_of_scaled(m: torch.Tensor, tau: float) -> torch.Tensor:
    """:func:`rank64` of the float32 scaled row ``fl(m * (1 / tau))``, the kernel's first
    step: the error the input's scaling brings (the ``X`` terms below) is then left out."""
    x = (m * (1.0 / tau)).double()  # a float32 product, as the kernel and the PyTorch path
    sig = torch.sigmoid((x[:, None, :] - x[:, :, None]).clamp(-50, 50))
    off = ~torch.eye(m.shape[1], dtype=torch.bool)
    return 1 + (sig * off).sum(-1)


def rank_tolerance(n: int, big_x: float) -> float:
    return n * (0.75 * EPS * big_x + 48 * EPS) + n * n * EPS


def grad_tolerance(n: int, big_x: float, scale: float, big_g: float) -> float:
    return scale * n * 2 * big_g * (0.3 * EPS * big_x + 18 * EPS + n * EPS / 4)


def rows_of(rows: int, n: int, seed: int, spread: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, n, generator=g) * spread


@needs_compiler
@pytest.mark.parametrize("n", [1, 2, 15, 16, 17, 33, 128])
@pytest.mark.parametrize("descending", [True, False])
def test_ranks_and_gradients_match_float64(n, descending):
    tau = 0.001
    m = rows_of(max(1, n // 2) + 3, n, seed=n, spread=0.01)  # within a few tau: unsaturated
    m[0, : n // 2] = m[0, 0]  # exact ties in one row
    g = rows_of(*m.shape, seed=100 + n, spread=1.0)
    got_m = m.clone().requires_grad_()
    got = smooth_rank(got_m, tau=tau, descending=descending, kernel="native")
    got.backward(g)
    want_m = m.double().requires_grad_()
    want = rank64(want_m, tau, descending)
    want.backward(g.double())
    big_x = float(m.abs().max()) / tau
    assert got.dtype == torch.float32
    err = (got.double() - want).abs().max().item()
    assert err <= rank_tolerance(n, big_x), err
    gerr = (got_m.grad.double() - want_m.grad).abs().max().item()
    assert gerr <= grad_tolerance(n, big_x, 1 / tau, float(g.abs().max())), gerr
    # the PyTorch path in float32 is within the same bounds of the truth
    torch_m = m.clone().requires_grad_()
    ours = smooth_rank(torch_m, tau=tau, descending=descending, kernel="torch")
    ours.backward(g)
    assert (ours.double() - want).abs().max().item() <= rank_tolerance(n, big_x)


@needs_compiler
@pytest.mark.parametrize("spread", [0.2, 0.6])
def test_wide_rows_match_float64(spread):
    """Rows spread over hundreds of tau (a trained model's): at 0.2 the kernel's float64 path
    (every entry within 700 tau of the midpoint), at 0.6 rows past that span, which take the
    float32 path with the exp of each unsaturated pair out of range."""
    tau, n = 0.001, 96
    m = rows_of(40, n, seed=21, spread=spread)
    g = rows_of(40, n, seed=22, spread=1.0)
    got_m = m.clone().requires_grad_()
    got = smooth_rank(got_m, tau=tau, kernel="native")
    got.backward(g)
    want_m = m.double().requires_grad_()
    want = rank64(want_m, tau)
    want.backward(g.double())
    big_x = float(m.abs().max()) / tau
    assert (got.double() - want).abs().max().item() <= rank_tolerance(n, big_x)
    gtol = grad_tolerance(n, big_x, 1 / tau, float(g.abs().max()))
    assert (got_m.grad.double() - want_m.grad).abs().max().item() <= gtol
    # against the truth of the rounded scaled rows: the kernel's own error alone (X = 0)
    scaled_m = m.clone().requires_grad_()
    truth = rank64_of_scaled(scaled_m, tau)
    truth.backward(g.double())
    assert (got.double() - truth).abs().max().item() <= rank_tolerance(n, 0.0)
    own = grad_tolerance(n, 0.0, 1 / tau, float(g.abs().max()))
    assert (got_m.grad.double() - scaled_m.grad.double()).abs().max().item() <= own


@needs_compiler
def test_saturated_pairs_and_wide_rows():
    """Scores 50 tau and more apart: exactly the clamp's constants, ranks 1..n."""
    n = 40
    m = torch.arange(n, dtype=torch.float32).flip(0).repeat(3, 1) * 0.2  # 200 tau apart
    got = smooth_rank(m, tau=0.001, kernel="native")
    want = rank64(m, 0.001)
    assert (got.double() - want).abs().max().item() <= rank_tolerance(n, 8000.0)
    assert torch.equal(got.round(), torch.arange(1, n + 1, dtype=torch.float32).repeat(3, 1))


@needs_compiler
def test_kept_and_recomputed_derivatives_are_the_same_numbers(monkeypatch):
    """Small inputs keep the pairs' derivatives from the forward; past the block budget the
    backward recomputes them with the same operations: equal bit for bit."""
    import vlret.losses.vsl_rank as module

    m = rows_of(20, 50, seed=3, spread=0.01)
    g = rows_of(20, 50, seed=4, spread=1.0)
    grads = []
    for budget in (module._BLOCK_ELEMENTS, 0):
        monkeypatch.setattr(module, "_BLOCK_ELEMENTS", budget)
        x = m.clone().requires_grad_()
        smooth_rank(x, kernel="native").backward(g)
        grads.append(x.grad)
    assert torch.equal(grads[0], grads[1])


@needs_compiler
def test_threads_do_not_change_the_numbers(monkeypatch):
    import vlret.losses.vsl_rank as module

    m = rows_of(64, 64, seed=5, spread=0.01)
    g = rows_of(64, 64, seed=6, spread=1.0)
    out = []
    for threads in (1, 3):
        monkeypatch.setattr(module, "_THREAD_PAIRS", 1)
        monkeypatch.setattr(torch, "get_num_threads", lambda t=threads: t)
        x = m.clone().requires_grad_()
        ranks = smooth_rank(x, kernel="native")
        ranks.backward(g)
        out.append((ranks, x.grad))
    assert torch.equal(out[0][0], out[1][0]) and torch.equal(out[0][1], out[1][1])


@needs_compiler
def test_non_contiguous_half_and_retained_graph():
    m = rows_of(30, 24, seed=7, spread=0.01)
    t = m.t()  # non-contiguous
    assert torch.equal(
        smooth_rank(t, kernel="native"), smooth_rank(t.contiguous(), kernel="native")
    )
    half = m.half().requires_grad_()
    ranks = smooth_rank(half, kernel="native")
    assert ranks.dtype == torch.float32
    ranks.sum().backward()
    assert half.grad.dtype == torch.float16
    x = m.clone().requires_grad_()
    r = smooth_rank(x, kernel="native")
    r.sum().backward(retain_graph=True)
    first = x.grad.clone()
    r.sum().backward()
    torch.testing.assert_close(x.grad, 2 * first, rtol=0, atol=0)


@needs_compiler
def test_auto_takes_the_kernel_for_float32_cpu_and_torch_for_float64():
    m = rows_of(8, 8, seed=8, spread=0.01)
    assert torch.equal(smooth_rank(m), smooth_rank(m, kernel="native"))
    assert _native.status("smooth_rank").startswith("compiled by ")
    m64 = m.double()
    assert torch.equal(smooth_rank(m64), smooth_rank(m64, kernel="torch"))


def test_kernel_argument_errors(monkeypatch):
    m = rows_of(4, 4, seed=9, spread=0.01)
    with pytest.raises(ValueError, match="kernel must be one of"):
        smooth_rank(m, kernel="fast")
    with pytest.raises(ValueError, match="kernel='native' computes float32 CPU tensors"):
        smooth_rank(m.double(), kernel="native")
    monkeypatch.setenv("VLRET_NATIVE", "0")
    with pytest.raises(RuntimeError, match="switched off by VLRET_NATIVE"):
        smooth_rank(m, kernel="native")
    # auto falls back to PyTorch, with the same numbers as kernel="torch"
    assert torch.equal(smooth_rank(m), smooth_rank(m, kernel="torch"))


@needs_compiler
def test_loss_module_kernel_parameter():
    g = torch.Generator().manual_seed(10)
    img, txt = torch.randn(16, 8, generator=g), torch.randn(16, 8, generator=g)
    sem = torch.rand(16, 16, generator=g)
    losses = {}
    for kernel in ("native", "torch"):
        loss = VisualSemanticLoss(kernel=kernel, tau=0.01)
        a, b = img.clone().requires_grad_(), txt.clone().requires_grad_()
        value = loss(a, b, list(range(16)), semantic_sim=sem)
        value.backward()
        losses[kernel] = (value, a.grad)
    torch.testing.assert_close(losses["native"][0], losses["torch"][0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(losses["native"][1], losses["torch"][1], rtol=1e-4, atol=1e-6)
    with pytest.raises(ParamError, match="kernel"):
        VisualSemanticLoss(kernel="fast")
    with pytest.raises(ValueError, match="kernel must be one of"):
        visual_semantic_loss(torch.zeros(2, 2), torch.zeros(2, 2), kernel="fast")


# -- the build cache ------------------------------------------------------------------------


@needs_compiler
def test_compiled_once_then_loaded_from_the_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("VLRET_NATIVE_CACHE", str(tmp_path))
    assert _native.library("smooth_rank") is not None
    built = sorted(tmp_path.glob("smooth_rank-*.so"))
    assert len(built) == 1 and not list(tmp_path.glob(".*"))  # no temporary left behind
    stamp = built[0].stat().st_mtime_ns
    _native.forget()
    assert _native.library("smooth_rank") is not None
    assert built[0].stat().st_mtime_ns == stamp  # loaded, not rebuilt
    # another CPU (other feature flags) gets its own object, never this one
    monkeypatch.setattr(_native, "_cpu_identity", lambda: "another cpu|flags")
    _native.forget()
    assert _native.library("smooth_rank") is not None
    assert len(list(tmp_path.glob("smooth_rank-*.so"))) == 2


def test_a_failing_compiler_warns_once_and_falls_back(monkeypatch, tmp_path):
    monkeypatch.setenv("VLRET_NATIVE_CACHE", str(tmp_path))
    failing = tmp_path / "cc"
    failing.write_text("#!/bin/sh\necho 'cc: error: no such option' >&2\nexit 1\n")
    failing.chmod(0o755)
    monkeypatch.setenv("CC", str(failing))
    with pytest.warns(RuntimeWarning, match="native smooth_rank kernel is not available"):
        assert _native.library("smooth_rank") is None
    assert "no such option" in _native.status("smooth_rank")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _native.library("smooth_rank") is None  # remembered: no second warning
    m = rows_of(5, 5, seed=11, spread=0.01)
    assert torch.equal(smooth_rank(m), smooth_rank(m, kernel="torch"))
    assert not list(tmp_path.glob("*.so")) and not list(tmp_path.glob(".*"))


def test_no_compiler_and_unknown_kernel(monkeypatch):
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(_native.shutil, "which", lambda name: None)
    assert _native.compiler() is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # silently the PyTorch code
        assert _native.library("smooth_rank") is None
    assert "no C compiler" in _native.status("smooth_rank")
    with pytest.raises(ValueError, match="no native kernel named 'nope'"):
        _native.library("nope")


def test_switch_values(monkeypatch):
    for value, on in (("0", False), ("off", False), ("False", False), ("1", True), ("", True)):
        monkeypatch.setenv("VLRET_NATIVE", value)
        assert _native.enabled() is on
    monkeypatch.delenv("VLRET_NATIVE")
    monkeypatch.delenv("VLRET_NATIVE_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", "/somewhere")
    assert str(_native.cache_dir()) == os.path.join("/somewhere", "vlret", "native")


@needs_compiler
@pytest.mark.parametrize("descending", [True, False])
def test_fused_vsl_terms_match_float64(descending):
    """The fused per-row terms (both ranks and the min/max ratio in one pass) against the
    float64 PyTorch loss of the same float32 inputs: a term is off by at most two ranks'
    errors (ratio a / b with a, b >= 1), and its gradient by the rank bound with the ratio's
    derivative (at most 1 / n) as the incoming gradient."""
    n, tau = 48, 0.001
    sim = rows_of(n, n, seed=12, spread=0.01)
    sim.diagonal().add_(0.3)  # an outlier per row: the kernel's checked path
    sem = rows_of(n, n, seed=13, spread=0.01).abs()
    sem[:, :8] = 0.0  # ties, as captions sharing no word give
    big_x = max(float(sim.abs().max()), float(sem.abs().max())) / tau
    got_s = sim.clone().requires_grad_()
    got = visual_semantic_loss(
        got_s, sem, tau=tau, descending=descending, reduction="none", kernel="native"
    )
    g = rows_of(1, n, seed=14, spread=1.0)[0]
    got.backward(g)
    want_s = sim.double().requires_grad_()
    want = visual_semantic_loss(
        want_s, sem.double(), tau=tau, descending=descending, reduction="none", kernel="torch"
    )
    want.backward(g.double())
    tol = rank_tolerance(n, big_x)
    assert (got.double() - want).abs().max().item() <= 2 * tol
    gtol = grad_tolerance(n, big_x, 1 / tau, float(g.abs().max()) / n)
    gtol += (1 / tau) * n * 2 * float(g.abs().max()) * (2 * tol / n) / 4
    assert (got_s.grad.double() - want_s.grad).abs().max().item() <= gtol
    # no grad: the terms alone, the same numbers
    with torch.no_grad():
        again = visual_semantic_loss(
            sim, sem, tau=tau, descending=descending, reduction="none", kernel="native"
        )
    assert torch.equal(again, got.detach())


@needs_compiler
def test_fused_text_side_and_reductions():
    n = 12
    sim = rows_of(n, n, seed=15, spread=0.01)
    sem, tsem = rows_of(n, n, seed=16, spread=0.01), rows_of(n, n, seed=17, spread=0.01)
    for reduction in ("mean", "sum", "none"):
        a = visual_semantic_loss(
            sim, sem, text_semantic_sim=tsem, reduction=reduction, kernel="native"
        )
        b = visual_semantic_loss(
            sim.double(),
            sem.double(),
            text_semantic_sim=tsem.double(),
            reduction=reduction,
            kernel="torch",
        )
        torch.testing.assert_close(a.double(), b, rtol=0, atol=4 * rank_tolerance(n, 50.0))


@needs_compiler
def test_the_portable_build_gives_the_same_numbers(monkeypatch, tmp_path):
    """Built without ``-march=native`` (the compiler's baseline ISA: no AVX-512, so the
    division and the lane loops instead of the intrinsics), as on a CPU the kernel was not
    tuned for: the same ranks and gradients to the kernel's own rounding."""
    m = torch.cat([rows_of(20, 70, seed=23, spread=0.01), rows_of(20, 70, seed=24, spread=0.2)])
    g = rows_of(40, 70, seed=25, spread=1.0)
    results = []
    for flags in (_native.FLAG_SETS, _native.FLAG_SETS[1:]):
        monkeypatch.setattr(_native, "FLAG_SETS", flags)
        monkeypatch.setenv("VLRET_NATIVE_CACHE", str(tmp_path / str(len(flags))))
        _native.forget()
        x = m.clone().requires_grad_()
        ranks = smooth_rank(x, kernel="native")
        ranks.backward(g)
        results.append((ranks.double(), x.grad.double()))
    (r0, g0), (r1, g1) = results
    assert (r0 - r1).abs().max().item() <= 2 * rank_tolerance(70, 0.0)
    big_g = float(g.abs().max())
    assert (g0 - g1).abs().max().item() <= 2 * grad_tolerance(70, 0.0, 1000.0, big_g)
