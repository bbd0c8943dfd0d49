"""GOAL's weights: triplet weights x pair weights (Xuan & Chen, Eq. 3-13), and its config.

Instead of a loss, GOAL prescribes the gradient on the similarity matrix. Each anchor forms
one triplet per direction with its positive ``p = S[i, i]`` and its hardest negative
``s_n`` (the most similar non-positive in its row for an image anchor, in its column for a
text anchor). The objective's gradient on that triplet is

* ``dL/ds_n = T * P-`` (push the negative away), ``dL/dp = -T * P+`` (pull the positive in),

with a triplet weight ``T`` (Eq. 5, 7, 8) and a pair weight ``P`` (Eq. 9-13). All 15
combinations are available; Table 1 of the paper maps five of them to known losses (see
``docs/goal.md`` for which of them are the gradient of that loss).

Where the paper and the authors' released gradient file disagree, this module follows:

* ``tau = 10``: the only value the paper states (Fig. 2, for ``T^nca`` and ``T^cir``). The code's
  default ``tau = 1`` makes both weights almost constant (``T^nca`` spans only
  ``sigmoid(+-2)`` over the whole cosine square).
* ``circle_offset = 0.5``: the released code's ``T^cir = 1 / (1 + exp(tau (p (2 - p) - s_n^2
  - 0.5)))``. Eq. (8) as printed is ``circle_offset = 0``. With 0.5 the ``T = 1/2`` contour,
  the circle ``(1 - p)^2 + s_n^2 = 1/2``, touches ``T^nca``'s line ``p = s_n`` at (0.5, 0.5), so
  ``T^cir`` agrees with ``T^nca`` on ordinary triplets and departs in the corners as the paper
  describes; with 0 and ``tau = 10``, ``T^cir < 0.01`` for every triplet with ``p >= 0.5 >=
  s_n``. Circle loss with relaxation margin ``m`` has offset ``1 - 2 m^2`` (0.5 is ``m = 0.5``);
  ``circle_offset = 1`` (``m = 0``) with ``tau = gamma`` makes ``(cir, lin)`` exactly
  ``1/gamma`` times the gradient of Circle loss on the hardest negative (when ``s_n >= 0``).
* ``T^con`` is the Heaviside of ``margin + s_n - p`` as in Eq. (5) (the code had no margin check),
  taken strictly (0 at a hinge of exactly 0).
* The gradient is multiplied by the incoming gradient (the released backward ignored it), so
  loss weights, warm-up factors and AMP loss scaling work.
* ``pos_mask`` entries are never negatives (the code only excluded the diagonal).
* The MS relative similarities (Eq. 12-13) of anchor ``i`` use the batch's positive-pair
  scores ``S[k, k]`` (an image-text batch has one positive per anchor, so the other positives
  are the other pairs; the released code did the same), kept when ``S[k, k] < s_n + epsilon``
  (set P), and the anchor's negatives ``S[i, j]``, kept when ``S[i, j] > min(p, R) -
  epsilon`` with ``R = min_k S[k, k]`` (set N). This is Eq. (12)'s ``min{S_xy, R_xy^i} -
  epsilon`` taken over the relative positives ``R_xy^i``, the candidates of P rather than the
  selected set (symmetrically, P's bound ``max{S_xy', R'_xy^j} + epsilon`` ranges over all the
  anchor's negatives and so is ``s_n + epsilon``; taking the selected sets would make each
  bound depend on the other set). ``p`` is itself on the diagonal, so N's bound is
  ``min_k S[k, k] - epsilon`` for every anchor. As in the MS loss's own sums, the selected pair
  belongs to its set when it passes the test and then contributes the neutral term (``e^0 =
  1`` for sig-ms, ``0`` for lin-ms), so ``P- <= |N|`` and ``P+ <= |P|`` stay bounded. An empty
  set gives the neutral value (``m = 1`` for sig-ms, ``m = 0`` for lin-ms), i.e. the plain sig
  / lin weight.
* Under hardest-negative mining every member of N is at most ``s_n``, so the printed
  ``m-^sig = mean_N exp(-beta (s_n - R))`` is at most 1 and ``P-^sig-ms >= P-^sig`` always.
  The paper's prose says the case ``m-^sig < 1`` "will not exist under hard negative mining";
  with its formula ``m-^sig <= 1`` always (``= 1`` only when every member of N equals
  ``s_n``), so sig-ms only ever raises the hardest negative's weight over sig. This module
  follows the formula.
* The linear pair weights are clamped at 0, as Circle loss's ``alpha_n = [s_n]_+`` and
  ``alpha_p = [1 - p]_+``: with a hardest negative below 0, Eq. (10) as printed would pull it
  towards the anchor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from ..._checks import MARGIN, NON_NEGATIVE, POSITIVE, REAL, Choice, ParamError
from ..params import TiledLossParams, param, reduction_param

#: Triplet weights: constant (Eq. 5), NCA (Eq. 7), circle (Eq. 8).
TRIPLET_WEIGHTS: tuple[str, ...] = ("con", "nca", "cir")
#: Pair weights: constant (Eq. 9), linear (Eq. 10), sigmoid (Eq. 11), linear-MS (Eq. 13),
#: sigmoid-MS (Eq. 12).
PAIR_WEIGHTS: tuple[str, ...] = ("con", "lin", "sig", "lin-ms", "sig-ms")


def _check_kind(triplet_weight: str, pair_weight: str) -> None:
    """Raise :class:`ParamError` naming the unknown weight, listing the 15 combinations."""
    for name, value, kinds in (
        ("triplet_weight", triplet_weight, TRIPLET_WEIGHTS),
        ("pair_weight", pair_weight, PAIR_WEIGHTS),
    ):
        if value not in kinds:
            combos = ", ".join(f"({t}, {p})" for t in TRIPLET_WEIGHTS for p in PAIR_WEIGHTS)
            raise ParamError(
                name,
                f"{name} must be one of {kinds}, got {value!r} (unknown GOAL combination "
                f"triplet_weight={triplet_weight!r}, pair_weight={pair_weight!r}); valid "
                f"combinations: {combos}",
            )


@dataclass(frozen=True, kw_only=True)
class GoalParams(TiledLossParams):
    """Parameters of a GOAL objective, the one declaration read by :func:`goal_objective`,
    :func:`tiled_goal_objective`, :class:`GoalObjective` and the weight functions' defaults
    (defaults: the paper's best combination and ``tau``, the released code's ``circle_offset``
    and pair-weight settings)."""

    triplet_weight: str = param("cir", Choice(TRIPLET_WEIGHTS), "T: con, nca or cir (Eq. 5, 7, 8)")
    pair_weight: str = param(
        "sig-ms", Choice(PAIR_WEIGHTS), "P: con, lin, sig, lin-ms or sig-ms (Eq. 9-13)"
    )
    margin: float = param(0.2, MARGIN, "the margin of T^con (Eq. 5) and of the hinge value")
    tau: float = param(10.0, POSITIVE, "the sharpness of T^nca and T^cir (Fig. 2)")
    alpha: float = param(2.0, POSITIVE, "the slope of the positive sigmoid weights (Eq. 11-12)")
    beta: float = param(10.0, POSITIVE, "the slope of the negative sigmoid weights, MS sums")
    lam: float = param(0.5, REAL, "the centre lambda of the sigmoid pair weights")
    epsilon: float = param(0.1, NON_NEGATIVE, "the MS sets' margin (Eq. 12-13)")
    circle_offset: float = param(0.5, REAL, "the offset 1 - 2 m^2 of T^cir (module notes)")
    reduction: str = reduction_param("sum")

    def __post_init__(self) -> None:
        _check_kind(self.triplet_weight, self.pair_weight)  # lists the valid combinations
        super().__post_init__()


def goal_triplet_weight(
    kind: str,
    pos: torch.Tensor,
    neg: torch.Tensor,
    *,
    margin: float = GoalParams.margin,
    tau: float = GoalParams.tau,
    circle_offset: float = GoalParams.circle_offset,
) -> torch.Tensor:
    r"""Triplet weight ``T`` of positive similarity ``pos`` and negative similarity ``neg``.

    * ``"con"``, Eq. (5): :math:`\delta(m + s_n - p)` (1 where the margin is violated, else 0).
    * ``"nca"``, Eq. (7): :math:`1 / (1 + e^{\tau (p - s_n)})`.
    * ``"cir"``, Eq. (8) plus the released code's offset:
      :math:`1 / (1 + e^{\tau (p (2 - p) - s_n^2 - c)})`, ``c = circle_offset``.

    Elementwise; ``pos`` and ``neg`` broadcast.
    """
    if kind == "con":
        return (margin + neg - pos > 0).to(torch.result_type(pos, neg))
    if kind == "nca":
        return torch.sigmoid(tau * (neg - pos))
    if kind == "cir":
        return torch.sigmoid(tau * (neg * neg + circle_offset - pos * (2 - pos)))
    _check_kind(kind, "con")
    raise AssertionError  # pragma: no cover


def _pair_weight_log_ms(
    kind: str,
    pos: torch.Tensor,
    neg: torch.Tensor,
    alpha: float,
    beta: float,
    lam: float,
    ms_pos: torch.Tensor | float,
    ms_neg: torch.Tensor | float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pair weights; for ``sig-ms`` ``ms_pos``/``ms_neg`` are the logarithms of ``m^sig``."""
    if kind == "con":
        one = torch.ones_like(pos + neg)
        return one, one
    if kind == "lin":
        return (1 - pos).clamp(min=0), neg.clamp(min=0)
    if kind == "sig":
        return torch.sigmoid(alpha * (lam - pos)), torch.sigmoid(beta * (neg - lam))
    if kind == "lin-ms":
        return ((1 - ms_pos) * (1 - pos)).clamp(min=0), ((1 + ms_neg) * neg).clamp(min=0)
    if kind == "sig-ms":
        # 1 / (m + e^a) == exp(-logaddexp(log m, a)): finite for any m >= 0 and any a.
        return (
            torch.exp(
                -torch.logaddexp(torch.as_tensor(ms_pos, dtype=pos.dtype), alpha * (pos - lam))
            ),
            torch.exp(
                -torch.logaddexp(torch.as_tensor(ms_neg, dtype=neg.dtype), beta * (lam - neg))
            ),
        )
    _check_kind("con", kind)
    raise AssertionError  # pragma: no cover


def goal_pair_weights(
    kind: str,
    pos: torch.Tensor,
    neg: torch.Tensor,
    *,
    alpha: float = GoalParams.alpha,
    beta: float = GoalParams.beta,
    lam: float = GoalParams.lam,
    ms_pos: torch.Tensor | float | None = None,
    ms_neg: torch.Tensor | float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Pair weights ``(P+, P-)`` of positive similarity ``pos`` and negative similarity ``neg``.

    * ``"con"``, Eq. (9): 1 and 1.
    * ``"lin"``, Eq. (10): :math:`[1 - p]_+` and :math:`[s_n]_+`.
    * ``"sig"``, Eq. (11): :math:`1/(1 + e^{\alpha(p - \lambda)})`,
      :math:`1/(1 + e^{-\beta(s_n - \lambda)})`.
    * ``"sig-ms"``, Eq. (12): as ``sig`` with the 1 replaced by the relative terms ``ms_pos`` =
      :math:`m_+^{sig}` and ``ms_neg`` = :math:`m_-^{sig}` (default 1: plain ``sig``).
    * ``"lin-ms"``, Eq. (13): :math:`[(1 - m_+^{lin})(1 - p)]_+`,
      :math:`[(1 + m_-^{lin}) s_n]_+` with ``ms_pos``, ``ms_neg`` the relative terms (default 0).

    Elementwise; all tensors broadcast. Fig. 3 of the paper plots these curves.
    """
    if kind == "sig-ms":
        lp = 0.0 if ms_pos is None else torch.log(torch.as_tensor(ms_pos, dtype=pos.dtype))
        ln = 0.0 if ms_neg is None else torch.log(torch.as_tensor(ms_neg, dtype=neg.dtype))
        return _pair_weight_log_ms(kind, pos, neg, alpha, beta, lam, lp, ln)
    mp = 0.0 if ms_pos is None else ms_pos
    mn = 0.0 if ms_neg is None else ms_neg
    return _pair_weight_log_ms(kind, pos, neg, alpha, beta, lam, mp, mn)


def _relative_positive(
    pos: torch.Tensor, neg: torch.Tensor, cfg: GoalParams, batch_pos: torch.Tensor | None = None
) -> torch.Tensor:
    """MS relative term of the positives, ``(2, B)``: log m+^sig (sig-ms) or m+^lin (lin-ms).

    P = {S[k, k] : S[k, k] < s_n + epsilon} is a threshold set over the batch's positive
    scores, so sorting them once and taking prefix sums gives every anchor's mean in
    O(B log B) instead of a (B, B) mask. Empty P gives the neutral value 0. ``batch_pos``: the
    batch's positives when the anchors ``pos`` are only some of them (tiled local anchors).
    """
    sorted_pos = (pos if batch_pos is None else batch_pos).sort().values
    count = torch.searchsorted(sorted_pos, (neg + cfg.epsilon).contiguous())  # number < bound
    last = (count - 1).clamp(min=0)
    n = count.clamp(min=1).to(pos.dtype)
    if cfg.pair_weight == "sig-ms":
        # mean_k e^{alpha (p - p_k)} = e^{alpha (p - p_min)} mean_k e^{-alpha (p_k - p_min)};
        # the shifted terms lie in (0, 1] and the first is 1, so the prefix sums never vanish.
        lowest = sorted_pos[0]
        prefix = torch.cumsum(torch.exp(-cfg.alpha * (sorted_pos - lowest)), 0)
        value = cfg.alpha * (pos - lowest) + prefix[last].log() - n.log()
    else:
        value = pos - torch.cumsum(sorted_pos, 0)[last] / n
    return torch.where(count > 0, value, 0.0)


def _relative_negative(
    filled: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor, cfg: GoalParams
) -> torch.Tensor:
    """MS relative term of the negatives, ``(2, B)``: log m-^sig (sig-ms) or m-^lin (lin-ms)
    over N = {S[i, j] negative : S[i, j] > min(p, min_k S[k, k]) - epsilon}.

    The bound is Eq. (12)'s ``min{S_xy, R} - epsilon`` with R the relative positives, the batch
    diagonal that set P draws from; ``p`` is on that diagonal, so the bound is
    ``min_k S[k, k] - epsilon``, one scalar for every anchor and both directions.

    ``filled`` is ``sim`` with the dtype's lowest value outside the negatives; row ``i`` serves
    image anchor ``i`` and column ``i`` text anchor ``i``. Every member of N is at most the
    hardest negative, which belongs to N whenever N is non-empty, so the sig-ms sum of
    ``e^{beta (S - s_n)} <= 1`` is at least 1 and needs no max-shift.
    """
    keep = filled > pos.min() - cfg.epsilon
    count = torch.stack((keep.sum(1), keep.sum(0)))
    n = count.clamp(min=1).to(filled.dtype)
    if cfg.pair_weight == "sig-ms":
        rows = torch.exp(cfg.beta * (filled - neg[0][:, None])).mul_(keep).sum(1)
        cols = torch.exp(cfg.beta * (filled - neg[1][None, :])).mul_(keep).sum(0)
        value = torch.stack((rows, cols)).clamp(min=1).log() - n.log()
    else:
        kept = filled * keep
        value = neg - torch.stack((kept.sum(1), kept.sum(0))) / n
    return torch.where(count > 0, value, 0.0)


class _Hardest(NamedTuple):
    """Each anchor's triplet in both directions (``(2, B)`` each; row 0 the image anchors, rows
    of the matrix, row 1 the text anchors, columns)."""

    pos: torch.Tensor  # (B,) the diagonal
    column: torch.Tensor  # the hardest negative's column (row 0) / row (row 1)
    neg: torch.Tensor  # its score; the positive as a stand-in where has_neg is False
    has_neg: torch.Tensor
    ms_neg: torch.Tensor | float  # the MS relative negative term (0 for the other weights)


def _hardest(s: torch.Tensor, negatives: torch.Tensor, cfg: GoalParams) -> _Hardest:
    """The hardest negative of every anchor and the MS negative term of its pair weight."""
    pos = s.diagonal()
    # One masked copy serves both directions: rows for image anchors, columns for texts.
    filled = s.masked_fill(~negatives, torch.finfo(s.dtype).min)
    row_val, row_idx = filled.max(1)
    col_val, col_idx = filled.max(0)
    has_neg = torch.stack((negatives.any(1), negatives.any(0)))
    # Anchors without a negative get a harmless stand-in; their weights are zeroed later.
    neg = torch.where(has_neg, torch.stack((row_val, col_val)), pos)
    ms_neg: torch.Tensor | float = 0.0
    if cfg.pair_weight in ("lin-ms", "sig-ms"):
        ms_neg = _relative_negative(filled, pos, neg, cfg)
    return _Hardest(pos, torch.stack((row_idx, col_idx)), neg, has_neg, ms_neg)


def _goal_triplets(
    s: torch.Tensor, negatives: torch.Tensor, cfg: GoalParams
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-triplet quantities of both directions.

    Returns ``(hardest, weight_pos, weight_neg, hinge)``, each ``(2, B)``: row 0 holds the image
    anchors (rows of ``s``), row 1 the text anchors (columns). ``weight_pos = T * P+``,
    ``weight_neg = T * P-``, ``hinge = [margin + s_n - p]_+``; all 0 for anchors without a
    negative.
    """
    h = _hardest(s, negatives, cfg)
    weight_pos, weight_neg, hinge = triplet_weights_from_hardest(
        cfg, h.pos, h.neg, h.has_neg, h.ms_neg
    )
    return h.column, weight_pos, weight_neg, hinge


def _factors(
    cfg: GoalParams,
    pos: torch.Tensor,
    neg: torch.Tensor,
    ms_neg: torch.Tensor | float,
    batch_pos: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(T, P+, P-)`` of each triplet (the MS positive term computed here, the negative one
    given: the dense and tiled objectives find it differently)."""
    t = goal_triplet_weight(
        cfg.triplet_weight,
        pos,
        neg,
        margin=cfg.margin,
        tau=cfg.tau,
        circle_offset=cfg.circle_offset,
    )
    ms_pos: torch.Tensor | float = 0.0
    if cfg.pair_weight in ("lin-ms", "sig-ms"):
        ms_pos = _relative_positive(pos, neg, cfg, batch_pos)
    p_pos, p_neg = _pair_weight_log_ms(
        cfg.pair_weight, pos, neg, cfg.alpha, cfg.beta, cfg.lam, ms_pos, ms_neg
    )
    return t, p_pos, p_neg


def triplet_weights_from_hardest(
    cfg: GoalParams,
    pos: torch.Tensor,
    neg: torch.Tensor,
    has_neg: torch.Tensor,
    ms_neg: torch.Tensor | float,
    batch_pos: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(T P+, T P-, hinge)``, each ``(2, B)``, from the positives ``pos`` ``(B,)``, the hardest
    negatives ``neg`` ``(2, B)`` (any stand-in where ``has_neg`` is False) and the relative
    negative term ``ms_neg`` of the MS pair weights (0 for the other pair weights).

    Shared by the dense :class:`GoalFunction` and the tiled objective, which find ``neg`` and
    ``ms_neg`` differently; anchors without a negative get all-zero weights and hinge.
    ``batch_pos``: all the batch's positives (set P) when ``pos`` holds some anchors only.
    """
    t, p_pos, p_neg = _factors(cfg, pos, neg, ms_neg, batch_pos)
    active = has_neg.to(pos.dtype)
    t = t * active
    hinge = (cfg.margin + neg - pos).clamp(min=0) * active
    return t * p_pos, t * p_neg, hinge


def goal_anchor_weights(
    sim: torch.Tensor, negatives: torch.Tensor, params: GoalParams
) -> dict[str, torch.Tensor]:
    """Every anchor's triplet and its weights, factor by factor, as :class:`GoalFunction` forms
    them (for analysis: which part of the batch a combination weighs; docs/results.md).

    Args:
        sim: ``(B, B)`` similarities, ``sim[i, i]`` the pairs.
        negatives: ``(B, B)`` bool, True where an entry is a negative of its row and column.
        params: The combination and its constants.

    Returns:
        ``positive``, ``hardest``, ``triplet`` (``T``), ``pair_pos`` (``P+``) and ``pair_neg``
        (``P-``), each ``(2, B)``: row 0 the image anchors (rows of ``sim``), row 1 the text
        anchors (columns); ``has_negative`` (bool) marks the anchors with a negative, whose
        other entries are meaningful (``T P+`` and ``T P-`` are the objective's gradient on
        ``p`` and ``s_n``).
    """
    h = _hardest(sim, negatives, params)
    t, p_pos, p_neg = _factors(params, h.pos, h.neg, h.ms_neg)
    return {
        "positive": h.pos.expand_as(h.neg),
        "hardest": h.neg,
        "triplet": t,
        "pair_pos": p_pos,
        "pair_neg": p_neg,
        "has_negative": h.has_neg,
    }


__all__ = [
    "PAIR_WEIGHTS",
    "TRIPLET_WEIGHTS",
    "GoalParams",
    "goal_anchor_weights",
    "goal_pair_weights",
    "goal_triplet_weight",
    "triplet_weights_from_hardest",
]
