r"""USER's UTO loss (Zhang et al., 2024, "Unified Semantic Enhancement with Momentum Contrast
for Image-Text Retrieval") and its momentum-contrast form against memory queues.

The formula is read from the authors' release (``lib/loss.py``, class ``UTO``: ``forward`` and
``moco_forward``; ``lib/vse.py``: the total loss), with ``alpha`` its ``mu`` (90) and
``epsilon`` its ``gama`` (0.5). Each negative pair ``(i, j)`` is pushed through
``exp(alpha (s_ij - epsilon))``, each positive pulled through ``-log(1 + relu(s_ii))``:

.. math:: \ell_i = \frac{1}{\alpha}\log\Big(1 + \sum_{j \ne i} e^{\alpha(s_{ij} - \epsilon)}\Big)
          + \frac{1}{\alpha}\log\Big(1 + \sum_{j \ne i} e^{\alpha(s_{ji} - \epsilon)}\Big)
          - \log\big(1 + \max(s_{ii}, 0)\big)

plus the diagonal's constant in each sum (below).

**The diagonal, as released.** The release zeroes the diagonal of the score matrix before the
exponential instead of leaving it out, so each row sum and each column sum holds the constant
``exp(-alpha epsilon)`` (``e^-45`` by default) in place of the positive pair. It is kept here,
as a constant without gradient: the value is the release's to float rounding (the difference
from leaving it out is at most ``log(1 + e^-45) / 90``, about ``3e-22``, per term).

**Further positives** (``pos_mask``, another caption of the same image) follow the loss
contract: they are left out of the sums (not pushed) and not pulled either; only the diagonal
is pulled. The release has no such mask (its batches hold one caption per image slot and its
queue may hold a batch image's own captions).

**The momentum-contrast form** (``moco_forward``; ``queue_size > 0``): each image is also
scored against the queued texts and each text against the queued images, the same form with a
pull of the momentum positive, ``log(1 + sum_k e^{alpha (q_ik - epsilon)}) / alpha
- log(1 + relu(p_i))``, where ``p_i`` is the image's score with the momentum encoder's key of
its own caption (``txt_keys``), and symmetrically with ``img_keys`` for the texts. Without
momentum keys (no ``train.momentum_encoder``), the keys are the detached embeddings the queue
stores: ``p_i`` is ``s_ii`` with the caption's side detached (and ``s_ii`` itself when a pair
scorer hands queue blocks to :func:`uto_loss` without key positives). No diagonal constant
enters the queue sums (there is none in the release's). The total is ``batch_weight`` (the
release's ``loss_lamda``: 20 on Flickr30K, 1 on MS-COCO) times the in-batch loss plus the
queue loss, as ``lib/vse.py`` adds them. Two
differences from the release, both vlret's queue (:mod:`vlret.losses._queue`): the queue starts
empty rather than filled with random unit vectors, and a queued key of an anchor's own image is
no negative of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from .._checks import (
    NON_NEGATIVE,
    POSITIVE,
    REAL,
    Number,
    ParamError,
    check_embeddings,
    check_finite,
    check_reduction,
    compute_dtype,
)
from ..similarity import Ids
from ._base import LossCapabilities, PairLoss, log1p_sum_exp, prepare, reduce_per_index
from ._queue import EmbeddingQueues, extra_negatives
from .params import LossParams, param
from .registry import register_loss


@dataclass(frozen=True, kw_only=True)
class UTOParams(LossParams):
    """Parameters of UTO (defaults: the release's ``arguments.py`` and training scripts)."""

    alpha: float = param(90.0, POSITIVE, "alpha (the release's mu): scale of the exponents")
    epsilon: float = param(
        0.5, REAL, "epsilon (the release's gama): the score a negative is pushed below"
    )
    batch_weight: float = param(
        1.0, NON_NEGATIVE, "weight of the in-batch loss (loss_lamda; the queue loss has 1)"
    )
    queue_size: int = param(
        0,
        Number(integer=True, ge=0),
        "entries of each memory queue of past keys (USER: 2048 F30K, 4096 COCO; 0: none)",
        passed=False,
    )
    embed_dim: int | None = param(
        None, Number(integer=True, ge=1, optional=True), "key width of the queues", passed=False
    )

    def check_relations(self) -> None:
        """A queue (``queue_size > 0``) needs ``embed_dim``; raise :class:`ParamError`."""
        if self.queue_size and self.embed_dim is None:
            raise ParamError("embed_dim", "embed_dim is required when queue_size > 0")


def _key_positives(values: torch.Tensor | None, name: str, fallback: torch.Tensor) -> torch.Tensor:
    """The ``(B,)`` momentum positives ``name``, checked, or ``fallback`` (the diagonal)."""
    if values is None:
        return fallback
    if not isinstance(values, torch.Tensor) or tuple(values.shape) != tuple(fallback.shape):
        got = tuple(values.shape) if isinstance(values, torch.Tensor) else type(values).__name__
        raise ValueError(f"{name} must have shape {tuple(fallback.shape)}, got {got}")
    check_finite(values, name)
    return values.to(device=fallback.device, dtype=fallback.dtype)


def _pull(pos: torch.Tensor) -> torch.Tensor:
    """``-log(1 + relu(pos))``, the pull of each positive."""
    return -torch.log1p(torch.relu(pos))


def uto_loss(
    sim: torch.Tensor,
    *,
    alpha: float = 90.0,
    epsilon: float = 0.5,
    batch_weight: float = 1.0,
    pos_mask: torch.Tensor | None = None,
    reduction: str = "mean",
    extra_neg_txt: torch.Tensor | None = None,
    extra_neg_img: torch.Tensor | None = None,
    extra_neg_txt_mask: torch.Tensor | None = None,
    extra_neg_img_mask: torch.Tensor | None = None,
    key_pos_txt: torch.Tensor | None = None,
    key_pos_img: torch.Tensor | None = None,
) -> torch.Tensor:
    """USER's UTO loss on a ``(B, B)`` score matrix (module doc), with its queue form.

    Index ``i``'s term is ``batch_weight`` times the in-batch term of row ``i`` and column
    ``i`` (one pull of ``s_ii``), plus, with ``extra_neg_txt``, image ``i``'s queue term and,
    with ``extra_neg_img``, text ``i``'s queue term. ``"mean"`` divides the sum by ``B``: the
    release's value.

    Args:
        sim: ``(B, B)`` scores, rows images, columns texts.
        alpha: The scale of the exponents (the release's ``mu``).
        epsilon: The score a negative is pushed below (the release's ``gama``).
        batch_weight: The weight of the in-batch term (the release's ``loss_lamda``).
        pos_mask: Optional ``(B, B)`` bool mask of further positives: neither pushed nor
            pulled.
        reduction: ``"mean"``, ``"sum"`` or ``"none"`` over the ``B`` indices.
        extra_neg_txt: Optional ``(B, K)`` scores of the images against queued texts.
        extra_neg_img: Optional ``(K', B)`` scores of queued images against the texts.
        extra_neg_txt_mask: Optional bool (broadcast to ``extra_neg_txt``): the entries that
            are negatives (default: all).
        extra_neg_img_mask: The same for ``extra_neg_img``.
        key_pos_txt: Optional ``(B,)`` scores of each image with the momentum key of its
            caption, the positive of its queue term (default: the diagonal of ``sim``).
        key_pos_img: Optional ``(B,)`` scores of each text with the momentum key of its
            image (default: the diagonal).

    Returns:
        The reduced loss, or the ``(B,)`` per-index terms.

    Raises:
        ValueError: A bad argument, named.
    """
    POSITIVE.check(alpha, "alpha")
    REAL.check(epsilon, "epsilon")
    NON_NEGATIVE.check(batch_weight, "batch_weight")
    check_reduction(reduction)
    s, negatives = prepare(sim, pos_mask)
    size = s.shape[0]
    to_txt = extra_negatives(extra_neg_txt, extra_neg_txt_mask, "extra_neg_txt", (size, None), s)
    to_img = extra_negatives(extra_neg_img, extra_neg_img_mask, "extra_neg_img", (None, size), s)
    diagonal = torch.eye(size, dtype=torch.bool, device=s.device)
    # the release's zeroed diagonal: exp(alpha * (0 - epsilon)) in each sum, a constant
    z = (alpha * (s - epsilon)).masked_fill(diagonal, -alpha * epsilon)
    summed = negatives | diagonal
    pos = s.diagonal()
    terms = log1p_sum_exp(z, summed, dim=1) / alpha + log1p_sum_exp(z, summed, dim=0) / alpha
    terms = batch_weight * (terms + _pull(pos))
    if to_txt is not None:  # each image against the queued texts
        positive = _key_positives(key_pos_txt, "key_pos_txt", pos)
        push = log1p_sum_exp(alpha * (to_txt[0] - epsilon), to_txt[1], dim=1) / alpha
        terms = terms + push + _pull(positive)
    if to_img is not None:  # each text against the queued images
        positive = _key_positives(key_pos_img, "key_pos_img", pos)
        push = log1p_sum_exp(alpha * (to_img[0] - epsilon), to_img[1], dim=0) / alpha
        terms = terms + push + _pull(positive)
    return reduce_per_index(terms, reduction)


@register_loss("uto")
class UTOLoss(EmbeddingQueues, PairLoss):
    """Module form of :func:`uto_loss`, USER's loss (dense only, no tiled form).

    ``queue_size=K`` (with ``embed_dim``, the run's model's width) gives the module two memory
    queues of the last ``K`` image and text keys (:class:`~vlret.losses._queue.EmbeddingQueues`,
    USER's ``moco_M``): each batch's images are scored against the queued texts and its texts
    against the queued images (an entry of the anchor's own image id is none), with the
    momentum encoder's keys (``train.momentum_encoder``, USER's ``moco_r`` = 0.999) as the
    positives of those terms, then the keys are enqueued in training mode. With a queue the
    loss has no local shards.
    """

    declared = LossCapabilities()
    paper = "USER (Zhang et al. 2024)"
    equation = "USER's UTO loss and its momentum-contrast form (release lib/loss.py)"
    Params = UTOParams
    config: UTOParams
    dense = staticmethod(uto_loss)

    def forward(
        self,
        img_emb: torch.Tensor,
        txt_emb: torch.Tensor,
        img_ids: Ids | None = None,
        txt_ids: Ids | None = None,
        *,
        img_keys: torch.Tensor | None = None,
        txt_keys: torch.Tensor | None = None,
        gathered: bool = False,
        shard: tuple[int, int] | None = None,
        **inputs: Any,
    ) -> torch.Tensor:
        """The loss of a batch of embeddings; with a queue, the queue terms take each anchor's
        score with the momentum key of its pair as their positive, then the keys are enqueued
        (training mode).

        Args:
            img_emb: ``(B, D)`` image embeddings.
            txt_emb: ``(B, D)`` text embeddings; text ``i`` is image ``i``'s positive pair.
            img_ids: Optional image ids (further positives; queue entries of the same id are
                no negatives).
            txt_ids: Optional ids of the texts' images (default ``img_ids``).
            img_keys: Optional ``(B, D)`` momentum keys of the images (queue positives of the
                texts, and enqueued instead of ``img_emb``).
            txt_keys: Optional ``(B, D)`` momentum keys of the texts.
            gathered: The inputs are already the global batch of every rank.
            shard: Refused with a queue (as :class:`~vlret.losses._queue.EmbeddingQueues`).
            **inputs: Further inputs of :func:`uto_loss`.

        Returns:
            The reduced loss, or the ``(B,)`` terms for ``reduction="none"``.

        Raises:
            ValueError: Bad inputs, keys without a queue, or ``shard`` with a queue.
        """
        if self.img_queue is not None:
            check_embeddings(img_emb, txt_emb)
            dtype = compute_dtype(torch.promote_types(img_emb.dtype, txt_emb.dtype))
            img_n, txt_n = img_emb.to(dtype), txt_emb.to(dtype)
            if self.normalize:
                img_n, txt_n = F.normalize(img_n, dim=1), F.normalize(txt_n, dim=1)
            # the keys of the pairs (the detached embeddings without a momentum encoder)
            inputs["key_pos_txt"] = (img_n * self._keys(txt_keys, txt_n, "txt_keys")).sum(1)
            inputs["key_pos_img"] = (txt_n * self._keys(img_keys, img_n, "img_keys")).sum(1)
        return super().forward(
            img_emb,
            txt_emb,
            img_ids,
            txt_ids,
            img_keys=img_keys,
            txt_keys=txt_keys,
            gathered=gathered,
            shard=shard,
            **inputs,
        )


__all__ = ["UTOLoss", "UTOParams", "uto_loss"]
