"""Unified loss of pair similarity optimization: Eq. (5), weighted (24), adaptive margin (26)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._checks import MARGIN, POSITIVE, check_finite, check_positive, check_reduction
from ..similarity import Ids
from ._base import (
    LossCapabilities,
    PairLoss,
    log1p_sum_exp,
    prepare,
    reduce_per_index,
    reduce_terms,
)
from ._tiling import prepare_embeddings, softmax_terms
from .params import TiledLossParams, param, reduction_param
from .registry import register_loss


@dataclass(frozen=True, kw_only=True)
class UnifiedParams(TiledLossParams):
    """Parameters of the Unified loss (defaults: the paper's VSE++ / BUTD setting, B.1.1)."""

    margin: float = param(0.2, MARGIN, "the margin m of every anchor")
    gamma: float = param(60.0, POSITIVE, "the scale gamma")
    reduction: str = reduction_param("sum")


def unified_loss(
    sim: torch.Tensor,
    *,
    margin: float = 0.2,
    gamma: float = 60.0,
    pos_mask: torch.Tensor | None = None,
    weights: torch.Tensor | None = None,
    margins: torch.Tensor | None = None,
    reduction: str = "sum",
) -> torch.Tensor:
    r"""Unified loss, Eq. (5) of "Unified Loss of Pair Similarity Optimization":

    .. math:: \frac{1}{\gamma}\sum_i
              \log\Big(1 + \sum_{j \ne i} e^{\gamma(s_{ij} - s_{ii} + m)}\Big)
              + \log\Big(1 + \sum_{j \ne i} e^{\gamma(s_{ji} - s_{ii} + m)}\Big)

    Special cases (tested): ``gamma -> inf`` gives Triplet-HN (Eq. 6); ``margin=0`` gives
    ``gamma * unified == infonce(temperature=1/gamma, reduction="sum")`` (Eq. 7).

    * ``weights`` ``(B, B)``: the weighted form, Eq. (24): :math:`w_{ij}s_{ij} - w_{ii}s_{ii}`
      inside the exponent (and :math:`w_{ji}s_{ji} - w_{ii}s_{ii}` for text anchors).
    * ``margins`` ``(B,)``: the adaptive-margin form, Eq. (26): anchor ``i`` uses ``m_i`` in both
      directions; it replaces ``margin``.

    Defaults ``m=0.2, gamma=60`` are the paper's VSE++ (BUTD) setting (appendix B.1.1; BFAN,
    SGRAF and CLIP use gamma=50). Sum reduction as in the paper. ``margin >= 0``: the paper
    asks for differences "greater than a margin m", and ``m = 0`` is already VLC (Eq. 7).
    """
    MARGIN.check(margin, "margin")
    check_positive(gamma, "gamma")
    check_reduction(reduction)
    s, negatives = prepare(sim, pos_mask)
    batch = s.shape[0]
    if weights is not None:
        if not isinstance(weights, torch.Tensor) or tuple(weights.shape) != (batch, batch):
            shape = tuple(weights.shape) if isinstance(weights, torch.Tensor) else type(weights)
            raise ValueError(f"weights must be a ({batch}, {batch}) tensor like sim, got {shape}")
        check_finite(weights, "weights")
        s = weights.to(s.dtype) * s
    pos = s.diagonal()
    m_row: float | torch.Tensor
    m_col: float | torch.Tensor
    if margins is None:
        m_row = m_col = margin
    else:
        if not isinstance(margins, torch.Tensor) or tuple(margins.shape) != (batch,):
            shape = tuple(margins.shape) if isinstance(margins, torch.Tensor) else type(margins)
            raise ValueError(f"margins must be a ({batch},) tensor, one per anchor, got {shape}")
        check_finite(margins, "margins")
        m = margins.to(s.dtype)
        m_row, m_col = m[:, None], m[None, :]
    img_terms = log1p_sum_exp(gamma * (s - pos[:, None] + m_row), negatives, dim=1)
    txt_terms = log1p_sum_exp(gamma * (s - pos[None, :] + m_col), negatives, dim=0)
    return reduce_terms(img_terms / gamma, txt_terms / gamma, reduction)


def tiled_unified_loss(
    img_emb: torch.Tensor,
    txt_emb: torch.Tensor,
    *,
    margin: float = 0.2,
    gamma: float = 60.0,
    margins: torch.Tensor | None = None,
    img_ids: Ids | None = None,
    txt_ids: Ids | None = None,
    chunk_size: int,
    reduction: str = "sum",
    normalize: bool = True,
    shard: tuple[int, int] | None = None,
) -> torch.Tensor:
    """:func:`unified_loss` (Eq. 5; adaptive margins Eq. 26) on embeddings, tiled.

    The embeddings, ``img_ids``/``txt_ids``, ``chunk_size`` (the tile height), ``reduction``,
    ``normalize`` and ``shard`` work as in every tiled form (``docs/tiled.md``).

    Args:
        margin: The margin ``m`` of every anchor.
        gamma: The scale ``gamma``.
        margins: ``(B,)`` per-anchor margins replacing ``margin`` (both directions); they get
            their gradient when they require one.

    Returns:
        The value of the dense form on the cosine matrix. The weighted form (Eq. 24, a dense
        ``(B, B)`` ``weights``) has no tiled counterpart.

    Raises:
        ValueError: A bad argument, named.
    """
    MARGIN.check(margin, "margin")
    check_positive(gamma, "gamma")
    check_reduction(reduction)
    batch = prepare_embeddings(
        img_emb, txt_emb, img_ids, txt_ids, chunk_size=chunk_size, normalize=normalize
    )
    x = batch.x
    if margins is None:
        m = x.new_full((batch.batch,), float(margin))
    else:
        if not isinstance(margins, torch.Tensor) or tuple(margins.shape) != (batch.batch,):
            shape = tuple(margins.shape) if isinstance(margins, torch.Tensor) else type(margins)
            raise ValueError(
                f"margins must be a ({batch.batch},) tensor, one per anchor, got {shape}"
            )
        check_finite(margins, "margins")
        m = margins.to(device=x.device, dtype=x.dtype)
    scale = torch.tensor(float(gamma), dtype=x.dtype, device=x.device)
    terms = softmax_terms(batch, scale, m, shard)
    return reduce_per_index(terms, reduction, batch.batch) / gamma


@register_loss("unified")
class UnifiedLoss(PairLoss):
    """Module form of :func:`unified_loss`. ``weights`` and ``margins`` may be passed per batch
    (``loss(img, txt, margins=m)``, ``loss.from_similarity(sim, weights=w)``).

    ``chunk_size=N`` makes the embedding entry point use :func:`tiled_unified_loss` (O(N x B)
    memory, same values and gradients); the dense ``weights`` form is then unavailable.
    """

    declared = LossCapabilities(local_shards=True, paper_comparison=2, soft_margins=True)
    paper = "Unified Loss (Li et al.)"
    equation = "Unified Eq. (5), (24), (26)"
    Params = UnifiedParams
    dense = staticmethod(unified_loss)
    tiled = staticmethod(tiled_unified_loss)
