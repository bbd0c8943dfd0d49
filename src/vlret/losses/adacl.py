r"""Adaptive contrastive learning (AdaCL): "Discovering clone negatives via adaptive contrastive
learning for image-text matching", Eq. (3)-(11), Algorithm 1, appendix A.3-A.4, A.9-A.10.

AdaCL replaces the temperature of contrastive learning with two margins on the positive logit,
a scale ``m1`` and a shift ``m2`` (Eq. 3). Each training batch recomputes them in closed form
(Eq. 4-6, A.3) from an *anchor* chosen among the batch's likely clone negatives: a salient
score per row (Eq. 7) picks a row of salient negatives and a row of clone negatives, a 1-D
Gaussian discriminant analysis fitted on those two rows (Eq. 8-10) classifies every negative,
and the anchor comes from the median distance of the clones to their positives (Eq. 11).

No public code exists; every reading of the paper made here is written in the docstring of the
function that makes it. The pieces:

* :func:`adacl_loss`: the loss for given margins (Eq. 3 with the cross-entropy of Eq. 2, both
  directions), with optional memory-queue negatives.
* :func:`adacl_margins`: ``(anchor, Sigma_anchor) -> (m1, m2)`` (Algorithm 1 step 5, Eq. 20, 22).
* :func:`fit_gda`, :func:`clone_log_odds`, :func:`clone_posterior`: the GDA of Eq. (8)-(10).
* :func:`adacl_anchor`: Eq. (7)-(11) on one batch.
* :class:`AdaCLLoss` (registered as ``"adacl"``): margins as buffers updated every training
  batch, guards, ``last_stats`` for logging, an optional owned memory queue.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from .._checks import check_finite, check_reduction
from ..memory import MemoryQueue, as_id_tensor
from ..similarity import Ids
from ._base import PairLoss, log1p_sum_exp, prepare, reduce_terms
from .registry import register_loss

#: Anchor selection rules on Delta S (paper Table 5).
ANCHOR_SELECTIONS = ("median", "min", "max", "random")

#: Reasons for keeping the previous margins, in the order they are checked.
GUARDS = ("degenerate_variance", "empty_clone_set", "anchor_ge_one", "nonfinite_margins")

#: The paper's settings (Sec. 4.1): p_u = 0.03, eps = e^-7, m1 = 20 and m2 = 0.1 initially.
DEFAULT_P_U = 0.03
DEFAULT_EPS = math.exp(-7)


# --------------------------------------------------------------------------------------------
# Input checks
# --------------------------------------------------------------------------------------------


def _check_margin(value: float | torch.Tensor, name: str, *, positive: bool) -> None:
    if isinstance(value, torch.Tensor):
        if value.dim() != 0:
            raise ValueError(f"{name} must be a scalar, got shape {tuple(value.shape)}")
        v = float(value.detach())
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        v = float(value)
    else:
        raise ValueError(f"{name} must be a real number, got {type(value).__name__}")
    if not math.isfinite(v) or (positive and v <= 0):
        kind = "a positive finite number" if positive else "a finite number"
        raise ValueError(f"{name} must be {kind}, got {v!r}")


def _check_probabilities(p_u: float, eps: float) -> None:
    if not (isinstance(p_u, (int, float)) and 0.0 < p_u < 1.0):
        raise ValueError(f"p_u must be a probability in (0, 1), got {p_u!r}")
    if not (isinstance(eps, (int, float)) and 0.0 < eps < 1.0):
        raise ValueError(f"eps must be in (0, 1), got {eps!r}")
    if p_u + eps >= 1.0:
        # Otherwise eps * p_u / ((1 - eps)(1 - p_u)) >= 1 and m1 would not be positive.
        raise ValueError(f"p_u + eps must be below 1, got p_u={p_u!r}, eps={eps!r}")


def _extra(
    scores: torch.Tensor | None,
    mask: torch.Tensor | None,
    name: str,
    shape_of: tuple[int | None, int | None],
    dtype: torch.dtype,
    device: torch.device,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Validate an extra-negative block; ``shape_of`` fixes the dimension tied to the batch."""
    if scores is None:
        if mask is not None:
            raise ValueError(f"{name}_mask given without {name}")
        return None, None
    if not isinstance(scores, torch.Tensor) or scores.dim() != 2:
        got = tuple(scores.shape) if isinstance(scores, torch.Tensor) else type(scores).__name__
        raise ValueError(f"{name} must be a 2-D tensor, got {got}")
    for axis, want in enumerate(shape_of):
        if want is not None and scores.shape[axis] != want:
            layout = "(B, K)" if axis == 0 else "(K, B)"
            raise ValueError(
                f"{name} must have shape {layout} with B={want} matching sim, "
                f"got {tuple(scores.shape)}"
            )
    if not scores.dtype.is_floating_point:
        raise ValueError(f"{name} must be floating point, got dtype {scores.dtype}")
    if not bool(torch.isfinite(scores.sum())):  # one pass: a finite sum has finite terms
        check_finite(scores, name)
    if mask is None:
        return scores.to(device=device, dtype=dtype), None
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        raise ValueError(f"{name}_mask must be a bool tensor")
    try:
        mask = mask.to(device).expand(scores.shape)
    except RuntimeError:
        raise ValueError(
            f"{name}_mask must have shape {tuple(scores.shape)} like {name} (or broadcast to "
            f"it), got {tuple(mask.shape)}"
        ) from None
    return scores.to(device=device, dtype=dtype), mask


def _masked_logsumexp(z: torch.Tensor, mask: torch.Tensor | None, dim: int) -> torch.Tensor:
    if mask is None:
        return z.logsumexp(dim)
    return z.masked_fill(~mask, torch.finfo(z.dtype).min).logsumexp(dim)


def _log1p_sum_exp_with_extra(
    z: torch.Tensor,
    negatives: torch.Tensor,
    extra_z: torch.Tensor | None,
    extra_mask: torch.Tensor | None,
    dim: int,
) -> torch.Tensor:
    """``log(1 + sum_neg exp(z) + sum_extra exp(extra_z))`` along ``dim`` without concatenating."""
    if extra_z is None:
        return log1p_sum_exp(z, negatives, dim)
    lse = torch.logaddexp(
        _masked_logsumexp(z, negatives, dim), _masked_logsumexp(extra_z, extra_mask, dim)
    )
    return torch.logaddexp(torch.zeros((), dtype=z.dtype, device=z.device), lse)


@dataclass(frozen=True)
class _Batch:
    """Validated inputs in the compute dtype; masks are ``None`` where every entry counts."""

    sim: torch.Tensor
    negatives: torch.Tensor
    q_txt: torch.Tensor | None
    q_txt_mask: torch.Tensor | None
    q_img: torch.Tensor | None
    q_img_mask: torch.Tensor | None


def _prepare_batch(
    sim: torch.Tensor,
    pos_mask: torch.Tensor | None,
    extra_neg_txt: torch.Tensor | None,
    extra_neg_txt_mask: torch.Tensor | None,
    extra_neg_img: torch.Tensor | None = None,
    extra_neg_img_mask: torch.Tensor | None = None,
) -> _Batch:
    s, negatives = prepare(sim, pos_mask)
    b = s.shape[0]
    q_txt, q_txt_mask = _extra(
        extra_neg_txt, extra_neg_txt_mask, "extra_neg_txt", (b, None), s.dtype, s.device
    )
    q_img, q_img_mask = _extra(
        extra_neg_img, extra_neg_img_mask, "extra_neg_img", (None, b), s.dtype, s.device
    )
    return _Batch(s, negatives, q_txt, q_txt_mask, q_img, q_img_mask)


# --------------------------------------------------------------------------------------------
# Eq. (3): the loss for given margins
# --------------------------------------------------------------------------------------------


def adacl_loss(
    sim: torch.Tensor,
    *,
    m1: float | torch.Tensor,
    m2: float | torch.Tensor,
    pos_mask: torch.Tensor | None = None,
    extra_neg_txt: torch.Tensor | None = None,
    extra_neg_img: torch.Tensor | None = None,
    extra_neg_txt_mask: torch.Tensor | None = None,
    extra_neg_img_mask: torch.Tensor | None = None,
    reduction: str = "mean",
) -> torch.Tensor:
    r"""AdaCL loss for fixed margins, Eq. (3) with the cross-entropy of Eq. (2) / (13):

    .. math:: \hat p_i = \frac{e^{m_1(s_{ii} - m_2)}}
              {e^{m_1(s_{ii} - m_2)} + \sum_{j \ne i} e^{s_{ij}}}, \qquad
              \ell_i = -\log \hat p_i

    The positive logit is scaled and shifted, the negative logits are the raw similarities as
    printed (no temperature). It is applied in both directions, image->text on row ``i`` and
    text->image on column ``i`` (Eq. 3 is written for an image anchor; the paper trains its
    retrieval models bidirectionally), computed stably as
    ``log(1 + sum_j exp(s_ij - m1 (s_ii - m2)))``.

    * ``extra_neg_txt`` ``(B, K)``: similarities of each batch image to ``K`` extra texts
      (memory-queue keys), appended to the image->text denominators; ``extra_neg_img``
      ``(K', B)``: similarities of ``K'`` extra images to each batch text, appended to the
      text->image denominators. Both follow the ``sim`` layout (rows images, columns texts).
      ``extra_neg_*_mask`` (same shapes, bool) mark which extra entries are negatives (see
      :meth:`vlret.memory.MemoryQueue.negative_mask`); default: all.
    * ``pos_mask`` entries are left out of the denominators.
    * ``reduction`` follows :func:`~vlret.losses.infonce_loss`: ``"mean"`` is the mean over the
      ``B`` indices of (image->text CE + text->image CE); ``"sum"`` their sum; ``"none"`` the
      ``(B,)`` vector. Identity (tested): ``adacl_loss(sim, m1=1, m2=0) ==
      infonce_loss(sim, temperature=1)``.

    ``m1`` (> 0) and ``m2`` may be floats or 0-dim tensors; gradient flows through tensors, so
    pass buffers or detached values for the paper's training-free margins.
    """
    _check_margin(m1, "m1", positive=True)
    _check_margin(m2, "m2", positive=False)
    check_reduction(reduction)
    batch = _prepare_batch(
        sim, pos_mask, extra_neg_txt, extra_neg_txt_mask, extra_neg_img, extra_neg_img_mask
    )
    return _loss_of_batch(batch, m1, m2, reduction)


def _loss_of_batch(
    batch: _Batch, m1: float | torch.Tensor, m2: float | torch.Tensor, reduction: str
) -> torch.Tensor:
    s = batch.sim
    if isinstance(m1, torch.Tensor):
        m1 = m1.to(device=s.device, dtype=s.dtype)
    if isinstance(m2, torch.Tensor):
        m2 = m2.to(device=s.device, dtype=s.dtype)
    pos_logit = m1 * (s.diagonal() - m2)
    img_terms = _log1p_sum_exp_with_extra(
        s - pos_logit[:, None],
        batch.negatives,
        None if batch.q_txt is None else batch.q_txt - pos_logit[:, None],
        batch.q_txt_mask,
        dim=1,
    )
    txt_terms = _log1p_sum_exp_with_extra(
        s - pos_logit[None, :],
        batch.negatives,
        None if batch.q_img is None else batch.q_img - pos_logit[None, :],
        batch.q_img_mask,
        dim=0,
    )
    return reduce_terms(img_terms, txt_terms, reduction)


# --------------------------------------------------------------------------------------------
# Eq. (4)-(6), A.3: margins from the anchor
# --------------------------------------------------------------------------------------------


def _margins_from_log_sigma(
    anchor: torch.Tensor, log_sigma: torch.Tensor, p_u: float, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. (20) and (22) with ``log Sigma_anchor`` given (float64 in, float64 out)."""
    m1 = math.log(eps * p_u / ((1.0 - eps) * (1.0 - p_u))) / (anchor - 1.0)
    m2 = anchor + (math.log((1.0 - p_u) / p_u) - log_sigma) / m1
    return m1, m2


def adacl_margins(
    anchor: float | torch.Tensor,
    sigma_anchor: float | torch.Tensor,
    *,
    p_u: float = DEFAULT_P_U,
    eps: float = DEFAULT_EPS,
) -> tuple[float, float] | tuple[torch.Tensor, torch.Tensor]:
    r"""Margins from the anchor, Algorithm 1 step 5 (derived in A.3, Eq. 20 and 22):

    .. math:: m_1 = \log\frac{\epsilon\,p_u}{(1-\epsilon)(1-p_u)} \Big/ (\mathrm{anchor} - 1),
              \qquad
              m_2 = \mathrm{anchor} + \log\frac{1 - p_u}{p_u \Sigma_\mathrm{anchor}} \Big/ m_1

    They solve the two boundary conditions (tested to 1e-6): Eq. (4), the probability of the
    anchor under Eq. (3) equals ``p_u``,
    ``exp(m1 (anchor - m2)) / (exp(m1 (anchor - m2)) + Sigma_anchor) = p_u``; and Eq. (6), a
    positive of similarity 1 has probability ``1 - eps``. ``sigma_anchor`` is
    :math:`\Sigma_\mathrm{anchor} = \sum_{k \ne u} e^{s(I_u, T_k)}` (> 0). ``anchor`` must be
    below 1 (Eq. 6 pins similarity 1; an anchor at or above it has no positive ``m1``), and
    ``p_u + eps < 1``. Defaults are the paper's ``p_u = 0.03``, ``eps = e^-7``.

    Floats give floats; tensors give tensors (computed in float64, returned in the anchor's
    floating dtype). Raises ``ValueError`` naming the argument for inputs outside the domain.
    """
    _check_probabilities(p_u, eps)
    as_tensors = isinstance(anchor, torch.Tensor) or isinstance(sigma_anchor, torch.Tensor)
    a = torch.as_tensor(anchor, dtype=torch.float64)
    sig = torch.as_tensor(sigma_anchor, dtype=torch.float64, device=a.device)
    if not bool(torch.isfinite(a).all()) or bool((a >= 1).any()):
        raise ValueError(f"anchor must be a finite similarity below 1, got {anchor!r}")
    if not bool(torch.isfinite(sig).all()) or bool((sig <= 0).any()):
        raise ValueError(f"sigma_anchor must be a positive finite sum, got {sigma_anchor!r}")
    m1, m2 = _margins_from_log_sigma(a, sig.log(), p_u, eps)
    if not as_tensors:
        return float(m1), float(m2)
    out = anchor.dtype if isinstance(anchor, torch.Tensor) else torch.float64
    out = out if out.is_floating_point else torch.float64
    return m1.to(out), m2.to(out)


# --------------------------------------------------------------------------------------------
# Eq. (8)-(10), A.4: Gaussian discriminant analysis of clone negatives
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GDAFit:
    """Univariate GDA fit, Eq. (9): class C (clone, from S_cln) and C-bar (salient, from S_sln).

    Means, variances and priors are Python floats (computed in float64).
    """

    mu_clone: float
    var_clone: float
    prior_clone: float
    mu_salient: float
    var_salient: float
    prior_salient: float


def fit_gda(salient_negatives: torch.Tensor, clone_negatives: torch.Tensor) -> GDAFit:
    r"""Fit the two Gaussians of Eq. (9) on the negatives of S_sln and S_cln.

    * Means and variances are the maximum-likelihood estimates (variance divides by ``n``, as
      GDA does), computed in float64 (:class:`AdaCLLoss` computes them for every row at once in
      the compute dtype of ``sim``).
    * Each class keeps its own variance, as Eq. (9) and (27) are written (the paper mentions
      GDA's usual shared covariance, but its formula has :math:`\sigma_0 \ne \sigma_1`).
    * Priors come from the sizes of the two sets:
      :math:`\pi_1 = |S_{cln}| / (|S_{cln}| + |S_{sln}|)`.
    """
    for name, t in (("salient_negatives", salient_negatives), ("clone_negatives", clone_negatives)):
        if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.numel() == 0:
            raise ValueError(f"{name} must be a non-empty 1-D tensor")
    rows = np.full((2, max(salient_negatives.numel(), clone_negatives.numel())), np.nan)
    rows[0, : salient_negatives.numel()] = salient_negatives.detach().cpu().double().numpy()
    rows[1, : clone_negatives.numel()] = clone_negatives.detach().cpu().double().numpy()
    return _fit_nan_rows(rows, None)


def clone_log_odds(scores: torch.Tensor, fit: GDAFit) -> torch.Tensor:
    r"""``log p(C|s) - log p(C-bar|s)`` of Eq. (9), elementwise, in the dtype of ``scores``:

    .. math:: \log\frac{\pi_1}{\pi_0} + \log\frac{\sigma_0}{\sigma_1}
              + \frac{(s-\mu_0)^2}{2\sigma_0^2} - \frac{(s-\mu_1)^2}{2\sigma_1^2}

    Standardised distances are formed before squaring so that large raw scores do not overflow.
    Eq. (10): ``s`` is a clone negative where this is ``> 0``.
    """
    sd_c, sd_s = math.sqrt(fit.var_clone), math.sqrt(fit.var_salient)
    const = math.log(fit.prior_clone / fit.prior_salient) + math.log(sd_s / sd_c)
    z_c = (scores - fit.mu_clone) / sd_c
    z_s = (scores - fit.mu_salient) / sd_s
    return const + 0.5 * (z_s.square() - z_c.square())


def clone_posterior(scores: torch.Tensor, fit: GDAFit) -> torch.Tensor:
    """``p(C | s)`` of Eq. (9) (the logistic of :func:`clone_log_odds`)."""
    return torch.sigmoid(clone_log_odds(scores, fit))


def _clone_region(fit: GDAFit) -> tuple[float, float, bool]:
    """Eq. (10) as bounds: S* = ``lo < s < hi`` (``inside``) or ``s < lo or s > hi``.

    The log-odds of :func:`clone_log_odds` are the quadratic ``a s^2 + b s + c``; its roots
    (stable quadratic formula, float64) bound the clone region, so classifying ``B x (B + K)``
    scores costs two comparisons each instead of evaluating the log-odds. Equivalent to
    ``clone_log_odds(s, fit) > 0`` up to rounding at the roots (tested).
    """
    mu1, var1, mu0, var0 = fit.mu_clone, fit.var_clone, fit.mu_salient, fit.var_salient
    const = math.log(fit.prior_clone / fit.prior_salient) + 0.5 * math.log(var0 / var1)
    a = 0.5 / var0 - 0.5 / var1
    b = mu1 / var1 - mu0 / var0
    c = const + 0.5 * mu0 * mu0 / var0 - 0.5 * mu1 * mu1 / var1
    inf = math.inf
    if a == 0.0:
        if b == 0.0:
            return (-inf, inf, True) if c > 0 else (inf, -inf, True)
        root = -c / b
        return (root, inf, True) if b > 0 else (-inf, root, True)
    disc = b * b - 4.0 * a * c
    if disc <= 0.0:
        # No sign change: positive everywhere (a > 0) or nowhere (a < 0), up to one root point.
        return (-inf, inf, True) if a > 0 else (inf, -inf, True)
    q = -0.5 * (b + math.copysign(math.sqrt(disc), b))
    r1, r2 = sorted((q / a, c / q))
    # a < 0: clones between the roots (the clone Gaussian is narrower); a > 0: outside them.
    return r1, r2, a < 0


# --------------------------------------------------------------------------------------------
# Eq. (7)-(11): anchor selection
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AdaCLAnchor:
    """Outcome of :func:`adacl_anchor` on one batch.

    ``guard`` names the reason no anchor was found (``"degenerate_variance"`` or
    ``"empty_clone_set"``), else ``None``. ``anchor`` (``s_uu``) and ``log_sigma_anchor``
    (``log Sigma_anchor``, float64) are floats, ``row`` the anchor row ``u``, ``clone_count``
    = ``|S*|``, ``salient_row`` / ``clone_row`` the rows of S_sln / S_cln.
    """

    anchor: float | None
    log_sigma_anchor: float | None
    row: int | None
    clone_count: int
    salient_row: int | None
    clone_row: int | None
    fit: GDAFit | None
    guard: str | None


def adacl_anchor(
    sim: torch.Tensor,
    *,
    pos_mask: torch.Tensor | None = None,
    extra_neg_txt: torch.Tensor | None = None,
    extra_neg_txt_mask: torch.Tensor | None = None,
    selection: str = "median",
    top_k: int | None = None,
    min_variance: float = 1e-12,
    generator: torch.Generator | None = None,
) -> AdaCLAnchor:
    r"""Select the AdaCL anchor of a batch, Eq. (7)-(11) and Algorithm 1 steps 2-3.

    Readings of the paper made here:

    * **Rows.** Each row ``i`` (image anchor ``I_i``) with its positive ``s_ii`` and its
      negatives: the in-batch texts outside ``pos_mask`` plus the memory-queue texts of
      ``extra_neg_txt`` allowed by ``extra_neg_txt_mask`` (``M_i`` of them). Rows are used, not
      columns, because Eq. (4) writes :math:`\Sigma_\mathrm{anchor}` over
      :math:`s(I_u, T_k)`, an image anchor. Queue images (``extra_neg_img``) are negatives of
      text anchors and play no part here.
    * **Eq. (7)** salient score :math:`s_{ii} - \frac{1}{M_i}\sum_{j} s_{ij}` over the row's
      negatives. Only rows with at least 2 negatives are eligible. S_sln = negatives of the
      row with the highest score (class C-bar, not clone); S_cln = negatives of the row with the
      lowest (class C, clone). ``top_k`` (A.10, off by default as in the paper's main
      results) fits each class on the ``top_k`` largest scores of its set instead.
    * **Eq. (8)-(10)** the GDA of :func:`fit_gda` (maximum-likelihood means and two-pass
      variances of the two rows, in the compute dtype of ``sim``; float64 host values) and
      :func:`clone_log_odds`; S* = every negative of every row (in-batch and queue) with
      log-odds > 0, i.e. :math:`p(C|s) > p(\bar C|s)`, found through the roots of the log-odds
      quadratic (:func:`_clone_region`). :math:`\Sigma_\mathrm{anchor}` is summed in float64.
    * **Eq. (11)** :math:`\Delta S = \{|s_{ii} - s| : s \in S^*\}` with ``s_ii`` the positive of
      the row ``s`` belongs to. ``selection="median"`` takes the clone whose delta is the lower
      median (rank ``ceil(|S*|/2)``, so it is an observed element), ``"min"`` / ``"max"`` the
      smallest / largest delta, ``"random"`` a uniform draw (``generator``, else the global RNG)
      -- the four rules of Table 5.
    * **The anchor is the positive score** :math:`s_{uu}` of the row ``u`` that this clone
      belongs to, and :math:`\Sigma_\mathrm{anchor} = \sum_k e^{s_{uk}}` sums that row's
      negatives (in-batch outside ``pos_mask``, plus queue). Eq. (11) reads
      ":math:`anchor := s^{pos} | \delta = median(\Delta S)`", Sec. 3.2 says the anchor score is
      :math:`s(I_u, T_u)` (":math:`s^{pos}` in Eq. 11"), and Eq. (4) puts the anchor in the
      positive slot of row ``u`` with :math:`\Sigma_\mathrm{anchor}` over that row's negatives;
      A.3's shorthand "the median of S*" (the clone score itself) is not consistent with those,
      so it is not followed.

    Guards: fewer than two eligible rows' worth of negatives or a variance ``<= min_variance``
    (or non-finite) gives ``guard="degenerate_variance"``; an empty S* gives
    ``guard="empty_clone_set"`` (this includes the case where one row is both S_sln and S_cln).
    Runs without gradient; synchronises with the host a few times (row picks, ``|S*|``).
    """
    if selection not in ANCHOR_SELECTIONS:
        raise ValueError(f"selection must be one of {ANCHOR_SELECTIONS}, got {selection!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 2):
        raise ValueError(f"top_k must be None or an integer >= 2, got {top_k!r}")
    if not (isinstance(min_variance, (int, float)) and min_variance >= 0):
        raise ValueError(f"min_variance must be a non-negative number, got {min_variance!r}")
    with torch.no_grad():
        batch = _prepare_batch(sim.detach(), pos_mask, _detached(extra_neg_txt), extra_neg_txt_mask)
        return _anchor_of_batch(batch, selection, top_k, min_variance, generator)


def _kth_smallest_index(values: torch.Tensor, k: int) -> int:
    """Index of the ``k``-th smallest entry (1-based) of a 1-D tensor.

    On CPU numpy's introselect is used: ``torch.kthvalue`` is some 50x slower there on the
    ``~10^5`` deltas of a queue batch (measured), and this step would dominate AdaCL's cost.
    """
    if values.device.type == "cpu":
        return int(np.argpartition(values.numpy(), k - 1)[k - 1])
    return int(values.kthvalue(k).indices)


def _detached(t: torch.Tensor | None) -> torch.Tensor | None:
    return t.detach() if isinstance(t, torch.Tensor) else t


@torch.no_grad()
def _anchor_of_batch(
    batch: _Batch,
    selection: str,
    top_k: int | None,
    min_variance: float,
    generator: torch.Generator | None,
) -> AdaCLAnchor:
    s = batch.sim.detach()
    pos = s.diagonal()
    width = s.shape[0]
    # Candidate blocks of every row: in-batch texts, then queue texts, visited in turn rather
    # than concatenated. Non-negatives become NaN, which every comparison below rejects.
    blocks = [s.masked_fill(~batch.negatives, math.nan)]
    n_neg = torch.count_nonzero(batch.negatives, dim=1)
    if batch.q_txt is not None:
        q, q_mask = batch.q_txt.detach(), batch.q_txt_mask
        if q_mask is None:
            blocks.append(q)
            n_neg = n_neg + q.shape[1]
        else:
            blocks.append(q.masked_fill(~q_mask, math.nan))
            n_neg = n_neg + torch.count_nonzero(q_mask.expand(q.shape), dim=1)
    count = n_neg.clamp(min=1)
    mean_neg = sum(x.nansum(dim=1) for x in blocks) / count
    salient = pos - mean_neg
    if top_k is None:
        # Two-pass (maximum-likelihood) variance of every row's negatives, so that one host
        # transfer brings the salient / clone rows together with their GDA statistics.
        var_neg = sum((x - mean_neg[:, None]).square_().nansum(dim=1) for x in blocks) / count
        extra = [mean_neg, var_neg, n_neg.to(mean_neg.dtype)]
    else:
        extra = []
    picks = torch.stack([salient.argmax(), salient.argmin(), n_neg.min()]).to(pos.dtype)
    host = torch.cat([picks, *extra]).tolist()
    i_plus, i_minus, fewest = (int(v) for v in host[:3])
    if fewest < 2:  # rare: rows with fewer than two negatives cannot define a variance
        eligible = n_neg >= 2
        picks = torch.stack(
            [
                torch.where(eligible, salient, -math.inf).argmax(),
                torch.where(eligible, salient, math.inf).argmin(),
                eligible.any(),
            ]
        )
        i_plus, i_minus, any_eligible = picks.tolist()
        if not any_eligible:
            return AdaCLAnchor(None, None, None, 0, None, None, None, "degenerate_variance")
    if top_k is None:
        width_b = pos.shape[0]
        means, variances, sizes = (host[3 + k * width_b : 3 + (k + 1) * width_b] for k in range(3))
        total = sizes[i_plus] + sizes[i_minus]
        fit = GDAFit(
            mu_clone=means[i_minus],
            var_clone=variances[i_minus],
            prior_clone=sizes[i_minus] / total,
            mu_salient=means[i_plus],
            var_salient=variances[i_plus],
            prior_salient=sizes[i_plus] / total,
        )
    else:
        fit = _fit_nan_rows(_host_rows(blocks, [i_plus, i_minus]), top_k)
    if not all(math.isfinite(v) and v > min_variance for v in (fit.var_clone, fit.var_salient)):
        return AdaCLAnchor(None, None, None, 0, i_plus, i_minus, fit, "degenerate_variance")
    lo, hi, inside = _clone_region(fit)
    # Delta S of every clone, +inf elsewhere: the k-th smallest over a whole block is then the
    # k-th smallest clone, with no compaction; the flat position gives the row directly.
    deltas, count = [], 0
    for x in blocks:
        clone = (x > lo) & (x < hi) if inside else (x < lo) | (x > hi)
        count += int(torch.count_nonzero(clone))
        deltas.append((pos[:, None] - x).abs_().masked_fill_(~clone, math.inf).flatten())
    delta = torch.cat(deltas) if len(deltas) > 1 else deltas[0]
    if count == 0:
        return AdaCLAnchor(None, None, None, 0, i_plus, i_minus, fit, "empty_clone_set")
    if selection == "median":
        pick = _kth_smallest_index(delta, (count + 1) // 2)
    elif selection == "min":
        pick = int(delta.argmin())
    elif selection == "max":
        pick = int(delta.masked_fill(delta == math.inf, -1.0).argmax())
    else:
        if generator is None:
            r = int(torch.randint(count, ()))
        else:
            r = int(torch.randint(count, (), generator=generator, device=generator.device))
        pick = int((delta < math.inf).nonzero()[r, 0])
    in_batch = width * width
    u = pick // width if pick < in_batch else (pick - in_batch) // blocks[1].shape[1]
    row_u = _host_rows(blocks, [u])[0]
    values = row_u[~np.isnan(row_u)].astype(np.float64)
    top = values.max()
    log_sigma = float(top + math.log(np.exp(values - top).sum()))
    return AdaCLAnchor(float(s[u, u]), log_sigma, u, count, i_plus, i_minus, fit, None)


def _host_rows(blocks: list[torch.Tensor], index: list[int]) -> np.ndarray:
    """The given rows of every block side by side on the host, ``(len(index), width)``.

    The statistics of a few rows (GDA fit, ``Sigma_anchor``) are cheaper in numpy than as a
    dozen small tensor operations; on CPU the blocks are viewed, not copied.
    """
    if blocks[0].device.type == "cpu":
        parts = [x.numpy()[index] for x in blocks]
    else:
        idx = torch.tensor(index, device=blocks[0].device)
        parts = [x.index_select(0, idx).cpu().numpy() for x in blocks]
    return np.concatenate(parts, axis=1) if len(parts) > 1 else parts[0]


def _fit_nan_rows(rows: np.ndarray, top_k: int | None) -> GDAFit:
    """:func:`fit_gda` on row 0 (S_sln) and row 1 (S_cln) of a NaN-padded ``(2, N)`` array."""
    rows = rows.astype(np.float64)
    if top_k is not None:
        # Largest top_k of each row; NaN padding sorts last and is restored afterwards.
        ranked = -np.sort(-np.where(np.isnan(rows), -np.inf, rows), axis=1)[:, :top_k]
        rows = np.where(np.isneginf(ranked), np.nan, ranked)
    stats = []
    for row in rows:
        values = row[~np.isnan(row)]
        mean = values.sum() / values.size
        centred = values - mean
        stats.append((values.size, float(mean), float(centred @ centred) / values.size))
    (n_s, mu_s, var_s), (n_c, mu_c, var_c) = stats
    return GDAFit(
        mu_clone=mu_c,
        var_clone=var_c,
        prior_clone=n_c / (n_s + n_c),
        mu_salient=mu_s,
        var_salient=var_s,
        prior_salient=n_s / (n_s + n_c),
    )


# --------------------------------------------------------------------------------------------
# Module
# --------------------------------------------------------------------------------------------


def _ids_for_queue(ids: Ids | None, name: str, rows: int) -> torch.Tensor | None:
    if ids is None:
        return None
    if isinstance(ids, torch.Tensor):
        return as_id_tensor(ids, name, rows)
    if isinstance(ids, Sequence) and not isinstance(ids, str):
        return as_id_tensor(list(ids), name, rows)
    raise ValueError(f"{name} must be a 1-D integer tensor or a sequence of ints")


@register_loss("adacl")
class AdaCLLoss(PairLoss):
    r"""AdaCL (Algorithm 1): :func:`adacl_loss` with margins re-estimated every training batch.

    State, all saved by ``state_dict``: the buffers ``m1``, ``m2`` (initially the paper's 20 and
    0.1) and the memory queues when ``queue_size > 0``; as extra state (host values), the last
    ``anchor`` and ``log_sigma_anchor``, ``clone_count`` (``|S*|``), ``steps`` (training batches
    seen), ``guard_counts`` (one counter per entry of :data:`GUARDS`) and ``last_guard`` (-1
    before the first batch, 0 after an accepted update, else 1 + the index of the guard).

    In training mode each call of :meth:`from_similarity` (hence of ``forward``) first runs
    Algorithm 1 steps 2-5 on the detached batch -- :func:`adacl_anchor`, then
    :func:`adacl_margins` -- and then computes the loss with the new margins (step 6). In eval
    mode the margins are used as they are. No gradient flows through ``m1`` and ``m2``.

    * **Guards.** A degenerate variance (``<= min_variance``), an empty S*, an anchor
      ``>= max_anchor`` (default 1, where Eq. 6 has no positive ``m1``) or margins that are not
      finite (or ``m1 <= 0`` after rounding to the buffer dtype) keep the previous margins and
      increment the matching counter; at most one guard fires per batch. ``m1`` grows as
      ``10.5 / (1 - anchor)`` with the paper's ``p_u, eps``: an anchor a rounding error below 1
      (a positive pair of identical embeddings) gives ``m1 ~ 1e8``; lower ``max_anchor`` (e.g.
      0.999) to refuse such near-singular anchors as well.
    * **Smoothing.** ``margin_momentum`` ``mu`` (default 0: the paper's raw per-batch values)
      blends an accepted update as ``m <- mu * m_prev + (1 - mu) * m_new``; the paper reports
      oscillating ``m1`` early in training (Fig. 3a), which this can damp.
    * **Memory queue** (Sec. 4.1, A.9: size 4096 in the paper). With ``queue_size > 0`` the
      module owns two :class:`~vlret.memory.MemoryQueue` of ``embed_dim`` keys (``img_queue``,
      ``txt_queue``). ``forward`` scores the batch against them (masked by image id, so an
      image's own captions are never queue negatives), and after the loss, in training mode,
      enqueues ``img_keys`` / ``txt_keys`` (the momentum encoder's outputs,
      :class:`~vlret.memory.MomentumEncoder`) or, when not given, the detached batch
      embeddings. Queue negatives enter the denominators and the anchor statistics (``M`` =
      batch plus queue, as in Eq. 1). Ids stored in the queue must be integers.
    * **Distributed.** Queues gather keys from all ranks. With ``sync_margins=True`` the margins
      accepted on rank 0 are broadcast after each update, so every rank trains with the same
      ``m1, m2``; anchors, ``|S*|`` and guard counters stay per rank.
    * ``last_stats`` is a dict of plain Python values for logging (see
      :func:`vlret.analysis.adacl_plots.append_stats`).

    Calling the loss twice per optimiser step updates the margins twice.
    """

    paper = "AdaCL (adaptive contrastive, clone negs)"
    equation = "AdaCL Eq. (3)-(11), Alg. 1"

    def __init__(
        self,
        *,
        m1_init: float = 20.0,
        m2_init: float = 0.1,
        p_u: float = DEFAULT_P_U,
        eps: float = DEFAULT_EPS,
        anchor_selection: str = "median",
        top_k: int | None = None,
        margin_momentum: float = 0.0,
        min_variance: float = 1e-12,
        max_anchor: float = 1.0,
        queue_size: int = 0,
        embed_dim: int | None = None,
        sync_margins: bool = True,
        reduction: str = "mean",
        normalize: bool = True,
    ) -> None:
        super().__init__(reduction=reduction, normalize=normalize)
        _check_margin(m1_init, "m1_init", positive=True)
        _check_margin(m2_init, "m2_init", positive=False)
        _check_probabilities(p_u, eps)
        if anchor_selection not in ANCHOR_SELECTIONS:
            raise ValueError(
                f"anchor_selection must be one of {ANCHOR_SELECTIONS}, got {anchor_selection!r}"
            )
        if top_k is not None and (
            isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 2
        ):
            raise ValueError(f"top_k must be None or an integer >= 2, got {top_k!r}")
        if not (isinstance(margin_momentum, (int, float)) and 0.0 <= margin_momentum < 1.0):
            raise ValueError(f"margin_momentum must be in [0, 1), got {margin_momentum!r}")
        if not (isinstance(min_variance, (int, float)) and min_variance >= 0):
            raise ValueError(f"min_variance must be a non-negative number, got {min_variance!r}")
        if not (isinstance(max_anchor, (int, float)) and max_anchor <= 1.0):
            raise ValueError(f"max_anchor must be a number <= 1, got {max_anchor!r}")
        if isinstance(queue_size, bool) or not isinstance(queue_size, int) or queue_size < 0:
            raise ValueError(f"queue_size must be a non-negative integer, got {queue_size!r}")
        if queue_size and embed_dim is None:
            raise ValueError("embed_dim is required when queue_size > 0")
        self.p_u = float(p_u)
        self.eps = float(eps)
        self.anchor_selection = anchor_selection
        self.top_k = top_k
        self.margin_momentum = float(margin_momentum)
        self.min_variance = float(min_variance)
        self.max_anchor = float(max_anchor)
        self.queue_size = queue_size
        self.sync_margins = bool(sync_margins)
        self.register_buffer("m1", torch.tensor(float(m1_init)))
        self.register_buffer("m2", torch.tensor(float(m2_init)))
        # Bookkeeping lives on the host (saved through get_extra_state): updating it costs no
        # tensor operations, which matter at small batches.
        self.steps = 0
        self.anchor = math.nan
        self.log_sigma_anchor = math.nan
        self.clone_count = 0
        self.guard_counts = [0] * len(GUARDS)
        self.last_guard = -1
        if queue_size:
            self.img_queue: MemoryQueue | None = MemoryQueue(queue_size, embed_dim)
            self.txt_queue: MemoryQueue | None = MemoryQueue(queue_size, embed_dim)
        else:
            self.img_queue = None
            self.txt_queue = None

    # -- state update (Algorithm 1 steps 2-5) ---------------------------------------------

    @torch.no_grad()
    def update_margins(
        self,
        sim: torch.Tensor,
        pos_mask: torch.Tensor | None = None,
        *,
        extra_neg_txt: torch.Tensor | None = None,
        extra_neg_txt_mask: torch.Tensor | None = None,
    ) -> str | None:
        """Re-estimate ``m1, m2`` from one batch; returns the guard that fired, or ``None``."""
        batch = _prepare_batch(sim.detach(), pos_mask, _detached(extra_neg_txt), extra_neg_txt_mask)
        return self._update(batch)

    @torch.no_grad()
    def _update(self, batch: _Batch) -> str | None:
        self.steps += 1
        found = _anchor_of_batch(
            batch, self.anchor_selection, self.top_k, self.min_variance, generator=None
        )
        guard = found.guard
        self.clone_count = found.clone_count
        if found.anchor is None:
            self.anchor = self.log_sigma_anchor = math.nan
        else:
            # The closed form runs on host floats (float64), without small tensor operations.
            anchor, log_sigma = found.anchor, found.log_sigma_anchor
            self.anchor, self.log_sigma_anchor = anchor, log_sigma
            if anchor >= self.max_anchor:
                guard = "anchor_ge_one"
            else:
                m1, m2 = _margins_from_log_sigma(anchor, log_sigma, self.p_u, self.eps)
                mu = self.margin_momentum
                if mu:
                    prev_m1, prev_m2 = torch.stack([self.m1, self.m2]).double().tolist()
                    m1 = mu * prev_m1 + (1.0 - mu) * m1
                    m2 = mu * prev_m2 + (1.0 - mu) * m2
                info = torch.finfo(self.m1.dtype)
                if math.isfinite(m2) and abs(m2) <= info.max and info.tiny <= m1 <= info.max:
                    self.m1.fill_(m1)
                    self.m2.fill_(m2)
                else:
                    guard = "nonfinite_margins"
        if guard is None:
            self.last_guard = 0
        else:
            code = GUARDS.index(guard)
            self.guard_counts[code] += 1
            self.last_guard = code + 1
        if self.sync_margins and dist.is_available() and dist.is_initialized():
            if dist.get_world_size() > 1:
                packed = torch.stack([self.m1, self.m2])
                dist.broadcast(packed, src=0)
                self.m1.copy_(packed[0])
                self.m2.copy_(packed[1])
        return guard

    @property
    def last_stats(self) -> dict[str, float | int | str | None]:
        """Margins, anchor, ``|S*|`` and guard counters after the last batch, as plain values.

        Keys: ``step``, ``m1``, ``m2``, ``anchor`` (``None`` when no anchor was found),
        ``log_sigma_anchor``, ``clone_count``, ``updated`` (the margins were re-estimated),
        ``guard`` (name of the guard that fired, or ``None``) and ``guard_<name>`` counters.
        """
        code = self.last_guard
        stats: dict[str, float | int | str | None] = {
            "step": self.steps,
            "m1": float(self.m1),
            "m2": float(self.m2),
            "anchor": self.anchor if math.isfinite(self.anchor) else None,
            "log_sigma_anchor": (
                self.log_sigma_anchor if math.isfinite(self.log_sigma_anchor) else None
            ),
            "clone_count": self.clone_count,
            "updated": code == 0,
            "guard": GUARDS[code - 1] if code > 0 else None,
        }
        for name, n in zip(GUARDS, self.guard_counts, strict=True):
            stats[f"guard_{name}"] = n
        return stats

    def get_extra_state(self) -> dict[str, object]:
        return {
            "steps": self.steps,
            "anchor": self.anchor,
            "log_sigma_anchor": self.log_sigma_anchor,
            "clone_count": self.clone_count,
            "guard_counts": dict(zip(GUARDS, self.guard_counts, strict=True)),
            "last_guard": self.last_guard,
        }

    def set_extra_state(self, state: dict[str, object]) -> None:
        if not isinstance(state, dict) or set(state) != set(self.get_extra_state()):
            raise ValueError("AdaCLLoss extra state must be a dict saved by AdaCLLoss")
        self.steps = int(state["steps"])
        self.anchor = float(state["anchor"])
        self.log_sigma_anchor = float(state["log_sigma_anchor"])
        self.clone_count = int(state["clone_count"])
        counts = state["guard_counts"]
        self.guard_counts = [int(counts.get(name, 0)) for name in GUARDS]
        self.last_guard = int(state["last_guard"])

    # -- loss -------------------------------------------------------------------------------

    def from_similarity(
        self,
        sim: torch.Tensor,
        pos_mask: torch.Tensor | None = None,
        *,
        extra_neg_txt: torch.Tensor | None = None,
        extra_neg_img: torch.Tensor | None = None,
        extra_neg_txt_mask: torch.Tensor | None = None,
        extra_neg_img_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        batch = _prepare_batch(
            sim, pos_mask, extra_neg_txt, extra_neg_txt_mask, extra_neg_img, extra_neg_img_mask
        )
        if self.training:
            self._update(batch)
        # Clones: a later in-place update must not touch tensors saved for this backward.
        return _loss_of_batch(batch, self.m1.clone(), self.m2.clone(), self.reduction)

    def forward(
        self,
        img_emb: torch.Tensor,
        txt_emb: torch.Tensor,
        img_ids: Ids | None = None,
        txt_ids: Ids | None = None,
        *,
        img_keys: torch.Tensor | None = None,
        txt_keys: torch.Tensor | None = None,
    ) -> torch.Tensor:
        sim, pos_mask = self.similarity_and_mask(img_emb, txt_emb, img_ids, txt_ids)
        if self.img_queue is None or self.txt_queue is None:
            if img_keys is not None or txt_keys is not None:
                raise ValueError("img_keys/txt_keys need a memory queue (queue_size > 0)")
            return self.from_similarity(sim, pos_mask=pos_mask)
        batch = img_emb.shape[0]
        img_id_t = _ids_for_queue(img_ids, "img_ids", batch)
        txt_id_t = _ids_for_queue(txt_ids, "txt_ids", batch) if txt_ids is not None else img_id_t
        img_n = F.normalize(img_emb, dim=1) if self.normalize else img_emb
        txt_n = F.normalize(txt_emb, dim=1) if self.normalize else txt_emb
        # Copies: the enqueue below writes the buffers in place before backward runs.
        q_txt = self.txt_queue.keys.to(img_n.dtype, copy=True)
        q_img = self.img_queue.keys.to(txt_n.dtype, copy=True)
        loss = self.from_similarity(
            sim,
            pos_mask=pos_mask,
            extra_neg_txt=img_n @ q_txt.t(),
            extra_neg_img=q_img @ txt_n.t(),
            extra_neg_txt_mask=self.txt_queue.negative_mask(img_id_t),
            extra_neg_img_mask=self.img_queue.negative_mask(txt_id_t).t(),
        )
        if self.training:
            self.img_queue.enqueue(self._keys(img_keys, img_n, "img_keys"), img_id_t)
            self.txt_queue.enqueue(self._keys(txt_keys, txt_n, "txt_keys"), txt_id_t)
        return loss

    def _keys(self, keys: torch.Tensor | None, fallback: torch.Tensor, name: str) -> torch.Tensor:
        if keys is None:
            return fallback.detach()
        if not isinstance(keys, torch.Tensor) or keys.shape != fallback.shape:
            got = tuple(keys.shape) if isinstance(keys, torch.Tensor) else type(keys).__name__
            raise ValueError(f"{name} must have shape {tuple(fallback.shape)}, got {got}")
        keys = keys.detach()
        return F.normalize(keys, dim=1) if self.normalize else keys

    def extra_repr(self) -> str:
        return (
            f"m1={float(self.m1):.4g}, m2={float(self.m2):.4g}, p_u={self.p_u}, "
            f"eps={self.eps:.3g}, anchor_selection={self.anchor_selection!r}, "
            f"queue_size={self.queue_size}, reduction={self.reduction!r}"
        )
