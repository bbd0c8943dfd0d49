"""Triplet ranking loss, VSE++ style (Unified-loss paper Eq. 1-2; Faghri et al., VSE++)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._checks import FLAG, MARGIN, check_reduction
from ..similarity import Ids
from ._base import (
    HardestNegativeLoss,
    LossCapabilities,
    prepare,
    reduce_per_index,
    reduce_terms,
)
from ._tiling import (
    Embedded,
    hardest_negatives,
    hinge_sums,
    prepare_embeddings,
    scores_at,
    shard_directions,
)
from .params import TiledLossParams, param, reduction_param
from .registry import register_loss


@dataclass(frozen=True, kw_only=True)
class TripletParams(TiledLossParams):
    """Parameters of the triplet ranking loss (VSE++)."""

    margin: float = param(0.2, MARGIN, "the hinge margin m")
    hardest: bool = param(True, FLAG, "the hardest negative (VSE++) or the sum over all (VSE0)")
    reduction: str = reduction_param("sum")  # VSE++ sums over the batch


def triplet_loss(
    sim: torch.Tensor,
    *,
    margin: float = 0.2,
    hardest: bool = True,
    pos_mask: torch.Tensor | None = None,
    reduction: str = "sum",
) -> torch.Tensor:
    r"""Bidirectional triplet ranking loss on a ``(B, B)`` similarity matrix.

    With ``hardest=True`` this is Triplet-HN, Eq. (1)-(2) of the Unified-loss paper:

    .. math:: \sum_i [m + s(V_i,\hat T_i) - s_{ii}]_+ + [m + s(\hat V_i, T_i) - s_{ii}]_+

    where :math:`\hat T_i` (:math:`\hat V_i`) is the most similar negative text of image ``i``
    (image of text ``i``). ``hardest=False`` sums the hinge over all negatives (VSE0).
    Entries of ``pos_mask`` are never negatives. Default reduction ``"sum"`` as in VSE++.
    ``margin >= 0``: the paper's "differences greater than a margin m".
    """
    MARGIN.check(margin, "margin")
    check_reduction(reduction)
    s, negatives = prepare(sim, pos_mask)
    pos = s.diagonal()
    # Hinges are >= 0, so the max of the hinges equals the hinge of the hardest negative, and a
    # row whose entries are all masked yields a graph-attached zero.
    hinge_i2t = (margin + s - pos[:, None]).clamp(min=0).masked_fill(~negatives, 0)
    hinge_t2i = (margin + s - pos[None, :]).clamp(min=0).masked_fill(~negatives, 0)
    if hardest:
        img_terms, txt_terms = hinge_i2t.amax(dim=1), hinge_t2i.amax(dim=0)
    else:
        img_terms, txt_terms = hinge_i2t.sum(dim=1), hinge_t2i.sum(dim=0)
    return reduce_terms(img_terms, txt_terms, reduction)


def hardest_hinge(
    neg: torch.Tensor, pos: torch.Tensor, top: torch.Tensor, margin: float
) -> torch.Tensor:
    """``[margin + s_neg - s_pos]_+`` per anchor with its hardest negative's score ``neg``;
    0 where the anchor has no negative (``top`` is the dtype's most negative value) and a zero
    gradient where the hinge is exactly 0."""
    hinge = margin + neg - pos
    return torch.where((top > torch.finfo(top.dtype).min) & (hinge > 0), hinge, 0.0)


def _hardest_terms(batch: Embedded, margin: float, shard) -> torch.Tensor:
    """Triplet-HN per index: the hardest negatives are found without gradient, then their
    scores are recomputed with it (autograd's gather backward scatters the gradient)."""
    if shard is None:
        x, y = batch.x, batch.y
        exclusions = batch.exclusions
        row_top, row_arg, col_top, col_arg = hardest_negatives(
            x, y, exclusions, batch.tile, columns=True
        )
        diag = (x * y).sum(1)
        rows = hardest_hinge(scores_at(x, y, row_arg), diag, row_top, margin)
        return rows + hardest_hinge(scores_at(y, x, col_arg), diag, col_top, margin)
    terms = []
    for d in shard_directions(batch, shard):
        top, arg = hardest_negatives(d.rows, d.cands, d.exclusions, batch.tile, columns=False)
        neg = scores_at(d.rows, d.cands, arg)
        terms.append(hardest_hinge(neg, d.positives, top, margin))
    return terms[0] + terms[1]


def _sum_terms(batch: Embedded, margin: float, shard) -> torch.Tensor:
    """VSE0 per index: the sums of the hinges over all negatives."""
    if shard is None:
        diag = (batch.x * batch.y).sum(1)
        exclusions = batch.exclusions
        rows, cols = hinge_sums(
            batch.x, batch.y, diag, diag, margin=margin, exclusions=exclusions, tile=batch.tile
        )
        return rows + cols
    terms = []
    for d in shard_directions(batch, shard):
        rows, _ = hinge_sums(
            d.rows,
            d.cands,
            d.positives,
            None,
            margin=margin,
            exclusions=d.exclusions,
            tile=batch.tile,
        )
        terms.append(rows)
    return terms[0] + terms[1]


def tiled_triplet_loss(
    img_emb: torch.Tensor,
    txt_emb: torch.Tensor,
    *,
    margin: float = 0.2,
    hardest: bool = True,
    img_ids: Ids | None = None,
    txt_ids: Ids | None = None,
    chunk_size: int,
    reduction: str = "sum",
    normalize: bool = True,
    shard: tuple[int, int] | None = None,
) -> torch.Tensor:
    """:func:`triplet_loss` (Triplet-HN Eq. 1-2, or VSE0 with ``hardest=False``), tiled.

    The embeddings, ``img_ids``/``txt_ids``, ``chunk_size`` (the tile height), ``reduction``,
    ``normalize`` and ``shard`` work as in every tiled form (``docs/tiled.md``).

    Args:
        margin: The hinge margin.
        hardest: The hardest negative of each anchor (VSE++) or the sum over all (VSE0).

    Returns:
        The dense form's value. At exact ties of the hardest negative the whole gradient goes
        to the lowest index (the dense ``amax`` splits it; the value is the same).

    Raises:
        ValueError: A bad argument, named.
    """
    MARGIN.check(margin, "margin")
    check_reduction(reduction)
    batch = prepare_embeddings(
        img_emb, txt_emb, img_ids, txt_ids, chunk_size=chunk_size, normalize=normalize
    )
    terms = (_hardest_terms if hardest else _sum_terms)(batch, float(margin), shard)
    return reduce_per_index(terms, reduction, batch.batch)


@register_loss("triplet")
class TripletLoss(HardestNegativeLoss):
    """Module form of :func:`triplet_loss` (VSE++; Unified-loss paper Eq. 1-2).

    ``chunk_size=N`` makes the embedding entry point use :func:`tiled_triplet_loss`, which never
    holds the ``B x B`` matrix (same value; at exact ties of the hardest negative the whole
    gradient goes to the first index instead of being split).
    """

    declared = LossCapabilities(
        local_shards=True,
        all_negatives_warmup=True,
        paper_comparison=0,
        soft_margins=True,
        hinge_terms=True,
    )
    paper = "VSE++ (Faghri et al. 2018)"
    equation = "Unified Eq. (1)-(2)"
    Params = TripletParams
    config: TripletParams
    dense = staticmethod(triplet_loss)
    tiled = staticmethod(tiled_triplet_loss)
