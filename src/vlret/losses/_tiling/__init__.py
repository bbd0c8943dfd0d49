"""The streaming engine: losses over tiles of the similarity matrix, never the whole matrix.

A dense loss builds ``S = X Y^T`` (``B x B``) and lets autograd keep it and its gradient. The
primitives here take the embeddings and stream **tiles** (blocks of rows ``S[I, :] = X[I] Y^T``
of ``tile`` rows), keep ``O(B)`` statistics per row and per column, and recompute the tiles in
the backward pass. Peak extra memory is ``O(tile * B)``.

Each primitive has a **square** mode (the ``(B, B)`` batch, rows and columns at once) and a
**rectangle** mode (rows only: the local **shard** of a data-parallel rank against the gathered
batch, or a block of memory-queue keys). Which entries of a tile are not negatives is an
:class:`Exclusions` object: the id matches and the diagonal (square), the id matches and each
row's own pair (shard), the empty or same-id slots (queue).

Primitives:

* :func:`negatives_lse`: ``log sum_{j negative} exp(x_i . y_j)`` per row (and per column),
  differentiable. InfoNCE, Unified and AdaCL are ``log(1 + exp(lse_i - offset_i))`` on it.
* :func:`hardest_negatives`: the largest negative score of each row (and column) and its index,
  without gradient; a loss differentiates ``(x * y[index]).sum(1)`` (autograd's gather
  backward is the scatter).
* :func:`hinge_sums`: ``sum_j [margin + s_ij - d_i]_+`` over the negatives, differentiable in
  the embeddings and in the offsets ``d``.
* :func:`tile_rows`: any per-row reduction of a tile (SigLIP's pair sum, CMPM's KL), the tile
  recomputed in the backward pass by autograd.

Semantics shared with the dense losses: a line without negatives gives the dtype's most
negative finite value (never ``-inf``), half-precision inputs are computed in float32, ties of
the hardest negative go to the lowest index.

The module imports no loss family; each family file builds its tiled form on these primitives.
"""

from .hinges import hardest_negatives, hinge_sums
from .lse import log1p_exp, negatives_lse, softmax_terms
from .rows import tile_rows
from .tiles import (
    Codes,
    Direction,
    Embedded,
    Exclusions,
    PairExclusions,
    QueueBlock,
    QueueExclusions,
    SquareExclusions,
    check_shard,
    masked_tiles,
    prepare_embeddings,
    scalar_tensor,
    scores_at,
    shard_directions,
    tiles,
)

__all__ = [
    "Codes",
    "Direction",
    "Embedded",
    "Exclusions",
    "PairExclusions",
    "QueueBlock",
    "QueueExclusions",
    "SquareExclusions",
    "check_shard",
    "hardest_negatives",
    "hinge_sums",
    "log1p_exp",
    "masked_tiles",
    "negatives_lse",
    "prepare_embeddings",
    "scalar_tensor",
    "scores_at",
    "shard_directions",
    "softmax_terms",
    "tile_rows",
    "tiles",
]
