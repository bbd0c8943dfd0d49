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

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from .._checks import (
    FLAG,
    NON_NEGATIVE,
    POSITIVE,
    REAL,
    Choice,
    Number,
    ParamError,
    check_embeddings,
    check_finite,
    check_pos_mask,
    check_reduction,
    check_similarity,
    compute_dtype,
)
from ..memory import MemoryQueue, as_id_tensor
from ..similarity import Ids
from ._base import LossCapabilities, PairLoss, init_args, reduce_terms
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


def _check_temperature(value: float) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not (0.0 < value < math.inf)
    ):
        raise ValueError(f"negative_temperature must be a positive finite number, got {value!r}")
    return float(value)


def _check_scale_negatives(scale_negatives: bool, temperature: float) -> None:
    if not isinstance(scale_negatives, bool):
        raise ValueError(f"scale_negatives must be a bool, got {scale_negatives!r}")
    if scale_negatives and temperature != 1.0:
        raise ValueError(
            "scale_negatives=True scales the negatives by m1; it excludes a "
            f"negative_temperature other than 1, got {temperature!r}"
        )


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


@dataclass(frozen=True)
class _Block:
    """Scores in the compute dtype with the entries that are *not* negatives.

    ``excluded`` (bool) is ``None`` when every entry is a negative; ``out`` is the same mask as
    0 / 1 in the compute dtype and ``penalty`` is ``out * finfo(dtype).min``. The loss adds
    ``penalty`` (the backward pass of an addition is free, unlike that of ``masked_fill``) and
    the anchor statistics multiply by ``1 - out``. Masks are converted through ``uint8``, which
    torch turns into floats several times faster than ``bool`` on CPU.
    """

    scores: torch.Tensor
    excluded: torch.Tensor | None = None
    out: torch.Tensor | None = None
    penalty: torch.Tensor | None = None


def _block(scores: torch.Tensor, excluded: torch.Tensor | None) -> _Block:
    if excluded is None:
        return _Block(scores)
    excluded = excluded.contiguous()
    out = excluded.view(torch.uint8).to(scores.dtype)
    return _Block(scores, excluded, out, out * torch.finfo(scores.dtype).min)


@dataclass(frozen=True)
class _Batch:
    """Validated inputs: ``sim`` (its excluded entries: the diagonal and ``pos_mask``) and the
    optional queue blocks ``q_txt`` ``(B, K)`` and ``q_img`` ``(K', B)``."""

    sim: _Block
    q_txt: _Block | None
    q_img: _Block | None


def _prepare_batch(
    sim: torch.Tensor,
    pos_mask: torch.Tensor | None,
    extra_neg_txt: torch.Tensor | None,
    extra_neg_txt_mask: torch.Tensor | None,
    extra_neg_img: torch.Tensor | None = None,
    extra_neg_img_mask: torch.Tensor | None = None,
) -> _Batch:
    check_similarity(sim)
    excluded = check_pos_mask(pos_mask, sim.shape[0], sim.device)
    s = sim.to(compute_dtype(sim.dtype))
    b = s.shape[0]
    q_txt, q_txt_mask = _extra(
        extra_neg_txt, extra_neg_txt_mask, "extra_neg_txt", (b, None), s.dtype, s.device
    )
    q_img, q_img_mask = _extra(
        extra_neg_img, extra_neg_img_mask, "extra_neg_img", (None, b), s.dtype, s.device
    )
    return _Batch(
        _block(s, excluded),
        None if q_txt is None else _block(q_txt, None if q_txt_mask is None else ~q_txt_mask),
        None if q_img is None else _block(q_img, None if q_img_mask is None else ~q_img_mask),
    )


def _negative_logsumexp(block: _Block, dim: int, scale: float = 1.0) -> torch.Tensor:
    """``log sum exp`` of the negatives of a block along ``dim``, logits ``scale * s``.

    Excluded entries get the dtype's most negative finite value added (never ``-inf``, whose
    arithmetic produces NaN gradients), so they contribute ``exp(-huge) = 0`` and a line
    without negatives gives about that value, hence a graph-attached zero loss term. The
    penalty is added after scaling, so it cannot overflow to ``-inf``.
    """
    scores = block.scores if _is_one(scale) else block.scores * scale
    scores = scores if block.penalty is None else scores + block.penalty
    return scores.logsumexp(dim)


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
    negative_temperature: float = 1.0,
    scale_negatives: bool = False,
) -> torch.Tensor:
    r"""AdaCL loss for fixed margins, Eq. (3) with the cross-entropy of Eq. (2) / (13):

    .. math:: \hat p_i = \frac{e^{m_1(s_{ii} - m_2)}}
              {e^{m_1(s_{ii} - m_2)} + \sum_{j \ne i} e^{s_{ij}}}, \qquad
              \ell_i = -\log \hat p_i

    The positive logit is scaled and shifted, the negative logits are the raw similarities as
    printed (no temperature). It is applied in both directions, image->text on row ``i`` and
    text->image on column ``i`` (Eq. 3 is written for an image anchor; the paper trains its
    retrieval models bidirectionally), computed stably as
    ``log(1 + exp(logsumexp_j s_ij - m1 (s_ii - m2)))``: the negatives' log-sum-exp does not
    depend on the margins, so one masked copy of ``sim`` serves both directions.

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

    ``negative_temperature`` ``t`` (default 1: Eq. 3 as printed; not in the paper) divides
    every negative logit, in-batch and queue: the denominators sum ``exp(s_ij / t)``, the
    temperature of Eq. (1)-(2) kept on the negatives while the positive logit stays
    ``m1 (s_ii - m2)``. Identity (tested): ``adacl_loss(sim, m1=1/t, m2=0,
    negative_temperature=t) == infonce_loss(sim, temperature=t)``. :class:`AdaCLLoss` uses
    the same scaled negatives for ``Sigma_anchor``, so Eq. (4) and (6) keep holding for the
    loss actually trained (see its notes and docs/adacl.md, "Training dynamics").

    ``scale_negatives=True`` (not in the paper's printed Eq. 3; excludes
    ``negative_temperature``) gives the negatives the positive's scale: ``exp(m1 s_ij)``, i.e.
    a softmax at temperature ``1/m1`` with the shift ``m2`` on the positive only (the
    scale-and-margin form of CosFace). Identity (tested): ``adacl_loss(sim, m1=1/t, m2=0,
    scale_negatives=True) == infonce_loss(sim, temperature=t)``.
    """
    _check_margin(m1, "m1", positive=True)
    _check_margin(m2, "m2", positive=False)
    check_reduction(reduction)
    t = _check_temperature(negative_temperature)
    _check_scale_negatives(scale_negatives, t)
    scale: float | torch.Tensor = m1 if scale_negatives else 1.0 / t
    batch = _prepare_batch(
        sim, pos_mask, extra_neg_txt, extra_neg_txt_mask, extra_neg_img, extra_neg_img_mask
    )
    return _loss_of_batch(batch, m1, m2, reduction, scale=scale)


def _is_one(scale: float | torch.Tensor) -> bool:
    return not isinstance(scale, torch.Tensor) and scale == 1.0


def _negatives_logsumexp(
    batch: _Batch, scale: float | torch.Tensor = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """``log sum exp`` of every row's (image->text) and column's (text->image) negative logits
    ``scale * s`` (``scale = 1 / negative_temperature``), queue included: ``log Sigma`` of
    Eq. (3)-(4), independent of the margins."""
    sim = batch.sim
    filled = sim.scores if _is_one(scale) else sim.scores * scale
    filled = filled if sim.penalty is None else filled + sim.penalty
    lse_row = filled.logsumexp(1)
    lse_col = filled.logsumexp(0)
    if batch.q_txt is not None:
        lse_row = torch.logaddexp(lse_row, _negative_logsumexp(batch.q_txt, 1, scale))
    if batch.q_img is not None:
        lse_col = torch.logaddexp(lse_col, _negative_logsumexp(batch.q_img, 0, scale))
    return lse_row, lse_col


def _loss_of_batch(
    batch: _Batch,
    m1: float | torch.Tensor,
    m2: float | torch.Tensor,
    reduction: str,
    lse: tuple[torch.Tensor, torch.Tensor] | None = None,
    scale: float | torch.Tensor = 1.0,
) -> torch.Tensor:
    """Eq. (3) in both directions, negative logits ``scale * s``; ``lse`` is
    :func:`_negatives_logsumexp` (with the same ``scale``) when already known."""
    s = batch.sim.scores
    if isinstance(m1, torch.Tensor):
        m1 = m1.to(device=s.device, dtype=s.dtype)
    if isinstance(m2, torch.Tensor):
        m2 = m2.to(device=s.device, dtype=s.dtype)
    if isinstance(scale, torch.Tensor):
        scale = scale.to(device=s.device, dtype=s.dtype)
    lse_row, lse_col = _negatives_logsumexp(batch, scale) if lse is None else lse
    pos_logit = m1 * (s.diagonal() - m2)
    zero = torch.zeros((), dtype=s.dtype, device=s.device)
    img_terms = torch.logaddexp(zero, lse_row - pos_logit)
    txt_terms = torch.logaddexp(zero, lse_col - pos_logit)
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
      GDA does), computed in float64 on the host (as :func:`adacl_anchor` and
      :class:`AdaCLLoss` do for the two rows).
    * Each class keeps its own variance, as Eq. (9) and (27) are written (the paper mentions
      GDA's usual shared covariance, but its formula has :math:`\sigma_0 \ne \sigma_1`).
    * Priors come from the sizes of the two sets:
      :math:`\pi_1 = |S_{cln}| / (|S_{cln}| + |S_{sln}|)`.
    """
    for name, t in (("salient_negatives", salient_negatives), ("clone_negatives", clone_negatives)):
        if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.numel() == 0:
            raise ValueError(f"{name} must be a non-empty 1-D tensor")
    return _fit_values(
        salient_negatives.detach().cpu().double().numpy(),
        clone_negatives.detach().cpu().double().numpy(),
        None,
    )


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
    negative_temperature: float = 1.0,
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
      variances of the two rows' negatives, float64 on the host) and
      :func:`clone_log_odds`; S* = every negative of every row (in-batch and queue) with
      log-odds > 0, i.e. :math:`p(C|s) > p(\bar C|s)`, found through the roots of the log-odds
      quadratic (:func:`_clone_region`). :math:`\Sigma_\mathrm{anchor}` is summed in float64.
    * **Eq. (11)** :math:`\Delta S = \{|s_{ii} - s| : s \in S^*\}` with ``s_ii`` the positive of
      the row ``s`` belongs to. ``selection="median"`` takes the clone whose delta is the lower
      median (rank ``ceil(|S*|/2)``, so it is an observed element; on CPU, among equal deltas
      the first in row-major order, batch block before queue block), ``"min"`` / ``"max"`` the
      smallest / largest delta, ``"random"`` a uniform draw (``generator``, else the global RNG;
      :class:`AdaCLLoss` passes its own seeded generator) -- the four rules of Table 5.
    * **The anchor is the positive score** :math:`s_{uu}` of the row ``u`` that this clone
      belongs to, and :math:`\Sigma_\mathrm{anchor} = \sum_k e^{s_{uk}}` sums that row's
      negatives (in-batch outside ``pos_mask``, plus queue). Eq. (11) reads
      ":math:`anchor := s^{pos} | \delta = median(\Delta S)`", Sec. 3.2 says the anchor score is
      :math:`s(I_u, T_u)` (":math:`s^{pos}` in Eq. 11"), and Eq. (4) puts the anchor in the
      positive slot of row ``u`` with :math:`\Sigma_\mathrm{anchor}` over that row's negatives;
      A.3's shorthand "the median of S*" (the clone score itself) is not consistent with those,
      so it is not followed.
    * ``negative_temperature`` ``t`` (default 1, the printed Eq. 3) only changes
      :math:`\Sigma_\mathrm{anchor} = \sum_k e^{s_{uk}/t}`, to match the negatives of
      :func:`adacl_loss` with the same ``t``. Salient scores, the GDA, S* and Delta S use the
      raw similarities (a common positive scale would not change S* or the ranks anyway), and
      the anchor stays the raw ``s_uu``: Eq. (6) pins the similarity 1.

    Guards: fewer than two eligible rows' worth of negatives or a variance ``<= min_variance``
    (or non-finite) gives ``guard="degenerate_variance"``; an empty S* gives
    ``guard="empty_clone_set"`` (this includes the case where one row is both S_sln and S_cln).
    Runs without gradient. On CPU the elementwise work over the ``B x (B + K)`` scores is done
    in numpy on views of the tensors; on other devices it stays there and a few scalars come to
    the host (row picks and the two rows, ``|S*|``, the pick, the anchor).
    """
    if selection not in ANCHOR_SELECTIONS:
        raise ValueError(f"selection must be one of {ANCHOR_SELECTIONS}, got {selection!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 2):
        raise ValueError(f"top_k must be None or an integer >= 2, got {top_k!r}")
    if not (isinstance(min_variance, (int, float)) and min_variance >= 0):
        raise ValueError(f"min_variance must be a non-negative number, got {min_variance!r}")
    scale = 1.0 / _check_temperature(negative_temperature)
    with torch.no_grad():
        batch = _prepare_batch(sim.detach(), pos_mask, _detached(extra_neg_txt), extra_neg_txt_mask)
        return _anchor_of_batch(batch, selection, top_k, min_variance, generator, scale=scale)


def _kth_smallest_index(values: torch.Tensor, k: int) -> int:
    """Index of the ``k``-th smallest entry (1-based) of a 1-D tensor.

    On CPU numpy's introselect finds the value and the first entry equal to it is returned:
    ``torch.kthvalue`` is some 50x slower there on the ``~10^5`` deltas of a queue batch, and
    ``np.partition`` plus a scan is twice as fast as ``np.argpartition`` (measured).
    """
    if values.device.type == "cpu":
        v = values.numpy()
        kth = np.partition(v, k - 1)[k - 1]
        return int(np.argmax(v == kth))
    return int(values.kthvalue(k).indices)


def _detached(t: torch.Tensor | None) -> torch.Tensor | None:
    return t.detach() if isinstance(t, torch.Tensor) else t


#: Signed integer type of the same width as a float type (for :func:`_fill_inf`).
_INT_OF_FLOAT = {np.dtype(np.float32): np.int32, np.dtype(np.float64): np.int64}


def _fill_inf(d: np.ndarray, mask: np.ndarray) -> None:
    """``d[mask] = +inf`` in place for a non-negative float array, without branches.

    Non-negative IEEE floats order like their bit patterns read as signed integers, so the
    integer maximum with ``mask * bits(+inf)`` sets the masked entries to ``+inf`` and leaves
    the others bit for bit. ``np.putmask`` (and ``masked_fill_``) are some 20x slower on the
    irregular clone masks (measured), the cost of mispredicted branches.
    """
    itype = _INT_OF_FLOAT.get(d.dtype)
    if itype is None:
        np.putmask(d, mask, np.inf)
        return
    bits = d.view(itype)
    fill = mask.view(np.uint8).astype(itype)
    fill *= np.array(np.inf, dtype=d.dtype).view(itype)
    np.maximum(bits, fill, out=bits)


def _blocks(batch: _Batch) -> list[_Block]:
    """The candidate blocks of every image row: in-batch texts, then queue texts (if any)."""
    return [batch.sim] if batch.q_txt is None else [batch.sim, batch.q_txt]


def _row_negatives(blocks: list[_Block], rows: list[int]) -> list[np.ndarray]:
    """The negatives of the given rows (in-batch, then queue) as float64 host arrays.

    The statistics of a few rows (GDA fit, ``Sigma_anchor``) are cheaper in numpy than as a
    dozen small tensor operations; on CPU the blocks are viewed, not copied.
    """
    per_row: list[list[np.ndarray]] = [[] for _ in rows]
    for block in blocks:
        x, excluded = block.scores.detach(), block.excluded
        if x.device.type == "cpu":
            values = x.numpy()[rows]
            drop = None if excluded is None else excluded.numpy()[rows]
        else:
            idx = torch.tensor(rows, device=x.device)
            values = x.index_select(0, idx).cpu().numpy()
            drop = None if excluded is None else excluded.index_select(0, idx).cpu().numpy()
        for k, parts in enumerate(per_row):
            parts.append(values[k] if drop is None else values[k][~drop[k]])
    return [np.concatenate(parts).astype(np.float64) for parts in per_row]


def _fit_values(salient: np.ndarray, clone: np.ndarray, top_k: int | None) -> GDAFit:
    """:func:`fit_gda` on float64 host arrays (``top_k``: the largest ``top_k`` of each)."""
    stats = []
    for values in (salient, clone):
        if top_k is not None:
            values = -np.sort(-values)[:top_k]
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


def _log_sum_exp(values: np.ndarray) -> float:
    top = values.max()
    return float(top + math.log(np.exp(values - top).sum()))


@torch.no_grad()
def _anchor_of_batch(
    batch: _Batch,
    selection: str,
    top_k: int | None,
    min_variance: float,
    generator: torch.Generator | None,
    log_sigma_rows: torch.Tensor | None = None,
    scale: float = 1.0,
) -> AdaCLAnchor:
    """Eq. (7)-(11) on a prepared batch. ``log_sigma_rows``: ``log Sigma`` of every row when
    the caller has it (the loss computes it, :func:`_negatives_logsumexp`, with the same
    ``scale``); else the anchor row's ``log sum exp(scale * s)`` is summed here in float64."""
    blocks = _blocks(batch)
    s = batch.sim.scores.detach()
    on_cpu = s.device.type == "cpu"
    pos = s.diagonal()
    width = s.shape[0]
    # Eq. (7) for every row: sum and number of the row's negatives. x - x * out is x for a
    # negative and exactly 0 otherwise, so the sums equal those over the negatives alone.
    total = torch.zeros_like(pos)
    n_neg = torch.zeros_like(pos)
    for block in blocks:
        x = block.scores.detach()
        if block.out is None:
            total += x.sum(1)
            n_neg += x.shape[1]
        else:
            total += torch.addcmul(x, x, block.out, value=-1.0).sum(1)
            n_neg += x.shape[1] - block.out.sum(1)
    salient = pos - total / n_neg.clamp(min=1)
    if on_cpu:
        salient_h, n_neg_h = salient.numpy(), n_neg.numpy()
    else:
        salient_h, n_neg_h = torch.stack([salient, n_neg]).cpu().numpy()
    eligible = n_neg_h >= 2
    if eligible.all():
        i_plus, i_minus = int(salient_h.argmax()), int(salient_h.argmin())
    elif eligible.any():  # rare: rows with fewer than two negatives cannot define a variance
        i_plus = int(np.where(eligible, salient_h, -np.inf).argmax())
        i_minus = int(np.where(eligible, salient_h, np.inf).argmin())
    else:
        return AdaCLAnchor(None, None, None, 0, None, None, None, "degenerate_variance")
    # Eq. (8)-(9): the GDA of the two rows' negatives, float64 on the host.
    fit = _fit_values(*_row_negatives(blocks, [i_plus, i_minus]), top_k)
    if not all(math.isfinite(v) and v > min_variance for v in (fit.var_clone, fit.var_salient)):
        return AdaCLAnchor(None, None, None, 0, i_plus, i_minus, fit, "degenerate_variance")
    lo, hi, inside = _clone_region(fit)
    # Eq. (10)-(11): Delta S of every clone, +inf elsewhere, written block by block into one
    # flat buffer: the k-th smallest over it is the k-th smallest clone, with no compaction,
    # and the flat position gives the row directly. On CPU numpy does the elementwise work
    # on views of the same memory (its comparisons are several times cheaper than torch's).
    sizes = [block.scores.numel() for block in blocks]
    delta = torch.empty(sum(sizes), dtype=s.dtype, device=s.device)
    count, offset = 0, 0
    for block, size in zip(blocks, sizes, strict=True):
        x, out = block.scores.detach(), block.excluded
        if on_cpu:
            x, out = x.numpy(), None if out is None else out.numpy()
        # Not a clone: outside the clone region of Eq. (10), or not a negative of the row.
        other = (x <= lo) | (x >= hi) if inside else (x >= lo) & (x <= hi)
        if out is not None:
            other |= out
        if on_cpu:
            count += size - int(np.count_nonzero(other))
            d = delta.numpy()[offset : offset + size].reshape(x.shape)
            np.abs(np.subtract(pos.numpy()[:, None], x, out=d), out=d)
            _fill_inf(d, other)
        else:
            count += size - int(torch.count_nonzero(other))
            d = delta[offset : offset + size].view(x.shape)
            torch.sub(pos[:, None], x, out=d).abs_().masked_fill_(other, math.inf)
        offset += size
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
    u = pick // width if pick < in_batch else (pick - in_batch) // blocks[1].scores.shape[1]
    if log_sigma_rows is None:
        log_sigma = _log_sum_exp(scale * _row_negatives(blocks, [u])[0])
        anchor = float(s.numpy()[u, u]) if on_cpu else float(pos[u])
    elif on_cpu:
        log_sigma, anchor = float(log_sigma_rows.numpy()[u]), float(s.numpy()[u, u])
    else:
        log_sigma, anchor = torch.stack([log_sigma_rows[u], pos[u]]).double().tolist()
    return AdaCLAnchor(anchor, log_sigma, u, count, i_plus, i_minus, fit, None)


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
    seen), ``guard_counts`` (one counter per entry of :data:`GUARDS`), ``last_guard`` (-1
    before the first batch, 0 after an accepted update, else 1 + the index of the guard),
    ``m1_capped`` (updates whose ``m1`` was capped by ``max_m1``) and the state of the module's
    random generator (``anchor_selection="random"``).

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
    * **Cap on m1** (not in the paper). Nothing bounds ``m1 = 10.47 / (1 - anchor)`` while the
      anchor stays below ``max_anchor``: 105 at an anchor of 0.9, 1047 at 0.99, and a 200-step
      run on random embeddings at B=64 reached ``m1 = 22,359`` without any guard firing. Such a
      scale makes the positive logit ``m1 (s_ii - m2)`` dominate every denominator (the loss
      and its gradient vanish for most pairs, and are huge for the few below ``m2``).
      ``max_m1`` (default ``None``: the paper's unbounded rule) clamps ``m1`` to ``max_m1`` and
      recomputes ``m2 = anchor + log((1 - p_u) / (p_u Sigma_anchor)) / m1`` for the clamped
      value, so Eq. (4) (the anchor's probability is ``p_u``) still holds and only Eq. (6) (the
      probability at similarity 1) is relaxed. The update is accepted and counted in
      ``m1_capped``. Recommended: ``max_m1=100``, about 2.6x the value the paper reports
      ``m1`` settling at (38.1, Fig. 3a); it leaves anchors up to ~0.895 untouched.
    * **Random anchor.** ``anchor_selection="random"`` draws from a ``torch.Generator`` owned by
      the module and seeded with ``seed`` (default 0), never from the global RNG, so it does
      not shift the training's random stream; its state is saved in the extra state, so a
      resumed checkpoint continues the same draws.
    * **Smoothing.** ``margin_momentum`` ``mu`` (default 0: the paper's raw per-batch values)
      blends an accepted update as ``m <- mu * m_prev + (1 - mu) * m_new``; the paper reports
      oscillating ``m1`` early in training (Fig. 3a), which this can damp.
    * **Negative logits** (not in the paper; defaults keep the printed Eq. 3, negatives
      ``exp(s_ij)``). Eq. (3) pulls a positive with the scale ``m1`` and pushes the
      negatives with the scale 1, so a shift ``c`` of every similarity changes a row's logit
      margin by ``(m1 - 1/t) c``: the loss rewards moving *all* similarities towards 1 when
      ``m1 > 1/t`` and towards -1 when ``m1 < 1/t``. Since ``m1 = 10.47 / (1 - anchor)`` rises
      and falls with the positives, this is a positive feedback, and on the tiny synthetic
      preset training collapses to a constant embedding (``t = 1``, m1 -> 7,000) or to
      image/text embeddings at cosine -1 (``t = 0.05`` or 0.1, m1 -> 5.2); see docs/adacl.md,
      "Training dynamics". ``negative_temperature=t`` divides every negative logit (batch and
      queue) and ``Sigma_anchor`` by ``t`` (Eq. 1-2's temperature kept on the negatives);
      ``scale_negatives=True`` gives the negatives the scale ``m1`` too (``exp(m1 s_ij)``, a
      softmax at temperature ``1/m1`` with the shift ``m2`` on the positive, as in CosFace),
      which makes the loss invariant to that common shift and is the setting that trains on
      the tiny preset. Eq. (20) does not involve ``Sigma_anchor``, so m1 is unchanged; with
      ``scale_negatives`` ``Sigma_anchor = sum_k exp(m1 s_uk)`` is summed at the new (possibly
      capped) ``m1`` before Eq. (22), so Eq. (4) and (6) hold for the loss actually trained.
    * **Warm-up.** ``warmup_steps=N`` (default 0) trains the first ``N`` training batches with
      the initial margins (``m1_init``, ``m2_init``) and starts the per-batch re-estimation
      after them (``last_stats["warmup"]``). In the paper's order (Algorithm 1: update, then
      loss) the initial values are otherwise overwritten before they are ever used.
    * **Memory queue** (Sec. 4.1, A.9: size 4096 in the paper). With ``queue_size > 0`` the
      module owns two :class:`~vlret.memory.MemoryQueue` of ``embed_dim`` keys (``img_queue``,
      ``txt_queue``). ``forward`` scores the batch against them (masked by image id, so an
      image's own captions are never queue negatives), and after the loss, in training mode,
      enqueues ``img_keys`` / ``txt_keys`` (the momentum encoder's outputs,
      :class:`~vlret.memory.MomentumEncoder`) or, when not given, the detached batch
      embeddings. Queue negatives enter the denominators and the anchor statistics (``M`` =
      batch plus queue, as in Eq. 1). Ids stored in the queue must be integers.
    * **Distributed.** Two ways of calling the loss under ``torch.distributed``:

      - *Global batch* (what :class:`vlret.train.Trainer` does, exact): every rank passes the
        all-gathered batch (:func:`vlret.train.distributed.gather_with_grad` for the
        embeddings, ids and momentum keys gathered without gradient) and ``gathered=True``.
        Every rank then computes the loss, the anchor and the margins of the single-process
        ``N*B`` batch against the same queue, and the queues enqueue the global keys exactly
        once, without a further all-gather (they stay identical on all ranks since their
        inputs are). ``N`` ranks of ``B`` pairs thus match one process on the concatenated
        batch, queue contents included.
      - *Local batch* (``gathered=False``, the default): each rank scores only its own ``B``
        pairs (in-batch negatives from that rank only) against the shared queue, and each
        queue all-gathers the keys of all ranks in rank order before writing them, so every
        rank still holds the same queue. This differs from one process on ``N*B`` pairs.

      In a single process ``gathered`` has no effect. With ``sync_margins=True`` the margins
      accepted on rank 0 are broadcast after each update, so every rank trains with the same
      ``m1, m2``; anchors, ``|S*|`` and guard counters stay per rank. The broadcast is a
      collective on the buffers themselves, so (1) the module must live on a device the process
      group's backend supports -- with NCCL, move the loss to the rank's CUDA device
      (``loss.to(device)``; CPU buffers fail there), with gloo CPU works -- and (2) every rank
      must run the training-mode forward the same number of times, in the same order as its
      other collectives (a rank that skips a batch, or runs an extra one, deadlocks the
      others). Eval-mode calls do not synchronise. ``sync_margins=False`` keeps margins per rank.
    * ``last_stats`` is a dict of plain Python values for logging (see
      :func:`vlret.analysis.adacl_plots.append_stats`).
    * **Large batches** (``chunk_size=N``): ``forward`` never builds the ``(B, B)`` matrix
      nor the ``(B, K)`` queue blocks. The loss is the tiled Eq. (3) and the margin update
      streams strips (:class:`~vlret.losses.tiled.TiledAdaCLBatch`: the same salient rows,
      GDA, clone set, count and selection rule as the dense update, about three more strip
      passes), so ``O(N x (B + K))`` memory. A batch of at most ``N`` rows (one strip) takes
      the dense path: the same numbers in the same memory, and faster.

    Calling the loss twice per optimiser step updates the margins twice.
    """

    paper = "AdaCL (adaptive contrastive, clone negs)"
    equation = "AdaCL Eq. (3)-(11), Alg. 1"
    # m2 is a shift (any real); p_u, eps are probabilities (Eq. 4, 6); anchors are similarities.
    params = {
        "m1_init": POSITIVE,
        "m2_init": REAL,
        "p_u": Number(gt=0, lt=1),
        "eps": Number(gt=0, lt=1),
        "anchor_selection": Choice(ANCHOR_SELECTIONS),
        "top_k": Number(integer=True, ge=2, optional=True),
        "margin_momentum": Number(ge=0, lt=1),
        "negative_temperature": POSITIVE,
        "scale_negatives": FLAG,
        "warmup_steps": Number(integer=True, ge=0),
        "min_variance": NON_NEGATIVE,
        "max_anchor": Number(le=1),
        "max_m1": Number(gt=0, optional=True),
        "seed": Number(integer=True),
        "queue_size": Number(integer=True, ge=0),
        "embed_dim": Number(integer=True, ge=1, optional=True),
        "sync_margins": FLAG,
    }

    declared = LossCapabilities(momentum_keys=True, paper_comparison=5)

    @classmethod
    def capabilities(cls, params: Mapping[str, Any] | None = None) -> LossCapabilities:
        """A memory queue (``queue_size > 0``) is owned and needs ``embed_dim``."""
        queue = bool((params or {}).get("queue_size", 0))
        return dataclasses.replace(cls.declared, owns_queue=queue, needs_embed_dim=queue)

    def current_capabilities(self) -> LossCapabilities:
        return type(self).capabilities({"queue_size": self.queue_size})

    @classmethod
    def check_param_relations(cls, params: Mapping[str, Any]) -> None:
        """``p_u + eps < 1`` (else Eq. 20 gives no positive ``m1``), ``scale_negatives`` only
        with ``negative_temperature=1``, and ``embed_dim`` with a queue."""
        if params["p_u"] + params["eps"] >= 1.0:
            raise ParamError(
                "p_u",
                f"p_u + eps must be below 1, got p_u={params['p_u']!r}, eps={params['eps']!r}",
            )
        try:
            _check_scale_negatives(params["scale_negatives"], params["negative_temperature"])
        except ValueError as err:
            raise ParamError("scale_negatives", str(err)) from None
        if params["queue_size"] and params["embed_dim"] is None:
            raise ParamError("embed_dim", "embed_dim is required when queue_size > 0")

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
        negative_temperature: float = 1.0,
        scale_negatives: bool = False,
        warmup_steps: int = 0,
        min_variance: float = 1e-12,
        max_anchor: float = 1.0,
        max_m1: float | None = None,
        seed: int = 0,
        queue_size: int = 0,
        embed_dim: int | None = None,
        sync_margins: bool = True,
        reduction: str = "mean",
        normalize: bool = True,
        chunk_size: int | None = None,
    ) -> None:
        AdaCLLoss.check_params(init_args(locals()))
        super().__init__(reduction=reduction, normalize=normalize, chunk_size=chunk_size)
        negative_temperature = float(negative_temperature)
        self.p_u = float(p_u)
        self.eps = float(eps)
        self.anchor_selection = anchor_selection
        self.top_k = top_k
        self.margin_momentum = float(margin_momentum)
        self.negative_temperature = negative_temperature
        self.scale_negatives = scale_negatives
        self.warmup_steps = warmup_steps
        self.min_variance = float(min_variance)
        self.max_anchor = float(max_anchor)
        self.max_m1 = None if max_m1 is None else float(max_m1)
        self.seed = seed
        self.generator = torch.Generator().manual_seed(seed)
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
        self.m1_capped = 0
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
    def _update(self, batch: _Batch, log_sigma_rows: torch.Tensor | None = None) -> str | None:
        return self._update_with(
            lambda: _anchor_of_batch(
                batch,
                self.anchor_selection,
                self.top_k,
                self.min_variance,
                generator=self.generator,
                log_sigma_rows=log_sigma_rows,
                scale=1.0 / self.negative_temperature,
            ),
            lambda row: _row_negatives(_blocks(batch), [row])[0],
        )

    @torch.no_grad()
    def _update_with(self, find_anchor, row_negatives) -> str | None:
        """Algorithm 1 steps 2-5 given ``find_anchor() -> AdaCLAnchor`` and
        ``row_negatives(u) -> float64 array`` (dense batch or tiled strips)."""
        self.steps += 1
        if self.steps <= self.warmup_steps:
            # Warm-up: the initial margins are used as they are; nothing is estimated.
            self.anchor = self.log_sigma_anchor = math.nan
            self.clone_count = 0
            self.last_guard = -1
            return None
        found = find_anchor()
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
                # Eq. (20): m1 depends on the anchor alone (Sigma_anchor cancels out).
                m1, _ = _margins_from_log_sigma(anchor, 0.0, self.p_u, self.eps)
                if self.max_m1 is not None and m1 > self.max_m1:
                    # Keep Eq. (4) for the capped scale: m2 from Eq. (22) with m1 = max_m1.
                    m1 = self.max_m1
                    self.m1_capped += 1
                if self.scale_negatives:
                    # Sigma_anchor = sum_k exp(m1 s_uk) with the m1 just found.
                    log_sigma = _log_sum_exp(m1 * row_negatives(found.row))
                    self.log_sigma_anchor = log_sigma
                # Eq. (22).
                m2 = anchor + (math.log((1.0 - self.p_u) / self.p_u) - log_sigma) / m1
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
        ``guard`` (name of the guard that fired, or ``None``), ``guard_<name>`` counters and
        ``m1_capped`` (updates clamped by ``max_m1``, a counter) and ``warmup`` (the last batch
        was within ``warmup_steps``, margins not re-estimated). Built when read: the update
        itself keeps only the buffers and a few host numbers.
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
        stats["m1_capped"] = self.m1_capped
        stats["warmup"] = 0 < self.steps <= self.warmup_steps
        return stats

    def get_extra_state(self) -> dict[str, object]:
        return {
            "steps": self.steps,
            "anchor": self.anchor,
            "log_sigma_anchor": self.log_sigma_anchor,
            "clone_count": self.clone_count,
            "guard_counts": dict(zip(GUARDS, self.guard_counts, strict=True)),
            "last_guard": self.last_guard,
            "m1_capped": self.m1_capped,
            "rng_state": self.generator.get_state(),
        }

    #: Extra-state keys added after the first release; older checkpoints load without them.
    _OPTIONAL_STATE = frozenset({"m1_capped", "rng_state"})

    def set_extra_state(self, state: dict[str, object]) -> None:
        keys = set(self.get_extra_state())
        if not isinstance(state, dict) or not keys - self._OPTIONAL_STATE <= set(state) <= keys:
            raise ValueError("AdaCLLoss extra state must be a dict saved by AdaCLLoss")
        self.steps = int(state["steps"])
        self.anchor = float(state["anchor"])
        self.log_sigma_anchor = float(state["log_sigma_anchor"])
        self.clone_count = int(state["clone_count"])
        counts = state["guard_counts"]
        self.guard_counts = [int(counts.get(name, 0)) for name in GUARDS]
        self.last_guard = int(state["last_guard"])
        self.m1_capped = int(state.get("m1_capped", 0))
        if "rng_state" in state:
            rng = state["rng_state"]
            if not isinstance(rng, torch.Tensor):
                raise ValueError("AdaCLLoss extra state: rng_state must be a uint8 tensor")
            # A checkpoint read with map_location may have moved it; generators take CPU bytes.
            self.generator.set_state(rng.detach().to("cpu", torch.uint8))

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
        return self._update_and_score(
            lambda scale: _negatives_logsumexp(batch, scale),
            lambda m1, m2, lse, scale: _loss_of_batch(batch, m1, m2, self.reduction, lse, scale),
            lambda log_sigma_rows: self._update(batch, log_sigma_rows),
        )

    def _update_and_score(self, negatives_lse, loss, update) -> torch.Tensor:
        """Algorithm 1: the margin update (steps 2-5, training mode only), then the loss with
        the new margins (step 6), for the dense blocks or the tiled strips alike.

        ``negatives_lse(scale)`` gives the rows' and columns' ``log Sigma``, ``loss(m1, m2,
        lse, scale)`` Eq. (3), ``update(log_sigma_rows)`` the update given the rows' ``log
        Sigma`` (``None``: the update sums the anchor row itself).
        """
        if self.scale_negatives:
            # The negatives' logits m1 s_ij depend on the margins: update first, then score.
            if self.training:
                update(None)
            m1 = self.m1.clone()
            return loss(m1, self.m2.clone(), None, m1)
        # The negatives' log-sum-exp does not depend on the margins: computed once, it gives
        # the loss its denominators and the anchor update its Sigma_anchor.
        lse = negatives_lse(1.0 / self.negative_temperature)
        if self.training:
            update(lse[0].detach())
        # Clones: a later in-place update must not touch tensors saved for this backward.
        return loss(self.m1.clone(), self.m2.clone(), lse, 1.0)

    def forward(
        self,
        img_emb: torch.Tensor,
        txt_emb: torch.Tensor,
        img_ids: Ids | None = None,
        txt_ids: Ids | None = None,
        *,
        img_keys: torch.Tensor | None = None,
        txt_keys: torch.Tensor | None = None,
        gathered: bool = False,
        shard: tuple[int, int] | None = None,
    ) -> torch.Tensor:
        """Loss of a batch; ``img_keys`` / ``txt_keys`` fill the queue (see the class notes).

        ``gathered=True`` says the inputs (embeddings, ids, keys) are already the global batch
        of every rank, identical on all ranks: the queues then enqueue them as they are instead
        of all-gathering them again. Without a queue, and in a single process, it changes
        nothing.
        """
        self.check_shard(shard)  # AdaCL's anchor selection needs the whole batch
        if not isinstance(gathered, bool):
            raise ValueError(f"gathered must be a bool, got {gathered!r}")
        # One strip would hold the whole (B, B) matrix anyway: the dense path is then the same
        # computation in the same memory, and faster (its selection works on one block).
        tiled = False
        if self.chunk_size is not None:
            check_embeddings(img_emb, txt_emb)
            tiled = self.chunk_size < img_emb.shape[0]
        if self.img_queue is None or self.txt_queue is None:
            if img_keys is not None or txt_keys is not None:
                raise ValueError("img_keys/txt_keys need a memory queue (queue_size > 0)")
            if tiled:
                return self._tiled_forward(img_emb, txt_emb, img_ids, txt_ids)
            sim, pos_mask = self.similarity_and_mask(img_emb, txt_emb, img_ids, txt_ids)
            return self.from_similarity(sim, pos_mask=pos_mask)
        check_embeddings(img_emb, txt_emb)
        self.txt_queue.check_dim(img_emb, "img_emb", setting="embed_dim")  # txt_emb: same shape
        if not tiled:
            sim, pos_mask = self.similarity_and_mask(img_emb, txt_emb, img_ids, txt_ids)
        batch = img_emb.shape[0]
        img_id_t = _ids_for_queue(img_ids, "img_ids", batch)
        txt_id_t = _ids_for_queue(txt_ids, "txt_ids", batch) if txt_ids is not None else img_id_t
        img_n = F.normalize(img_emb, dim=1) if self.normalize else img_emb
        txt_n = F.normalize(txt_emb, dim=1) if self.normalize else txt_emb
        # Copies: the enqueue below writes the buffers in place before backward runs.
        q_txt = self.txt_queue.keys.to(img_n.dtype, copy=True)
        q_img = self.img_queue.keys.to(txt_n.dtype, copy=True)
        if tiled:
            from .tiled import QueueBlock

            # Ids as the queues store them; without ids every filled entry is a negative.
            txt_block = QueueBlock(q_txt, self.txt_queue.valid.clone(), None, None)
            img_block = QueueBlock(q_img, self.img_queue.valid.clone(), None, None)
            if img_id_t is not None:
                txt_block = QueueBlock(q_txt, txt_block.valid, self.txt_queue.ids.clone(), img_id_t)
                img_block = QueueBlock(q_img, img_block.valid, self.img_queue.ids.clone(), txt_id_t)
            loss = self._tiled_forward(
                img_emb, txt_emb, img_ids, txt_ids, queue_txt=txt_block, queue_img=img_block
            )
        else:
            loss = self.from_similarity(
                sim,
                pos_mask=pos_mask,
                extra_neg_txt=img_n @ q_txt.t(),
                extra_neg_img=q_img @ txt_n.t(),
                extra_neg_txt_mask=self.txt_queue.negative_mask(img_id_t),
                extra_neg_img_mask=self.img_queue.negative_mask(txt_id_t).t(),
            )
        if self.training:
            gather = not gathered
            self.img_queue.enqueue(self._keys(img_keys, img_n, "img_keys"), img_id_t, gather=gather)
            self.txt_queue.enqueue(self._keys(txt_keys, txt_n, "txt_keys"), txt_id_t, gather=gather)
        return loss

    def _tiled_forward(
        self, img_emb, txt_emb, img_ids, txt_ids, queue_txt=None, queue_img=None
    ) -> torch.Tensor:
        """``from_similarity`` without the ``(B, B)`` matrix (``chunk_size``); the queue
        blocks (``tiled.QueueBlock``) are scored strip by strip as well."""
        from .tiled import TiledAdaCLBatch  # tiled builds on this module's helpers

        batch = TiledAdaCLBatch(
            img_emb,
            txt_emb,
            img_ids,
            txt_ids,
            chunk_size=self.chunk_size,
            normalize=self.normalize,
            queue_txt=queue_txt,
            queue_img=queue_img,
        )

        def update(log_sigma_rows):
            def find():
                return batch.anchor(
                    selection=self.anchor_selection,
                    top_k=self.top_k,
                    min_variance=self.min_variance,
                    generator=self.generator,
                    scale=1.0 / self.negative_temperature,
                    log_sigma_rows=log_sigma_rows,
                )

            return self._update_with(find, batch.row_negatives)

        return self._update_and_score(
            batch.negatives_lse,
            lambda m1, m2, lse, scale: batch.loss(m1, m2, self.reduction, lse, scale),
            update,
        )

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
            f"negative_temperature={self.negative_temperature:g}, "
            f"scale_negatives={self.scale_negatives}, "
            f"warmup_steps={self.warmup_steps}, "
            f"queue_size={self.queue_size}, max_m1={self.max_m1}, reduction={self.reduction!r}"
        )
