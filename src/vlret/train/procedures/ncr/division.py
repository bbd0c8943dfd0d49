"""NCR's arithmetic (Huang et al., NeurIPS 2021): per-pair losses, the clean/noisy division,
label refinement and soft margins, on score matrices and per-pair vectors.

Every function here is pure (no model, no trainer); :mod:`vlret.train.procedures.ncr.step` runs
them on the trainer's networks. The released code is XLearning-SCU/2021-NeurIPS-NCR; where this
module departs from it, the docstring says so.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ...._extras import require
from ....losses._base import prepare, reduce_per_index

#: The soft-margin curves ``s(y)`` of the paper (``train.procedure_options.soft_margin``).
SOFT_MARGINS = ("exponential", "linear", "sin")


def _mean_hinges(
    sim: torch.Tensor, pos_mask: torch.Tensor | None, margin: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per index ``i``: the mean of ``[m + s_ij - s_ii]_+`` over the negatives ``j`` of row ``i``
    (image anchor) and of ``[m + s_ji - s_ii]_+`` over those of column ``i`` (text anchor)."""
    s, negatives = prepare(sim, pos_mask)
    pos = s.diagonal()
    rows = (margin + s - pos[:, None]).clamp(min=0).masked_fill(~negatives, 0)
    cols = (margin + s - pos[None, :]).clamp(min=0).masked_fill(~negatives, 0)
    n_rows = negatives.sum(dim=1).clamp(min=1).to(s.dtype)
    n_cols = negatives.sum(dim=0).clamp(min=1).to(s.dtype)
    return rows.sum(dim=1) / n_rows, cols.sum(dim=0) / n_cols


def per_pair_loss(
    sim: torch.Tensor, *, margin: float = 0.2, pos_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """The per-pair loss NCR's division fits its mixture to: for each pair ``i`` of a block,
    the hinge ``[m + s - s_ii]_+`` averaged over the block's negatives of image ``i`` plus the
    same over the negatives of caption ``i``, ``(B,)``.

    The release (``eval_loss``) divides each sum by the block size ``B`` with only the diagonal
    excluded; here the mean is over the true negatives (``pos_mask``: other captions of the
    same image are not negatives), which only differs when a block holds further positives.
    """
    rows, cols = _mean_hinges(sim, pos_mask, float(margin))
    return rows + cols


def predictions(
    sim: torch.Tensor, *, margin: float = 0.2, pos_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """A network's prediction ``p_i`` in ``[0, 1]`` that pair ``i`` matches (the paper's
    memorization-based estimate): its margin minus its mean hinge cost,
    ``m - (row_mean_i + col_mean_i) / 2`` clamped to ``[0, m]``, divided by the mean of the
    block's top ``B // 10 + 1`` values and clamped to ``[0, 1]`` (the release's normalisation;
    a block whose top values are all 0 gives 0 everywhere instead of NaN)."""
    rows, cols = _mean_hinges(sim, pos_mask, float(margin))
    p = (margin - (rows + cols) / 2).clamp(min=0, max=margin)
    top = p.topk(min(p.shape[0] // 10 + 1, p.shape[0])).values.mean()
    return (p / top.clamp(min=torch.finfo(p.dtype).tiny)).clamp(0, 1)


def min_max(losses: np.ndarray) -> np.ndarray:
    """``(x - min) / (max - min)`` in float64; all zeros when every loss is equal."""
    x = np.asarray(losses, dtype=np.float64)
    span = float(x.max() - x.min()) if x.size else 0.0
    return (x - x.min()) / span if span > 0 else np.zeros_like(x)


def clean_probability(
    losses: np.ndarray,
    *,
    max_iter: int = 10,
    tol: float = 1e-2,
    reg_covar: float = 5e-4,
    random_state: int | None = 0,
) -> np.ndarray:
    """Each pair's probability of being clean: the per-pair ``losses`` min-max normalised
    (:func:`min_max`), a 2-component :class:`sklearn.mixture.GaussianMixture` fitted to them
    with NCR's settings (``max_iter`` 10, ``tol`` 1e-2, ``reg_covar`` 5e-4), and the posterior
    of the component with the lower mean. ``random_state`` seeds the mixture's k-means
    initialisation (the release leaves it unseeded; a seed makes a resumed run redo an epoch's
    division identically)."""
    mixture = require("sklearn.mixture", "NCR's Gaussian mixture (train.procedure = 'ncr')")
    x = min_max(losses).reshape(-1, 1)
    gmm = mixture.GaussianMixture(
        n_components=2, max_iter=max_iter, tol=tol, reg_covar=reg_covar, random_state=random_state
    )
    gmm.fit(x)
    return gmm.predict_proba(x)[:, int(np.argmin(gmm.means_.ravel()))]


def split_clean(prob: np.ndarray, threshold: float = 0.5) -> np.ndarray:
    """The clean pairs: ``prob > threshold``; when no probability is at or below it, the
    threshold becomes the ``n // 100``-th smallest probability, so the lowest 1% (at least the
    lowest one) is called noisy, as released (``split_prob``)."""
    prob = np.asarray(prob, dtype=np.float64)
    if prob.size and prob.min() > threshold:
        threshold = float(np.sort(prob)[len(prob) // 100])
    return prob > threshold


def refined_labels(clean_prob: torch.Tensor, prediction: torch.Tensor) -> torch.Tensor:
    """The refined label of a clean pair (paper, Eq. 6): ``w + (1 - w) p`` with ``w`` its clean
    probability from the other network's mixture and ``p`` the training network's prediction
    (:func:`predictions`), per pair. (A noisy pair's label is the mean of both networks'
    predictions.) The release's line multiplies a ``(B,)`` probability with the first
    prediction ``pl[0]`` only and its targets broadcast against the score matrix row-wise;
    this is the paper's per-pair value."""
    w = clean_prob.to(prediction.dtype)
    return w + (1 - w) * prediction


def soft_margin_factor(labels: torch.Tensor, kind: str = "exponential") -> torch.Tensor:
    """``s(y)`` of the soft margin ``m s(y)`` (paper, Eq. 8): ``linear`` ``y``,
    ``exponential`` ``(10^y - 1) / 9`` (the default), ``sin`` ``sin(pi y - pi / 2) / 2 + 1/2``;
    each maps ``[0, 1]`` onto ``[0, 1]`` with ``s(0) = 0`` and ``s(1) = 1``."""
    if kind == "linear":
        return labels
    if kind == "exponential":
        return (torch.pow(10.0, labels) - 1) / 9
    if kind == "sin":
        return torch.sin(math.pi * labels - math.pi / 2) / 2 + 0.5
    raise ValueError(f"soft_margin: expected one of {', '.join(SOFT_MARGINS)}, got {kind!r}")


def soft_margin_triplet(
    sim: torch.Tensor,
    margins: torch.Tensor,
    *,
    pos_mask: torch.Tensor | None = None,
    hardest: bool = True,
    reduction: str = "sum",
) -> torch.Tensor:
    """The triplet loss with a margin per anchor pair (NCR's ``L_soft``, paper Eq. 7): pair
    ``i``'s margin ``margins[i]`` in both of its terms, ``[m_i + s(V_i, T_j) - s_ii]_+`` over its
    image's negatives ``j`` and ``[m_i + s(V_j, T_i) - s_ii]_+`` over its caption's, the hardest
    of each (or their sum with ``hardest=False``). The release broadcasts its margins along one
    axis of the score matrix, so its text-anchor terms use the negative's margin; this is the
    paper's per-anchor form, which :func:`vlret.losses.triplet_loss` gives for equal margins."""
    s, negatives = prepare(sim, pos_mask)
    if not isinstance(margins, torch.Tensor) or tuple(margins.shape) != (s.shape[0],):
        shape = tuple(margins.shape) if isinstance(margins, torch.Tensor) else type(margins)
        raise ValueError(f"margins must be a ({s.shape[0]},) tensor, one per anchor, got {shape}")
    m = margins.to(s.dtype)
    pos = s.diagonal()
    rows = (m[:, None] + s - pos[:, None]).clamp(min=0).masked_fill(~negatives, 0)
    cols = (m[None, :] + s - pos[None, :]).clamp(min=0).masked_fill(~negatives, 0)
    if hardest:
        return reduce_per_index(rows.amax(dim=1) + cols.amax(dim=0), reduction)
    return reduce_per_index(rows.sum(dim=1) + cols.sum(dim=0), reduction)


def noisy_split_quality(clean: np.ndarray, corrupted: np.ndarray | None) -> dict[str, float | None]:
    """``clean_fraction``, and against the recorded corruption (``corrupted``, one bool per
    pair; None on clean data): ``noisy_precision`` (corrupted among the pairs called noisy) and
    ``noisy_recall`` (called noisy among the corrupted); ``None`` where a count is 0."""
    clean = np.asarray(clean, dtype=bool)
    out: dict[str, float | None] = {
        "clean_fraction": float(clean.mean()) if clean.size else None,
        "noisy_pairs": int((~clean).sum()),
    }
    if corrupted is not None:
        corrupted = np.asarray(corrupted, dtype=bool)
        hit = int((~clean & corrupted).sum())
        called, truth = int((~clean).sum()), int(corrupted.sum())
        out["noisy_precision"] = hit / called if called else None
        out["noisy_recall"] = hit / truth if truth else None
    return out


__all__ = [
    "SOFT_MARGINS",
    "clean_probability",
    "min_max",
    "noisy_split_quality",
    "per_pair_loss",
    "predictions",
    "refined_labels",
    "soft_margin_factor",
    "soft_margin_triplet",
    "split_clean",
]
