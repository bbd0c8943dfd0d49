"""Tiles, exclusions and shards: how a batch is cut and which entries are negatives."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F

from ..._checks import CHUNK_SIZE, check_embeddings, check_finite, compute_dtype
from ...similarity import Ids, _ids_to_tensor

Codes = tuple[torch.Tensor, torch.Tensor] | None

# Same norm clamp as ``similarity.cosine_similarity``, so normalize=True matches the dense path.
_NORM_EPS = 1e-8


def tiles(n: int, size: int) -> Iterator[tuple[int, int]]:
    """``(start, stop)`` of the consecutive tiles of ``size`` rows covering ``range(n)``."""
    for start in range(0, n, size):
        yield start, min(start + size, n)


def check_shard(shard: object, batch: int) -> tuple[int, int]:
    """``shard`` as ``(start, stop)`` with ``0 <= start < stop <= batch``.

    Raises:
        ValueError: ``shard`` is not such a pair of ints.
    """
    ok = (
        isinstance(shard, tuple | list)
        and len(shard) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in shard)
        and 0 <= shard[0] < shard[1] <= batch
    )
    if not ok:
        raise ValueError(
            f"shard must be (start, stop) with 0 <= start < stop <= {batch}, got {shard!r}"
        )
    pair = cast("tuple[int, int]", shard)  # checked above
    return int(pair[0]), int(pair[1])


@dataclass(frozen=True)
class Embedded:
    """Validated embeddings of a batch: ``x``, ``y`` in the compute dtype (normalised when
    asked), the id ``codes`` and the ``tile`` height."""

    x: torch.Tensor
    y: torch.Tensor
    codes: Codes
    tile: int

    @property
    def batch(self) -> int:
        return self.x.shape[0]

    @property
    def exclusions(self) -> PairExclusions:
        """The square batch's exclusions (id matches and the diagonal) on its device."""
        return SquareExclusions(self.codes, self.batch, self.x.device)


def _codes(img_ids: Ids | None, txt_ids: Ids | None, batch: int, device) -> Codes:
    """Ids as two integer tensors with a shared coding (same rules as ``PairLoss``)."""
    if img_ids is None and txt_ids is None:
        return None
    if img_ids is None:
        raise ValueError("txt_ids given without img_ids; pass img_ids (and optionally txt_ids)")
    if txt_ids is None:
        txt_ids = img_ids
    if isinstance(img_ids, torch.Tensor) != isinstance(txt_ids, torch.Tensor):
        raise ValueError("img_ids and txt_ids must both be tensors or both be sequences")
    lookup: dict = {}
    out = []
    for name, ids in (("img_ids", img_ids), ("txt_ids", txt_ids)):
        codes = _ids_to_tensor(ids, name, lookup, device)
        if len(codes) != batch:
            raise ValueError(f"{name} must have one id per row ({batch}), got {len(codes)}")
        out.append(codes.to(device))
    return out[0], out[1]


def prepare_embeddings(
    img_emb: torch.Tensor,
    txt_emb: torch.Tensor,
    img_ids: Ids | None,
    txt_ids: Ids | None,
    *,
    chunk_size: int,
    normalize: bool,
) -> Embedded:
    """Validate a batch for a tiled loss.

    Args:
        img_emb: ``(B, D)`` image embeddings, ``B >= 2``.
        txt_emb: ``(B, D)`` text embeddings.
        img_ids: Optional ids marking further positives (``PairLoss`` rules).
        txt_ids: Optional ids of the texts' images (default ``img_ids``).
        chunk_size: Tile height, a positive int.
        normalize: L2-normalise the embeddings (cosine scores) or keep raw dot products.

    Returns:
        The :class:`Embedded` batch, float32 or wider.

    Raises:
        ValueError: Bad shapes, ids, ``chunk_size`` or non-finite values, naming the argument.
    """
    check_embeddings(img_emb, txt_emb, finite=False)  # checked once below, after the cast
    # the one tile-height spec a loss's declaration checks too (a direct call may pass anything)
    if chunk_size is None:
        raise ValueError("chunk_size (the tile height) is required by a tiled form, got None")
    CHUNK_SIZE.check(chunk_size, "chunk_size")
    batch = img_emb.shape[0]
    if batch < 2:
        raise ValueError(f"img_emb needs a batch size of at least 2 to have negatives, got {batch}")
    dtype = compute_dtype(torch.promote_types(img_emb.dtype, txt_emb.dtype))
    x, y = img_emb.to(dtype), txt_emb.to(dtype)
    check_finite(x, "img_emb")
    check_finite(y, "txt_emb")
    if normalize:
        x, y = F.normalize(x, dim=1, eps=_NORM_EPS), F.normalize(y, dim=1, eps=_NORM_EPS)
    return Embedded(x, y, _codes(img_ids, txt_ids, batch, x.device), chunk_size)


class Exclusions:
    """Which entries of a tile of scores are not negatives (positives, empty queue slots)."""

    def fill_(self, t: torch.Tensor, start: int, value: float) -> torch.Tensor:
        """Set the excluded entries of rows ``start:start + len(t)`` to ``value``, in place."""
        return t.masked_fill_(self.mask(start, start + t.shape[0]), value)

    def mask(self, start: int, stop: int) -> torch.Tensor:
        """Bool ``(stop - start, C)``: the excluded entries of rows ``start:stop``."""
        raise NotImplementedError


class PairExclusions(Exclusions):
    """Rows against candidates where row ``k``'s own pair is candidate ``pair[k]`` and equal
    id codes mark further positives (``pair=None``: the diagonal, the square batch)."""

    def __init__(
        self,
        row_codes: torch.Tensor | None,
        col_codes: torch.Tensor | None,
        pair: torch.Tensor | None,
        width: int,
        device: torch.device | str | None = None,
    ) -> None:
        self.row_codes, self.col_codes, self.pair, self.width = row_codes, col_codes, pair, width
        # Where mask() builds its tensor: the batch's device (a bare diagonal has no tensor).
        known = next((t.device for t in (row_codes, pair) if t is not None), None)
        self.device = torch.device(device) if device is not None else known

    def fill_(self, t: torch.Tensor, start: int, value: float) -> torch.Tensor:
        n = t.shape[0]
        if self.row_codes is not None:
            assert self.col_codes is not None  # row and column codes come together
            t.masked_fill_(
                self.row_codes[start : start + n, None] == self.col_codes[None, :], value
            )
        if self.pair is None:
            t.diagonal(start).fill_(value)
        else:
            t[torch.arange(n, device=t.device), self.pair[start : start + n]] = value
        return t

    def mask(self, start: int, stop: int) -> torch.Tensor:
        t = torch.zeros(stop - start, self.width, dtype=torch.bool, device=self.device)
        return self.fill_(t, start, True)


def SquareExclusions(  # noqa: N802 (a constructor)
    codes: Codes, batch: int, device: torch.device | str | None = None
) -> PairExclusions:
    """The exclusions of a ``(B, B)`` batch on ``device``: id matches and the diagonal."""
    rows, cols = (None, None) if codes is None else codes
    return PairExclusions(rows, cols, None, batch, device)


@dataclass(frozen=True)
class QueueBlock:
    """Memory-queue negatives of one direction.

    Attributes:
        keys: ``(K, D)`` queued embeddings (constants, no gradient).
        valid: ``(K,)`` bool, the filled slots.
        ids: Optional ``(K,)`` ids of the entries.
        anchor_ids: Optional ``(B,)`` ids of the anchors; an entry with the anchor's id is no
            negative of it (as ``MemoryQueue.negative_mask``).
    """

    keys: torch.Tensor
    valid: torch.Tensor
    ids: torch.Tensor | None = None
    anchor_ids: torch.Tensor | None = None


class QueueExclusions(Exclusions):
    """Anchors against a :class:`QueueBlock`: empty slots and entries with the anchor's id."""

    def __init__(self, block: QueueBlock) -> None:
        self.block = block

    def mask(self, start: int, stop: int) -> torch.Tensor:
        b = self.block
        if b.ids is None or b.anchor_ids is None:
            return (~b.valid)[None, :].expand(stop - start, -1)
        return ~(b.valid[None, :] & (b.ids[None, :] != b.anchor_ids[start:stop, None]))


def scores_at(rows: torch.Tensor, cands: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``s_k = rows[k] . cands[index[k]]``, differentiable; the gather's backward is an
    ``index_add_`` (the scatter of a hardest negative's gradient)."""
    return (rows * cands.index_select(0, index)).sum(1)


def scalar_tensor(value: float | torch.Tensor, like: torch.Tensor, name: str) -> torch.Tensor:
    """``value`` as a 0-dim tensor of ``like``'s dtype and device (a tensor keeps its graph)."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"{name} must be a scalar, got shape {tuple(value.shape)}")
        check_finite(value, name)
        return value.to(device=like.device, dtype=like.dtype).reshape(())
    return torch.tensor(value, dtype=like.dtype, device=like.device)


def masked_tiles(
    x: torch.Tensor, y: torch.Tensor, exclusions: Exclusions, tile: int, fill: float
) -> Iterator[tuple[int, int, torch.Tensor]]:
    """``(start, stop, t)`` per tile, ``t = x[start:stop] @ y.T`` with excluded entries set to
    ``fill``; computed without gradient."""
    with torch.no_grad():
        for start, stop in tiles(x.shape[0], tile):
            yield start, stop, exclusions.fill_(x[start:stop] @ y.t(), start, fill)


@dataclass(frozen=True)
class Direction:
    """One direction of a shard: ``rows`` (the shard's anchors, ``(n, D)``) against all
    ``cands`` (``(B, D)``); anchor ``k``'s own pair is candidate ``pair[k]``."""

    rows: torch.Tensor
    cands: torch.Tensor
    pair: torch.Tensor
    exclusions: PairExclusions

    @property
    def positives(self) -> torch.Tensor:
        """``(n,)`` the anchors' positive scores (differentiable)."""
        return scores_at(self.rows, self.cands, self.pair)


def shard_directions(batch: Embedded, shard: object) -> tuple[Direction, Direction]:
    """The image anchors and the text anchors of ``shard`` as two rectangles.

    A rank that holds pairs ``start:stop`` of an all-gathered batch computes only their terms:
    image anchor ``i`` against every text and text anchor ``i`` against every image. Summed
    over ranks (through a gather whose backward sums the gradients, e.g.
    ``torch.distributed.nn.functional.all_gather``) they are the loss of the whole batch.

    Raises:
        ValueError: ``shard`` is not ``(start, stop)`` inside the batch.
    """
    start, stop = check_shard(shard, batch.batch)
    pair = torch.arange(start, stop, device=batch.x.device)
    img, txt = (None, None) if batch.codes is None else batch.codes
    out = []
    for rows, cands, row_codes, cand_codes in (
        (batch.x, batch.y, img, txt),
        (batch.y, batch.x, txt, img),
    ):
        local = None if row_codes is None else row_codes[start:stop]
        exclusions = PairExclusions(local, cand_codes, pair, batch.batch)
        out.append(Direction(rows[start:stop], cands, pair, exclusions))
    return out[0], out[1]
