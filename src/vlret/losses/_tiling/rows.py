"""Per-row reductions of any function of a tile, recomputed in the backward pass.

:func:`negatives_lse`, :func:`hardest_negatives` and :func:`hinge_sums` have hand-written
backward passes for the three statistics most losses need. A loss whose per-row term is some
other function of the whole row of scores (SigLIP's sum of log-sigmoids over every pair,
CMPM's KL divergence between two distributions over the row) uses :func:`tile_rows`: each tile
``x[I] @ y.T`` is computed, reduced to one value per row by the loss's function and dropped;
the backward pass recomputes it (``torch.utils.checkpoint``, non-reentrant), so peak extra
memory stays ``O(tile * C)`` and the gradient is autograd's own, exact.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.checkpoint import checkpoint

from .tiles import tiles

#: ``fn(scores, start, *row_args)`` -> ``(stop - start,)``: one value per row of the tile
#: ``scores = x[start:stop] @ y.T``; ``row_args`` arrive sliced to the tile's rows.
RowFunction = Callable[..., torch.Tensor]


def _tile(fn: RowFunction, start: int, x: torch.Tensor, y: torch.Tensor, *row_args):
    return fn(x @ y.t(), start, *row_args)


def tile_rows(
    fn: RowFunction,
    x: torch.Tensor,
    y: torch.Tensor,
    tile: int,
    *row_args: torch.Tensor,
) -> torch.Tensor:
    """``out[i] = fn(x @ y.T, ...)[i]`` for every row, one ``tile``-row block at a time.

    Args:
        fn: ``fn(scores, start, *row_args)``: the ``(t, C)`` scores of rows ``start:start + t``
            and each of ``row_args`` sliced to those rows, to ``(t,)`` values. It may close
            over tensors that require grad (a learnable temperature): they get their gradient.
            It must be deterministic (the backward pass calls it again).
        x: ``(n, D)`` rows.
        y: ``(C, D)`` candidates.
        tile: Tile height.
        *row_args: ``(n, ...)`` per-row tensors (statistics from an earlier pass, offsets).

    Returns:
        ``(n,)``, differentiable in ``x``, ``y``, ``row_args`` and whatever ``fn`` closes over.
    """
    track = torch.is_grad_enabled()
    parts = []
    for start, stop in tiles(x.shape[0], tile):
        sliced = [a[start:stop] for a in row_args]
        if track:
            part = checkpoint(
                _tile,
                fn,
                start,
                x[start:stop],
                y,
                *sliced,
                use_reentrant=False,
                preserve_rng_state=False,  # fn is deterministic
            )
        else:
            part = _tile(fn, start, x[start:stop], y, *sliced)
        parts.append(part)
    return torch.cat(parts) if len(parts) > 1 else parts[0]
