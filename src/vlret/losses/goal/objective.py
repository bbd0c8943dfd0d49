"""GOAL's objective: the dense autograd function, the tiled form and the module (Eq. 3-13).

The weights, their formulas and where this package follows the paper or the released code
are in :mod:`vlret.losses.goal.weights`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd.function import once_differentiable

from ...similarity import Ids
from .._base import LossCapabilities, PairLoss, prepare, reduce_per_index
from .._tiling import (
    Embedded,
    hardest_negatives,
    prepare_embeddings,
    scores_at,
    shard_directions,
)
from ..registry import register_loss
from ..triplet import TripletLoss
from .weights import GoalParams, _goal_triplets, triplet_weights_from_hardest


def _config_of(arguments: dict[str, Any]) -> GoalParams:
    """The validated :class:`GoalParams` of a function's keyword arguments (its ``locals()``):
    the declared hyper-parameters and the reduction."""
    names = [*GoalParams().arguments(), "reduction"]
    return GoalParams(**{name: arguments[name] for name in names})


def _set_n(cfg: GoalParams, bound: torch.Tensor, rows: int, cols: int, like: torch.Tensor):
    """Streaming statistics of the MS set N (negatives above ``bound``, Eq. 12-13).

    Returns a tile visitor for :func:`~vlret.losses._tiling.hardest_negatives` and the
    ``(count, stat)`` it fills: per row (and per column when ``cols``) the size of N and
    either the log-sum-exp of ``beta s`` over N (sig-ms) or the plain sum of ``s`` (lin-ms).
    """
    sig, lowest = cfg.pair_weight == "sig-ms", torch.finfo(like.dtype).min
    count = torch.zeros(2, max(rows, cols), dtype=torch.long, device=like.device)
    stat = like.new_full((2, max(rows, cols)), lowest if sig else 0.0)

    def visit(start: int, stop: int, t: torch.Tensor) -> None:
        keep = t > bound
        count[0, start:stop] = keep.sum(1)
        z = torch.where(keep, t * cfg.beta, lowest) if sig else t * keep
        stat[0, start:stop] = z.logsumexp(1) if sig else z.sum(1)
        if cols:
            count[1, :cols] += keep.sum(0)
            col = z.logsumexp(0) if sig else z.sum(0)
            stat[1, :cols] = torch.logaddexp(stat[1, :cols], col) if sig else stat[1, :cols] + col

    return visit, count, stat


def _ms_negative(
    cfg: GoalParams, stat: torch.Tensor, count: torch.Tensor, neg: torch.Tensor
) -> torch.Tensor:
    """The MS relative negative term from set N's statistics (:func:`_set_n`); 0 for empty N."""
    size = count.clamp(min=1).to(neg.dtype)
    if cfg.pair_weight == "sig-ms":
        # log mean_N e^{beta (s - s_n)}; the sum is >= 1 as s_n is in N (log >= 0).
        value = (stat - cfg.beta * neg).clamp(min=0) - size.log()
    else:
        value = neg - stat / size
    return torch.where(count > 0, value, 0.0)


def _weights(cfg, pos, top, count, stat, batch_pos=None):
    """``(T P+, T P-, hinge)`` from streamed hardest negatives ``top`` and set-N statistics."""
    has_neg = top > torch.finfo(top.dtype).min
    neg = torch.where(has_neg, top, pos)  # a harmless stand-in; zero weights below
    ms = cfg.pair_weight in ("lin-ms", "sig-ms")
    ms_neg = _ms_negative(cfg, stat, count, neg) if ms else 0.0
    return triplet_weights_from_hardest(cfg, pos, neg, has_neg, ms_neg, batch_pos)


def _goal_terms(batch: Embedded, cfg: GoalParams, shard) -> torch.Tensor:
    """GOAL per index on a tiled batch: the hinge as value, the prescribed gradient through the
    surrogate ``sum w_neg s_neg - w_pos s_pos`` with detached weights."""
    x, y, tile = batch.x, batch.y, batch.tile
    diag = (x * y).sum(1)
    batch_pos = diag.detach()
    bound = batch_pos.min() - cfg.epsilon
    if shard is None:
        visit, count, stat = _set_n(cfg, bound, batch.batch, batch.batch, x)
        exclusions = batch.exclusions
        row_top, row_arg, col_top, col_arg = hardest_negatives(
            x, y, exclusions, tile, columns=True, visit=visit
        )
        with torch.no_grad():
            w_pos, w_neg, hinge = _weights(
                cfg, batch_pos, torch.stack((row_top, col_top)), count, stat
            )
        surrogate = (
            w_neg[0] * scores_at(x, y, row_arg)
            + w_neg[1] * scores_at(y, x, col_arg)
            - (w_pos[0] + w_pos[1]) * diag
        )
        return hinge[0] + hinge[1] + (surrogate - surrogate.detach())
    terms = []
    for d in shard_directions(batch, shard):
        n = d.rows.shape[0]
        visit, count, stat = _set_n(cfg, bound, n, 0, x)
        top, arg = hardest_negatives(
            d.rows, d.cands, d.exclusions, tile, columns=False, visit=visit
        )
        pos = d.positives
        with torch.no_grad():
            w_pos, w_neg, hinge = _weights(cfg, pos.detach(), top, count[0], stat[0], batch_pos)
        surrogate = w_neg * scores_at(d.rows, d.cands, arg) - w_pos * pos
        terms.append(hinge + (surrogate - surrogate.detach()))
    return terms[0] + terms[1]


def tiled_goal_objective(
    img_emb: torch.Tensor,
    txt_emb: torch.Tensor,
    *,
    triplet_weight: str = GoalParams.triplet_weight,
    pair_weight: str = GoalParams.pair_weight,
    margin: float = GoalParams.margin,
    tau: float = GoalParams.tau,
    alpha: float = GoalParams.alpha,
    beta: float = GoalParams.beta,
    lam: float = GoalParams.lam,
    epsilon: float = GoalParams.epsilon,
    circle_offset: float = GoalParams.circle_offset,
    img_ids: Ids | None = None,
    txt_ids: Ids | None = None,
    chunk_size: int,
    reduction: str = GoalParams.reduction,
    normalize: bool = GoalParams.normalize,
    shard: tuple[int, int] | None = None,
) -> torch.Tensor:
    """:func:`goal_objective` on embeddings, tiled, all 15 combinations.

    The value is the hardest-negative hinge (a monitoring value) and the gradient the
    prescribed one, through ``value.detach() + (surrogate - surrogate.detach())``.

    The embeddings, ``img_ids``/``txt_ids``, ``chunk_size`` (the tile height), ``reduction``,
    ``normalize`` and ``shard`` work as in every tiled form (``docs/tiled.md``). The
    hyper-parameters, their defaults and their one-line meanings are :class:`GoalParams`'
    declaration, read by both forms.

    Returns:
        The dense form's value; its gradient equals the dense prescribed gradient. Ties of the
        hardest negative go to the lowest index, as ``torch.max`` does in the dense form.

    Raises:
        ValueError: A bad argument, named.
    """
    cfg = _config_of(locals())
    batch = prepare_embeddings(
        img_emb, txt_emb, img_ids, txt_ids, chunk_size=chunk_size, normalize=normalize
    )
    return reduce_per_index(_goal_terms(batch, cfg, shard), cfg.reduction, batch.batch)


class GoalFunction(torch.autograd.Function):
    """The GOAL objective as an autograd function of the similarity matrix.

    ``GoalFunction.apply(sim, negatives, config)``: ``sim`` ``(B, B)`` floating point,
    ``negatives`` the bool mask of negatives, ``config`` a :class:`GoalParams`.

    Forward returns the monitoring value, the hardest-negative triplet loss
    ``[margin + s_n - p]_+`` per anchor and direction, reduced like every vlret loss (for
    ``(con, con)`` the objective is this loss's gradient wherever the loss is differentiable,
    see :func:`goal_objective`). Backward returns
    ``grad_output * dL/dS`` with ``dL/dS[i, n(i)] += T P-`` and ``dL/dS[i, i] -= T P+`` for each
    direction. Only ``O(B)`` numbers are kept between forward and backward.
    """

    @staticmethod
    def forward(ctx, sim: torch.Tensor, negatives: torch.Tensor, config: GoalParams):
        with torch.no_grad():
            hardest, weight_pos, weight_neg, hinge = _goal_triplets(sim, negatives, config)
            batch = sim.shape[0]
            idx = torch.arange(batch, device=sim.device)
            # Flat positions in S: (i, n_row(i)), (n_col(i), i), (i, i).
            flat = torch.cat(
                (idx * batch + hardest[0], hardest[1] * batch + idx, idx * (batch + 1))
            )
            values = torch.cat((weight_neg[0], weight_neg[1], -(weight_pos[0] + weight_pos[1])))
            per_index = hinge[0] + hinge[1]
        ctx.save_for_backward(flat, values)
        ctx.batch = batch
        ctx.reduction = config.reduction
        ctx.sim_dtype = sim.dtype
        if config.reduction == "none":
            return per_index
        if config.reduction == "sum":
            return per_index.sum()
        return per_index.mean()

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output: torch.Tensor):
        flat, values = ctx.saved_tensors
        batch = ctx.batch
        g = grad_output.to(values.dtype)
        if ctx.reduction == "none":
            scaled = values * g.repeat(3)
        elif ctx.reduction == "sum":
            scaled = values * g
        else:
            scaled = values * (g / batch)
        grad = torch.zeros(batch * batch, dtype=values.dtype, device=values.device)
        grad.index_add_(0, flat, scaled)
        return grad.view(batch, batch).to(ctx.sim_dtype), None, None


def goal_objective(
    sim: torch.Tensor,
    *,
    triplet_weight: str = GoalParams.triplet_weight,
    pair_weight: str = GoalParams.pair_weight,
    margin: float = GoalParams.margin,
    tau: float = GoalParams.tau,
    alpha: float = GoalParams.alpha,
    beta: float = GoalParams.beta,
    lam: float = GoalParams.lam,
    epsilon: float = GoalParams.epsilon,
    circle_offset: float = GoalParams.circle_offset,
    pos_mask: torch.Tensor | None = None,
    reduction: str = GoalParams.reduction,
) -> torch.Tensor:
    r"""GOAL gradient objective on a ``(B, B)`` similarity matrix (Xuan & Chen, Eq. 3-13).

    Returns the hardest-negative triplet loss with ``margin`` (a monitoring value); its
    backward is the GOAL gradient: for each anchor and direction, with ``p`` the positive and
    ``s_n`` the hardest negative (never a ``pos_mask`` entry),

    .. math:: \frac{\partial L}{\partial s_n} = T(p, s_n)\,P_-, \qquad
              \frac{\partial L}{\partial p} = -T(p, s_n)\,P_+

    times the incoming gradient. ``triplet_weight`` in ``TRIPLET_WEIGHTS`` (Eq. 5, 7, 8; see
    :func:`goal_triplet_weight`), ``pair_weight`` in ``PAIR_WEIGHTS`` (Eq. 9-13; see
    :func:`goal_pair_weights`); ``alpha, beta, lam`` are the sigmoid pair-weight parameters (Eq. 11,
    12), ``epsilon`` the MS selection slack (Eq. 12, 13), ``circle_offset`` the constant of the
    circle triplet weight. The defaults are :class:`GoalParams`' (the one declaration): the
    paper's best combination ``(cir, sig-ms)`` and ``tau`` (Fig. 2), the released code's
    ``circle_offset`` and pair-weight settings; :mod:`vlret.losses.goal.weights` gives the
    reasons and the alternatives.

    ``(con, con)`` equals the gradient of ``triplet_loss(hardest=True)`` almost everywhere:
    wherever every anchor's hardest negative is unique and no hinge ``margin + s_n - p`` is
    exactly 0, i.e. wherever that loss is differentiable. Elsewhere both are valid
    subgradients but differ: on a tie this objective puts the whole weight on the one negative
    ``torch.max`` returns while autograd through ``amax`` splits it evenly over the tied ones,
    and at a zero hinge ``T^con`` (a strict Heaviside) is 0 while autograd passes a fraction.
    ``(nca, con)`` is ``1/tau`` times the gradient of :func:`nca_hard_loss` (Eq. 6).
    ``reduction="mean"`` divides the gradient by ``B``; ``"none"`` returns the ``(B,)``
    per-index values and accepts a ``(B,)`` incoming gradient.
    """
    cfg = _config_of(locals())
    s, negatives = prepare(sim, pos_mask)
    return GoalFunction.apply(s, negatives, cfg)


@register_loss("goal")
class GoalObjective(PairLoss):
    """Module form of :func:`goal_objective` (GOAL, Xuan & Chen, Eq. 3-13).

    ``chunk_size=N`` makes the embedding entry point use
    :func:`tiled_goal_objective`, which never holds the ``B x B`` matrix.
    """

    declared = LossCapabilities(local_shards=True, all_negatives_warmup=True, paper_comparison=3)
    paper = "GOAL (Xuan & Chen 2022)"
    equation = "GOAL Eq. (3)-(13), Table 1"
    Params = GoalParams
    dense = staticmethod(goal_objective)
    tiled = staticmethod(tiled_goal_objective)
    config: GoalParams

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        c = self.config
        #: VSE-infinity's warm-up loss (:meth:`set_all_negatives`): the triplet sum of hinges
        #: over all negatives with this objective's margin and reduction; it holds no state.
        self.warmup = TripletLoss(
            margin=c.margin,
            hardest=False,
            reduction=c.reduction,
            normalize=c.normalize,
            chunk_size=c.chunk_size,
        )
        self.all_negatives = False

    def set_all_negatives(self, all_negatives: bool) -> None:
        """GOAL's objectives are defined on the hardest-negative triplet only (Eq. 3-13); in the
        warm-up the module trains on the triplet sum of hinges (``self.warmup``) instead, as
        VSE-infinity's code does in the epochs GOAL's gradient objective replaces."""
        self.all_negatives = bool(all_negatives)

    def forward(self, img_emb, txt_emb, img_ids=None, txt_ids=None, *, shard=None, **inputs):
        if self.all_negatives:
            return self.warmup(img_emb, txt_emb, img_ids, txt_ids, shard=shard)
        return super().forward(img_emb, txt_emb, img_ids, txt_ids, shard=shard, **inputs)

    def from_similarity(self, sim, pos_mask=None, **inputs):
        if self.all_negatives:
            return self.warmup.from_similarity(sim, pos_mask=pos_mask)
        return super().from_similarity(sim, pos_mask=pos_mask, **inputs)


__all__ = ["GoalFunction", "GoalObjective", "goal_objective", "tiled_goal_objective"]
