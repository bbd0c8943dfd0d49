"""A softmax loss's memory queues of embeddings (MoCo's memory bank; AdaCL Sec. 4.1, A.9).

A family that declares ``queue_size`` / ``embed_dim`` in its parameters and mixes in
:class:`EmbeddingQueues` (before :class:`~vlret.losses._base.PairLoss`) owns two
:class:`~vlret.memory.MemoryQueue` (``img_queue``, ``txt_queue``, the names the pair scorers'
bank procedure looks for) and declares, with ``queue_size > 0``, the capabilities the harness
reads: ``owns_queue`` and ``needs_embed_dim`` (the run's loss builder fills ``embed_dim``),
``momentum_keys`` (``train.momentum_encoder`` fills the queues with its keys) and no
``local_shards`` (each rank would enqueue only its own keys).

Each batch is scored against a snapshot of the queues: the images against the queued texts
(``extra_neg_txt``, ``(B, K)``) and the queued images against the texts (``extra_neg_img``,
``(K, B)``), an entry being a negative when its slot is filled and its image id differs from
the anchor's (:class:`~vlret.losses._tiling.QueueExclusions`). In training mode the momentum
keys (or the detached embeddings) are enqueued after the loss, as AdaCL's module does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from .._checks import check_embeddings, check_finite, compute_dtype
from ..memory import MemoryQueue, as_id_tensor
from ..similarity import Ids
from ._base import LossCapabilities, PairLoss, naming_embeddings
from ._tiling import QueueBlock, QueueExclusions


def queue_ids(ids: Ids | None, name: str, rows: int) -> torch.Tensor | None:
    """Ids to store in (and compare with) a memory queue, as a ``(rows,)`` long tensor.

    Raises:
        ValueError: Ids that are not non-negative integers, or of another length.
    """
    if ids is None:
        return None
    if isinstance(ids, torch.Tensor):
        return as_id_tensor(ids, name, rows)
    if isinstance(ids, Sequence) and not isinstance(ids, str):
        return as_id_tensor(list(ids), name, rows)
    raise ValueError(f"{name} must be a 1-D integer tensor or a sequence of ints")


def snapshot(queue: MemoryQueue, dtype: torch.dtype, anchor_ids: torch.Tensor | None) -> QueueBlock:
    """The queue's entries as this batch's negatives; copies, as the enqueue after the loss
    writes the buffers in place before backward runs. Without ids every filled entry is a
    negative."""
    ids = None if anchor_ids is None else queue.ids.clone()
    return QueueBlock(queue.keys.to(dtype, copy=True), queue.valid.clone(), ids, anchor_ids)


def extra_negatives(
    scores: torch.Tensor | None,
    mask: torch.Tensor | None,
    name: str,
    shape: tuple[int | None, int | None],
    like: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """A checked block of extra negatives (``from_similarity``'s ``extra_neg_txt`` /
    ``extra_neg_img``) and its mask, in ``like``'s dtype and device.

    Args:
        scores: The block, or ``None``.
        mask: Optional bool mask (broadcast to ``scores``) of the entries that are negatives;
            ``None``: every entry is.
        name: The argument's name, for errors.
        shape: The block's shape, ``None`` where it is free (the ``K`` entries).
        like: The batch's score matrix.

    Returns:
        ``(scores, negatives)``, or ``None`` without ``scores``.

    Raises:
        ValueError: A mask without scores, a block that is not a finite floating-point matrix
            of ``shape``, or a mask that is not bool or does not broadcast.
    """
    if scores is None:
        if mask is not None:
            raise ValueError(f"{name}_mask given without {name}")
        return None
    if not isinstance(scores, torch.Tensor) or scores.dim() != 2:
        got = tuple(scores.shape) if isinstance(scores, torch.Tensor) else type(scores).__name__
        raise ValueError(f"{name} must be a 2-D tensor, got {got}")
    if any(w is not None and n != w for n, w in zip(scores.shape, shape, strict=True)):
        layout = "(B, K)" if shape[0] is not None else "(K, B)"
        raise ValueError(
            f"{name} must have shape {layout} with B={like.shape[0]} matching sim, "
            f"got {tuple(scores.shape)}"
        )
    if not scores.dtype.is_floating_point:
        raise ValueError(f"{name} must be floating point, got dtype {scores.dtype}")
    check_finite(scores, name)
    scores = scores.to(device=like.device, dtype=like.dtype)
    if mask is None:
        return scores, torch.ones_like(scores, dtype=torch.bool)
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        raise ValueError(f"{name}_mask must be a bool tensor")
    try:
        mask = mask.to(like.device).expand(scores.shape)
    except RuntimeError:
        raise ValueError(
            f"{name}_mask must have shape {tuple(scores.shape)} like {name} (or broadcast to "
            f"it), got {tuple(mask.shape)}"
        ) from None
    return scores, mask


class EmbeddingQueues(PairLoss):
    """The memory queues of a softmax loss (module doc), mixed in before its family's base.

    The family's ``Params`` declare ``queue_size`` (0: none) and ``embed_dim``; its ``dense``
    function takes ``extra_neg_txt``, ``extra_neg_img`` and their masks, its ``tiled`` function
    ``queue_txt`` and ``queue_img`` (:class:`~vlret.losses._tiling.QueueBlock`).

    Attributes:
        img_queue: The image memory queue, or ``None``.
        txt_queue: The text memory queue, or ``None``.
    """

    @classmethod
    def capabilities(cls, params: Mapping[str, Any] | None = None) -> LossCapabilities:
        """With ``queue_size > 0``: ``owns_queue``, ``needs_embed_dim``, ``momentum_keys``, and
        no ``local_shards``."""
        if not (params or {}).get("queue_size", 0):
            return cls.declared
        return dataclasses.replace(
            cls.declared,
            owns_queue=True,
            needs_embed_dim=True,
            momentum_keys=True,
            local_shards=False,
        )

    def current_capabilities(self) -> LossCapabilities:
        return type(self).capabilities({"queue_size": getattr(self.config, "queue_size", 0)})

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        size = getattr(self.config, "queue_size", 0)
        dim = getattr(self.config, "embed_dim", None)
        self.img_queue: MemoryQueue | None = None
        self.txt_queue: MemoryQueue | None = None
        if size:
            assert dim is not None  # the family's check_relations: a queue needs embed_dim
            self.img_queue = MemoryQueue(size, dim)
            self.txt_queue = MemoryQueue(size, dim)

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
        """The loss of a batch of embeddings, against the queues when there are; then, in
        training mode, enqueue.

        Args:
            img_emb: ``(B, D)`` image embeddings.
            txt_emb: ``(B, D)`` text embeddings; text ``i`` is image ``i``'s positive pair.
            img_ids: Optional image ids (further positives; queue entries of the same id are
                no negatives).
            txt_ids: Optional ids of the texts' images (default ``img_ids``).
            img_keys: Optional ``(B, D)`` keys to enqueue instead of ``img_emb`` (a momentum
                encoder's).
            txt_keys: Optional ``(B, D)`` keys to enqueue instead of ``txt_emb``.
            gathered: The inputs are already the global batch of every rank: the queues
                enqueue them without all-gathering again.
            shard: As :meth:`PairLoss.forward`; refused with a queue.
            **inputs: Further inputs of the family's functions.

        Returns:
            The reduced loss, or the ``(B,)`` terms for ``reduction="none"``.

        Raises:
            ValueError: Bad inputs, keys without a queue, or ``shard`` with a queue.
        """
        if not isinstance(gathered, bool):
            raise ValueError(f"gathered must be a bool, got {gathered!r}")
        if self.img_queue is None or self.txt_queue is None:
            if img_keys is not None or txt_keys is not None:
                raise ValueError("img_keys/txt_keys need a memory queue (queue_size > 0)")
            return super().forward(img_emb, txt_emb, img_ids, txt_ids, shard=shard, **inputs)
        self.check_shard(shard)  # refused: a queue declares no local shards
        check_embeddings(img_emb, txt_emb)
        # half precision is scored in float32, against the queue too
        dtype = compute_dtype(torch.promote_types(img_emb.dtype, txt_emb.dtype))
        img_emb, txt_emb = img_emb.to(dtype), txt_emb.to(dtype)
        size = img_emb.shape[0]
        self.txt_queue.check_dim(img_emb, "img_emb", setting="embed_dim")
        img_id_t = queue_ids(img_ids, "img_ids", size)
        txt_id_t = queue_ids(txt_ids, "txt_ids", size) if txt_ids is not None else img_id_t
        img_n = F.normalize(img_emb, dim=1) if self.normalize else img_emb
        txt_n = F.normalize(txt_emb, dim=1) if self.normalize else txt_emb
        queue_txt = snapshot(self.txt_queue, dtype, img_id_t)
        queue_img = snapshot(self.img_queue, dtype, txt_id_t)
        if self.chunk_size is not None:
            loss = self.tiled_forward(
                img_emb, txt_emb, img_ids, txt_ids, queue_txt=queue_txt, queue_img=queue_img
            )
        else:
            sim, pos_mask = self.similarity_and_mask(img_emb, txt_emb, img_ids, txt_ids)
            blocks = {
                "extra_neg_txt": img_n @ queue_txt.keys.t(),
                "extra_neg_txt_mask": ~QueueExclusions(queue_txt).mask(0, size),
                "extra_neg_img": queue_img.keys @ txt_n.t(),
                "extra_neg_img_mask": ~QueueExclusions(queue_img).mask(0, size).t(),
            }
            with naming_embeddings(sim, img_emb, txt_emb):
                loss = self.from_similarity(sim, pos_mask, **blocks, **inputs)
        if self.training:
            gather = not gathered
            self.img_queue.enqueue(self._keys(img_keys, img_n, "img_keys"), img_id_t, gather=gather)
            self.txt_queue.enqueue(self._keys(txt_keys, txt_n, "txt_keys"), txt_id_t, gather=gather)
        return loss

    def _keys(self, keys: torch.Tensor | None, fallback: torch.Tensor, name: str) -> torch.Tensor:
        """The keys to enqueue: the momentum keys (normalised as the embeddings are), or the
        detached embeddings."""
        if keys is None:
            return fallback.detach()
        if not isinstance(keys, torch.Tensor) or keys.shape != fallback.shape:
            got = tuple(keys.shape) if isinstance(keys, torch.Tensor) else type(keys).__name__
            raise ValueError(f"{name} must have shape {tuple(fallback.shape)}, got {got}")
        keys = keys.detach().to(fallback.dtype)
        return F.normalize(keys, dim=1) if self.normalize else keys


__all__ = ["EmbeddingQueues", "extra_negatives", "queue_ids", "snapshot"]
