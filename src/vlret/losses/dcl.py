"""Decoupled contrastive loss (DCL; Yeh et al., ECCV 2022, Eq. 6), dense and tiled.

InfoNCE without the positive in its denominator: per anchor ``-s_ii / tau + log sum_{j neg}
exp(s_ij / tau)``, for image anchors (rows) and text anchors (columns). The cross-modal reading
used here takes the negatives from the other modality only, as the other losses of this package
do; further positives (``pos_mask``, equal ids) are left out. An anchor without a negative
contributes a graph-attached zero (its loss would be an unbounded pull). Identity with InfoNCE
at the same temperature: ``infonce_i = log(1 + exp(dcl_i))`` per direction.
"""

from __future__ import annotations

import torch

from .._checks import POSITIVE, check_positive, check_reduction
from ..similarity import Ids
from ._base import LossCapabilities, PairLoss, init_args, prepare, reduce_per_index, reduce_terms
from ._tiling import negatives_lse, prepare_embeddings, scalar_tensor, shard_directions
from .registry import register_loss


def _decoupled(lse: torch.Tensor, pos_logit: torch.Tensor) -> torch.Tensor:
    """``lse - pos_logit``, and 0 where the line has no negative (``lse`` is the sentinel)."""
    return torch.where(lse > torch.finfo(lse.dtype).min, lse - pos_logit, 0.0)


def dcl_loss(
    sim: torch.Tensor,
    *,
    temperature: float | torch.Tensor = 0.1,
    pos_mask: torch.Tensor | None = None,
    reduction: str = "mean",
) -> torch.Tensor:
    """DCL on a ``(B, B)`` similarity matrix (Eq. 6, both directions).

    Args:
        sim: ``(B, B)`` scores, rows images, columns texts, positives on the diagonal.
        temperature: ``tau``, a float or a (learnable) scalar tensor.
        pos_mask: Optional bool ``(B, B)`` further positives, never negatives.
        reduction: ``"mean"`` (over the ``B`` indices of the two directions' sum), ``"sum"``
            or ``"none"``.

    Returns:
        The reduced loss, or the ``(B,)`` per-index terms.

    Raises:
        ValueError: A bad argument, named.
    """
    check_positive(temperature, "temperature")
    check_reduction(reduction)
    s, negatives = prepare(sim, pos_mask)
    z = (s / temperature).masked_fill(~negatives, torch.finfo(s.dtype).min)
    pos = s.diagonal() / temperature
    return reduce_terms(_decoupled(z.logsumexp(1), pos), _decoupled(z.logsumexp(0), pos), reduction)


def tiled_dcl_loss(
    img_emb: torch.Tensor,
    txt_emb: torch.Tensor,
    *,
    temperature: float | torch.Tensor = 0.1,
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

    Returns:
        The value of ``dcl_loss`` on the cosine matrix.

    Raises:
        ValueError: A bad argument, named.
    """
    check_positive(temperature, "temperature")
    check_reduction(reduction)
    batch = prepare_embeddings(
        img_emb, txt_emb, img_ids, txt_ids, chunk_size=chunk_size, normalize=normalize
    )
    c = 1.0 / scalar_tensor(temperature, batch.x, "temperature")
    if shard is None:
        x, y = batch.x, batch.y
        exclusions = batch.exclusions
        rows, cols = negatives_lse(x * c, y, exclusions, batch.tile, columns=True)
        pos = c * (x * y).sum(1)
        terms = _decoupled(rows, pos) + _decoupled(cols, pos)
    else:
        terms = sum(
            _decoupled(
                negatives_lse(d.rows * c, d.cands, d.exclusions, batch.tile, columns=False),
                c * d.positives,
            )
            for d in shard_directions(batch, shard)
        )
    return reduce_per_index(terms, reduction, batch.batch)


@register_loss("dcl")
class DCLLoss(PairLoss):
    """Module form of :func:`dcl_loss`; ``chunk_size=N`` selects :func:`tiled_dcl_loss`."""

    declared = LossCapabilities(local_shards=True)
    paper = "DCL (Yeh et al. 2022)"
    equation = "DCL Eq. (6)"
    params = {"temperature": POSITIVE}

    def __init__(
        self,
        *,
        temperature: float = 0.1,
        reduction: str = "mean",
        normalize: bool = True,
        chunk_size: int | None = None,
    ) -> None:
        DCLLoss.check_params(init_args(locals()))
        super().__init__(reduction=reduction, normalize=normalize, chunk_size=chunk_size)
        self.temperature = float(temperature)

    def tiled_forward(self, img_emb, txt_emb, img_ids, txt_ids, shard=None) -> torch.Tensor:
        arguments = self.tiled_arguments(img_ids, txt_ids, shard)
        return tiled_dcl_loss(img_emb, txt_emb, temperature=self.temperature, **arguments)

    def from_similarity(
        self, sim: torch.Tensor, pos_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        return dcl_loss(
            sim, temperature=self.temperature, pos_mask=pos_mask, reduction=self.reduction
        )

    def extra_repr(self) -> str:
        return f"temperature={self.temperature}, reduction={self.reduction!r}"


__all__ = ["DCLLoss", "dcl_loss", "tiled_dcl_loss"]
