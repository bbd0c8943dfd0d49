"""Similarity distribution matching (SDM; IRRA, Jiang & Ye, CVPR 2023, Sec. 3.3), dense and tiled.

For image anchor ``i`` with cosine similarities ``s_ij`` to the batch's texts,

    p_ij = softmax_j(scale * s_ij),    q_ij = y_ij / sum_k y_ik,
    L_i2t = (1/B) sum_i KL(p_i || q_i) = (1/B) sum_i sum_j p_ij log(p_ij / (q_ij + eps)),

``y_ij = 1`` when text ``j`` describes the same identity as image ``i``; ``L_t2i`` is the same
over each text's row of image similarities, and ``L_sdm = L_i2t + L_t2i``. Readings (the
paper's Eq. 4-6 and IRRA's ``compute_sdm`` agree on each):

* ``scale`` is ``1 / tau`` with IRRA's ``tau = 0.02``: 50, fixed (``learnable_scale=True``
  learns its log instead, unclamped).
* The identities are the ids: ``img_ids`` / ``txt_ids`` are person ids, and every pair of the
  same person is a match (part of ``q``, not a negative); the diagonal always is one.
* ``eps = 1e-8`` inside the log of ``q`` (non-matches get ``log eps``); ``log p`` comes from a
  stable log-softmax. IRRA's code normalises with ``labels / labels.sum(dim=1)``, which
  broadcasts over columns; identity labels are symmetric, so that is the row normalisation.
* ``"mean"`` averages each direction over its ``B`` anchors and sums the two: IRRA's value.

SDM is CMPM's KL (``vlret.losses.cmpm``) on scaled cosines, so this file reuses CMPM's row
kernel and its streamed form; what SDM adds is its declaration and its learnable scale.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .._checks import FLAG, POSITIVE, check_positive, check_reduction
from ..similarity import Ids
from ._base import LossCapabilities, PairLoss, prepare, reduce_per_index, reduce_terms
from ._tiling import prepare_embeddings, scalar_tensor
from .cmpm import kl_rows, tiled_kl_terms
from .params import TiledLossParams, param
from .registry import register_loss


@dataclass(frozen=True, kw_only=True)
class SDMParams(TiledLossParams):
    """Parameters of SDM (defaults: IRRA's)."""

    scale: float = param(50.0, POSITIVE, "multiplies the cosines before the softmax (1/tau)")
    eps: float = param(1e-8, POSITIVE, "keeps log(q + eps) finite for the non-matches")
    learnable_scale: bool = param(False, FLAG, "learn log(scale), from scale", passed=False)


def _check(scale: float | torch.Tensor, eps: float, reduction: str) -> None:
    check_positive(scale, "scale")
    check_positive(eps, "eps")
    check_reduction(reduction)


def sdm_loss(
    sim: torch.Tensor,
    *,
    scale: float | torch.Tensor = 50.0,
    eps: float = 1e-8,
    pos_mask: torch.Tensor | None = None,
    reduction: str = "mean",
) -> torch.Tensor:
    """SDM on a ``(B, B)`` similarity matrix (IRRA Eq. 4-6, both directions).

    Args:
        sim: ``(B, B)`` cosines, rows images, columns texts, positives on the diagonal.
        scale: Multiplies the scores before the softmax, a positive float or a scalar tensor,
            which gets its gradient.
        eps: Keeps ``log(q + eps)`` finite.
        pos_mask: Optional bool ``(B, B)`` further matches (the same identity): part of ``q``.
        reduction: ``"mean"`` (IRRA's value), ``"sum"`` or ``"none"`` (the ``(B,)`` terms:
            image ``i``'s KL plus text ``i``'s).

    Returns:
        The reduced loss, or the per-index terms.

    Raises:
        ValueError: A bad argument, named.
    """
    _check(scale, eps, reduction)
    s, negatives = prepare(sim, pos_mask)
    c, matches = scalar_tensor(scale, s, "scale"), ~negatives
    img_terms = kl_rows(c * s, matches, eps, "l1")
    return reduce_terms(img_terms, kl_rows(c * s.t(), matches.t(), eps, "l1"), reduction)


def tiled_sdm_loss(
    img_emb: torch.Tensor,
    txt_emb: torch.Tensor,
    *,
    scale: float | torch.Tensor = 50.0,
    eps: float = 1e-8,
    img_ids: Ids | None = None,
    txt_ids: Ids | None = None,
    chunk_size: int,
    reduction: str = "mean",
    normalize: bool = True,
    shard: tuple[int, int] | None = None,
) -> torch.Tensor:
    """:func:`sdm_loss` on embeddings in ``O(chunk_size * B)`` memory.

    The embeddings, ``img_ids``/``txt_ids`` (identities), ``chunk_size`` (the tile height),
    ``reduction``, ``normalize`` and ``shard`` work as in every tiled form (``docs/tiled.md``).
    Each direction is streamed in tiles of whole rows, so each row's softmax is exact.

    Returns:
        The value of ``sdm_loss(cosine_similarity(img, txt), pos_mask=positive_mask(ids))``.

    Raises:
        ValueError: A bad argument, named.
    """
    _check(scale, eps, reduction)
    batch = prepare_embeddings(
        img_emb, txt_emb, img_ids, txt_ids, chunk_size=chunk_size, normalize=normalize
    )
    c = scalar_tensor(scale, batch.x, "scale")
    terms = tiled_kl_terms(batch, shard, c, eps, "l1", project=False)
    return reduce_per_index(terms, reduction, batch.batch)


@register_loss("sdm")
class SDMLoss(PairLoss):
    """Module form of :func:`sdm_loss`; ``chunk_size=N`` selects :func:`tiled_sdm_loss`.

    Pass the identities as ids: ``loss(img_emb, txt_emb, img_ids=pids, txt_ids=pids)``. With
    ``learnable_scale=True`` the module holds ``log_scale``, a parameter initialised to
    ``log(scale)``.
    """

    declared = LossCapabilities(local_shards=True)
    paper = "SDM / IRRA (Jiang & Ye 2023)"
    equation = "IRRA Eq. (4)-(6)"
    Params = SDMParams
    config: SDMParams
    dense = staticmethod(sdm_loss)
    tiled = staticmethod(tiled_sdm_loss)

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        if self.config.learnable_scale:
            self.log_scale = nn.Parameter(torch.tensor(math.log(self.config.scale)))

    @property
    def scale(self) -> float | torch.Tensor:
        """The scale in use: the fixed one, or ``exp(log_scale)`` (with its gradient)."""
        return self.log_scale.exp() if self.config.learnable_scale else self.config.scale

    def arguments(self) -> dict[str, Any]:
        return {**super().arguments(), "scale": self.scale}

    def extra_repr(self) -> str:
        return self.config.describe(scale=float(torch.as_tensor(self.scale).detach()))


__all__ = ["SDMLoss", "sdm_loss", "tiled_sdm_loss"]
