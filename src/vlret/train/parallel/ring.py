r"""Neighbour (ring) exchange for a loss that is a sum over independent pairs (SigLIP).

``train.exchange`` chooses how the ranks of a torchrun job see each other's pairs:

* ``"gather"`` (default): all-gather the embeddings (:mod:`.distributed`): every rank holds the
  ``N*B`` texts, and either computes the whole loss or, with local shards, its own rows.
* ``"ring"``: no all-gather. Rank ``r`` keeps its ``B`` images, computes their terms against its
  own ``B`` texts, then passes the text block it holds (embeddings and ids) to rank
  ``r + 1`` and receives one from rank ``r - 1``, ``N - 1`` times, adding the terms of its images
  against each block that arrives (open_clip's ``SigLipLoss(dist_impl="shift")``).
* ``"bidir"``: the same with both directions at once (``dist_impl="bidir"``): each round sends
  one block left and one right, ``ceil((N - 1) / 2)`` rounds of exchanges, the last one
  rightwards only when ``N - 1`` is odd.

Only a loss that declares ``LossCapabilities.pairwise_sum`` can be split this way: its value is
the sum over pairs of a term of one score, so the terms of rank ``r``'s images against every text
block add up to rank ``r``'s rows of the loss, and the ranks' rows add up to the loss of the
``N*B`` batch (``"mean"`` divides by ``N*B``). Positives are each image's own text (in its own
block) and, across blocks, the texts with an equal id (the exchanged ids); without ids a pair's
id is its index in the global batch.

**Gradients.** Each exchange is an autograd function (point-to-point ``batch_isend_irecv``);
its backward sends the gradient of the received block back the way it came, so the gradient
that rank ``q``'s images send to rank ``r``'s texts arrives at rank ``r`` before its text encoder
runs backward. As with local shards, the trainer scales the loss by ``N`` against
DistributedDataParallel's average, all-reduces the gradient of the loss's own parameters (SigLIP's
log-scale and bias: each rank holds its rows' share) before dividing it by ``N``, and logs the
all-reduced loss: the step equals one process on the concatenated batch (tested with 2 and 3
gloo processes, float64).

**Memory.** Per rank and exchange: one received ``B x D`` block (kept for the backward pass,
``N * B * D`` over the ring, as the gather) and the scores of the images against one block,
``B x B``, or ``chunk_size x B`` with the loss's tiled form (the tile recomputed in the
backward pass). The gather with local shards holds ``chunk_size x N*B`` scores instead, and
the plain gather the whole ``N*B x N*B`` matrix on every rank. The exchanges are sequential
(``N - 1`` latencies; ``"bidir"`` halves them and uses both directions of each link).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, cast

import torch
import torch.distributed as dist

from ...losses import PairLoss, loss_capabilities
from ...run.train_checks import EXCHANGE_KEY, EXCHANGES, check_exchange
from .distributed import collective, rank, world_size


class PairBlockLoss(Protocol):
    """A loss with ``LossCapabilities.pairwise_sum`` (:meth:`SigLIPLoss.pair_block_terms
    <vlret.losses.siglip.SigLIPLoss.pair_block_terms>`)."""

    reduction: str

    def pair_block_terms(
        self,
        img_emb: torch.Tensor,
        txt_emb: torch.Tensor,
        positives: Callable[[int, int], torch.Tensor],
    ) -> torch.Tensor: ...


def _p2p(
    sends: list[tuple[torch.Tensor, int]], recvs: list[tuple[torch.Tensor, int]], what: str
) -> None:
    """Post every send and receive of one exchange at once and wait for them."""
    ops = [dist.P2POp(dist.isend, t.contiguous(), peer) for t, peer in sends]
    ops += [dist.P2POp(dist.irecv, t, peer) for t, peer in recvs]
    with collective(what):
        for request in dist.batch_isend_irecv(ops):
            request.wait()


class _Shift(torch.autograd.Function):
    """Send ``(emb, ids)`` to rank ``to``, receive a block from rank ``frm``; the backward sends
    the received block's gradient to ``frm`` and receives ours from ``to``."""

    @staticmethod
    def forward(ctx, emb, ids, to, frm):
        got, got_ids = torch.empty_like(emb), torch.empty_like(ids)
        _p2p([(emb, to), (ids, to)], [(got, frm), (got_ids, frm)], "ring exchange")
        ctx.to, ctx.frm = to, frm
        ctx.mark_non_differentiable(got_ids)
        return got, got_ids

    @staticmethod
    def backward(ctx, grad, _grad_ids):
        back = torch.empty_like(grad)
        _p2p([(grad, ctx.frm)], [(back, ctx.to)], "ring exchange (backward)")
        return back, None, None, None


class _Bidir(torch.autograd.Function):
    """Send one block to rank ``left`` and one to rank ``right``, receive one from each; the
    backward returns each received block's gradient to its sender."""

    @staticmethod
    def forward(ctx, to_left, to_right, ids_left, ids_right, left, right):
        from_left, from_right = torch.empty_like(to_right), torch.empty_like(to_left)
        ids_from_left, ids_from_right = torch.empty_like(ids_right), torch.empty_like(ids_left)
        sends = [(to_left, left), (ids_left, left), (to_right, right), (ids_right, right)]
        recvs = [(from_right, right), (ids_from_right, right)]
        recvs += [(from_left, left), (ids_from_left, left)]
        _p2p(sends, recvs, "bidirectional ring exchange")
        ctx.left, ctx.right = left, right
        ctx.mark_non_differentiable(ids_from_left, ids_from_right)
        return from_left, from_right, ids_from_left, ids_from_right

    @staticmethod
    def backward(ctx, g_from_left, g_from_right, _gl, _gr):
        g_to_left, g_to_right = torch.empty_like(g_from_right), torch.empty_like(g_from_left)
        _p2p(
            [(g_from_left, ctx.left), (g_from_right, ctx.right)],
            [(g_to_left, ctx.left), (g_to_right, ctx.right)],
            "bidirectional ring exchange (backward)",
        )
        return g_to_left, g_to_right, None, None, None, None


def _ids(ids: Any, batch: int, me: int, device: torch.device) -> torch.Tensor:
    """The local ids as an integer tensor; without ids, each pair's index in the global batch."""
    if ids is None:
        return torch.arange(me * batch, (me + 1) * batch, device=device)
    codes = torch.as_tensor(ids, device=device) if not isinstance(ids, torch.Tensor) else ids
    if codes.dtype.is_floating_point or codes.dtype == torch.bool or codes.shape != (batch,):
        raise ValueError(
            f"ids: the ring exchange needs one integer id per pair ({batch}), got "
            f"{codes.dtype} of shape {tuple(codes.shape)}"
        )
    return codes.to(device=device, dtype=torch.long)


def ring_terms(
    loss: PairLoss,
    img_emb: torch.Tensor,
    txt_emb: torch.Tensor,
    ids: Any = None,
    *,
    bidir: bool = False,
) -> torch.Tensor:
    """The ``(B,)`` terms of this rank's images against every rank's texts, by neighbour
    exchange (see the module doc); every rank must call it with the same ``B``.

    Args:
        loss: A loss declaring ``LossCapabilities.pairwise_sum`` (SigLIP).
        img_emb: ``(B, D)`` this rank's image embeddings.
        txt_emb: ``(B, D)`` this rank's text embeddings; text ``i`` is image ``i``'s pair.
        ids: Optional ``(B,)`` integer ids of this rank's pairs; equal ids (on any rank) mark
            further positives. ``None``: only each pair's own.
        bidir: Exchange in both directions at once (``"bidir"``) instead of rightwards only.

    Returns:
        ``(B,)``: row ``i``'s sum of terms over the ``N*B`` texts, differentiable in the
        embeddings of every rank (through the exchanges) and in the loss's parameters. In a
        single process: the terms against the local texts.

    Raises:
        ValueError: The loss does not declare ``pairwise_sum``, or bad ``ids``.
    """
    if not loss_capabilities(loss).pairwise_sum:
        raise ValueError(
            f"{type(loss).__name__} is not a sum over independent pairs "
            "(LossCapabilities.pairwise_sum); the ring exchange cannot split it"
        )
    block = cast("PairBlockLoss", loss)
    world, me, batch = world_size(), rank(), img_emb.shape[0]
    own = _ids(ids, batch, me, img_emb.device)

    def matches(codes: torch.Tensor, diagonal: bool) -> Callable[[int, int], torch.Tensor]:
        def positives(start: int, stop: int) -> torch.Tensor:
            mask = own[start:stop, None] == codes[None, :]
            if diagonal:  # the own pair is a positive whatever the ids say (PairLoss rules)
                mask.diagonal(start).fill_(True)
            return mask

        return positives

    terms = block.pair_block_terms(img_emb, txt_emb, matches(own, True))
    left, right = (me - 1) % world, (me + 1) % world
    to_left = to_right = txt_emb
    ids_left = ids_right = own
    rounds, rest = divmod(world - 1, 2) if bidir else (0, world - 1)
    for _ in range(rounds):
        from_left, from_right, ids_from_left, ids_from_right = _Bidir.apply(
            to_left, to_right, ids_left, ids_right, left, right
        )
        terms = terms + block.pair_block_terms(img_emb, from_left, matches(ids_from_left, False))
        terms = terms + block.pair_block_terms(img_emb, from_right, matches(ids_from_right, False))
        to_left, to_right = from_right, from_left
        ids_left, ids_right = ids_from_right, ids_from_left
    for _ in range(rest):  # rightwards: what came from the left goes on to the right
        to_right, ids_right = _Shift.apply(to_right, ids_right, right, left)
        terms = terms + block.pair_block_terms(img_emb, to_right, matches(ids_right, False))
    return terms


def ring_loss(
    loss: PairLoss,
    img_emb: torch.Tensor,
    txt_emb: torch.Tensor,
    ids: Any = None,
    *,
    bidir: bool = False,
) -> torch.Tensor:
    """This rank's share of ``loss`` on the global batch by neighbour exchange
    (:func:`ring_terms`), reduced with the loss's ``reduction``: ``"mean"`` divides by the
    global batch ``N*B`` and ``"sum"`` sums, so the ranks' values add up to the loss of the
    concatenated batch; ``"none"`` gives the ``(B,)`` terms of this rank's rows.

    Raises:
        ValueError: As :func:`ring_terms`.
    """
    terms = ring_terms(loss, img_emb, txt_emb, ids, bidir=bidir)
    reduction = loss.reduction
    if reduction == "none":
        return terms
    total = terms.sum()
    return total if reduction == "sum" else total / (terms.numel() * world_size())


def exchange_mode(exchange: str, world: int) -> str:
    """The exchange a run uses: ``"gather"`` in a single process (nothing to exchange; the
    trainer then runs today's path), else ``exchange``."""
    return exchange if world > 1 else "gather"


__all__ = [
    "EXCHANGES",
    "EXCHANGE_KEY",
    "PairBlockLoss",
    "check_exchange",
    "exchange_mode",
    "ring_loss",
    "ring_terms",
]
