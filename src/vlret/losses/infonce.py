"""Vision-language contrastive loss (InfoNCE / CLIP), Unified-loss paper Eq. (3)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._checks import POSITIVE, check_positive, check_reduction
from ..similarity import Ids
from ._base import (
    LossCapabilities,
    PairLoss,
    log1p_sum_exp,
    prepare,
    reduce_per_index,
    reduce_terms,
)
from ._temperature import CLIPTemperature, CLIPTemperatureParams
from ._tiling import prepare_embeddings, scalar_tensor, softmax_terms
from .params import param
from .registry import register_loss


@dataclass(frozen=True, kw_only=True)
class InfoNCEParams(CLIPTemperatureParams):
    """Parameters of InfoNCE (CLIP / VLC)."""

    temperature: float = param(0.05, POSITIVE, "tau, the softmax temperature (gamma = 1/tau)")


def infonce_loss(
    sim: torch.Tensor,
    *,
    temperature: float | torch.Tensor = 0.05,
    pos_mask: torch.Tensor | None = None,
    reduction: str = "mean",
) -> torch.Tensor:
    r"""Bidirectional InfoNCE (VLC) on a ``(B, B)`` similarity matrix, Eq. (3) with
    :math:`\gamma = 1/\tau`:

    .. math:: -\sum_i \log\frac{e^{s_{ii}/\tau}}{\sum_j e^{s_{ij}/\tau}}
              + \log\frac{e^{s_{ii}/\tau}}{\sum_j e^{s_{ji}/\tau}}

    computed in the pair-similarity form Eq. (4), ``log(1 + sum_neg exp((s_ij - s_ii)/tau))``.
    Further positives (``pos_mask``) are left out of the denominators.

    ``reduction="mean"`` averages, over the ``B`` indices, the sum of the image->text and
    text->image cross-entropies. CLIP's own loss is half of that (it averages the two
    directions); multiply by 0.5 to match CLIP's numbers. ``temperature`` may be a tensor
    (a learnable temperature).
    """
    check_positive(temperature, "temperature")
    check_reduction(reduction)
    s, negatives = prepare(sim, pos_mask)
    pos = s.diagonal()
    img_terms = log1p_sum_exp((s - pos[:, None]) / temperature, negatives, dim=1)
    txt_terms = log1p_sum_exp((s - pos[None, :]) / temperature, negatives, dim=0)
    return reduce_terms(img_terms, txt_terms, reduction)


def tiled_infonce_loss(
    img_emb: torch.Tensor,
    txt_emb: torch.Tensor,
    *,
    temperature: float | torch.Tensor = 0.05,
    img_ids: Ids | None = None,
    txt_ids: Ids | None = None,
    chunk_size: int,
    reduction: str = "mean",
    normalize: bool = True,
    shard: tuple[int, int] | None = None,
) -> torch.Tensor:
    """:func:`infonce_loss` on embeddings in ``O(chunk_size * B)`` memory (the tiled form).

    The embeddings, ``img_ids``/``txt_ids``, ``chunk_size`` (the tile height), ``reduction``,
    ``normalize`` and ``shard`` work as in every tiled form (``docs/tiled.md``).

    Args:
        temperature: ``tau``, a float or a (learnable) scalar tensor, which gets its gradient.

    Returns:
        The value of ``infonce_loss(cosine_similarity(img, txt), pos_mask=positive_mask(ids))``.

    Raises:
        ValueError: A bad argument, named.
    """
    check_positive(temperature, "temperature")
    check_reduction(reduction)
    batch = prepare_embeddings(
        img_emb, txt_emb, img_ids, txt_ids, chunk_size=chunk_size, normalize=normalize
    )
    scale = 1.0 / scalar_tensor(temperature, batch.x, "temperature")
    terms = softmax_terms(batch, scale, None, shard)
    return reduce_per_index(terms, reduction, batch.batch)


@register_loss("infonce")
class InfoNCELoss(CLIPTemperature, PairLoss):
    """Module form of :func:`infonce_loss`.

    With ``learnable_temperature=True`` the module holds a learnable log-scale
    ``log(1/temperature)``, clamped in place like CLIP to ``[0, log(max_scale)]`` (scale <= 100
    by default) before each use, so the gradient is never cut by the clamp.

    ``chunk_size=N`` makes the embedding entry point use :func:`tiled_infonce_loss`
    (O(N x B) memory, same values and gradients).
    """

    declared = LossCapabilities(local_shards=True, paper_comparison=1)
    paper = "CLIP / VLC (Radford et al. 2021)"
    equation = "Unified Eq. (3)-(4)"
    Params = InfoNCEParams
    config: InfoNCEParams
    dense = staticmethod(infonce_loss)
    tiled = staticmethod(tiled_infonce_loss)
