"""Deep-metric-learning losses that Table 1 of the GOAL paper maps to (triplet weight, pair weight).

* ``circle``: Circle loss (Sun et al. 2020); GOAL ``(T^cir, P^lin)``.
* ``multi_similarity``: MS loss (Wang et al. 2019); GOAL ``(T^con, P^sig-ms)``.
* ``binomial_deviance``: binomial deviance (Yi et al. 2014); GOAL ``(T^con, P^sig)``.
* ``nca_hard``: NCA / NT-Xent with the hardest negative, GOAL Eq. (6); ``(T^nca, P^con)``.

They follow the contract of every vlret loss: ``sim`` is ``(B, B)`` with the positive pair of
anchor ``i`` on the diagonal, ``pos_mask`` (``(B, B)`` bool) marks further positives, which are
neither negatives nor pulled, and each loss sums an image-anchor term (row ``i``) and a
text-anchor term (column ``i``) per index, which ``reduction`` (``"sum"``, ``"mean"`` or
``"none"``) reduces over the ``B`` indices. A bad ``sim``, ``pos_mask`` or parameter raises a
``ValueError`` naming it. Circle, MS
and binomial deviance use every negative of the anchor, as their papers do; ``hardest=True``
keeps only the hardest negative, the triplet that GOAL reasons about. ``docs/goal.md`` states
which of them have exactly the gradient of their GOAL cell (tested in ``tests/test_dml.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._checks import (
    FLAG,
    NON_NEGATIVE,
    POSITIVE,
    REAL,
    check_positive,
    check_real,
    check_reduction,
)
from ._base import PairLoss, log1p_sum_exp, prepare, reduce_terms
from .params import LossParams, param, reduction_param
from .registry import register_loss

_HARDEST = "keep only the hardest negative of each anchor (GOAL's triplet)"


def _hardest_only(s: torch.Tensor, negatives: torch.Tensor, dim: int) -> torch.Tensor:
    """Mask keeping, along ``dim``, only the most similar negative (none for an empty line)."""
    filled = s.masked_fill(~negatives, torch.finfo(s.dtype).min)
    onehot = torch.zeros_like(negatives).scatter_(dim, filled.argmax(dim, keepdim=True), True)
    return onehot & negatives


def _softplus(x: torch.Tensor) -> torch.Tensor:
    """``log(1 + e^x)`` without F.softplus's linear cut-off, so its gradient is exactly sigmoid."""
    return torch.logaddexp(torch.zeros((), dtype=x.dtype, device=x.device), x)


def circle_loss(
    sim: torch.Tensor,
    *,
    margin: float = 0.4,
    gamma: float = 80.0,
    hardest: bool = False,
    pos_mask: torch.Tensor | None = None,
    reduction: str = "sum",
) -> torch.Tensor:
    """Circle loss (Sun et al., CVPR 2020); GOAL Table 1 ``(T^cir, P^lin)``, GOAL Eq. (8), (10).

    For each anchor, with positive ``p`` and negatives ``s_j``:

        log(1 + sum_j exp(gamma * a_n^j * (s_j - D_n)) * exp(-gamma * a_p * (p - D_p)))

    with ``a_p = [1 + m - p]_+``, ``a_n^j = [s_j + m]_+``, ``D_p = 1 - m`` and ``D_n = m``.
    The ``a`` are constants for the gradient, as in the Circle paper.

    With ``hardest=True``, ``margin=0`` and every hardest negative ``>= 0``, its gradient is
    ``gamma`` times GOAL ``(cir, lin)`` with ``tau=gamma, circle_offset=1``; a margin ``m``
    gives the triplet weight of offset ``1 - 2 m^2`` but pair weights ``[1 + m - p]_+``,
    ``[s_n + m]_+``.

    ``sim``, ``pos_mask`` and ``reduction`` follow every pair loss's contract
    (``docs/losses.md``).

    Args:
        margin: The relaxation ``m`` (any finite value). The defaults ``m=0.4, gamma=80``
            are the paper's fine-grained image retrieval setting (face recognition uses
            ``m=0.25, gamma=256``).
        gamma: The scale.
        hardest: Keep only the hardest negative of each anchor (the triplet GOAL reasons
            about) instead of every negative.

    Returns:
        The Circle loss: a scalar, or its ``(B,)`` terms with ``reduction="none"``.

    Raises:
        ValueError: A bad input, a non-finite ``margin`` or a non-positive ``gamma``.
    """
    check_real(margin, "margin")
    check_positive(gamma, "gamma")
    check_reduction(reduction)
    s, negatives = prepare(sim, pos_mask)
    pos = s.diagonal()
    alpha_p = (1 + margin - pos).clamp(min=0).detach()
    alpha_n = (s + margin).clamp(min=0).detach()
    neg_logit = alpha_n * (s - margin)
    pos_logit = alpha_p * (pos - (1 - margin))
    neg_row = _hardest_only(s, negatives, 1) if hardest else negatives
    neg_col = _hardest_only(s, negatives, 0) if hardest else negatives
    img_terms = log1p_sum_exp(gamma * (neg_logit - pos_logit[:, None]), neg_row, dim=1)
    txt_terms = log1p_sum_exp(gamma * (neg_logit - pos_logit[None, :]), neg_col, dim=0)
    return reduce_terms(img_terms, txt_terms, reduction)


def multi_similarity_loss(
    sim: torch.Tensor,
    *,
    alpha: float = 2.0,
    beta: float = 10.0,
    lam: float = 0.5,
    epsilon: float = 0.1,
    hardest: bool = False,
    pos_mask: torch.Tensor | None = None,
    reduction: str = "sum",
) -> torch.Tensor:
    """Multi-similarity loss (Wang et al., CVPR 2019) with its pair mining; GOAL Table 1
    ``(T^con, P^sig-ms)``, GOAL Eq. (11)-(12).

    For each anchor, with positive ``p`` and negatives ``s_j``:

        1/alpha * log(1 + [p < max_j s_j + epsilon] * exp(-alpha * (p - lam)))
          + 1/beta * log(1 + sum_{j: s_j > p - epsilon} exp(beta * (s_j - lam)))

    (the anchor's only pulled positive is its diagonal pair). The mining keeps the positive
    exactly when the hardest negative is kept, i.e. when ``epsilon + s_n - p > 0``: that
    Heaviside is GOAL's ``T^con`` with ``margin=epsilon``. With ``hardest=True`` the gradient
    is exactly GOAL ``(con, sig)`` with ``margin=epsilon``.

    The defaults ``alpha=2, beta=10, lam=0.5, epsilon=0.1`` are the GOAL paper's pair-weight
    settings, so the baseline and the GOAL cells share them; the MS paper uses ``alpha=2,
    beta=50, lam=1, epsilon=0.1``.

    ``sim``, ``pos_mask`` and ``reduction`` follow every pair loss's contract
    (``docs/losses.md``).

    Args:
        alpha: The positive slope.
        beta: The negative slope.
        lam: The similarity threshold ``lambda`` (any finite value).
        epsilon: The mining band, ``>= 0``.
        hardest: Let only the hardest negative of each anchor be mined.

    Returns:
        The MS loss: a scalar, or its ``(B,)`` terms with ``reduction="none"``.

    Raises:
        ValueError: A bad input, non-positive ``alpha`` or ``beta``, a non-finite ``lam`` or
            a negative ``epsilon``.
    """
    check_positive(alpha, "alpha")
    check_positive(beta, "beta")
    check_real(lam, "lam")
    check_real(epsilon, "epsilon")
    if epsilon < 0:
        raise ValueError(f"epsilon must be >= 0, got {epsilon!r}")
    check_reduction(reduction)
    s, negatives = prepare(sim, pos_mask)
    pos = s.diagonal()
    pos_term = _softplus(alpha * (lam - pos)) / alpha
    terms = []
    for dim, pos_b in ((1, pos[:, None]), (0, pos[None, :])):
        negs = _hardest_only(s, negatives, dim) if hardest else negatives
        mined = negs & (s > pos_b - epsilon)
        # The positive is mined iff p - eps < hardest negative iff the hardest one is mined.
        pos_kept = mined.any(dim)
        neg_term = log1p_sum_exp(beta * (s - lam), mined, dim=dim) / beta
        terms.append(torch.where(pos_kept, pos_term, 0.0) + neg_term)
    return reduce_terms(terms[0], terms[1], reduction)


def binomial_deviance_loss(
    sim: torch.Tensor,
    *,
    alpha: float = 2.0,
    beta: float = 10.0,
    lam: float = 0.5,
    hardest: bool = False,
    pos_mask: torch.Tensor | None = None,
    reduction: str = "sum",
) -> torch.Tensor:
    """Binomial deviance loss (Yi et al., ICPR 2014); GOAL Table 1 ``(T^con, P^sig)``, GOAL
    Eq. (11).

    For each anchor, with positive ``p`` and negatives ``s_j``:

        1/alpha * log(1 + exp(-alpha * (p - lam))) + sum_j 1/beta * log(1 + exp(beta * (s_j - lam)))

    parameterised as in the MS paper, with the ``1/alpha``, ``1/beta`` scales so that each
    pair's gradient is exactly the sigmoid pair weight ``P^sig``. Yi et al. write one slope
    ``alpha=2`` and a negative cost ``C=25`` (negative slope ``alpha C = 50``), without the
    scales and averaged over pairs. The defaults ``alpha=2, beta=10, lam=0.5`` are GOAL Fig. 3's.

    A pair loss has no triplet gate: the GOAL cell ``(con, sig)`` equals its ``hardest=True``
    gradient only where every hardest triplet violates ``margin`` (for cosine similarities,
    always once ``margin >= 2``).

    ``sim``, ``pos_mask`` and ``reduction`` follow every pair loss's contract
    (``docs/losses.md``).

    Args:
        alpha: The positive slope.
        beta: The negative slope.
        lam: The similarity threshold ``lambda`` (any finite value).
        hardest: Keep only the hardest negative of each anchor (GOAL's triplet).

    Returns:
        The binomial deviance: a scalar, or its ``(B,)`` terms with ``reduction="none"``.

    Raises:
        ValueError: A bad input, non-positive ``alpha`` or ``beta``, or a non-finite ``lam``.
    """
    check_positive(alpha, "alpha")
    check_positive(beta, "beta")
    check_real(lam, "lam")
    check_reduction(reduction)
    s, negatives = prepare(sim, pos_mask)
    pos_term = _softplus(alpha * (lam - s.diagonal())) / alpha
    neg_pair = _softplus(beta * (s - lam)) / beta
    neg_row = _hardest_only(s, negatives, 1) if hardest else negatives
    neg_col = _hardest_only(s, negatives, 0) if hardest else negatives
    img_terms = pos_term + neg_pair.masked_fill(~neg_row, 0).sum(1)
    txt_terms = pos_term + neg_pair.masked_fill(~neg_col, 0).sum(0)
    return reduce_terms(img_terms, txt_terms, reduction)


def nca_hard_loss(
    sim: torch.Tensor,
    *,
    tau: float = 10.0,
    pos_mask: torch.Tensor | None = None,
    reduction: str = "sum",
) -> torch.Tensor:
    """Hard-negative NCA / NT-Xent loss, GOAL Eq. (6), per anchor and direction:

        -log(exp(tau * p) / (exp(tau * p) + exp(tau * s_n))) = log(1 + exp(tau * (s_n - p)))

    with ``s_n`` the hardest negative. Its gradient is exactly ``tau`` times GOAL
    ``(nca, con)`` (GOAL Eq. 7): ``d/ds_n = tau * T^nca``, ``d/dp = -tau * T^nca``. An anchor
    without negatives contributes a graph-attached 0.

    ``sim``, ``pos_mask`` and ``reduction`` follow every pair loss's contract
    (``docs/losses.md``).

    Args:
        tau: The scale (default 10, the value of GOAL Fig. 2).

    Returns:
        The hard-negative NCA loss: a scalar, or its ``(B,)`` terms with ``reduction="none"``.

    Raises:
        ValueError: A bad input or a non-positive ``tau``.
    """
    check_positive(tau, "tau")
    check_reduction(reduction)
    s, negatives = prepare(sim, pos_mask)
    pos = s.diagonal()
    terms = []
    for dim in (1, 0):
        hardest_val = s.masked_fill(~negatives, torch.finfo(s.dtype).min).amax(dim)
        has_neg = negatives.any(dim)
        s_n = torch.where(has_neg, hardest_val, pos)
        terms.append(torch.where(has_neg, _softplus(tau * (s_n - pos)), 0.0))
    return reduce_terms(terms[0], terms[1], reduction)


@dataclass(frozen=True, kw_only=True)
class CircleParams(LossParams):
    """Parameters of Circle loss (defaults: the paper's fine-grained image retrieval setting)."""

    # m sets O_p = 1 + m, O_n = -m, Delta_p = 1 - m, Delta_n = m: any finite value defines it
    margin: float = param(0.4, REAL, "the relaxation m")
    gamma: float = param(80.0, POSITIVE, "the scale")
    hardest: bool = param(False, FLAG, _HARDEST)
    reduction: str = reduction_param("sum")


@register_loss("circle")
class CircleLoss(PairLoss):
    """Module form of :func:`circle_loss` (Circle loss; GOAL Table 1 ``(T^cir, P^lin)``)."""

    paper = "Circle loss (Sun et al. 2020)"
    equation = "GOAL Eq. (8), (10), Table 1"
    Params = CircleParams
    dense = staticmethod(circle_loss)


@dataclass(frozen=True, kw_only=True)
class BinomialDevianceParams(LossParams):
    """Parameters of the binomial deviance (defaults: GOAL Fig. 3's)."""

    alpha: float = param(2.0, POSITIVE, "the positive slope")
    beta: float = param(10.0, POSITIVE, "the negative slope")
    lam: float = param(0.5, REAL, "the similarity threshold lambda")
    hardest: bool = param(False, FLAG, _HARDEST)
    reduction: str = reduction_param("sum")


@register_loss("binomial_deviance")
class BinomialDevianceLoss(PairLoss):
    """Module form of :func:`binomial_deviance_loss` (GOAL ``(T^con, P^sig)``)."""

    paper = "Binomial deviance (Yi et al. 2014)"
    equation = "GOAL Eq. (11), Table 1"
    Params = BinomialDevianceParams
    dense = staticmethod(binomial_deviance_loss)


@dataclass(frozen=True, kw_only=True)
class MultiSimilarityParams(BinomialDevianceParams):
    """Parameters of the MS loss: the binomial deviance's and its mining band (defaults: GOAL's
    pair-weight settings)."""

    epsilon: float = param(0.1, NON_NEGATIVE, "the mining band")


@register_loss("multi_similarity")
class MultiSimilarityLoss(PairLoss):
    """Module form of :func:`multi_similarity_loss` (MS loss; GOAL ``(T^con, P^sig-ms)``)."""

    paper = "Multi-similarity (Wang et al. 2019)"
    equation = "GOAL Eq. (11)-(12), Table 1"
    Params = MultiSimilarityParams
    dense = staticmethod(multi_similarity_loss)


@dataclass(frozen=True, kw_only=True)
class NCAHardParams(LossParams):
    """Parameters of the hard-negative NCA loss."""

    tau: float = param(10.0, POSITIVE, "the scale (GOAL Fig. 2)")
    reduction: str = reduction_param("sum")


@register_loss("nca_hard")
class NCAHardLoss(PairLoss):
    """Module form of :func:`nca_hard_loss` (GOAL Eq. 6; ``(T^nca, P^con)`` up to ``tau``)."""

    paper = "NCA / NT-Xent, hardest negative"
    equation = "GOAL Eq. (6)-(7)"
    Params = NCAHardParams
    dense = staticmethod(nca_hard_loss)
