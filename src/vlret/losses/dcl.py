"""Decoupled contrastive loss (DCL; Yeh et al., ECCV 2022, Eq. 6), dense and tiled.

InfoNCE without the positive in its denominator: per anchor ``-s_ii / tau + log sum_{j neg}
exp(s_ij / tau)``, for image anchors (rows) and text anchors (columns). The cross-modal reading
used here takes the negatives from the other modality only, as the other losses of this package
do; further positives (``pos_mask``, equal ids) are left out. An anchor without a negative
contributes a graph-attached zero (its loss would be an unbounded pull). Identity with InfoNCE
at the same temperature: ``infonce_i = log(1 + exp(dcl_i))`` per direction.

``weighted=True`` is the paper's weighted variant DCLW: the positive term of pair ``i`` is
scaled by the negative von Mises-Fisher weight

    w_i = 2 - exp(s_ii / sigma) / ((1/B) sum_k exp(s_kk / sigma)) = 2 - B softmax_i(s_kk / sigma)

(``sigma = 0.5`` in the paper), ``-w_i s_ii / tau + log sum_{j neg} exp(s_ij / tau)``: pairs
that are already close are pulled less, the weights average 1. Readings:

* The mean runs over the ``B`` positive pairs of the (gathered) batch, the diagonal; the two
  directions share ``s_ii`` and so the weight. Further positives (ids) are not in it.
* The weight is not detached by default, as in the re-implementation the paper's readers use
  (raminnakhli/Decoupled-Contrastive-Learning, ``DCLW``): the gradient flows through it.
  lightly's ``DCLWLoss`` detaches it; ``detach_weight=True`` gives that reading.
* Under a shard the weights still normalise over the whole batch: every shard computes the
  ``B`` positive scores (a ``(B,)`` vector, no tile), so the shards add up to the batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch

from .._checks import FLAG, POSITIVE, check_positive, check_reduction
from ..similarity import Ids
from ._base import LossCapabilities, PairLoss, prepare, reduce_per_index, reduce_terms
from ._tiling import (
    check_shard,
    negatives_lse,
    prepare_embeddings,
    scalar_tensor,
    shard_directions,
)
from .params import TiledLossParams, param
from .registry import register_loss


@dataclass(frozen=True, kw_only=True)
class DCLParams(TiledLossParams):
    """Parameters of DCL / DCLW."""

    temperature: float = param(0.1, POSITIVE, "tau, the logits' temperature")
    weighted: bool = param(False, FLAG, "DCLW: weight each positive term by w_i (vMF)")
    sigma: float = param(0.5, POSITIVE, "the temperature of DCLW's weights")
    detach_weight: bool = param(False, FLAG, "no gradient through DCLW's weights (lightly)")


def _decoupled(lse: torch.Tensor, pos_logit: torch.Tensor) -> torch.Tensor:
    """``lse - pos_logit``, and 0 where the line has no negative (``lse`` is the sentinel)."""
    return torch.where(lse > torch.finfo(lse.dtype).min, lse - pos_logit, 0.0)


def _check(temperature, weighted, sigma, detach_weight, reduction) -> None:
    check_positive(temperature, "temperature")
    FLAG.check(weighted, "weighted")
    check_positive(sigma, "sigma")
    FLAG.check(detach_weight, "detach_weight")
    check_reduction(reduction)


def _vmf_weights(positives: torch.Tensor, sigma: float, *, detach: bool = False) -> torch.Tensor:
    """DCLW's negative von Mises-Fisher weights ``w_i = 2 - B softmax_i(s_ii / sigma)``.

    Args:
        positives: ``(B,)`` the positive scores ``s_ii`` of the whole batch.
        sigma: The weights' temperature, positive.
        detach: Cut the gradient through the weights.

    Returns:
        ``(B,)`` weights, averaging 1.
    """
    if detach:
        positives = positives.detach()
    return 2.0 - positives.shape[0] * torch.softmax(positives / sigma, dim=0)


def dcl_loss(
    sim: torch.Tensor,
    *,
    temperature: float | torch.Tensor = 0.1,
    weighted: bool = False,
    sigma: float = 0.5,
    detach_weight: bool = False,
    pos_mask: torch.Tensor | None = None,
    reduction: str = "mean",
) -> torch.Tensor:
    """DCL on a ``(B, B)`` similarity matrix (Eq. 6, both directions), or DCLW.

    Args:
        sim: ``(B, B)`` scores, rows images, columns texts, positives on the diagonal.
        temperature: ``tau``, a float or a (learnable) scalar tensor.
        weighted: DCLW: scale each positive term by its von Mises-Fisher weight ``w_i``.
        sigma: The weights' temperature (with ``weighted``), positive.
        detach_weight: With ``weighted``, no gradient through ``w_i`` (lightly's reading).
        pos_mask: Optional bool ``(B, B)`` further positives, never negatives.
        reduction: ``"mean"`` (over the ``B`` indices of the two directions' sum), ``"sum"``
            or ``"none"``.

    Returns:
        The reduced loss, or the ``(B,)`` per-index terms.

    Raises:
        ValueError: A bad argument, named.
    """
    _check(temperature, weighted, sigma, detach_weight, reduction)
    s, negatives = prepare(sim, pos_mask)
    z = (s / temperature).masked_fill(~negatives, torch.finfo(s.dtype).min)
    pos = s.diagonal() / temperature
    if weighted:
        pos = _vmf_weights(s.diagonal(), sigma, detach=detach_weight) * pos
    return reduce_terms(_decoupled(z.logsumexp(1), pos), _decoupled(z.logsumexp(0), pos), reduction)


def tiled_dcl_loss(
    img_emb: torch.Tensor,
    txt_emb: torch.Tensor,
    *,
    temperature: float | torch.Tensor = 0.1,
    weighted: bool = False,
    sigma: float = 0.5,
    detach_weight: bool = False,
    img_ids: Ids | None = None,
    txt_ids: Ids | None = None,
    chunk_size: int,
    reduction: str = "mean",
    normalize: bool = True,
    shard: tuple[int, int] | None = None,
) -> torch.Tensor:
    """:func:`dcl_loss` on embeddings in ``O(chunk_size * B)`` memory.

    The embeddings, ``img_ids``/``txt_ids``, ``chunk_size`` (the tile height), ``reduction``,
    ``normalize`` and ``shard`` work as in every tiled form (``docs/tiled.md``).

    Args:
        temperature: ``tau``, a float or a (learnable) scalar tensor.
        weighted: DCLW (see :func:`dcl_loss`); the weights normalise over the whole batch,
            also under a shard.
        sigma: The weights' temperature, positive.
        detach_weight: No gradient through the weights.

    Returns:
        The value of ``dcl_loss`` on the cosine matrix.

    Raises:
        ValueError: A bad argument, named.
    """
    _check(temperature, weighted, sigma, detach_weight, reduction)
    batch = prepare_embeddings(
        img_emb, txt_emb, img_ids, txt_ids, chunk_size=chunk_size, normalize=normalize
    )
    c = 1.0 / scalar_tensor(temperature, batch.x, "temperature")
    # the whole batch's positive scores: a shard's weights normalise over all of them
    every = (batch.x * batch.y).sum(1)
    weight = _vmf_weights(every, sigma, detach=detach_weight) if weighted else None
    if shard is None:
        x, y = batch.x, batch.y
        exclusions = batch.exclusions
        rows, cols = negatives_lse(x * c, y, exclusions, batch.tile, columns=True)
        pos = c * every if weight is None else c * weight * every
        terms = _decoupled(rows, pos) + _decoupled(cols, pos)
    else:
        start, stop = check_shard(shard, batch.batch)
        scale = c if weight is None else c * weight[start:stop]
        terms = cast(  # a sum of two tensors, never the start value 0
            torch.Tensor,
            sum(
                _decoupled(
                    negatives_lse(d.rows * c, d.cands, d.exclusions, batch.tile, columns=False),
                    scale * d.positives,
                )
                for d in shard_directions(batch, shard)
            ),
        )
    return reduce_per_index(terms, reduction, batch.batch)


@register_loss("dcl")
class DCLLoss(PairLoss):
    """Module form of :func:`dcl_loss`; ``chunk_size=N`` selects :func:`tiled_dcl_loss`;
    ``weighted=True`` is DCLW."""

    declared = LossCapabilities(local_shards=True)
    paper = "DCL (Yeh et al. 2022)"
    equation = "DCL Eq. (6); DCLW (vMF-weighted positive)"
    Params = DCLParams
    dense = staticmethod(dcl_loss)
    tiled = staticmethod(tiled_dcl_loss)


__all__ = ["DCLLoss", "dcl_loss", "tiled_dcl_loss"]
