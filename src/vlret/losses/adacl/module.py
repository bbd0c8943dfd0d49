"""The AdaCL module: Algorithm 1's state machine around the objective, margins and anchor."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, cast

import torch
import torch.nn.functional as F

from ..._checks import check_embeddings, compute_dtype
from ...memory import MemoryQueue, as_id_tensor
from ...similarity import Ids
from .._base import LossCapabilities, PairLoss
from .._tiling import QueueBlock, QueueExclusions
from ..registry import register_loss
from .anchor import AnchorSearch, log_sum_exp, row_negatives
from .config import GUARDS, AdaCLParams
from .margins import m1_from_anchor, m2_from_log_sigma
from .objective import DenseAdaCLBatch, TiledAdaCLBatch

Batch = DenseAdaCLBatch | TiledAdaCLBatch


def _ids_for_queue(ids: Ids | None, name: str, rows: int) -> torch.Tensor | None:
    if ids is None:
        return None
    if isinstance(ids, torch.Tensor):
        return as_id_tensor(ids, name, rows)
    if isinstance(ids, Sequence) and not isinstance(ids, str):
        return as_id_tensor(list(ids), name, rows)
    raise ValueError(f"{name} must be a 1-D integer tensor or a sequence of ints")


@register_loss("adacl")
class AdaCLLoss(PairLoss):
    r"""AdaCL, Algorithm 1: :func:`~vlret.losses.adacl_loss` with margins re-estimated every
    training batch.

    In training mode each call first runs Algorithm 1 steps 2-5 on the detached batch (the
    anchor of Eq. 7-11, :func:`~vlret.losses.adacl.select_anchor`, then the margins of Eq. 20
    and 22), then computes the loss with the new margins (step 6). In eval mode the margins are
    used as they are. No gradient flows through ``m1`` and ``m2``. Calling the loss twice per
    optimiser step updates the margins twice.

    * **Guards.** A degenerate variance, an empty S*, an anchor ``>= max_anchor`` (Eq. 6 has no
      positive ``m1`` at 1) or margins that are not finite in the buffer dtype keep the
      previous margins and increment the matching counter of :data:`GUARDS`; at most one fires
      per batch.
    * **Cap on m1** (not in the paper). ``m1 = 10.47 / (1 - anchor)`` is unbounded below
      ``max_anchor``; ``max_m1`` clamps it and recomputes ``m2`` by Eq. (22) for the clamped
      value, so Eq. (4) still holds and only Eq. (6) is relaxed (counted in ``m1_capped``).
    * **Negative logits** (not in the paper). ``negative_temperature=t`` divides every negative
      logit and ``Sigma_anchor`` by ``t``; ``scale_negatives=True`` gives the negatives the
      scale ``m1`` (``Sigma_anchor`` is then summed at the new ``m1`` before Eq. 22), so Eq. (4)
      and (6) hold for the loss actually trained. See docs/adacl.md, "Training dynamics".
    * **Memory queue** (Sec. 4.1, A.9). With ``queue_size > 0`` the module owns two
      :class:`~vlret.memory.MemoryQueue` (``img_queue``, ``txt_queue``); ``forward`` scores the
      batch against a snapshot of each (a :class:`~vlret.losses.adacl.QueueBlock`; an
      image's own captions are never its queue negatives) and, in training mode, enqueues
      ``img_keys`` / ``txt_keys`` (a momentum encoder's outputs) or the detached embeddings.
    * **Distributed.** ``gathered=True``: the inputs are the all-gathered batch of every rank
      (what :class:`vlret.train.Trainer` passes); every rank then computes the single-process
      loss and margins, and the queues enqueue the global keys once. ``gathered=False``: each
      rank scores its own pairs and the queues all-gather the keys before enqueueing. With
      ``sync_margins`` the module declares its margins in :meth:`synced_buffers`, and the
      trainer broadcasts rank 0's after each step (a hook; a caller with its own loop calls
      :func:`vlret.train.parallel.distributed.broadcast_from_main` on them), so the module must sit
      on a device the backend supports.
    * **Large batches.** ``chunk_size`` is the tile height, as for every tiled loss: with it
      set, ``forward`` never builds the ``(B, B)`` matrix nor the ``(B, K)`` queue blocks
      (:class:`TiledAdaCLBatch`, the same anchor selection over tiles), whatever the batch
      size. A batch no taller than one tile is tiled too: the one-tile values differ from the
      dense path's by float rounding, so the dense path is no shortcut for it.

    The parameters are the fields of :class:`~vlret.losses.adacl.AdaCLParams`, with the
    paper's defaults, validated and stored as ``config`` (with ``reduction``, ``normalize`` and
    ``chunk_size``, the tile height).

    Attributes:
        config: The validated :class:`~vlret.losses.adacl.AdaCLParams`.
        m1: The scale margin (a buffer, saved by ``state_dict``).
        m2: The shift margin (a buffer).
        img_queue: The image memory queue, or ``None``.
        txt_queue: The text memory queue, or ``None``.
        generator: The random rule's generator, its state saved in the extra state.
        steps: Training batches seen; with ``anchor``, ``log_sigma_anchor``, ``clone_count``,
            ``guard_counts``, ``last_guard`` (-1 before the first batch, 0 after an accepted
            update, else 1 + the guard's index) and ``m1_capped``, host bookkeeping saved as
            extra state.

    Raises:
        ParamError: A parameter outside its constraint (:class:`AdaCLParams`).
    """

    paper = "AdaCL (adaptive contrastive, clone negs)"
    equation = "AdaCL Eq. (3)-(11), Alg. 1"
    Params = AdaCLParams
    config: AdaCLParams

    declared = LossCapabilities(momentum_keys=True, paper_comparison=5)

    # Registered buffers (typed here: nn.Module's __getattr__ knows no buffer's type).
    m1: torch.Tensor
    m2: torch.Tensor

    @classmethod
    def capabilities(cls, params: Mapping[str, Any] | None = None) -> LossCapabilities:
        """A memory queue (``queue_size > 0``) is owned and needs ``embed_dim``."""
        queue = bool((params or {}).get("queue_size", 0))
        return dataclasses.replace(cls.declared, owns_queue=queue, needs_embed_dim=queue)

    def current_capabilities(self) -> LossCapabilities:
        return type(self).capabilities({"queue_size": self.config.queue_size})

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        c = self.config
        self.generator = torch.Generator().manual_seed(c.seed)
        self.register_buffer("m1", torch.tensor(c.m1_init))
        self.register_buffer("m2", torch.tensor(c.m2_init))
        # Bookkeeping lives on the host (saved through get_extra_state): no tensor operations.
        self.steps = 0
        self.anchor = math.nan
        self.log_sigma_anchor = math.nan
        self.clone_count = 0
        self.guard_counts = [0] * len(GUARDS)
        self.m1_capped = 0
        self.last_guard = -1
        self.img_queue: MemoryQueue | None = None
        self.txt_queue: MemoryQueue | None = None
        if c.queue_size:
            assert c.embed_dim is not None  # check_relations: a queue needs embed_dim
            self.img_queue = MemoryQueue(c.queue_size, c.embed_dim)
            self.txt_queue = MemoryQueue(c.queue_size, c.embed_dim)

    # -- state update (Algorithm 1 steps 2-5) ---------------------------------------------

    @torch.no_grad()
    def update_margins(
        self,
        sim: torch.Tensor,
        pos_mask: torch.Tensor | None = None,
        *,
        extra_neg_txt: torch.Tensor | None = None,
        extra_neg_txt_mask: torch.Tensor | None = None,
    ) -> str | None:
        """Re-estimate ``m1, m2`` from one batch's similarities (Algorithm 1 steps 2-5).

        Args:
            sim: ``(B, B)`` similarities.
            pos_mask: Optional ``(B, B)`` bool further positives.
            extra_neg_txt: Optional ``(B, K)`` similarities to queue texts.
            extra_neg_txt_mask: Optional bool mask of the queue entries that are negatives.

        Returns:
            The name of the guard that fired, or ``None``.
        """
        extra = extra_neg_txt.detach() if isinstance(extra_neg_txt, torch.Tensor) else extra_neg_txt
        return self._update(DenseAdaCLBatch(sim.detach(), pos_mask, extra, extra_neg_txt_mask))

    def _search(self, batch: Batch) -> AnchorSearch:
        """The anchor search on a batch, up to its pass over the tiles."""
        c = self.config
        return AnchorSearch(
            batch,
            selection=c.anchor_selection,
            top_k=c.top_k,
            min_variance=c.min_variance,
            scale=1.0 / c.negative_temperature,
        )

    @torch.no_grad()
    def _update(
        self,
        batch: Batch,
        log_sigma_rows: torch.Tensor | None = None,
        search: AnchorSearch | None = None,
    ) -> str | None:
        """Algorithm 1 steps 2-5 on a batch; ``log_sigma_rows``: every row's ``log Sigma``
        when known (the loss's denominators); ``search``: the batch's anchor search when the
        caller started it (this call then estimates: it is past the warm-up)."""
        c = self.config
        self.steps += 1
        if self.steps <= c.warmup_steps:
            # Warm-up: the initial margins are used as they are; nothing is estimated.
            self.anchor = self.log_sigma_anchor = math.nan
            self.clone_count = 0
            self.last_guard = -1
            return None
        if search is None:
            search = self._search(batch)
        found = search.finish(log_sigma_rows, self.generator)
        self.clone_count = found.clone_count
        self.anchor = self.log_sigma_anchor = math.nan
        guard = found.guard
        if found.anchor is not None:
            # an anchor comes with its row and log Sigma (AdaCLAnchor)
            assert found.log_sigma_anchor is not None and found.row is not None
            guard = self._accept(batch, found.anchor, found.log_sigma_anchor, found.row)
        if guard is None:
            self.last_guard = 0
        else:
            code = GUARDS.index(guard)
            self.guard_counts[code] += 1
            self.last_guard = code + 1
        return guard

    def synced_buffers(self) -> tuple[torch.Tensor, ...]:
        """The buffers a data-parallel trainer overwrites with rank 0's after each training
        step (``sync_margins``: the margins; :class:`vlret.train.hooks.core.SyncLossBuffers`)."""
        return (self.m1, self.m2) if self.config.sync_margins else ()

    def _accept(self, batch: Batch, anchor: float, log_sigma: float, row: int) -> str | None:
        """Margins from an anchor (Eq. 20, 22; host floats) into the buffers, or the guard."""
        c = self.config
        self.anchor, self.log_sigma_anchor = anchor, log_sigma
        if anchor >= c.max_anchor:
            return "anchor_ge_one"
        m1 = m1_from_anchor(anchor, c.p_u, c.eps)
        if c.max_m1 is not None and m1 > c.max_m1:
            m1 = c.max_m1  # m2 below keeps Eq. (4) for the capped scale
            self.m1_capped += 1
        if c.scale_negatives:
            # Sigma_anchor = sum_k exp(m1 s_uk) with the m1 just found.
            log_sigma = log_sum_exp(m1 * row_negatives(batch, row))
            self.log_sigma_anchor = log_sigma
        m2 = m2_from_log_sigma(anchor, log_sigma, m1, c.p_u)
        mu = c.margin_momentum
        if mu:
            prev_m1, prev_m2 = torch.stack([self.m1, self.m2]).double().tolist()
            m1 = mu * prev_m1 + (1.0 - mu) * m1
            m2 = mu * prev_m2 + (1.0 - mu) * m2
        info = torch.finfo(self.m1.dtype)
        if not (math.isfinite(m2) and abs(m2) <= info.max and info.tiny <= m1 <= info.max):
            return "nonfinite_margins"
        self.m1.fill_(m1)
        self.m2.fill_(m2)
        return None

    @property
    def last_stats(self) -> dict[str, float | int | str | None]:
        """Margins, anchor, ``|S*|`` and guard counters after the last batch, as plain values.

        Keys: ``step``, ``m1``, ``m2``, ``anchor`` (``None`` when no anchor was found),
        ``log_sigma_anchor``, ``clone_count``, ``updated`` (the margins were re-estimated),
        ``guard`` (the guard that fired, or ``None``), ``guard_<name>`` counters, ``m1_capped``
        (updates clamped by ``max_m1``) and ``warmup`` (the last batch was within
        ``warmup_steps``).
        """
        code = self.last_guard
        stats: dict[str, float | int | str | None] = {
            "step": self.steps,
            "m1": float(self.m1),
            "m2": float(self.m2),
            "anchor": self.anchor if math.isfinite(self.anchor) else None,
            "log_sigma_anchor": (
                self.log_sigma_anchor if math.isfinite(self.log_sigma_anchor) else None
            ),
            "clone_count": self.clone_count,
            "updated": code == 0,
            "guard": GUARDS[code - 1] if code > 0 else None,
        }
        for name, n in zip(GUARDS, self.guard_counts, strict=True):
            stats[f"guard_{name}"] = n
        stats["m1_capped"] = self.m1_capped
        stats["warmup"] = 0 < self.steps <= self.config.warmup_steps
        return stats

    def get_extra_state(self) -> dict[str, object]:
        return {
            "steps": self.steps,
            "anchor": self.anchor,
            "log_sigma_anchor": self.log_sigma_anchor,
            "clone_count": self.clone_count,
            "guard_counts": dict(zip(GUARDS, self.guard_counts, strict=True)),
            "last_guard": self.last_guard,
            "m1_capped": self.m1_capped,
            "rng_state": self.generator.get_state(),
        }

    #: Extra-state keys added after the first release; older checkpoints load without them.
    _OPTIONAL_STATE = frozenset({"m1_capped", "rng_state"})

    def set_extra_state(self, state: dict[str, Any]) -> None:
        keys = set(self.get_extra_state())
        if not isinstance(state, dict) or not keys - self._OPTIONAL_STATE <= set(state) <= keys:
            raise ValueError("AdaCLLoss extra state must be a dict saved by AdaCLLoss")
        self.steps = int(state["steps"])
        self.anchor = float(state["anchor"])
        self.log_sigma_anchor = float(state["log_sigma_anchor"])
        self.clone_count = int(state["clone_count"])
        counts = state["guard_counts"]
        self.guard_counts = [int(counts.get(name, 0)) for name in GUARDS]
        self.last_guard = int(state["last_guard"])
        self.m1_capped = int(state.get("m1_capped", 0))
        if "rng_state" in state:
            rng = state["rng_state"]
            if not isinstance(rng, torch.Tensor):
                raise ValueError("AdaCLLoss extra state: rng_state must be a uint8 tensor")
            # A checkpoint read with map_location may have moved it; generators take CPU bytes.
            self.generator.set_state(rng.detach().to("cpu", torch.uint8))

    # -- loss -------------------------------------------------------------------------------

    def from_similarity(  # type: ignore[override]  # its own keywords: the queue blocks
        self,
        sim: torch.Tensor,
        pos_mask: torch.Tensor | None = None,
        *,
        extra_neg_txt: torch.Tensor | None = None,
        extra_neg_img: torch.Tensor | None = None,
        extra_neg_txt_mask: torch.Tensor | None = None,
        extra_neg_img_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The loss of a similarity matrix (arguments as :func:`~vlret.losses.adacl_loss`)."""
        return self._score(
            DenseAdaCLBatch(
                sim, pos_mask, extra_neg_txt, extra_neg_txt_mask, extra_neg_img, extra_neg_img_mask
            )
        )

    def _score(self, batch: Batch) -> torch.Tensor:
        """Algorithm 1: the margin update (steps 2-5, training mode only), then the loss with
        the new margins (step 6)."""
        c = self.config
        if c.scale_negatives:
            # The negatives' logits m1 s_ij depend on the margins: update first, then score.
            if self.training:
                self._update(batch)
            m1 = self.m1.clone()
            return batch.loss(m1, self.m2.clone(), self.reduction, None, m1)
        # The negatives' log-sum-exp does not depend on the margins: computed once, it gives
        # the loss its denominators and the anchor update its Sigma_anchor.
        scale = 1.0 / c.negative_temperature
        search = None
        if (
            self.training
            and not isinstance(batch, DenseAdaCLBatch)
            and self.steps >= c.warmup_steps
        ):
            # This call's update estimates: its pass over the in-batch tiles (the streamed
            # median's band) rides on the loss's forward, one product per tile (fused.py).
            search = self._search(batch)
        if search is not None and search.wants_tiles:
            # not isinstance: tests stand a recorder in for the TiledAdaCLBatch name
            lse = cast("TiledAdaCLBatch", batch).negatives_lse(scale, search.visit)
        else:
            lse = batch.negatives_lse(scale)
        if self.training:
            self._update(batch, lse[0].detach(), search)
        # Clones: a later in-place update must not touch tensors saved for this backward.
        return batch.loss(self.m1.clone(), self.m2.clone(), self.reduction, lse, 1.0)

    def forward(  # type: ignore[override]  # its own keywords: momentum keys, gathered
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
    ) -> torch.Tensor:
        """The loss of a batch of embeddings; with a queue, then enqueue (training mode).

        Args:
            img_emb: ``(B, D)`` image embeddings.
            txt_emb: ``(B, D)`` text embeddings.
            img_ids: Optional image ids (further positives; queue entries of the same id are
                no negatives).
            txt_ids: Optional ids of the texts' images (default ``img_ids``).
            img_keys: Optional ``(B, D)`` keys to enqueue instead of ``img_emb``.
            txt_keys: Optional ``(B, D)`` keys to enqueue instead of ``txt_emb``.
            gathered: The inputs are already the global batch of every rank: the queues
                enqueue them without all-gathering again.
            shard: Refused: the anchor selection needs the whole batch.

        Returns:
            The reduced loss, or the ``(B,)`` terms for ``reduction="none"``.

        Raises:
            ValueError: Bad inputs, keys without a queue, or ``shard``.
        """
        self.check_shard(shard)
        if not isinstance(gathered, bool):
            raise ValueError(f"gathered must be a bool, got {gathered!r}")
        check_embeddings(img_emb, txt_emb)
        # half precision is scored in float32, against the queue too (as the tiled batch does)
        dtype = compute_dtype(torch.promote_types(img_emb.dtype, txt_emb.dtype))
        img_emb, txt_emb = img_emb.to(dtype), txt_emb.to(dtype)
        size = img_emb.shape[0]
        # chunk_size is the tile height: set, the batch is tiled even when it fits in one tile
        tiled = self.chunk_size is not None
        queue_txt = queue_img = None
        if self.img_queue is None or self.txt_queue is None:
            if img_keys is not None or txt_keys is not None:
                raise ValueError("img_keys/txt_keys need a memory queue (queue_size > 0)")
        else:
            self.txt_queue.check_dim(img_emb, "img_emb", setting="embed_dim")
            img_id_t = _ids_for_queue(img_ids, "img_ids", size)
            txt_id_t = _ids_for_queue(txt_ids, "txt_ids", size) if txt_ids is not None else img_id_t
            img_n = F.normalize(img_emb, dim=1) if self.normalize else img_emb
            txt_n = F.normalize(txt_emb, dim=1) if self.normalize else txt_emb
            queue_txt = _snapshot(self.txt_queue, img_n.dtype, img_id_t)
            queue_img = _snapshot(self.img_queue, txt_n.dtype, txt_id_t)
        if tiled:
            assert self.chunk_size is not None  # tiled
            batch: Batch = TiledAdaCLBatch(
                img_emb,
                txt_emb,
                img_ids,
                txt_ids,
                chunk_size=self.chunk_size,
                normalize=self.normalize,
                queue_txt=queue_txt,
                queue_img=queue_img,
            )
        else:
            sim, pos_mask = self.similarity_and_mask(img_emb, txt_emb, img_ids, txt_ids)
            extra = {}
            if queue_txt is not None:
                assert queue_img is not None  # the two queues come together
                extra = {
                    "extra_neg_txt": img_n @ queue_txt.keys.t(),
                    "extra_neg_txt_mask": ~QueueExclusions(queue_txt).mask(0, size),
                    "extra_neg_img": queue_img.keys @ txt_n.t(),
                    "extra_neg_img_mask": ~QueueExclusions(queue_img).mask(0, size).t(),
                }
            batch = DenseAdaCLBatch(sim, pos_mask, **extra)
        loss = self._score(batch)
        if queue_txt is not None and self.training:
            assert self.img_queue is not None and self.txt_queue is not None  # queue_txt is set
            gather = not gathered
            self.img_queue.enqueue(self._keys(img_keys, img_n, "img_keys"), img_id_t, gather=gather)
            self.txt_queue.enqueue(self._keys(txt_keys, txt_n, "txt_keys"), txt_id_t, gather=gather)
        return loss

    def _keys(self, keys: torch.Tensor | None, fallback: torch.Tensor, name: str) -> torch.Tensor:
        if keys is None:
            return fallback.detach()
        if not isinstance(keys, torch.Tensor) or keys.shape != fallback.shape:
            got = tuple(keys.shape) if isinstance(keys, torch.Tensor) else type(keys).__name__
            raise ValueError(f"{name} must have shape {tuple(fallback.shape)}, got {got}")
        keys = keys.detach()
        return F.normalize(keys, dim=1) if self.normalize else keys

    def extra_repr(self) -> str:
        # the margins now, then the declaration's fields
        return f"m1={float(self.m1):g}, m2={float(self.m2):g}, " + self.config.describe()


def _snapshot(
    queue: MemoryQueue, dtype: torch.dtype, anchor_ids: torch.Tensor | None
) -> QueueBlock:
    """The queue's negatives for this batch; copies, as the enqueue after the loss writes the
    buffers in place before backward runs. Without ids every filled entry is a negative."""
    ids = None if anchor_ids is None else queue.ids.clone()
    return QueueBlock(queue.keys.to(dtype, copy=True), queue.valid.clone(), ids, anchor_ids)
