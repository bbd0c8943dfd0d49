"""Adaptive offline quintuplet loss, AOQ (Chen, Deng and Luo, ECCV 2020; sunnychencool/AOQ).

AOQ adds, to the online hardest-negative triplet of VSE++, negatives mined offline over the
whole training set by a first-round model (``vlret mine-negatives``; the per-item draw is
:mod:`vlret.data.offline_negatives`). For batch item ``i`` (image ``I_i``, caption ``T_i``) the
data loader supplies:

* ``T'_i``, an offline negative caption of ``I_i`` (one of ``I_i``'s mined top captions);
* ``I'_i``, an offline negative image of ``T_i`` (one of ``T_i``'s mined top images);
* the quintuplet pair ``(I''_i, T''_i)``: the image of ``T'_i`` and a caption of ``I'_i``, a
  positive-looking pair that shares nothing with item ``i``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from .._checks import (
    FLAG,
    MARGIN,
    POSITIVE,
    REAL,
    check_embeddings,
    check_finite,
    check_reduction,
    compute_dtype,
)
from ..similarity import Ids
from ._base import HardestNegativeLoss, LossCapabilities, prepare, reduce_per_index
from .params import LossParams, param, reduction_param
from .registry import register_loss

#: The per-item scores :func:`aoq_loss` takes besides ``sim``, in the order of the docstring.
OFFLINE_SCORES = ("offline_txt_sim", "offline_img_sim", "offline_pair_sim", "quintuplet_sim")
#: The embeddings :class:`AOQLoss` takes besides the batch's, the same order.
OFFLINE_EMBEDDINGS = (
    "offline_txt_emb",
    "offline_img_emb",
    "quintuplet_img_emb",
    "quintuplet_txt_emb",
)


@dataclass(frozen=True, kw_only=True)
class AOQParams(LossParams):
    """Parameters of AOQ (defaults: the released code's ``ContrastiveLoss``)."""

    margin: float = param(0.2, MARGIN, "the margin of the online hardest-negative hinges")
    offline_margin: float = param(0.0, MARGIN, "the margin of the offline and quintuplet hinges")
    alpha: float = param(0.3, POSITIVE, "alpha: the scale of the adaptive weight")
    beta: float = param(1.5, REAL, "beta: the adaptive weight at equal offline and online scores")
    detach_weights: bool = param(
        False, FLAG, "no gradient through the adaptive weights (the release keeps it)"
    )
    hardest: bool = param(
        True, FLAG, "the online hinge on the hardest negative (False: summed over all of them)"
    )
    reduction: str = reduction_param("sum")  # the release sums over the batch


def _per_item(value: Any, name: str, sim: torch.Tensor) -> torch.Tensor:
    if value is None:
        raise ValueError(
            f"{name}: AOQ needs the batch's offline scores {', '.join(OFFLINE_SCORES)} ((B,) "
            "each; the offline negatives a loader draws from a `vlret mine-negatives` file)"
        )
    if not isinstance(value, torch.Tensor) or value.shape != (sim.shape[0],):
        shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        raise ValueError(f"{name}: expected a ({sim.shape[0]},) tensor, got {shape}")
    check_finite(value, name)
    return value.to(sim.dtype)


def aoq_loss(
    sim: torch.Tensor,
    *,
    offline_txt_sim: torch.Tensor | None = None,
    offline_img_sim: torch.Tensor | None = None,
    offline_pair_sim: torch.Tensor | None = None,
    quintuplet_sim: torch.Tensor | None = None,
    margin: float = 0.2,
    offline_margin: float = 0.0,
    alpha: float = 0.3,
    beta: float = 1.5,
    detach_weights: bool = False,
    hardest: bool = True,
    pos_mask: torch.Tensor | None = None,
    reduction: str = "sum",
) -> torch.Tensor:
    r"""AOQ on a ``(B, B)`` similarity matrix (rows images, columns captions) and the batch's
    offline scores, as the released ``ContrastiveLoss`` computes it (the paper, Sec. 3).

    With :math:`s_{ii}` the positive, :math:`\hat s^t_i = \max_{j \ne i} s_{ij}` image ``i``'s
    hardest online caption and :math:`\hat s^v_i = \max_{j \ne i} s_{ji}` caption ``i``'s
    hardest online image, the term of index ``i`` is

    .. math:: w^t_i [m + \hat s^t_i - s_{ii}]_+ + w^v_i [m + \hat s^v_i - s_{ii}]_+
              + \sum_{o} [m' + o_i - s_{ii}]_+,
              \qquad w^t_i = \beta - (s(I_i, T'_i) - \hat s^t_i) / \alpha

    (:math:`w^v_i` likewise with :math:`s(I'_i, T_i)` and :math:`\hat s^v_i`), the last sum
    over the four offline scores :math:`o`: ``offline_txt_sim`` :math:`s(I_i, T'_i)`,
    ``offline_img_sim`` :math:`s(I'_i, T_i)`, ``offline_pair_sim`` :math:`s(I'_i, T'_i)` and
    ``quintuplet_sim`` :math:`s(I''_i, T''_i)`, each ``(B,)``.

    The release neither clamps the weights (one can be negative when the offline negative beats
    the online one by more than ``alpha * beta``) nor detaches them: their gradient pushes the
    offline score down and the online hardest score up. ``detach_weights=True`` takes them as
    constants instead (the reading of the paper's text, where they only scale the hinge).
    Entries of ``pos_mask`` (another caption of the same image in the batch) are never online
    negatives; the release has no such mask (each batch item is a different caption, rarely of
    the same image). An anchor without any online negative contributes only its offline hinges.
    Sum reduction as in the release.

    ``hardest=False`` sums the online hinge over every negative of the anchor,
    :math:`w^t_i \sum_{j \ne i} [m + s_{ij} - s_{ii}]_+` (and likewise for captions), the weight
    still taken from the hardest one: the release's ``max_violation`` off, and VSE-infinity's
    all-negatives warm-up (``train.all_negatives_epochs``, :meth:`AOQLoss.set_all_negatives`).
    The release multiplies its ``(B, B)`` hinge matrix by the ``(B,)`` weights, which
    broadcasts along the columns (each caption's weight on every image's hinge with it); here
    each anchor's hinges take the anchor's weight, as the paper writes it.

    Raises:
        ValueError: A missing offline score (named), bad shapes or parameters.
    """
    MARGIN.check(margin, "margin")
    MARGIN.check(offline_margin, "offline_margin")
    POSITIVE.check(alpha, "alpha")
    REAL.check(beta, "beta")
    check_reduction(reduction)
    s, negatives = prepare(sim, pos_mask)
    offline = [
        _per_item(v, n, s)
        for v, n in zip(
            (offline_txt_sim, offline_img_sim, offline_pair_sim, quintuplet_sim),
            OFFLINE_SCORES,
            strict=True,
        )
    ]
    pos = s.diagonal()
    low = torch.finfo(s.dtype).min
    filled = s.masked_fill(~negatives, low)
    hard_txt, hard_img = filled.amax(dim=1), filled.amax(dim=0)  # per image, per caption
    has_txt, has_img = negatives.any(dim=1), negatives.any(dim=0)
    terms = []
    for hard, has, off in ((hard_txt, has_txt, offline[0]), (hard_img, has_img, offline[1])):
        hard = torch.where(has, hard, pos)  # no negative: a zero hinge, a finite weight
        weight = beta - (off - hard) / alpha
        if detach_weights:
            weight = weight.detach()
        hinge = (margin + hard - pos).clamp(min=0)
        if not hardest:  # every negative of the anchor: rows for images, columns for captions
            dim = 1 if off is offline[0] else 0
            every = (margin + s - pos.unsqueeze(dim)).clamp(min=0)
            hinge = every.masked_fill(~negatives, 0.0).sum(dim=dim)
        terms.append(weight * torch.where(has, hinge, torch.zeros_like(hinge)))
    for off in offline:
        terms.append((offline_margin + off - pos).clamp(min=0))
    return reduce_per_index(torch.stack(terms).sum(0), reduction)


@register_loss("aoq")
class AOQLoss(HardestNegativeLoss):
    """Module form of :func:`aoq_loss` (AOQ, ECCV 2020).

    ``loss(img_emb, txt_emb, img_ids=None, txt_ids=None, *, offline_txt_emb, offline_img_emb,
    quintuplet_img_emb, quintuplet_txt_emb)``: the four ``(B, D)`` embeddings of each item's
    offline negatives (:data:`OFFLINE_EMBEDDINGS`: ``T'_i``, ``I'_i``, ``I''_i``, ``T''_i``
    of the module docstring of :mod:`vlret.losses.aoq`), scored like the batch (cosine, or dot
    products with ``normalize=False``). A model that scores pairs passes the four ``(B,)``
    scores to :meth:`from_similarity` (:data:`OFFLINE_SCORES`). Either entry point refuses a
    batch without them.
    """

    declared = LossCapabilities(
        similarity_inputs=OFFLINE_SCORES, all_negatives_warmup=True, offline_negatives=True
    )
    paper = "AOQ (Chen et al. 2020)"
    equation = "AOQ Sec. 3, the released ContrastiveLoss"
    Params = AOQParams
    config: AOQParams
    dense = staticmethod(aoq_loss)

    def forward(
        self,
        img_emb: torch.Tensor,
        txt_emb: torch.Tensor,
        img_ids: Ids | None = None,
        txt_ids: Ids | None = None,
        *,
        shard: tuple[int, int] | None = None,
        offline_txt_emb: torch.Tensor | None = None,
        offline_img_emb: torch.Tensor | None = None,
        quintuplet_img_emb: torch.Tensor | None = None,
        quintuplet_txt_emb: torch.Tensor | None = None,
        **inputs: Any,
    ) -> torch.Tensor:
        """The loss of a batch and its offline negatives' embeddings.

        Args:
            img_emb: ``(B, D)`` image embeddings.
            txt_emb: ``(B, D)`` text embeddings; text ``i`` is image ``i``'s positive pair.
            img_ids: Optional ids of the images; equal ids mark further positives.
            txt_ids: Optional ids of the texts' images (default ``img_ids``).
            shard: Refused (AOQ has no tiled form).
            offline_txt_emb: ``(B, D)``: an offline negative caption of each image.
            offline_img_emb: ``(B, D)``: an offline negative image of each caption.
            quintuplet_img_emb: ``(B, D)``: the image of each offline negative caption.
            quintuplet_txt_emb: ``(B, D)``: a caption of each offline negative image.
            **inputs: Further inputs of :func:`aoq_loss` (none by default).

        Returns:
            The reduced loss, or the ``(B,)`` terms for ``reduction="none"``.

        Raises:
            ValueError: A missing offline embedding (named), bad shapes or ids.
        """
        self.check_shard(shard)
        check_embeddings(img_emb, txt_emb)  # an empty batch is named first, as every loss's
        given = (offline_txt_emb, offline_img_emb, quintuplet_img_emb, quintuplet_txt_emb)
        missing = [n for n, v in zip(OFFLINE_EMBEDDINGS, given, strict=True) if v is None]
        if missing:
            raise ValueError(
                f"AOQLoss needs the batch's offline negatives: {', '.join(missing)} missing "
                f"((B, D) each: {', '.join(OFFLINE_EMBEDDINGS)}, drawn per item from a `vlret "
                "mine-negatives` file, vlret.data.offline_negatives)"
            )
        sim, pos_mask = self.similarity_and_mask(img_emb, txt_emb, img_ids, txt_ids)
        for name, value in zip(OFFLINE_EMBEDDINGS, given, strict=True):
            if not isinstance(value, torch.Tensor) or value.shape != img_emb.shape:
                shape = tuple(value.shape) if isinstance(value, torch.Tensor) else value
                raise ValueError(
                    f"{name}: expected the shape of img_emb {tuple(img_emb.shape)}, got {shape}"
                )

        def scores(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            # half precision scored in float32, as the batch's sim (numerics rule)
            dtype = compute_dtype(torch.promote_types(a.dtype, b.dtype))
            a, b = a.to(dtype), b.to(dtype)
            if self.normalize:
                a, b = F.normalize(a, dim=-1, eps=1e-8), F.normalize(b, dim=-1, eps=1e-8)
            return (a * b).sum(dim=-1)

        off_t, off_i, q_i, q_t = (v for v in given if v is not None)  # all four, checked
        offline = {
            "offline_txt_sim": scores(img_emb, off_t),
            "offline_img_sim": scores(off_i, txt_emb),
            "offline_pair_sim": scores(off_i, off_t),
            "quintuplet_sim": scores(q_i, q_t),
        }
        return self.from_similarity(sim, pos_mask=pos_mask, **offline, **inputs)


__all__ = ["OFFLINE_EMBEDDINGS", "OFFLINE_SCORES", "AOQLoss", "AOQParams", "aoq_loss"]
