"""Cross-modal projection matching loss (CMPM; Zhang & Lu, ECCV 2018, Sec. 3.1), dense and tiled.

For image anchor ``i`` the scalar projections of its embedding on every normalised text,
``x_i . ybar_j`` with ``ybar_j = y_j / ||y_j||``, give the projection compatibility
distribution (Eq. 1)

    p_ij = softmax_j(x_i . ybar_j),

and the true matches the normalised matching distribution (Eq. 2) ``q_ij = y_ij / sum_k y_ik``
(``y_ij = 1`` for a matching pair: the own pair and, with ids, every text of the same image).
The loss is the KL divergence of ``q`` from ``p`` per anchor (Eqs. 3-4),

    L_i2t = (1/B) sum_i sum_j p_ij log(p_ij / (q_ij + eps)),

``eps`` a small number (the paper and its code: ``1e-8``) that keeps the non-matching entries
finite; ``L_t2i`` is the same with images and texts swapped (texts projected on normalised
images), and ``L_cmpm = L_i2t + L_t2i`` (Eq. 5). Further positives are positives: they share
``q``'s mass, they are not left out as in the softmax losses.

Readings (the authors' TensorFlow release agrees with the paper on each):

* No temperature: ``p`` is the softmax of the raw projection. ``scale`` multiplies the logits
  (``1``: the paper) for embeddings whose projections are cosines, where an unscaled softmax
  over ``[-1, 1]`` is nearly uniform.
* ``q`` divides by the number of matches (``target_norm="l1"``, Eq. 2 and the release). The
  PyTorch re-implementations common in text-based person search divide by its L2 norm,
  ``q_ij = 1 / sqrt(n_i)`` on the matches (``target_norm="l2"``; equal to ``"l1"`` when each
  anchor has one match).
* ``log(p / (q + eps))`` as written: ``log p`` from a stable log-softmax. (The release also
  adds ``1e-8`` inside the log, a guard a log-softmax does not need.)

``normalize`` says what the anchor is projected as; the candidates are always normalised:

* ``normalize=False`` (the default): the paper's projection, the unnormalised anchor on the
  normalised candidates: ``x_i . ybar_j`` for image anchors, ``y_j . xbar_i`` for text anchors
  (two different matrices; the dense function takes the second as ``sim_t2i``).
* ``normalize=True``: the anchor is normalised too, every score is a cosine, one matrix for both
  directions; use it with a ``scale`` (e.g. ``20``, the inverse of InfoNCE's default
  temperature here) for encoders that already normalise their output.

Both rank a query's candidates as the cosine does (the projection is the cosine times the
anchor's norm), so retrieval is evaluated on cosines either way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from .._checks import (
    POSITIVE,
    Choice,
    check_embeddings,
    check_positive,
    check_reduction,
    check_similarity,
    compute_dtype,
)
from ..similarity import Ids
from ._base import LossCapabilities, PairLoss, prepare, reduce_per_index, reduce_terms
from ._tiling import Embedded, prepare_embeddings, scalar_tensor, shard_directions, tile_rows
from .params import TiledLossParams, normalize_param, param
from .registry import register_loss

TARGET_NORMS = ("l1", "l2")


@dataclass(frozen=True, kw_only=True)
class CMPMParams(TiledLossParams):
    """Parameters of CMPM (defaults: the paper's projection, no scale, eps 1e-8)."""

    scale: float = param(1.0, POSITIVE, "multiplies the scores before the softmax (1: the paper)")
    eps: float = param(1e-8, POSITIVE, "the eps of Eq. 3 that keeps log(q + eps) finite")
    target_norm: str = param("l1", Choice(TARGET_NORMS), "q sums to 1 (l1, Eq. 2) or has norm 1")
    # the paper projects the raw anchor on the normalised candidates
    normalize: bool = normalize_param(False)


#: Lower bound of a norm when projecting on a normalised candidate (``cosine_similarity``'s).
_NORM_EPS = 1e-8


def _check(scale, eps, target_norm, reduction) -> None:
    check_positive(scale, "scale")
    check_positive(eps, "eps")
    if target_norm not in TARGET_NORMS:
        raise ValueError(f"target_norm must be one of {TARGET_NORMS}, got {target_norm!r}")
    check_reduction(reduction)


def kl_rows(
    logits: torch.Tensor, positives: torch.Tensor, eps: float, target_norm: str
) -> torch.Tensor:
    """``sum_j p_ij (log p_ij - log(q_ij + eps))`` per row: ``p = softmax(logits)``, ``q`` the
    row's matches (``positives``, at least the own pair) normalised by their count or its root."""
    log_p = logits.log_softmax(1)
    count = positives.sum(1, dtype=logits.dtype)
    q = count.reciprocal() if target_norm == "l1" else count.rsqrt()
    log_target = torch.where(positives, torch.log(q + eps)[:, None], math.log(eps))
    return (log_p.exp() * (log_p - log_target)).sum(1)


def cmpm_loss(
    sim: torch.Tensor,
    *,
    scale: float | torch.Tensor = 1.0,
    sim_t2i: torch.Tensor | None = None,
    eps: float = 1e-8,
    target_norm: str = "l1",
    pos_mask: torch.Tensor | None = None,
    reduction: str = "mean",
) -> torch.Tensor:
    """CMPM on ``(B, B)`` scores (Eqs. 1-5, both directions).

    Args:
        sim: ``(B, B)`` image-anchor scores, rows images, columns texts, positives on the
            diagonal: the paper's ``x_i . ybar_j``, or cosines.
        scale: Multiplies the scores before the softmax (``1``: the paper), a positive float or
            a scalar tensor, which gets its gradient.
        sim_t2i: Optional ``(B, B)`` text-anchor scores in the same layout (rows images,
            columns texts; text ``j``'s logits are column ``j``): the paper's
            ``y_j . xbar_i`` at ``[i, j]``. Default ``sim`` (a symmetric score: the cosine, a
            pair scorer's output).
        eps: The ``eps`` of Eq. 3, a positive float (paper: ``1e-8``).
        target_norm: ``"l1"``, ``q`` sums to 1 (Eq. 2), or ``"l2"`` (see the module docstring).
        pos_mask: Optional bool ``(B, B)`` further positives (matches: part of ``q``).
        reduction: ``"mean"`` (``L_i2t + L_t2i``: the mean over the ``B`` indices of the two
            directions' sum), ``"sum"`` or ``"none"``.

    Returns:
        The reduced loss, or the ``(B,)`` per-index terms (image ``i``'s KL plus text ``i``'s).

    Raises:
        ValueError: A bad argument, named.
    """
    _check(scale, eps, target_norm, reduction)
    s, negatives = prepare(sim, pos_mask)
    if sim_t2i is None:
        t = s
    else:
        check_similarity(sim_t2i, "sim_t2i")
        if sim_t2i.shape != sim.shape:
            raise ValueError(
                f"sim_t2i must have the shape of sim {tuple(sim.shape)}, got {tuple(sim_t2i.shape)}"
            )
        t = sim_t2i.to(device=s.device, dtype=s.dtype)
    c = scalar_tensor(scale, s, "scale")
    positives = ~negatives
    img_terms = kl_rows(c * s, positives, eps, target_norm)
    txt_terms = kl_rows(c * t.t(), positives.t(), eps, target_norm)
    return reduce_terms(img_terms, txt_terms, reduction)


def tiled_cmpm_loss(
    img_emb: torch.Tensor,
    txt_emb: torch.Tensor,
    *,
    scale: float | torch.Tensor = 1.0,
    eps: float = 1e-8,
    target_norm: str = "l1",
    img_ids: Ids | None = None,
    txt_ids: Ids | None = None,
    chunk_size: int,
    reduction: str = "mean",
    normalize: bool = False,
    shard: tuple[int, int] | None = None,
) -> torch.Tensor:
    """:func:`cmpm_loss` on embeddings in ``O(chunk_size * B)`` memory.

    The embeddings, ``img_ids``/``txt_ids``, ``chunk_size`` (the tile height), ``reduction``
    and ``shard`` work as in every tiled form (``docs/tiled.md``); ``normalize`` as in the
    module docstring (``False``: the paper's projection of the raw anchor on the normalised
    candidates; ``True``: cosines). Each direction is a rectangle of whole rows, the images
    against every normalised text and the texts against every normalised image, streamed by
    ``tile_rows``: a tile holds complete rows, so each row's softmax normaliser and KL term are
    computed inside it and the tile is recomputed in the backward pass. A shard is the same two
    rectangles for its anchors ``start:stop``; their matches are each anchor's own pair and the
    candidates with an equal id.

    Args:
        scale: Multiplies the scores before the softmax, a positive float or a scalar tensor.
        eps: The ``eps`` of Eq. 3.
        target_norm: ``"l1"`` (Eq. 2) or ``"l2"``.

    Returns:
        The value of ``cmpm_loss`` on the projection (or cosine) matrices.

    Raises:
        ValueError: A bad argument, named.
    """
    _check(scale, eps, target_norm, reduction)
    batch = prepare_embeddings(
        img_emb, txt_emb, img_ids, txt_ids, chunk_size=chunk_size, normalize=normalize
    )
    c = scalar_tensor(scale, batch.x, "scale")
    terms = tiled_kl_terms(batch, shard, c, eps, target_norm, project=not normalize)
    return reduce_per_index(terms, reduction, batch.batch)


def tiled_kl_terms(
    batch: Embedded,
    shard: tuple[int, int] | None,
    scale: torch.Tensor,
    eps: float,
    target_norm: str,
    *,
    project: bool,
) -> torch.Tensor:
    """Per index, :func:`kl_rows` of the image anchor plus that of the text anchor, each
    direction a rectangle of whole rows streamed by ``tile_rows`` (``shard``: its anchors only).

    Args:
        batch: The prepared batch.
        shard: ``(start, stop)`` or ``None``.
        scale: Multiplies the scores before the softmax.
        eps: The ``eps`` of the target's log.
        target_norm: ``"l1"`` or ``"l2"``.
        project: Normalise the candidates only (CMPM's projection of raw anchors).
    """
    terms = []
    for d in shard_directions(batch, (0, batch.batch) if shard is None else shard):
        cands = F.normalize(d.cands, dim=1, eps=_NORM_EPS) if project else d.cands
        matches = d.exclusions  # own pair and equal ids: the entries where y_ij = 1

        def rows(scores: torch.Tensor, start: int, matches=matches) -> torch.Tensor:
            positives = matches.mask(start, start + scores.shape[0])
            return kl_rows(scale * scores, positives, eps, target_norm)

        terms.append(tile_rows(rows, d.rows, cands, batch.tile))
    return terms[0] + terms[1]


@register_loss("cmpm")
class CMPMLoss(PairLoss):
    """Module form of :func:`cmpm_loss`; ``chunk_size=N`` selects :func:`tiled_cmpm_loss`.

    ``normalize=False`` (the default, the paper) projects each unnormalised anchor on the
    normalised candidates; ``normalize=True`` uses cosines for both directions (pair with
    ``scale``). ``from_similarity`` uses the one matrix it is given for both directions.
    """

    declared = LossCapabilities(local_shards=True)
    paper = "CMPM (Zhang & Lu 2018)"
    equation = "CMPM Eqs. (1)-(5)"
    Params = CMPMParams
    dense = staticmethod(cmpm_loss)
    tiled = staticmethod(tiled_cmpm_loss)

    def forward(
        self,
        img_emb: torch.Tensor,
        txt_emb: torch.Tensor,
        img_ids: Ids | None = None,
        txt_ids: Ids | None = None,
        *,
        shard: tuple[int, int] | None = None,
        **inputs: Any,
    ) -> torch.Tensor:
        """As :meth:`PairLoss.forward`; the dense projection form builds both directions'
        matrices from one product: ``x_i . ybar_j = (x_i . y_j) / ||y_j||`` and
        ``y_j . xbar_i = (x_i . y_j) / ||x_i||``."""
        if self.normalize or self.chunk_size is not None or shard is not None:
            return super().forward(img_emb, txt_emb, img_ids, txt_ids, shard=shard, **inputs)
        check_embeddings(img_emb, txt_emb)
        dtype = compute_dtype(torch.promote_types(img_emb.dtype, txt_emb.dtype))
        x, y = img_emb.to(dtype), txt_emb.to(dtype)
        dots, pos_mask = self.similarity_and_mask(x, y, img_ids, txt_ids)  # raw: normalize=False
        img_norm = x.norm(dim=1).clamp_min(_NORM_EPS)
        txt_norm = y.norm(dim=1).clamp_min(_NORM_EPS)
        return cmpm_loss(
            dots / txt_norm[None, :],
            sim_t2i=dots / img_norm[:, None],
            pos_mask=pos_mask,
            reduction=self.reduction,
            **self.arguments(),
            **inputs,
        )


__all__ = ["CMPMLoss", "cmpm_loss", "tiled_cmpm_loss"]
