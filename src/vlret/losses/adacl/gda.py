"""Gaussian discriminant analysis of clone negatives: AdaCL Eq. (8)-(10), appendix A.4."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch


@dataclass(frozen=True)
class GDAFit:
    """Univariate GDA fit, Eq. (9): class C (clone, from S_cln) and C-bar (salient, from S_sln).

    Attributes:
        mu_clone: Mean of the clone class.
        var_clone: Variance of the clone class.
        prior_clone: Prior of the clone class.
        mu_salient: Mean of the salient class.
        var_salient: Variance of the salient class.
        prior_salient: Prior of the salient class.

    All are Python floats computed in float64.
    """

    mu_clone: float
    var_clone: float
    prior_clone: float
    mu_salient: float
    var_salient: float
    prior_salient: float


def fit_gda(salient_negatives: torch.Tensor, clone_negatives: torch.Tensor) -> GDAFit:
    r"""Fit the two Gaussians of Eq. (9) on the negatives of S_sln and S_cln.

    Means and variances are the maximum-likelihood estimates (the variance divides by ``n``, as
    GDA does), in float64 on the host. Each class keeps its own variance, as Eq. (9) and (27)
    are written (the paper mentions GDA's shared covariance, but its formula has
    :math:`\sigma_0 \ne \sigma_1`). Priors come from the sizes of the two sets,
    :math:`\pi_1 = |S_{cln}| / (|S_{cln}| + |S_{sln}|)`.

    Args:
        salient_negatives: 1-D scores of S_sln (class C-bar), non-empty.
        clone_negatives: 1-D scores of S_cln (class C), non-empty.

    Returns:
        The :class:`GDAFit`.

    Raises:
        ValueError: An argument is not a non-empty 1-D tensor.
    """
    for name, t in (("salient_negatives", salient_negatives), ("clone_negatives", clone_negatives)):
        if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.numel() == 0:
            raise ValueError(f"{name} must be a non-empty 1-D tensor")
    return fit_values(
        salient_negatives.detach().cpu().double().numpy(),
        clone_negatives.detach().cpu().double().numpy(),
        None,
    )


def fit_values(salient: np.ndarray, clone: np.ndarray, top_k: int | None) -> GDAFit:
    """:func:`fit_gda` on float64 host arrays; ``top_k`` (A.10): fit each class on its
    ``top_k`` largest scores only."""
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


def clone_log_odds(scores: torch.Tensor, fit: GDAFit) -> torch.Tensor:
    r"""``log p(C|s) - log p(C-bar|s)`` of Eq. (9), elementwise.

    .. math:: \log\frac{\pi_1}{\pi_0} + \log\frac{\sigma_0}{\sigma_1}
              + \frac{(s-\mu_0)^2}{2\sigma_0^2} - \frac{(s-\mu_1)^2}{2\sigma_1^2}

    Standardised distances are formed before squaring, so large raw scores do not overflow.
    Eq. (10): ``s`` is a clone negative where this is ``> 0``.

    Args:
        scores: Similarities, any shape.
        fit: The GDA of Eq. (9).

    Returns:
        The log-odds in the dtype of ``scores``.
    """
    sd_c, sd_s = math.sqrt(fit.var_clone), math.sqrt(fit.var_salient)
    const = math.log(fit.prior_clone / fit.prior_salient) + math.log(sd_s / sd_c)
    z_c = (scores - fit.mu_clone) / sd_c
    z_s = (scores - fit.mu_salient) / sd_s
    return const + 0.5 * (z_s.square() - z_c.square())


def clone_posterior(scores: torch.Tensor, fit: GDAFit) -> torch.Tensor:
    """``p(C | s)`` of Eq. (9), the logistic of :func:`clone_log_odds`.

    Args:
        scores: Similarities, any shape.
        fit: The GDA of Eq. (9).

    Returns:
        The posterior in the dtype of ``scores``.
    """
    return torch.sigmoid(clone_log_odds(scores, fit))


class CloneRegion(NamedTuple):
    """Eq. (10) as bounds: S* is ``lo < s < hi`` when ``inside``, else ``s < lo or s > hi``."""

    lo: float
    hi: float
    inside: bool

    def outside(
        self, s: torch.Tensor, out: torch.Tensor | None = None, tmp: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Bool mask of the scores outside the clone region (two comparisons per score);
        ``out`` and ``tmp``: bool buffers of ``s``'s shape to write it with."""
        if out is None or tmp is None:
            if self.inside:
                return (s <= self.lo) | (s >= self.hi)
            return (s >= self.lo) & (s <= self.hi)
        if self.inside:
            return torch.le(s, self.lo, out=out).logical_or_(torch.ge(s, self.hi, out=tmp))
        return torch.ge(s, self.lo, out=out).logical_and_(torch.le(s, self.hi, out=tmp))


def clone_region(fit: GDAFit) -> CloneRegion:
    """The clone region of Eq. (10) through the roots of the log-odds quadratic.

    The log-odds of :func:`clone_log_odds` are the quadratic ``a s^2 + b s + c``; its roots
    (stable quadratic formula, float64) bound the region, so classifying every score costs two
    comparisons instead of evaluating the log-odds. Equivalent to ``clone_log_odds(s, fit) > 0``
    up to rounding at the roots.

    Args:
        fit: The GDA of Eq. (9).

    Returns:
        The :class:`CloneRegion`.
    """
    mu1, var1, mu0, var0 = fit.mu_clone, fit.var_clone, fit.mu_salient, fit.var_salient
    const = math.log(fit.prior_clone / fit.prior_salient) + 0.5 * math.log(var0 / var1)
    a = 0.5 / var0 - 0.5 / var1
    b = mu1 / var1 - mu0 / var0
    c = const + 0.5 * mu0 * mu0 / var0 - 0.5 * mu1 * mu1 / var1
    inf = math.inf
    if a == 0.0:
        if b == 0.0:
            return CloneRegion(-inf, inf, True) if c > 0 else CloneRegion(inf, -inf, True)
        root = -c / b
        return CloneRegion(root, inf, True) if b > 0 else CloneRegion(-inf, root, True)
    disc = b * b - 4.0 * a * c
    if disc <= 0.0:
        # No sign change: positive everywhere (a > 0) or nowhere (a < 0), up to one root point.
        return CloneRegion(-inf, inf, True) if a > 0 else CloneRegion(inf, -inf, True)
    q = -0.5 * (b + math.copysign(math.sqrt(disc), b))
    r1, r2 = sorted((q / a, c / q))
    # a < 0: clones between the roots (the clone Gaussian is narrower); a > 0: outside them.
    return CloneRegion(r1, r2, a < 0)
