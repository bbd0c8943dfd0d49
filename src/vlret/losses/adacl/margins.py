"""AdaCL margins in closed form: Algorithm 1 step 5, appendix A.3 (Eq. 20 and 22)."""

from __future__ import annotations

import math

import torch

from .config import DEFAULT_EPS, DEFAULT_P_U, check_probabilities


def margins_from_log_sigma(anchor, log_sigma, p_u: float, eps: float):
    """Eq. (20) and (22) with ``log Sigma_anchor`` given.

    Args:
        anchor: The anchor similarity (float or float64 tensor), below 1.
        log_sigma: ``log Sigma_anchor`` (same kind).
        p_u: The anchor's probability under Eq. (3) (Eq. 4).
        eps: One minus the probability of a positive of similarity 1 (Eq. 6).

    Returns:
        ``(m1, m2)`` of the kind of the inputs.
    """
    m1 = m1_from_anchor(anchor, p_u, eps)
    return m1, m2_from_log_sigma(anchor, log_sigma, m1, p_u)


def m1_from_anchor(anchor, p_u: float, eps: float):
    """Eq. (20): ``m1 = log(eps p_u / ((1 - eps)(1 - p_u))) / (anchor - 1)``; ``Sigma_anchor``
    cancels out, so ``m1`` depends on the anchor alone."""
    return math.log(eps * p_u / ((1.0 - eps) * (1.0 - p_u))) / (anchor - 1.0)


def m2_from_log_sigma(anchor, log_sigma, m1, p_u: float):
    """Eq. (22): ``m2 = anchor + log((1 - p_u) / (p_u Sigma_anchor)) / m1``, the shift that
    gives the anchor the probability ``p_u`` under Eq. (3) with the scale ``m1`` (Eq. 4)."""
    return anchor + (math.log((1.0 - p_u) / p_u) - log_sigma) / m1


def adacl_margins(
    anchor: float | torch.Tensor,
    sigma_anchor: float | torch.Tensor,
    *,
    p_u: float = DEFAULT_P_U,
    eps: float = DEFAULT_EPS,
) -> tuple[float, float] | tuple[torch.Tensor, torch.Tensor]:
    r"""Margins from the anchor, Algorithm 1 step 5 (A.3, Eq. 20 and 22).

    .. math:: m_1 = \log\frac{\epsilon\,p_u}{(1-\epsilon)(1-p_u)} \Big/ (\mathrm{anchor} - 1),
              \qquad
              m_2 = \mathrm{anchor} + \log\frac{1 - p_u}{p_u \Sigma_\mathrm{anchor}} \Big/ m_1

    They solve the two boundary conditions: Eq. (4), the anchor's probability under Eq. (3) is
    ``p_u``, ``exp(m1 (anchor - m2)) / (exp(m1 (anchor - m2)) + Sigma_anchor) = p_u``; and
    Eq. (6), a positive of similarity 1 has probability ``1 - eps``.

    Args:
        anchor: The anchor similarity, finite and below 1 (Eq. 6 pins similarity 1).
        sigma_anchor: :math:`\Sigma_\mathrm{anchor} = \sum_{k \ne u} e^{s(I_u, T_k)}`, > 0.
        p_u: The anchor's probability (the paper's 0.03).
        eps: The paper's ``e^-7``; ``p_u + eps < 1``.

    Returns:
        ``(m1, m2)``: floats for float inputs; for tensors, tensors computed in float64 and
        returned in the anchor's floating dtype.

    Raises:
        ValueError: An input outside its domain, naming it.
    """
    check_probabilities(p_u, eps)
    as_tensors = isinstance(anchor, torch.Tensor) or isinstance(sigma_anchor, torch.Tensor)
    a = torch.as_tensor(anchor, dtype=torch.float64)
    sig = torch.as_tensor(sigma_anchor, dtype=torch.float64, device=a.device)
    if not bool(torch.isfinite(a).all()) or bool((a >= 1).any()):
        raise ValueError(f"anchor must be a finite similarity below 1, got {anchor!r}")
    if not bool(torch.isfinite(sig).all()) or bool((sig <= 0).any()):
        raise ValueError(f"sigma_anchor must be a positive finite sum, got {sigma_anchor!r}")
    m1, m2 = margins_from_log_sigma(a, sig.log(), p_u, eps)
    if not as_tensors:
        return float(m1), float(m2)
    out = anchor.dtype if isinstance(anchor, torch.Tensor) else torch.float64
    out = out if out.is_floating_point else torch.float64
    return m1.to(out), m2.to(out)
