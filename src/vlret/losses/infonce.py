"""Vision-language contrastive loss (InfoNCE / CLIP), Unified-loss paper Eq. (3), optionally
with a memory queue of past keys as further negatives (MoCo's; :mod:`vlret.losses._queue`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._checks import POSITIVE, Number, ParamError, check_positive, check_reduction
from ..similarity import Ids
from ._base import (
    LossCapabilities,
    PairLoss,
    log1p_sum_exp,
    prepare,
    reduce_per_index,
    reduce_terms,
)
from ._queue import EmbeddingQueues, extra_negatives
from ._temperature import CLIPTemperature, CLIPTemperatureParams
from ._tiling import (
    Embedded,
    QueueBlock,
    QueueExclusions,
    log1p_exp,
    negatives_lse,
    prepare_embeddings,
    scalar_tensor,
    softmax_terms,
)
from .params import param
from .registry import register_loss


@dataclass(frozen=True, kw_only=True)
class InfoNCEParams(CLIPTemperatureParams):
    """Parameters of InfoNCE (CLIP / VLC)."""

    temperature: float = param(0.05, POSITIVE, "tau, the softmax temperature (gamma = 1/tau)")
    queue_size: int = param(
        0,
        Number(integer=True, ge=0),
        "entries of each memory queue of past keys, further negatives (0: none)",
        passed=False,
    )
    embed_dim: int | None = param(
        None, Number(integer=True, ge=1, optional=True), "key width of the queues", passed=False
    )

    def check_relations(self) -> None:
        """A queue (``queue_size > 0``) needs ``embed_dim``; raise :class:`ParamError`."""
        if self.queue_size and self.embed_dim is None:
            raise ParamError("embed_dim", "embed_dim is required when queue_size > 0")


def infonce_loss(
    sim: torch.Tensor,
    *,
    temperature: float | torch.Tensor = 0.05,
    pos_mask: torch.Tensor | None = None,
    reduction: str = "mean",
    extra_neg_txt: torch.Tensor | None = None,
    extra_neg_img: torch.Tensor | None = None,
    extra_neg_txt_mask: torch.Tensor | None = None,
    extra_neg_img_mask: torch.Tensor | None = None,
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

    Extra negatives (a memory queue's scores, MoCo-style) join the denominators: image row
    ``i`` also sums over the ``K`` entries of ``extra_neg_txt[i]`` its mask allows, text column
    ``j`` over the ``K'`` entries of ``extra_neg_img[:, j]``. It is the loss of the batch with
    those scores appended as further negative columns (rows), none of them a positive.

    Args:
        sim: ``(B, B)`` similarities, rows images, columns texts.
        temperature: ``tau``, a float or a (learnable) scalar tensor.
        pos_mask: Optional ``(B, B)`` bool mask of further positives.
        reduction: ``"mean"``, ``"sum"`` or ``"none"`` over the ``B`` indices.
        extra_neg_txt: Optional ``(B, K)`` similarities of the images to ``K`` extra texts.
        extra_neg_img: Optional ``(K', B)`` similarities of ``K'`` extra images to the texts.
        extra_neg_txt_mask: Optional bool (broadcast to ``extra_neg_txt``): the entries that
            are negatives (default: all).
        extra_neg_img_mask: The same for ``extra_neg_img``.

    Returns:
        The reduced loss, or the ``(B,)`` per-index terms.

    Raises:
        ValueError: A bad argument, named.
    """
    check_positive(temperature, "temperature")
    check_reduction(reduction)
    s, negatives = prepare(sim, pos_mask)
    size = s.shape[0]
    to_txt = extra_negatives(extra_neg_txt, extra_neg_txt_mask, "extra_neg_txt", (size, None), s)
    to_img = extra_negatives(extra_neg_img, extra_neg_img_mask, "extra_neg_img", (None, size), s)
    pos = s.diagonal()
    img_z, img_neg = s - pos[:, None], negatives
    txt_z, txt_neg = s - pos[None, :], negatives
    if to_txt is not None:  # further negative columns of every image row
        img_z = torch.cat([img_z, to_txt[0] - pos[:, None]], dim=1)
        img_neg = torch.cat([img_neg, to_txt[1]], dim=1)
    if to_img is not None:  # further negative rows of every text column
        txt_z = torch.cat([txt_z, to_img[0] - pos[None, :]], dim=0)
        txt_neg = torch.cat([txt_neg, to_img[1]], dim=0)
    img_terms = log1p_sum_exp(img_z / temperature, img_neg, dim=1)
    txt_terms = log1p_sum_exp(txt_z / temperature, txt_neg, dim=0)
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
    queue_txt: QueueBlock | None = None,
    queue_img: QueueBlock | None = None,
) -> torch.Tensor:
    """:func:`infonce_loss` on embeddings in ``O(chunk_size * B)`` memory (the tiled form).

    The embeddings, ``img_ids``/``txt_ids``, ``chunk_size`` (the tile height), ``reduction``,
    ``normalize`` and ``shard`` work as in every tiled form (``docs/tiled.md``).

    Args:
        temperature: ``tau``, a float or a (learnable) scalar tensor, which gets its gradient.
        queue_txt: Optional memory-queue texts, further negatives of the image rows (keys
            normalised as the embeddings are; entries of a row's own image id excluded).
        queue_img: Optional memory-queue images, further negatives of the text columns.

    Returns:
        The value of ``infonce_loss(cosine_similarity(img, txt), pos_mask=positive_mask(ids))``,
        with the queues' scores as ``extra_neg_txt`` / ``extra_neg_img``.

    Raises:
        ValueError: A bad argument, named; ``shard`` with a queue.
    """
    check_positive(temperature, "temperature")
    check_reduction(reduction)
    batch = prepare_embeddings(
        img_emb, txt_emb, img_ids, txt_ids, chunk_size=chunk_size, normalize=normalize
    )
    scale = 1.0 / scalar_tensor(temperature, batch.x, "temperature")
    if queue_txt is None and queue_img is None:
        terms = softmax_terms(batch, scale, None, shard)
    elif shard is not None:
        raise ValueError("shard= cannot be combined with a memory queue (queue_txt, queue_img)")
    else:
        terms = _queued_softmax_terms(batch, scale, queue_txt, queue_img)
    return reduce_per_index(terms, reduction, batch.batch)


def _queued_softmax_terms(
    batch: Embedded, scale: torch.Tensor, queue_txt: QueueBlock | None, queue_img: QueueBlock | None
) -> torch.Tensor:
    """Per index ``log(1 + e^{lse_i - c s_ii})`` of each direction, the log-sum-exp over the
    in-batch negatives and the queue's (``c = 1/tau``)."""
    x, y = batch.x, batch.y
    offset = scale * (x * y).sum(1)
    rows, cols = negatives_lse(x * scale, y, batch.exclusions, batch.tile, columns=True)
    if queue_txt is not None:
        keys = queue_txt.keys.to(x.dtype)
        more = negatives_lse(x * scale, keys, QueueExclusions(queue_txt), batch.tile, columns=False)
        rows = torch.logaddexp(rows, more)
    if queue_img is not None:
        keys = queue_img.keys.to(y.dtype)
        more = negatives_lse(y * scale, keys, QueueExclusions(queue_img), batch.tile, columns=False)
        cols = torch.logaddexp(cols, more)
    return log1p_exp(rows - offset) + log1p_exp(cols - offset)


@register_loss("infonce")
class InfoNCELoss(CLIPTemperature, EmbeddingQueues, PairLoss):
    """Module form of :func:`infonce_loss`.

    With ``learnable_temperature=True`` the module holds a learnable log-scale
    ``log(1/temperature)``, clamped in place like CLIP to ``[0, log(max_scale)]`` (scale <= 100
    by default) before each use, so the gradient is never cut by the clamp.

    ``chunk_size=N`` makes the embedding entry point use :func:`tiled_infonce_loss`
    (O(N x B) memory, same values and gradients).

    ``queue_size=K`` (with ``embed_dim``, the run's model's width) gives the module two memory
    queues of the last ``K`` image and text keys, MoCo's memory bank as AdaCL Sec. 4.1 uses it
    (:class:`~vlret.losses._queue.EmbeddingQueues`): each batch's images are scored against the
    queued texts and its texts against the queued images as further negatives
    (``extra_neg_txt`` / ``extra_neg_img`` of :func:`infonce_loss`; an entry of the anchor's
    own image id is none), then, in training, the momentum encoder's keys
    (``train.momentum_encoder``) or the detached embeddings are enqueued. It is the InfoNCE
    baseline with AdaCL's negatives (``adacl_clip_*_infonce_queue``). With a queue the loss
    has no local shards.
    """

    declared = LossCapabilities(local_shards=True, paper_comparison=1)
    paper = "CLIP / VLC (Radford et al. 2021)"
    equation = "Unified Eq. (3)-(4)"
    Params = InfoNCEParams
    config: InfoNCEParams
    dense = staticmethod(infonce_loss)
    tiled = staticmethod(tiled_infonce_loss)
