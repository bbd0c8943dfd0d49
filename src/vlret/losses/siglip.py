"""Sigmoid loss (SigLIP; Zhai et al., ICCV 2023, Eq. 1 / Algorithm 1), dense and tiled.

Every image-text pair of the batch is an independent binary classification:

    L = -(1/B) sum_i sum_j log sigmoid(z_ij (e^t s_ij + b))

with ``z_ij = +1`` for a matching pair and ``-1`` otherwise, a learnable log-scale ``t``
(initialised to ``log 10``) and a learnable bias ``b`` (initialised to ``-10``, so that the
many negatives start near their target and the first steps are not spent pushing them down).
There is no softmax and no second direction: the ``B x B`` sum over the rows already covers
every pair once, so the term of index ``i`` is row ``i``'s sum over all ``j`` (image ``i``
against every text) and ``"mean"`` divides the total by ``B``.

Further positives (``pos_mask``, equal ids) are **positives**, ``z_ij = +1``: another caption of
the same image is a matching pair, and a sigmoid loss has no denominator they could be left out
of. open_clip's ``SigLipLoss`` takes only the diagonal as positive (``labels = 2 * eye - 1``);
with distinct ids the two agree.

Mapping to open_clip: ``SigLipLoss.forward(image_features, text_features, logit_scale,
logit_bias)`` computes ``logits = logit_scale * image_features @ text_features.T + logit_bias``,
``labels = 2 * eye - 1`` and returns ``-logsigmoid(labels * logits).sum() / B``. The open_clip
model stores the log-scale as its ``logit_scale`` parameter and passes ``logit_scale.exp()`` to
the loss. So our ``t`` (``SigLIPLoss.log_scale``) is the model's ``logit_scale`` parameter, the
loss argument ``logit_scale`` is our ``scale = exp(t)``, our ``b`` is ``logit_bias``, and our
``"mean"`` equals its value on features the model has already normalised (``normalize=True``
normalises here instead). open_clip's training loop also clamps the log-scale to
``[0, log 100]`` after each step; the paper does not, and neither does this module.

All terms are computed with ``logsigmoid`` (stable for any logit, no ``log(sigmoid)``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .._checks import FLAG, REAL, check_positive, check_real, check_reduction, compute_dtype
from ..similarity import Ids
from ._base import LossCapabilities, PairLoss, prepare, reduce_per_index
from ._tiling import Exclusions, prepare_embeddings, scalar_tensor, shard_directions, tile_rows
from .params import TiledLossParams, param
from .registry import register_loss


@dataclass(frozen=True, kw_only=True)
class SigLIPParams(TiledLossParams):
    """Parameters of SigLIP: the initial log-scale and bias, and whether they are learned
    (the module hands ``scale = exp(t)`` and ``b`` to the functions)."""

    log_scale: float = param(math.log(10.0), REAL, "t, the initial log-scale", passed=False)
    bias: float = param(-10.0, REAL, "b, the initial bias", passed=False)
    learnable_scale: bool = param(True, FLAG, "t is an nn.Parameter", passed=False)
    learnable_bias: bool = param(True, FLAG, "b is an nn.Parameter", passed=False)


def _pair_terms(
    scores: torch.Tensor, positives: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor
) -> torch.Tensor:
    """``-sum_j log sigmoid(z_ij (scale * s_ij + bias))`` per row, ``z = +1`` on ``positives``."""
    logits = scale * scores + bias
    return -F.logsigmoid(torch.where(positives, logits, -logits)).sum(1)


def siglip_loss(
    sim: torch.Tensor,
    *,
    scale: float | torch.Tensor = 10.0,
    bias: float | torch.Tensor = -10.0,
    pos_mask: torch.Tensor | None = None,
    reduction: str = "mean",
) -> torch.Tensor:
    """SigLIP's sigmoid loss on a ``(B, B)`` similarity matrix (Eq. 1, Algorithm 1).

    Args:
        sim: ``(B, B)`` scores, rows images, columns texts, positives on the diagonal.
        scale: ``e^t``, the logit scale (paper: ``t = log 10`` at the start), a positive float
            or a (learnable) scalar tensor, which gets its gradient.
        bias: ``b`` (paper: ``-10`` at the start), a float or a (learnable) scalar tensor.
        pos_mask: Optional bool ``(B, B)`` further positives; they are positives
            (``z_ij = +1``), like the diagonal.
        reduction: ``"mean"`` (the paper's ``1/B`` times the sum over all pairs), ``"sum"``
            or ``"none"`` (row ``i``'s sum over every text ``j``).

    Returns:
        The reduced loss, or the ``(B,)`` per-index terms.

    Raises:
        ValueError: A bad argument, named.
    """
    check_positive(scale, "scale")
    check_real(bias, "bias")
    check_reduction(reduction)
    s, negatives = prepare(sim, pos_mask)
    c, b = scalar_tensor(scale, s, "scale"), scalar_tensor(bias, s, "bias")
    return reduce_per_index(_pair_terms(s, ~negatives, c, b), reduction)


def tiled_siglip_loss(
    img_emb: torch.Tensor,
    txt_emb: torch.Tensor,
    *,
    scale: float | torch.Tensor = 10.0,
    bias: float | torch.Tensor = -10.0,
    img_ids: Ids | None = None,
    txt_ids: Ids | None = None,
    chunk_size: int,
    reduction: str = "mean",
    normalize: bool = True,
    shard: tuple[int, int] | None = None,
) -> torch.Tensor:
    """:func:`siglip_loss` on embeddings in ``O(chunk_size * B)`` memory.

    The embeddings, ``img_ids``/``txt_ids``, ``chunk_size`` (the tile height), ``reduction``,
    ``normalize`` and ``shard`` work as in every tiled form (``docs/tiled.md``). One direction
    covers every pair, so only rows are streamed (``tile_rows``): row ``i``'s term is its sum
    over all texts, the tile recomputed in the backward pass. A shard is its images
    ``start:stop`` against every text; the positives of those rows are each row's own pair and
    the texts with an equal id (the shard's exclusions).

    Args:
        scale: ``e^t``, a positive float or a (learnable) scalar tensor.
        bias: ``b``, a float or a (learnable) scalar tensor.

    Returns:
        The value of ``siglip_loss`` on the cosine (or, ``normalize=False``, dot-product)
        matrix; ``"none"`` under a shard gives the ``(stop - start,)`` terms of its rows.

    Raises:
        ValueError: A bad argument, named.
    """
    check_positive(scale, "scale")
    check_real(bias, "bias")
    check_reduction(reduction)
    batch = prepare_embeddings(
        img_emb, txt_emb, img_ids, txt_ids, chunk_size=chunk_size, normalize=normalize
    )
    c, b = scalar_tensor(scale, batch.x, "scale"), scalar_tensor(bias, batch.x, "bias")
    images, _ = shard_directions(batch, (0, batch.batch) if shard is None else shard)
    positives: Exclusions = images.exclusions  # own pair and equal ids: the z = +1 entries

    def rows(scores: torch.Tensor, start: int) -> torch.Tensor:
        return _pair_terms(scores, positives.mask(start, start + scores.shape[0]), c, b)

    terms = tile_rows(rows, images.rows, images.cands, batch.tile)
    return reduce_per_index(terms, reduction, batch.batch)


#: Lower bound of a row's norm when the embeddings are normalised (as the tiled forms).
_NORM_EPS = 1e-8


def siglip_block_terms(
    img_emb: torch.Tensor,
    txt_emb: torch.Tensor,
    positives: Callable[[int, int], torch.Tensor],
    *,
    scale: float | torch.Tensor = 10.0,
    bias: float | torch.Tensor = -10.0,
    chunk_size: int | None = None,
    normalize: bool = True,
) -> torch.Tensor:
    """Each image's sum of SigLIP pair terms against one block of texts: the ring exchange's
    unit (``LossCapabilities.pairwise_sum``, :mod:`vlret.train.parallel.ring`).

    Args:
        img_emb: ``(n, D)`` image embeddings (the rows).
        txt_emb: ``(m, D)`` text embeddings of one block (the columns).
        positives: ``positives(start, stop)``: bool ``(stop - start, m)``, the ``z = +1``
            entries of rows ``start:stop`` (own pairs and equal ids).
        scale: ``e^t``, a positive float or a (learnable) scalar tensor.
        bias: ``b``, a float or a (learnable) scalar tensor.
        chunk_size: Tile height: the ``(n, m)`` scores are streamed ``chunk_size`` rows at a
            time and recomputed in the backward pass (``O(chunk_size * m)`` memory); ``None``
            scores the block at once.
        normalize: Cosine scores (L2-normalised embeddings) or raw dot products.

    Returns:
        ``(n,)``, differentiable in both blocks, ``scale`` and ``bias``; summed over every text
        block of a batch, row ``i``'s term of :func:`siglip_loss` (``"none"``).
    """
    dtype = compute_dtype(torch.promote_types(img_emb.dtype, txt_emb.dtype))
    x, y = img_emb.to(dtype), txt_emb.to(dtype)
    if normalize:
        x, y = F.normalize(x, dim=1, eps=_NORM_EPS), F.normalize(y, dim=1, eps=_NORM_EPS)
    c, b = scalar_tensor(scale, x, "scale"), scalar_tensor(bias, x, "bias")

    def rows(scores: torch.Tensor, start: int) -> torch.Tensor:
        return _pair_terms(scores, positives(start, start + scores.shape[0]), c, b)

    if chunk_size is None:
        return rows(x @ y.t(), 0)
    return tile_rows(rows, x, y, chunk_size)


@register_loss("siglip")
class SigLIPLoss(PairLoss):
    """Module form of :func:`siglip_loss`; ``chunk_size=N`` selects :func:`tiled_siglip_loss`.

    Holds the log-scale ``t`` (``log_scale``) and the bias ``b``, each an ``nn.Parameter``
    when learnable (the paper's setting, both by default) and a fixed float otherwise; the loss
    uses ``scale = exp(t)``. ``log_scale`` is open_clip's ``logit_scale`` parameter and
    ``bias`` its ``logit_bias`` (see the module docstring).
    """

    declared = LossCapabilities(local_shards=True, pairwise_sum=True)
    paper = "SigLIP (Zhai et al. 2023)"
    equation = "SigLIP Eq. (1), Algorithm 1"
    Params = SigLIPParams
    config: SigLIPParams
    dense = staticmethod(siglip_loss)
    tiled = staticmethod(tiled_siglip_loss)

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        c = self.config
        self.learnable_scale, self.learnable_bias = c.learnable_scale, c.learnable_bias
        t, b = c.log_scale, c.bias
        self.log_scale: nn.Parameter | float = (
            nn.Parameter(torch.tensor(t)) if c.learnable_scale else t
        )
        self.bias: nn.Parameter | float = nn.Parameter(torch.tensor(b)) if c.learnable_bias else b

    def arguments(self) -> dict[str, Any]:
        t = self.log_scale
        return {"scale": t.exp() if isinstance(t, torch.Tensor) else math.exp(t), "bias": self.bias}

    def pair_block_terms(
        self,
        img_emb: torch.Tensor,
        txt_emb: torch.Tensor,
        positives: Callable[[int, int], torch.Tensor],
    ) -> torch.Tensor:
        """:func:`siglip_block_terms` with this module's scale, bias, tile height and
        normalisation (``LossCapabilities.pairwise_sum``)."""
        return siglip_block_terms(
            img_emb,
            txt_emb,
            positives,
            **self.arguments(),
            chunk_size=self.chunk_size,
            normalize=self.normalize,
        )

    def extra_repr(self) -> str:
        scale, bias = (float(torch.as_tensor(v).detach()) for v in self.arguments().values())
        return self.config.describe(log_scale=math.log(scale), bias=bias)


__all__ = ["SigLIPLoss", "siglip_block_terms", "siglip_loss", "tiled_siglip_loss"]
