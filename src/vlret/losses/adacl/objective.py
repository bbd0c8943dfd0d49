"""AdaCL's objective for given margins, Eq. (3) with the cross-entropy of Eq. (2), dense and tiled.

Two batch types carry what :class:`~vlret.losses.AdaCLLoss` needs from one batch: the
negatives' log-sum-exps (``log Sigma`` of every row and column, which do not depend on the
margins), Eq. (3) given the margins, and the score tiles the anchor selection reads
(:class:`~vlret.losses.adacl.anchor.ScoreTiles`):

* :class:`DenseAdaCLBatch`: a similarity matrix in memory, with optional queue score blocks;
  its score tiles are the whole blocks (one tile each).
* :class:`TiledAdaCLBatch`: embeddings, scored tile by tile by the streaming engine
  (``negatives_lse`` on the ``(B, B)`` square and on the memory-queue rectangles), never
  holding the ``(B, B)`` matrix.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..._checks import (
    check_finite,
    check_pos_mask,
    check_reduction,
    check_similarity,
    compute_dtype,
)
from ...similarity import Ids
from .._base import reduce_per_index
from .._tiling import (
    QueueBlock,
    QueueExclusions,
    log1p_exp,
    negatives_lse,
    prepare_embeddings,
)
from .config import check_margin, check_scale_negatives, check_temperature
from .fused import visited_square_lse

#: ``visit(block, start, scores, excluded)``: a tile shown to the anchor search.
TileVisit = Callable[[int, int, torch.Tensor, torch.Tensor | None], None]

Scale = float | torch.Tensor


def _is_one(scale: Scale) -> bool:
    return not isinstance(scale, torch.Tensor) and scale == 1.0


def _eq3(
    pos: torch.Tensor,
    lse: tuple[torch.Tensor, torch.Tensor],
    m1: Scale,
    m2: Scale,
    reduction: str,
) -> torch.Tensor:
    """Eq. (3) per index from the positives and the negatives' log-sum-exps:
    ``log(1 + exp(lse_row_i - m1 (s_ii - m2))) + log(1 + exp(lse_col_i - m1 (s_ii - m2)))``."""
    if isinstance(m1, torch.Tensor):
        m1 = m1.to(device=pos.device, dtype=pos.dtype)
    if isinstance(m2, torch.Tensor):
        m2 = m2.to(device=pos.device, dtype=pos.dtype)
    pos_logit = m1 * (pos - m2)
    per_index = log1p_exp(lse[0] - pos_logit) + log1p_exp(lse[1] - pos_logit)
    return reduce_per_index(per_index, reduction)


# ----------------------------------------------------------------------------- dense


@dataclass(frozen=True)
class _ScoreBlock:
    """Scores in the compute dtype and the entries that are not negatives (``None``: all are)."""

    scores: torch.Tensor
    excluded: torch.Tensor | None

    def lse(self, scale: Scale, dims: tuple[int, ...] = (1, 0)) -> tuple[torch.Tensor, ...]:
        """Log-sum-exps of the negative logits ``scale * s`` along ``dims`` (1: rows, 0:
        columns).

        Excluded entries get the dtype's most negative finite value *added* (never ``-inf``,
        whose arithmetic gives NaN gradients; an addition's backward is free, unlike that of
        ``masked_fill``), after scaling so it cannot overflow; a line without negatives gives
        about that value, hence a graph-attached zero loss term.
        """
        filled = self.scores if _is_one(scale) else self.scores * scale
        if self.excluded is not None:
            out = self.excluded.view(torch.uint8).to(filled.dtype)
            filled = filled + out * torch.finfo(filled.dtype).min
        return tuple(filled.logsumexp(dim) for dim in dims)


def _extra_block(
    scores: torch.Tensor | None,
    mask: torch.Tensor | None,
    name: str,
    shape_of: tuple[int | None, int | None],
    like: torch.Tensor,
) -> _ScoreBlock | None:
    """Validate an extra-negative block; ``shape_of`` fixes the dimension tied to the batch."""
    if scores is None:
        if mask is not None:
            raise ValueError(f"{name}_mask given without {name}")
        return None
    if not isinstance(scores, torch.Tensor) or scores.dim() != 2:
        got = tuple(scores.shape) if isinstance(scores, torch.Tensor) else type(scores).__name__
        raise ValueError(f"{name} must be a 2-D tensor, got {got}")
    for axis, want in enumerate(shape_of):
        if want is not None and scores.shape[axis] != want:
            layout = "(B, K)" if axis == 0 else "(K, B)"
            raise ValueError(
                f"{name} must have shape {layout} with B={want} matching sim, "
                f"got {tuple(scores.shape)}"
            )
    if not scores.dtype.is_floating_point:
        raise ValueError(f"{name} must be floating point, got dtype {scores.dtype}")
    if not bool(torch.isfinite(scores.sum())):  # one pass: a finite sum has finite terms
        check_finite(scores, name)
    scores = scores.to(device=like.device, dtype=like.dtype)
    if mask is None:
        return _ScoreBlock(scores, None)
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        raise ValueError(f"{name}_mask must be a bool tensor")
    try:
        mask = mask.to(like.device).expand(scores.shape)
    except RuntimeError:
        raise ValueError(
            f"{name}_mask must have shape {tuple(scores.shape)} like {name} (or broadcast to "
            f"it), got {tuple(mask.shape)}"
        ) from None
    return _ScoreBlock(scores, (~mask).contiguous())


class DenseAdaCLBatch:
    """A validated similarity matrix with optional memory-queue score blocks (the arguments
    of :func:`adacl_loss` of the same names); ``ValueError`` names a bad one."""

    def __init__(
        self,
        sim: torch.Tensor,
        pos_mask: torch.Tensor | None = None,
        extra_neg_txt: torch.Tensor | None = None,
        extra_neg_txt_mask: torch.Tensor | None = None,
        extra_neg_img: torch.Tensor | None = None,
        extra_neg_img_mask: torch.Tensor | None = None,
    ) -> None:
        check_similarity(sim)
        excluded = check_pos_mask(pos_mask, sim.shape[0], sim.device)
        s = sim.to(compute_dtype(sim.dtype))
        b = s.shape[0]
        self.sim = _ScoreBlock(s, excluded)
        self.q_txt = _extra_block(extra_neg_txt, extra_neg_txt_mask, "extra_neg_txt", (b, None), s)
        self.q_img = _extra_block(extra_neg_img, extra_neg_img_mask, "extra_neg_img", (None, b), s)
        # Score tiles (the anchor's source): one tile per block, image rows' blocks only.
        self.blocks = [self.sim] if self.q_txt is None else [self.sim, self.q_txt]
        self.tile = b
        self.widths = tuple(block.scores.shape[1] for block in self.blocks)
        self._detached = [block.scores.detach() for block in self.blocks]

    @property
    def positives(self) -> torch.Tensor:
        """``(B,)`` detached positive scores ``s_ii``."""
        return self.sim.scores.detach().diagonal()

    def scores(self, block: int, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Rows ``start:stop`` of block ``block`` (views) and their excluded entries."""
        scores, excluded = self._detached[block], self.blocks[block].excluded
        if stop - start == self.tile:  # the whole block: no slicing ops
            return scores, excluded
        return scores[start:stop], None if excluded is None else excluded[start:stop]

    def score_bound(self) -> float:
        """The largest ``|s|`` over the blocks."""
        return max(float(b.scores.detach().abs().max()) for b in self.blocks)

    def negative_sums(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Float64 ``(B,)`` sum and number of each image row's negatives, every block."""
        total = torch.zeros(self.tile, dtype=torch.float64, device=self.sim.scores.device)
        count = torch.zeros_like(total)
        for scores, block in zip(self._detached, self.blocks, strict=True):
            if block.excluded is not None:
                scores = scores.masked_fill(block.excluded, 0.0)
                count -= block.excluded.sum(1)
            total += scores.sum(1, dtype=torch.float64)
            count += scores.shape[1]
        return total, count

    def negatives_lse(self, scale: Scale = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
        """``log Sigma`` of Eq. (3)-(4): the log-sum-exp of every row's (image->text) and
        column's (text->image) negative logits ``scale * s``, queue blocks included."""
        if isinstance(scale, torch.Tensor):
            scale = scale.to(device=self.sim.scores.device, dtype=self.sim.scores.dtype)
        lse_row, lse_col = self.sim.lse(scale)
        if self.q_txt is not None:
            lse_row = torch.logaddexp(lse_row, self.q_txt.lse(scale, (1,))[0])
        if self.q_img is not None:
            lse_col = torch.logaddexp(lse_col, self.q_img.lse(scale, (0,))[0])
        return lse_row, lse_col

    def loss(
        self,
        m1: Scale,
        m2: Scale,
        reduction: str,
        lse: tuple[torch.Tensor, torch.Tensor] | None = None,
        scale: Scale = 1.0,
    ) -> torch.Tensor:
        """Eq. (3) in both directions with negative logits ``scale * s`` (``lse``: the
        :meth:`negatives_lse` of the same ``scale`` when already known)."""
        lse = self.negatives_lse(scale) if lse is None else lse
        return _eq3(self.sim.scores.diagonal(), lse, m1, m2, reduction)


def adacl_loss(
    sim: torch.Tensor,
    *,
    m1: float | torch.Tensor,
    m2: float | torch.Tensor,
    pos_mask: torch.Tensor | None = None,
    extra_neg_txt: torch.Tensor | None = None,
    extra_neg_img: torch.Tensor | None = None,
    extra_neg_txt_mask: torch.Tensor | None = None,
    extra_neg_img_mask: torch.Tensor | None = None,
    reduction: str = "mean",
    negative_temperature: float = 1.0,
    scale_negatives: bool = False,
) -> torch.Tensor:
    r"""AdaCL loss for fixed margins, Eq. (3) with the cross-entropy of Eq. (2) / (13).

    .. math:: \hat p_i = \frac{e^{m_1(s_{ii} - m_2)}}
              {e^{m_1(s_{ii} - m_2)} + \sum_{j \ne i} e^{s_{ij}}}, \qquad
              \ell_i = -\log \hat p_i

    The positive logit is scaled and shifted, the negative logits are the raw similarities as
    printed (no temperature). Applied in both directions, image->text on row ``i`` and
    text->image on column ``i`` (Eq. 3 is written for an image anchor; the paper trains its
    retrieval models bidirectionally), as ``log(1 + exp(logsumexp_j s_ij - m1 (s_ii - m2)))``.
    Identities: ``adacl_loss(sim, m1=1, m2=0) == infonce_loss(sim, temperature=1)``;
    ``adacl_loss(sim, m1=1/t, m2=0, negative_temperature=t)`` and ``adacl_loss(sim,
    m1=1/t, m2=0, scale_negatives=True)`` equal ``infonce_loss(sim, temperature=t)``.

    Args:
        sim: ``(B, B)`` similarities, rows images, columns texts.
        m1: Scale of the positive logit, > 0; a float or a 0-dim tensor (gradient flows
            through tensors: pass buffers or detached values for training-free margins).
        m2: Shift of the positive logit, finite.
        pos_mask: Optional ``(B, B)`` bool further positives, left out of the denominators.
        extra_neg_txt: Optional ``(B, K)`` similarities of each batch image to ``K`` extra
            texts (memory-queue keys), appended to the image->text denominators.
        extra_neg_img: Optional ``(K', B)`` similarities of ``K'`` extra images to each batch
            text, appended to the text->image denominators.
        extra_neg_txt_mask: Optional bool (broadcast to ``extra_neg_txt``): which extra entries
            are negatives (see :meth:`vlret.memory.MemoryQueue.negative_mask`); default all.
        extra_neg_img_mask: The same for ``extra_neg_img``.
        reduction: ``"mean"`` (mean over the ``B`` indices of image->text plus text->image),
            ``"sum"`` or ``"none"`` (the ``(B,)`` vector).
        negative_temperature: ``t`` dividing every negative logit, in-batch and queue (not in
            the paper; 1 is Eq. 3 as printed).
        scale_negatives: Give the negatives the positive's scale, ``exp(m1 s_ij)``: a softmax
            at temperature ``1/m1`` with the shift ``m2`` on the positive (the CosFace form;
            not in the paper's printed Eq. 3). Excludes ``negative_temperature``.

    Returns:
        The reduced loss, or the ``(B,)`` per-index terms.

    Raises:
        ValueError: Bad inputs, naming the argument.
    """
    check_margin(m1, "m1", positive=True)
    check_margin(m2, "m2", positive=False)
    check_reduction(reduction)
    t = check_temperature(negative_temperature)
    check_scale_negatives(scale_negatives, t)
    batch = DenseAdaCLBatch(
        sim, pos_mask, extra_neg_txt, extra_neg_txt_mask, extra_neg_img, extra_neg_img_mask
    )
    return batch.loss(m1, m2, reduction, scale=m1 if scale_negatives else 1.0 / t)


# ----------------------------------------------------------------------------- tiled


class TiledAdaCLBatch:
    """A batch of embeddings scored tile by tile, never holding the ``(B, B)`` matrix.

    Args:
        img_emb: ``(B, D)`` image embeddings.
        txt_emb: ``(B, D)`` text embeddings.
        img_ids: Optional ids marking further positives (``PairLoss`` rules).
        txt_ids: Optional ids of the texts' images (default ``img_ids``).
        chunk_size: Tile height; memory is ``O(chunk_size x (B + K))``.
        normalize: L2-normalise the embeddings (cosine scores).
        queue_txt: Optional memory-queue texts, negatives of the image rows.
        queue_img: Optional memory-queue images, negatives of the text columns.

    Raises:
        ValueError: Bad shapes, ids or ``chunk_size``, naming the argument.
    """

    def __init__(
        self,
        img_emb: torch.Tensor,
        txt_emb: torch.Tensor,
        img_ids: Ids | None = None,
        txt_ids: Ids | None = None,
        *,
        chunk_size: int,
        normalize: bool = True,
        queue_txt: QueueBlock | None = None,
        queue_img: QueueBlock | None = None,
    ) -> None:
        e = prepare_embeddings(
            img_emb, txt_emb, img_ids, txt_ids, chunk_size=chunk_size, normalize=normalize
        )
        self.x, self.y, self.tile = e.x, e.y, e.tile
        self.square = e.exclusions
        self.queue_txt, self.queue_img = (
            None if q is None else _on(q, self.x) for q in (queue_txt, queue_img)
        )
        self.widths = (e.batch,) if self.queue_txt is None else (e.batch, len(self.queue_txt.keys))

    @property
    def positives(self) -> torch.Tensor:
        """``(B,)`` detached positive scores ``x_i . y_i``."""
        return (self.x.detach() * self.y.detach()).sum(1)

    def scores(self, block: int, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Scores of image rows ``start:stop`` against the batch texts (``block`` 0) or the
        queue texts (1), without gradient, and their excluded entries."""
        x = self.x.detach()[start:stop]
        if block == 0:
            return x @ self.y.detach().t(), self.square.mask(start, stop)
        assert self.queue_txt is not None  # block 1 exists only with a queue
        return x @ self.queue_txt.keys.t(), QueueExclusions(self.queue_txt).mask(start, stop)

    def score_bound(self) -> float:
        """A bound on ``|s|`` (Cauchy-Schwarz on the largest norms)."""
        cand = self.y.detach().norm(dim=1).max()
        if self.queue_txt is not None and len(self.queue_txt.keys):
            cand = torch.maximum(cand, self.queue_txt.keys.norm(dim=1).max())
        return float(self.x.detach().norm(dim=1).max() * cand)

    def negative_sums(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Float64 ``(B,)`` sum and number of each image row's negatives, every block, without
        a tile: by linearity, ``sum_j x_i . y_j = x_i . sum_j y_j``, less the sums of the
        excluded entries, grouped by id (float64 products of the stored embeddings)."""
        x, y = self.x.detach().double(), self.y.detach().double()
        size = x.shape[0]
        total = x @ y.sum(0)
        count = torch.full((size,), float(size), dtype=torch.float64, device=x.device)
        codes, diag = self.square.row_codes, (x * y).sum(1)
        if codes is None:  # the diagonal only
            total -= diag
            count -= 1
        else:
            assert self.square.col_codes is not None  # the codes come together
            group, n = _group_sums(self.square.col_codes, y, codes)
            total -= (x * group).sum(1)
            count -= n
            off = self.square.col_codes != codes  # a diagonal outside its row's id group
            total -= torch.where(off, diag, 0.0)
            count -= off.double()
        q = self.queue_txt
        if q is not None:
            keys, ids = q.keys[q.valid].double(), None if q.ids is None else q.ids[q.valid]
            total += x @ keys.sum(0)
            count += keys.shape[0]
            if ids is not None and q.anchor_ids is not None:
                group, n = _group_sums(ids, keys, q.anchor_ids)
                total -= (x * group).sum(1)
                count -= n
        return total, count

    def negatives_lse(
        self, scale: Scale = 1.0, visit: TileVisit | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """As :meth:`DenseAdaCLBatch.negatives_lse`, from the engine's tiles.

        Args:
            scale: The negative logits' scale.
            visit: Shown every tile of the in-batch block on the way, as
                ``visit(0, start, scores, excluded)`` with the values of :meth:`scores` (read
                only; :meth:`AnchorSearch.visit <vlret.losses.adacl.anchor.AnchorSearch.visit>`);
                needs a float ``scale``.
        """
        if visit is not None:
            assert not isinstance(scale, torch.Tensor)  # the anchor's scale is a float

            def shown(start: int, s: torch.Tensor) -> None:
                visit(0, start, s, self.square.mask(start, start + s.shape[0]))

            rows, cols = visited_square_lse(self.x, self.y, scale, self.square, self.tile, shown)
            return self._queue_lse(rows, cols, scale)
        if isinstance(scale, torch.Tensor):
            scale = scale.to(device=self.x.device, dtype=self.x.dtype)
        x = self.x if _is_one(scale) else self.x * scale
        rows, cols = negatives_lse(x, self.y, self.square, self.tile, columns=True)
        return self._queue_lse(rows, cols, scale)

    def _queue_lse(
        self, rows: torch.Tensor, cols: torch.Tensor, scale: Scale
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The in-batch log-sum-exps with the queue blocks' added."""
        x = self.x if _is_one(scale) else self.x * scale
        if self.queue_txt is not None:
            q = negatives_lse(
                x, self.queue_txt.keys, QueueExclusions(self.queue_txt), self.tile, columns=False
            )
            rows = torch.logaddexp(rows, q)
        if self.queue_img is not None:
            y = self.y if _is_one(scale) else self.y * scale
            q = negatives_lse(
                y, self.queue_img.keys, QueueExclusions(self.queue_img), self.tile, columns=False
            )
            cols = torch.logaddexp(cols, q)
        return rows, cols

    def loss(
        self,
        m1: Scale,
        m2: Scale,
        reduction: str,
        lse: tuple[torch.Tensor, torch.Tensor] | None = None,
        scale: Scale = 1.0,
    ) -> torch.Tensor:
        """As :meth:`DenseAdaCLBatch.loss`."""
        lse = self.negatives_lse(scale) if lse is None else lse
        return _eq3((self.x * self.y).sum(1), lse, m1, m2, reduction)


def _group_sums(
    ids: torch.Tensor, values: torch.Tensor, query: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """For each query id: the sum of the ``values`` rows whose id equals it, and their number
    (float64)."""
    codes = torch.unique(torch.cat([ids, query]), return_inverse=True)[1]
    own, asked = codes[: len(ids)], codes[len(ids) :]
    sums = values.new_zeros(int(codes.max()) + 1, values.shape[1]).index_add_(0, own, values)
    counts = torch.bincount(own, minlength=sums.shape[0]).double()
    return sums[asked], counts[asked]


def _on(block: QueueBlock, like: torch.Tensor) -> QueueBlock:
    """``block`` on the device of ``like``, its keys in ``like``'s dtype."""
    device = like.device
    return QueueBlock(
        block.keys.to(device=device, dtype=like.dtype),
        block.valid.to(device),
        None if block.ids is None else block.ids.to(device),
        None if block.anchor_ids is None else block.anchor_ids.to(device),
    )


def tiled_adacl_loss(
    img_emb: torch.Tensor,
    txt_emb: torch.Tensor,
    *,
    m1: float | torch.Tensor,
    m2: float | torch.Tensor,
    img_ids: Ids | None = None,
    txt_ids: Ids | None = None,
    chunk_size: int,
    reduction: str = "mean",
    normalize: bool = True,
) -> torch.Tensor:
    """Tiled :func:`adacl_loss` for given margins, in-batch negatives, Eq. (3).

    Per index ``i``: ``log(1 + exp(L_i - m1 (s_ii - m2)))`` with ``L_i`` the log-sum-exp of
    row ``i``'s negatives, plus the same over column ``i``. The two log-sum-exp vectors come
    from the streaming engine; the rest is ``O(B)`` autograd, so ``m1`` / ``m2`` tensors that
    require grad get their gradient as in the dense form.

    Args:
        img_emb: ``(B, D)`` image embeddings.
        txt_emb: ``(B, D)`` text embeddings.
        m1: Scale of the positive logit, > 0.
        m2: Shift of the positive logit.
        img_ids: Optional ids marking further positives.
        txt_ids: Optional ids of the texts' images (default ``img_ids``).
        chunk_size: Tile height.
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
        normalize: L2-normalise the embeddings.

    Returns:
        The reduced loss, or the ``(B,)`` per-index terms.

    Raises:
        ValueError: Bad inputs, naming the argument.
    """
    check_margin(m1, "m1", positive=True)
    check_margin(m2, "m2", positive=False)
    check_reduction(reduction)
    batch = TiledAdaCLBatch(
        img_emb, txt_emb, img_ids, txt_ids, chunk_size=chunk_size, normalize=normalize
    )
    return batch.loss(m1, m2, reduction)
