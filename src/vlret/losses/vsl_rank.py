"""The smooth rank of VSL (Eq. 4): every entry's rank within its row through sigmoids of the
pairwise differences, with a fused native kernel and its PyTorch fallback.

Two implementations compute the same numbers (to float rounding):

* the PyTorch path evaluates every ordered pair ``(j, k)`` of a row as a block of
  ``(rows, n, n)`` sigmoids, a block of rows at a time (memory ``O(n^2)`` beyond one block);
* the native kernel (``vlret/_native/smooth_rank.c``, float32 on the CPU) evaluates each
  unordered pair once, one ``exp`` giving both sigmoids and the derivative, in one pass over
  each row with no ``n^3`` intermediate; the derivatives are kept for the backward when they
  fit in the PyTorch path's block budget, else recomputed.

``kernel="auto"`` (the default) takes the native kernel for float32 (and half, computed in
float32) CPU tensors when it is available (:func:`vlret._native.library`: compiled on first
use, ``VLRET_NATIVE=0`` switches it off) and the PyTorch path otherwise (float64, GPUs, no C
compiler). ``benchmarks/bench_vsl.py`` times both beside the triplet loss.
"""

from __future__ import annotations

import ctypes
import warnings

import torch

from .. import _native
from .._checks import Number, check_finite, check_positive, compute_dtype
from .deprecated import REMOVED_IN

#: The sigmoid's exponent ``x / tau`` is clamped to ``[-50, 50]`` (as Smooth-AP does): beyond
#: it the sigmoid is saturated to within 2e-22. The gradient there is tiny but not exactly
#: zero (as autograd through ``clamp`` would give): the hand-written backward evaluates
#: ``sigma' = sigma (1 - sigma)`` at the clamped exponent, so a saturated pair contributes up
#: to ``sigma'(+-50) ~ 1.9e-22`` (times ``1 / tau``) in float64 and float32 alike (0 where
#: ``sigma`` itself rounded to 1; the native kernel forms it as ``e / (1 + e)^2`` with
#: ``e = exp(-50)``, about 1.9e-22 on both sides).
EXPONENT_CLAMP = 50.0
#: Elements of one ``(rows, n, n)`` block of pairwise sigmoids (16 MiB in float32).
_BLOCK_ELEMENTS = 1 << 22


#: Rows of one block of the smooth rank's ``(rows, n, n)`` pairwise sigmoids, or ``None``.
RANK_BLOCK = Number(integer=True, ge=1, optional=True)


def _rank_block(rank_block: int | None, chunk_size: int | None) -> int | None:
    """``rank_block``, or the deprecated ``chunk_size`` it was called before (issue 25)."""
    if chunk_size is not None:
        if rank_block is not None:
            raise ValueError("chunk_size is the old name of rank_block; give rank_block only")
        warnings.warn(
            "chunk_size of the smooth rank is deprecated; it is now rank_block (chunk_size "
            f"means a tiled loss's tile height; the old name is removed in {REMOVED_IN})",
            DeprecationWarning,
            stacklevel=3,
        )
        rank_block = chunk_size
    RANK_BLOCK.check(rank_block, "rank_block")
    return rank_block


def _rows_per_block(n_rows: int, n_cols: int, rank_block: int | None) -> int:
    if rank_block is not None:
        return min(rank_block, n_rows)
    return max(1, min(n_rows, _BLOCK_ELEMENTS // (n_cols * n_cols)))


def _pairwise_sigmoids(scaled: torch.Tensor) -> torch.Tensor:
    """``(c, n) -> (c, n, n)`` with ``[r, j, k] = sigmoid(clamp(scaled[r, k] - scaled[r, j]))``."""
    block = scaled[:, None, :] - scaled[:, :, None]
    return block.clamp_(-EXPONENT_CLAMP, EXPONENT_CLAMP).sigmoid_()


def _ranks(scaled: torch.Tensor, rows: int) -> torch.Tensor:
    out = torch.empty_like(scaled)
    for r0 in range(0, scaled.shape[0], rows):
        # 1 + sum over k != j = sum over all k + 1 - sigmoid(0), and sigmoid(0) = 0.5 exactly.
        out[r0 : r0 + rows] = _pairwise_sigmoids(scaled[r0 : r0 + rows]).sum(-1).add_(0.5)
    return out


class _SmoothRank(torch.autograd.Function):
    """Row-wise smooth rank with a hand-written backward that never holds all ``n^3`` terms.

    With ``w_rjk = sigmoid'(z_rjk)`` (symmetric in ``j, k``) and incoming gradient ``g``:
    ``dL/dm_ra = (sign / tau) * sum_j w_raj (g_rj - g_ra)``. When all the sigmoids fit in one
    block they are kept for the backward, which turns them into ``w`` in place (a fresh
    ``n^3`` buffer costs more in page faults than the arithmetic on it); otherwise, or on a
    second backward through a retained graph, they are recomputed block by block.
    """

    @staticmethod
    def forward(ctx, m: torch.Tensor, scale: float, rows: int) -> torch.Tensor:
        scaled = m * scale
        n_rows, n_cols = m.shape
        ctx.scale, ctx.rows = scale, rows
        ctx.save_for_backward(scaled)
        ctx.sigmoids = None
        if rows >= n_rows and n_rows * n_cols * n_cols <= _BLOCK_ELEMENTS:
            # An intermediate, not an input or output: kept on ctx so the backward may consume it.
            ctx.sigmoids = _pairwise_sigmoids(scaled)
            return ctx.sigmoids.sum(-1).add_(0.5)
        return _ranks(scaled, rows)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        (scaled,) = ctx.saved_tensors
        kept, ctx.sigmoids = ctx.sigmoids, None
        g = grad_out.to(scaled.dtype)
        grad = torch.empty_like(scaled)
        rows = scaled.shape[0] if kept is not None else ctx.rows
        for r0 in range(0, scaled.shape[0], rows):
            w = kept if kept is not None else _pairwise_sigmoids(scaled[r0 : r0 + rows])
            w.addcmul_(w, w, value=-1.0)  # sigmoid' = sig (1 - sig), in place
            gb = g[r0 : r0 + w.shape[0]]
            # Row vectors times w (symmetric): [sum_j g_j w_ja, sum_j w_ja] in one batched product.
            both = torch.stack((gb, torch.ones_like(gb)), dim=1) @ w
            grad[r0 : r0 + w.shape[0]] = both[:, 0] - gb * both[:, 1]
        return grad.mul_(ctx.scale), None, None


#: ``kernel`` values of :func:`smooth_rank`.
KERNELS = ("auto", "native", "torch")
#: Pairs (rows x n x n) from which the native kernel splits rows over ``torch``'s threads
#: (B = 256 and up). Below it one thread: torch's OpenMP workers spin for a while after each
#: parallel operation, so threads of the kernel's own started right after one compete with
#: them for the cores; at B = 128 with 2 threads on a 2-core machine that made VSL slower, not
#: faster (benchmarks/bench_vsl.py), while at B = 1024 the threads pay (0.6 s against 1.0 s).
_THREAD_PAIRS = 1 << 24
_P = ctypes.c_void_p
_DECLARED: set[ctypes.CDLL] = set()  # libraries whose signatures are declared


def _native_library() -> ctypes.CDLL | None:
    """The compiled kernel with its signatures declared, or ``None`` (see :mod:`vlret._native`)."""
    lib = _native.library("smooth_rank")
    if lib is not None and lib not in _DECLARED:
        i64, f32, i32 = ctypes.c_int64, ctypes.c_float, ctypes.c_int
        lib.vlret_smooth_rank_pair_floats.argtypes = [i64]
        lib.vlret_smooth_rank_pair_floats.restype = i64
        lib.vlret_smooth_rank_forward.argtypes = [_P, f32, i64, i64, _P, _P, i32]
        lib.vlret_smooth_rank_forward.restype = i32
        lib.vlret_smooth_rank_backward.argtypes = [_P, f32, _P, i64, i64, _P, _P, i32]
        lib.vlret_smooth_rank_backward.restype = i32
        lib.vlret_vsl_forward.argtypes = [_P, _P, f32, i64, i64, _P, _P, _P, _P, i32]
        lib.vlret_vsl_forward.restype = i32
        lib.vlret_vsl_backward.argtypes = [_P, f32, _P, i64, i64, _P, _P, _P, _P, i32]
        lib.vlret_vsl_backward.restype = i32
        _DECLARED.add(lib)
    return lib


def _scale(tau: float, descending: bool) -> float:
    """The factor a row is multiplied by before its pairs' differences: ``+-1 / tau``."""
    return (1.0 if descending else -1.0) / float(tau)


def _threads(rows: int, n: int) -> int:
    return torch.get_num_threads() if rows * n * n >= _THREAD_PAIRS else 1


def _native_ranks(lib: ctypes.CDLL, m: torch.Tensor, scale: float, w: torch.Tensor | None):
    """Ranks of the float32 contiguous ``m`` (and the pairs' derivatives into ``w``)."""
    rows, n = m.shape
    out = torch.empty_like(m)
    ptr = None if w is None else w.data_ptr()
    _check(
        lib.vlret_smooth_rank_forward(
            m.data_ptr(), scale, rows, n, out.data_ptr(), ptr, _threads(rows, n)
        )
    )
    return out


class _NativeSmoothRank(torch.autograd.Function):
    """The smooth rank through the native kernel (float32, CPU); see the module doc."""

    @staticmethod
    def forward(ctx, m: torch.Tensor, scale: float, lib: ctypes.CDLL) -> torch.Tensor:
        w = _pairs_buffer(lib, m.shape[0], m.shape[1], m.dtype)
        ctx.scale, ctx.lib, ctx.w = scale, lib, w
        ctx.save_for_backward(m)
        return _native_ranks(lib, m, scale, w)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        (m,) = ctx.saved_tensors
        rows, n = m.shape
        g = grad_out.to(m.dtype).contiguous()
        grad = torch.empty_like(m)
        w = ctx.w  # read only: a second backward through a retained graph reads it again
        _check(
            ctx.lib.vlret_smooth_rank_backward(
                m.data_ptr(),
                ctx.scale,
                g.data_ptr(),
                rows,
                n,
                None if w is None else w.data_ptr(),
                grad.data_ptr(),
                _threads(rows, n),
            )
        )
        return grad, None, None


def _check(failed: int) -> None:
    if failed:
        raise MemoryError("smooth_rank: the native kernel could not allocate its row buffers")


def _pairs_buffer(lib: ctypes.CDLL, rows: int, n: int, dtype: torch.dtype) -> torch.Tensor | None:
    """The buffer of the pairs' derivatives, when it fits the PyTorch path's block budget."""
    per_row = int(lib.vlret_smooth_rank_pair_floats(n))
    return torch.empty(rows * per_row, dtype=dtype) if rows * per_row <= _BLOCK_ELEMENTS else None


def _native_terms(lib: ctypes.CDLL, s: torch.Tensor, c: torch.Tensor, scale: float, w):
    """VSL's per-row terms of the contiguous float32 ``s`` and ``c`` with both rank matrices
    (and the pairs' derivatives into ``w``)."""
    rows, n = s.shape
    terms = s.new_empty(rows)
    sr, cr = torch.empty_like(s), torch.empty_like(s)
    _check(
        lib.vlret_vsl_forward(
            s.data_ptr(),
            c.data_ptr(),
            scale,
            rows,
            n,
            terms.data_ptr(),
            sr.data_ptr(),
            cr.data_ptr(),
            None if w is None else w.data_ptr(),
            _threads(rows, n),
        )
    )
    return terms, sr, cr


class _NativeRankDisagreement(torch.autograd.Function):
    """VSL's per-row terms (Eq. 5) of ``s`` against the constant ``c`` in one native pass:
    both rows' ranks and the min/max ratio, and in the backward the ratio's derivative
    through the similarity's ranks; the same numbers as :func:`smooth_rank` composed with
    the ratio (to float rounding), without a PyTorch operation per step."""

    @staticmethod
    def forward(ctx, s: torch.Tensor, c: torch.Tensor, scale: float, lib: ctypes.CDLL):
        w = _pairs_buffer(lib, s.shape[0], s.shape[1], s.dtype)
        terms, sr, cr = _native_terms(lib, s, c, scale, w)
        ctx.scale, ctx.lib, ctx.w = scale, lib, w
        ctx.save_for_backward(s, sr, cr)
        return terms

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_terms: torch.Tensor):
        s, sr, cr = ctx.saved_tensors
        rows, n = s.shape
        g = grad_terms.to(s.dtype).contiguous()
        grad = torch.empty_like(s)
        w = ctx.w
        _check(
            ctx.lib.vlret_vsl_backward(
                s.data_ptr(),
                ctx.scale,
                g.data_ptr(),
                rows,
                n,
                sr.data_ptr(),
                cr.data_ptr(),
                None if w is None else w.data_ptr(),
                grad.data_ptr(),
                _threads(rows, n),
            )
        )
        return grad, None, None, None


def native_rank_disagreement(
    s: torch.Tensor, c: torch.Tensor, *, tau: float, descending: bool, kernel: str
) -> torch.Tensor | None:
    """VSL's per-row terms ``1 - mean_j min(sr, cr) / max(sr, cr)`` through the native kernel,
    or ``None`` when ``kernel`` and the tensors call for the PyTorch path (the caller's).

    ``s`` (finite, differentiable) and ``c`` (finite, a constant) are ``(rows, n)`` in the
    same dtype; ``kernel`` as in :func:`smooth_rank`.
    """
    lib = _choose(kernel, s)
    if lib is None:
        return None
    scale = _scale(tau, descending)
    s, c = s.contiguous(), c.detach().contiguous()
    if torch.is_grad_enabled() and s.requires_grad:
        return _NativeRankDisagreement.apply(s, c, scale, lib)
    return _native_terms(lib, s.detach(), c, scale, None)[0]


def _choose(kernel: str, m: torch.Tensor) -> ctypes.CDLL | None:
    """The native library when ``kernel`` and ``m`` (already in its compute dtype) allow it."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    if kernel == "torch":
        return None
    fits = m.dtype == torch.float32 and m.device.type == "cpu"
    if kernel == "native" and not fits:
        raise ValueError(
            f"kernel='native' computes float32 CPU tensors, got {m.dtype} on {m.device.type}"
        )
    lib = _native_library() if fits else None
    if kernel == "native" and lib is None:
        raise RuntimeError(
            "kernel='native': the smooth_rank kernel is not available ("
            + (_native.status("smooth_rank") or "unknown reason")
            + ")"
        )
    return lib


def smooth_rank(
    m: torch.Tensor,
    *,
    tau: float = 0.001,
    descending: bool = True,
    rank_block: int | None = None,
    chunk_size: int | None = None,
    kernel: str = "auto",
) -> torch.Tensor:
    """Smooth rank of every entry within its row, VSL Eq. (4) with ``k != j``.

    With ``descending=True`` (the released code and Smooth-AP):

        R(i, j, M) = 1 + sum_{k != j} Omega(m_ik - m_ij),   Omega(x) = 1 / (1 + exp(-x / tau))

    so the largest entry of a row gets rank about 1. ``descending=False`` is Eq. (4) as printed,
    ``Omega(m_ij - m_ik)``, where the largest gets rank about ``n``; the two always sum to
    ``n + 1``. As ``tau -> 0`` the ranks become exact (ties count one half each way). The
    exponent ``x / tau`` is clamped to ``[-50, 50]`` (:data:`EXPONENT_CLAMP`).

    Memory stays ``O(n^2)`` beyond one block of ``rows x n x n`` pairwise terms (measured in
    ``docs/vsl.md``): the PyTorch path computes them a block of rows at a time, in the forward
    and again in the backward; the native kernel forms none of them and keeps the pairs'
    derivatives for the backward only while they fit in one block.

    Args:
        m: ``(rows, n)``, any floating dtype (half precision is computed and returned in
            float32).
        tau: The sigmoid's temperature, in the units of ``m``.
        descending: Rank the largest entry 1 (``False``: Eq. 4 as printed).
        rank_block: Rows per block; ``None``: as many as fit in 4M pairwise terms.
        chunk_size: The deprecated name of ``rank_block`` (a DeprecationWarning).
        kernel: ``"auto"``: the native kernel for float32 (or half) CPU tensors when it is
            available, else PyTorch; ``"native"``: the native kernel or an error;
            ``"torch"``: the PyTorch path (see the module doc). ``rank_block`` applies to
            the PyTorch path; the native kernel needs no block of pairs.

    Returns:
        ``(rows, n)`` ranks in ``[1, n]``, differentiable with respect to ``m``.

    Raises:
        ValueError: ``m`` is not a non-empty finite floating 2-D tensor, or a bad ``tau``,
            ``rank_block`` or ``kernel`` (``"native"`` for a tensor that is not float32 on
            the CPU).
        RuntimeError: ``kernel="native"`` and the kernel is not available (no C compiler,
            ``VLRET_NATIVE=0``).
    """
    if not isinstance(m, torch.Tensor):
        raise ValueError(f"m must be a torch.Tensor, got {type(m).__name__}")
    if m.dim() != 2 or m.shape[0] == 0 or m.shape[1] == 0:
        raise ValueError(f"m must be a non-empty 2-D (rows, n) tensor, got shape {tuple(m.shape)}")
    if not m.dtype.is_floating_point:
        raise ValueError(f"m must be a floating-point tensor, got dtype {m.dtype}")
    check_positive(tau, "tau")
    rank_block = _rank_block(rank_block, chunk_size)
    m = m.to(compute_dtype(m.dtype))
    check_finite(m, "m")
    scale = _scale(tau, descending)
    lib = _choose(kernel, m)
    if lib is not None:
        m = m.contiguous()
        if torch.is_grad_enabled() and m.requires_grad:
            return _NativeSmoothRank.apply(m, scale, lib)
        return _native_ranks(lib, m.detach(), scale, None)
    rows = _rows_per_block(m.shape[0], m.shape[1], rank_block)
    if torch.is_grad_enabled() and m.requires_grad:
        return _SmoothRank.apply(m, scale, rows)
    return _ranks(m.detach() * scale, rows)


__all__ = [
    "EXPONENT_CLAMP",
    "KERNELS",
    "RANK_BLOCK",
    "native_rank_disagreement",
    "smooth_rank",
]
