"""Triplet alignment loss (TAL; RDE, Qin et al., CVPR 2024, Sec. 3.3), dense and tiled.

For image anchor ``i`` with cosine similarities ``s_ij`` to the batch's texts, ``P_i`` the
texts of the same identity (the own pair included) and ``N_i`` the others,

    S+_i   = sum_{j in P_i} alpha_ij s_ij,   alpha_ij = softmax_{j in P_i}(s_ij / tau),
    L_i2t  = [m - S+_i + tau log sum_{j in N_i} exp(s_ij / tau)]_+ ,

``tau log sum exp(s / tau)`` a log-sum-exp relaxation of the hardest negative (it tends to
``max_j s_ij`` as ``tau -> 0``) and ``S+_i`` a softmax-weighted positive that leans on the
hardest positive. ``L_t2i`` is the same over each text's column of image similarities, and the
term of pair ``i`` is ``L_i2t + L_t2i``. Readings (RDE's paper and its ``compute_TAL_per``):

* ``tau = 0.015`` and ``m = 0.1``: the released runs' values (the function's own defaults
  differ; the training script passes these).
* ``alpha`` is a constant (``.detach()`` in the code; ``detach_weights=True``); the paper's
  formula does not say. ``detach_weights=False`` back-propagates through the weights as well.
* The identities are the ids (``img_ids`` / ``txt_ids``: person ids); the diagonal always is a
  positive. A line without negatives contributes a graph-attached 0 (the code takes
  ``log 0 = -inf`` and clamps it to 0).
* The code clamps the negatives' sum at ``1e36`` before its log, an overflow guard a
  log-sum-exp does not need; it is left out.
* RDE's code builds ``scores = text @ image.T`` (rows texts); both directions are summed, so
  the value is the same. It then sums the per-pair terms weighted by its clean-pair estimate;
  without that estimate (every weight 1) the code's value is the plain **sum** over the batch,
  this loss's default ``reduction="sum"`` (``"mean"`` divides by ``B``). RDE's noisy-pair
  filter itself is not part of the loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._checks import FLAG, MARGIN, POSITIVE, check_positive, check_reduction
from ..similarity import Ids
from ._base import LossCapabilities, PairLoss, prepare, reduce_per_index, reduce_terms
from ._tiling import prepare_embeddings, shard_directions, tile_rows
from .params import TiledLossParams, param, reduction_param
from .registry import register_loss


@dataclass(frozen=True, kw_only=True)
class TALParams(TiledLossParams):
    """Parameters of TAL (defaults: RDE's released runs)."""

    tau: float = param(0.015, POSITIVE, "temperature of the negatives' LSE and the weights")
    margin: float = param(0.1, MARGIN, "the hinge margin m")
    detach_weights: bool = param(True, FLAG, "alpha is a constant (RDE's code)")
    reduction: str = reduction_param("sum")


def _check(tau: float, margin: float, reduction: str) -> None:
    check_positive(tau, "tau")
    if not isinstance(margin, int | float) or isinstance(margin, bool) or margin < 0:
        raise ValueError(f"margin must be a number >= 0, got {margin!r}")
    check_reduction(reduction)


def tal_rows(
    scores: torch.Tensor,
    positives: torch.Tensor,
    tau: float,
    margin: float,
    detach_weights: bool,
) -> torch.Tensor:
    """The TAL term of each row: ``[m - sum_P alpha s + tau log sum_N exp(s / tau)]_+``.

    Args:
        scores: ``(n, C)`` similarities of ``n`` anchors to ``C`` candidates.
        positives: Bool ``(n, C)``, the same identity; each row holds at least one.
        tau: The temperature.
        margin: The margin ``m``.
        detach_weights: ``alpha`` without gradient.

    Returns:
        ``(n,)``; a row without negatives gives a graph-attached 0.
    """
    lowest = torch.finfo(scores.dtype).min
    z = scores / tau
    weights = z.masked_fill(~positives, lowest).softmax(1)
    if detach_weights:
        weights = weights.detach()
    positive = (weights * scores).sum(1)
    negatives_lse = z.masked_fill(positives, lowest).logsumexp(1)
    term = (margin - positive + tau * negatives_lse).clamp_min(0)
    has_negative = (~positives).any(1)
    return torch.where(has_negative, term, scores.sum(1) * 0)


def tal_loss(
    sim: torch.Tensor,
    *,
    tau: float = 0.015,
    margin: float = 0.1,
    detach_weights: bool = True,
    pos_mask: torch.Tensor | None = None,
    reduction: str = "sum",
) -> torch.Tensor:
    """TAL on a ``(B, B)`` similarity matrix (RDE Sec. 3.3, both directions).

    Args:
        sim: ``(B, B)`` cosines, rows images, columns texts, positives on the diagonal.
        tau: The temperature of the negatives' log-sum-exp and of the positives' weights.
        margin: The hinge margin ``m``.
        detach_weights: The positives' weights ``alpha`` are constants (RDE's code).
        pos_mask: Optional bool ``(B, B)`` further matches (the same identity): positives.
        reduction: ``"sum"`` (RDE's value), ``"mean"`` or ``"none"`` (the ``(B,)`` terms:
            image ``i``'s term plus text ``i``'s).

    Returns:
        The reduced loss, or the per-index terms.

    Raises:
        ValueError: A bad argument, named.
    """
    _check(tau, margin, reduction)
    s, negatives = prepare(sim, pos_mask)
    positives = ~negatives
    img_terms = tal_rows(s, positives, tau, margin, detach_weights)
    txt_terms = tal_rows(s.t(), positives.t(), tau, margin, detach_weights)
    return reduce_terms(img_terms, txt_terms, reduction)


def tiled_tal_loss(
    img_emb: torch.Tensor,
    txt_emb: torch.Tensor,
    *,
    tau: float = 0.015,
    margin: float = 0.1,
    detach_weights: bool = True,
    img_ids: Ids | None = None,
    txt_ids: Ids | None = None,
    chunk_size: int,
    reduction: str = "sum",
    normalize: bool = True,
    shard: tuple[int, int] | None = None,
) -> torch.Tensor:
    """:func:`tal_loss` on embeddings in ``O(chunk_size * B)`` memory.

    The embeddings, ``img_ids``/``txt_ids`` (identities), ``chunk_size`` (the tile height),
    ``reduction``, ``normalize`` and ``shard`` work as in every tiled form (``docs/tiled.md``).
    Each direction is a rectangle of whole rows (images against every text, texts against
    every image) streamed by the engine's ``tile_rows``: a tile holds complete rows, so each
    row's log-sum-exp and positive weights are exact, and the tile is recomputed in the
    backward pass.

    Args:
        tau: The temperature.
        margin: The hinge margin ``m``.
        detach_weights: The positives' weights are constants.

    Returns:
        The value of ``tal_loss(cosine_similarity(img, txt), pos_mask=positive_mask(ids))``.

    Raises:
        ValueError: A bad argument, named.
    """
    _check(tau, margin, reduction)
    batch = prepare_embeddings(
        img_emb, txt_emb, img_ids, txt_ids, chunk_size=chunk_size, normalize=normalize
    )
    terms = []
    for d in shard_directions(batch, (0, batch.batch) if shard is None else shard):
        matches = d.exclusions  # own pair and equal ids: the positives

        def rows(scores: torch.Tensor, start: int, matches=matches) -> torch.Tensor:
            positives = matches.mask(start, start + scores.shape[0])
            return tal_rows(scores, positives, tau, margin, detach_weights)

        terms.append(tile_rows(rows, d.rows, d.cands, batch.tile))
    return reduce_per_index(terms[0] + terms[1], reduction, batch.batch)


@register_loss("tal")
class TALLoss(PairLoss):
    """Module form of :func:`tal_loss`; ``chunk_size=N`` selects :func:`tiled_tal_loss`.

    Pass the identities as ids: ``loss(img_emb, txt_emb, img_ids=pids, txt_ids=pids)``.
    """

    declared = LossCapabilities(local_shards=True)
    paper = "TAL / RDE (Qin et al. 2024)"
    equation = "RDE Sec. 3.3 (TAL)"
    Params = TALParams
    config: TALParams
    dense = staticmethod(tal_loss)
    tiled = staticmethod(tiled_tal_loss)


__all__ = ["TALLoss", "tal_loss", "tal_rows", "tiled_tal_loss"]
