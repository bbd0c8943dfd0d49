"""Hard-negative noise contrastive estimation (HN-NCE; Radenovic et al., CVPR 2023, "DiHT",
Sec. 3.3), dense and tiled.

InfoNCE whose negatives are importance-weighted towards the hard ones. For image anchor ``i``
with logits ``z_ij = s_ij / tau`` and positive logit ``p_i = z_ii``:

    L_i2t(i) = -log( e^{p_i} / (alpha e^{p_i} + sum_{j neg} w_ij e^{z_ij}) ),
    w_ij = n_i e^{beta1 z_ij} / sum_{k neg} e^{beta1 z_ik},

and ``L_t2i`` the same over column ``i`` (the images as candidates of text anchor ``i``) with
``beta2``. The term of index ``i`` is ``L_i2t(i) + L_t2i(i)``; ``"mean"`` averages it over the
``B`` indices, i.e. the two directions are summed and each is averaged over the batch, as in
the paper's loss and the public re-implementations (the authors did not release theirs).
``alpha`` scales the positive in the denominator (``alpha = 0`` removes it: the decoupled
variant, with ``beta = 0`` exactly DCL); ``beta1``/``beta2`` concentrate the weights on the
hard negatives (``0``: uniform weights); ``alpha = 1, beta1 = beta2 = 0`` is InfoNCE.

Defaults: ``alpha = 1`` and ``beta1 = beta2 = 0.5``, the setting of the public
re-implementations of DiHT's loss (one ``beta`` for both directions), and ``tau = 0.07``,
CLIP's initial temperature: DiHT trains CLIP with CLIP's learnable temperature, which the module
offers as ``learnable_temperature=True`` (clamped like ``InfoNCELoss``).

Readings:

* The weights are part of the loss as written: they are not detached, so the gradient also
  flows through them (as in the paper's formula and the re-implementations).
* ``beta`` multiplies the temperature-scaled logit: ``w ~ e^{beta s / tau}``.
* Further positives (``pos_mask``, equal ids) are neither negatives nor weighted, as in every
  loss of this package. The paper's weight normaliser ``n - 1`` (the number of negatives of a
  batch of distinct pairs) becomes the line's own number of negatives ``n_i``, so the weights
  of a line always average 1 and ``beta = 0`` stays exactly InfoNCE with ids.
* A line without negatives contributes a graph-attached zero, as in InfoNCE (its exact value,
  the constant ``log alpha``, carries no gradient and is undefined at ``alpha = 0``).

Computed in log space: ``log sum_j w_ij e^{z_ij} = log n_i + LSE_neg((1 + beta) z_i)
- LSE_neg(beta z_i)``, and the term is ``logaddexp(log alpha, that - p_i)`` (``alpha = 0``:
``that - p_i``). The tiled form streams the two log-sum-exps: with ``beta1 == beta2`` the
square mode of ``negatives_lse`` gives both directions from one exponential per entry and
scale (two passes, one when ``beta = 0``); with ``beta1 != beta2``, and for a shard, each
direction is one ``tile_rows`` pass that evaluates both scales on each tile of scores.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import cast

import torch

from .._checks import NON_NEGATIVE, POSITIVE, check_positive, check_reduction
from ..similarity import Ids
from ._base import LossCapabilities, PairLoss, prepare, reduce_per_index, reduce_terms
from ._temperature import CLIPTemperature, CLIPTemperatureParams
from ._tiling import (
    Direction,
    negatives_lse,
    prepare_embeddings,
    scalar_tensor,
    shard_directions,
    tile_rows,
)
from .params import param
from .registry import register_loss


@dataclass(frozen=True, kw_only=True)
class HNNCEParams(CLIPTemperatureParams):
    """Parameters of HN-NCE (defaults: the public re-implementations; CLIP's initial tau)."""

    temperature: float = param(0.07, POSITIVE, "tau, the logits' temperature")
    alpha: float = param(1.0, NON_NEGATIVE, "weight of the positive in the denominator")
    beta1: float = param(0.5, NON_NEGATIVE, "concentration of the image-to-text weights")
    beta2: float = param(0.5, NON_NEGATIVE, "concentration of the text-to-image weights")


def _check(temperature, alpha, beta1, beta2, reduction) -> None:
    check_positive(temperature, "temperature")
    NON_NEGATIVE.check(alpha, "alpha")
    NON_NEGATIVE.check(beta1, "beta1")
    NON_NEGATIVE.check(beta2, "beta2")
    check_reduction(reduction)


def _masked_lse(logits: torch.Tensor, negatives: torch.Tensor, dim: int) -> torch.Tensor:
    """Log-sum-exp of the negatives along ``dim`` (the dtype's lowest value when none)."""
    return logits.masked_fill(~negatives, torch.finfo(logits.dtype).min).logsumexp(dim)


def _terms(
    hard: torch.Tensor,
    soft: torch.Tensor | None,
    count: torch.Tensor,
    pos_logit: torch.Tensor,
    alpha: float,
) -> torch.Tensor:
    """Per line ``-log(e^p / (alpha e^p + sum_neg w e^z))`` from ``hard = LSE_neg((1+beta) z)``
    and ``soft = LSE_neg(beta z)`` (``None`` for ``beta = 0``, where it is ``log n``), and 0
    where the line has no negative."""
    if soft is None:
        excess = hard - pos_logit
    else:
        # n = 0 only where hard = soft = the sentinel; clamp keeps that branch finite
        excess = count.clamp(min=1).to(hard.dtype).log() + (hard - soft) - pos_logit
    if alpha > 0:
        excess = torch.logaddexp(excess.new_tensor(math.log(alpha)), excess)
    return torch.where(count > 0, excess, 0.0)


def hn_nce_loss(
    sim: torch.Tensor,
    *,
    temperature: float | torch.Tensor = 0.07,
    alpha: float = 1.0,
    beta1: float = 0.5,
    beta2: float = 0.5,
    pos_mask: torch.Tensor | None = None,
    reduction: str = "mean",
) -> torch.Tensor:
    """HN-NCE on a ``(B, B)`` similarity matrix (DiHT Sec. 3.3, both directions summed).

    Args:
        sim: ``(B, B)`` scores, rows images, columns texts, positives on the diagonal.
        temperature: ``tau``, a float or a (learnable) scalar tensor, which gets its gradient.
        alpha: Weight of the positive in the denominator, ``>= 0`` (``1``: InfoNCE's).
        beta1: Concentration of the image-to-text weights (image anchors, rows), ``>= 0``.
        beta2: Concentration of the text-to-image weights (text anchors, columns), ``>= 0``.
        pos_mask: Optional bool ``(B, B)`` further positives, never negatives.
        reduction: ``"mean"`` (over the ``B`` indices of the two directions' sum), ``"sum"``
            or ``"none"``.

    Returns:
        The reduced loss, or the ``(B,)`` per-index terms.

    Raises:
        ValueError: A bad argument, named.
    """
    _check(temperature, alpha, beta1, beta2, reduction)
    s, negatives = prepare(sim, pos_mask)
    z = s / temperature
    pos = z.diagonal()
    out = []
    for beta, dim in ((beta1, 1), (beta2, 0)):
        hard = _masked_lse(z * (1.0 + beta), negatives, dim)
        soft = _masked_lse(z * beta, negatives, dim) if beta else None
        out.append(_terms(hard, soft, negatives.sum(dim), pos, alpha))
    return reduce_terms(out[0], out[1], reduction)


def _negative_counts(d: Direction) -> torch.Tensor:
    """``(n,)`` the number of negatives of each anchor of ``d``, without a ``(n, C)`` mask."""
    ex = d.exclusions
    width = d.cands.shape[0]
    if ex.row_codes is None:
        return torch.full((d.rows.shape[0],), width - 1, device=d.rows.device)
    assert ex.col_codes is not None  # row and column codes come together
    ordered = ex.col_codes.sort().values
    rows = ex.row_codes
    same = torch.searchsorted(ordered, rows, right=True) - torch.searchsorted(ordered, rows)
    # the own pair is excluded too; it is among the equal codes unless the two ids differ
    return width - same - (rows != ex.col_codes[d.pair]).long()


def _direction_terms(
    d: Direction, scale: torch.Tensor, beta: float, alpha: float, tile: int
) -> torch.Tensor:
    """The terms of ``d``'s anchors, both log-sum-exps from one tile of scores at a time."""
    count = _negative_counts(d)

    def rows(scores: torch.Tensor, start: int, pos: torch.Tensor, n: torch.Tensor):
        negatives = ~d.exclusions.mask(start, start + scores.shape[0])
        z = scores * scale
        hard = _masked_lse(z * (1.0 + beta), negatives, 1)
        soft = _masked_lse(z * beta, negatives, 1) if beta else None
        return _terms(hard, soft, n, pos, alpha)

    return tile_rows(rows, d.rows, d.cands, tile, scale * d.positives, count)


def tiled_hn_nce_loss(
    img_emb: torch.Tensor,
    txt_emb: torch.Tensor,
    *,
    temperature: float | torch.Tensor = 0.07,
    alpha: float = 1.0,
    beta1: float = 0.5,
    beta2: float = 0.5,
    img_ids: Ids | None = None,
    txt_ids: Ids | None = None,
    chunk_size: int,
    reduction: str = "mean",
    normalize: bool = True,
    shard: tuple[int, int] | None = None,
) -> torch.Tensor:
    """:func:`hn_nce_loss` on embeddings in ``O(chunk_size * B)`` memory.

    The embeddings, ``img_ids``/``txt_ids``, ``chunk_size`` (the tile height), ``reduction``,
    ``normalize`` and ``shard`` work as in every tiled form (``docs/tiled.md``). With
    ``beta1 == beta2`` the whole batch takes the square mode of ``negatives_lse`` (one or two
    passes for both directions); otherwise, and for a shard, each direction is one
    ``tile_rows`` pass (module docstring).

    Args:
        temperature: ``tau``, a float or a (learnable) scalar tensor, which gets its gradient.
        alpha: Weight of the positive in the denominator, ``>= 0``.
        beta1: Concentration of the image-to-text weights, ``>= 0``.
        beta2: Concentration of the text-to-image weights, ``>= 0``.

    Returns:
        The value of ``hn_nce_loss`` on the cosine (or, ``normalize=False``, dot-product)
        matrix; ``"none"`` under a shard gives the ``(stop - start,)`` terms of its pairs.

    Raises:
        ValueError: A bad argument, named.
    """
    _check(temperature, alpha, beta1, beta2, reduction)
    batch = prepare_embeddings(
        img_emb, txt_emb, img_ids, txt_ids, chunk_size=chunk_size, normalize=normalize
    )
    c = 1.0 / scalar_tensor(temperature, batch.x, "temperature")
    images, texts = shard_directions(batch, (0, batch.batch) if shard is None else shard)
    if shard is None and beta1 == beta2:
        x, y, exclusions, tile = batch.x, batch.y, batch.exclusions, batch.tile
        hard = negatives_lse(x * ((1.0 + beta1) * c), y, exclusions, tile, columns=True)
        soft = (
            negatives_lse(x * (beta1 * c), y, exclusions, tile, columns=True)
            if beta1
            else (None, None)
        )
        pos = c * (x * y).sum(1)
        terms = cast(  # a sum of two tensors, never the start value 0
            torch.Tensor,
            sum(
                _terms(h, s, _negative_counts(d), pos, alpha)
                for h, s, d in zip(hard, soft, (images, texts), strict=True)
            ),
        )
    else:
        terms = _direction_terms(images, c, beta1, alpha, batch.tile) + _direction_terms(
            texts, c, beta2, alpha, batch.tile
        )
    return reduce_per_index(terms, reduction, batch.batch)


@register_loss("hn_nce")
class HNNCELoss(CLIPTemperature, PairLoss):
    """Module form of :func:`hn_nce_loss`; ``chunk_size=N`` selects :func:`tiled_hn_nce_loss`.

    With ``learnable_temperature=True`` the module holds a learnable log-scale
    ``log(1/temperature)``, clamped in place like CLIP (and ``InfoNCELoss``) to
    ``[0, log(max_scale)]`` before each use: DiHT's training setting.
    """

    declared = LossCapabilities(local_shards=True)
    paper = "HN-NCE / DiHT (Radenovic et al. 2023)"
    equation = "DiHT Sec. 3.3 (HN-NCE)"
    Params = HNNCEParams
    config: HNNCEParams
    dense = staticmethod(hn_nce_loss)
    tiled = staticmethod(tiled_hn_nce_loss)


__all__ = ["HNNCELoss", "hn_nce_loss", "tiled_hn_nce_loss"]
