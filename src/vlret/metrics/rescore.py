"""Inference re-scoring of a retrieval score matrix: dual softmax and QB-Norm (NON-STANDARD).

Both methods change the scores a trained model gives before the ranks are counted. Results
obtained with them are not results of the papers' protocols and must never share a table with
standard ones: :class:`Rescoring` carries the label and the JSON record that say so.

* **Dual softmax** (DSL; Cheng et al. 2021, "Improving Video-Text Retrieval by Multi-Stream
  Corpus Alignment and Dual Softmax Loss", CAMoE) multiplies each score by a softmax prior
  taken over the *other* axis of the test matrix (:func:`dual_softmax`). The prior of a text
  query uses the scores of every other test text, so it uses the test set's own statistics:
  a deployed system, which sees one query at a time, cannot compute it.
* **QB-Norm** (Bogolin et al., CVPR 2022, "Cross Modal Retrieval with Querybank
  Normalisation") with the (dynamic) inverted softmax normalises each gallery item's scores by
  its scores against a *querybank* of training queries (:func:`qb_norm`), so it needs no test
  query but the current one.

The matrices here follow :mod:`vlret.metrics.ranks`: ``sim`` is ``(N_img, N_txt)`` for
:func:`dual_softmax` and :func:`rescored_metrics`, while :func:`qb_norm` takes the generic
``(N_query, N_gallery)`` layout of the QB-Norm paper (text-to-image: ``sim.T``).

This module is core: it imports torch and :mod:`vlret.metrics` only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ._blocks import (
    RescoreParameterError,
    _check_logits,
    _describe,
    _matrix,
    _positive,
    _positive_int,
    _row_spans,
)
from .ranks import (
    RetrievalMetrics,
    average_metrics,
    metrics_from_ranks,
    retrieval_ranks_from_rows,
)

RESCORE_METHODS = ("dsl", "qbnorm")
#: CAMoE's inference temperature is 1 on CLIP logits (100 x the cosine); on cosines that is 0.01.
DSL_TEMPERATURE = 0.01
#: QB-Norm's defaults (paper and public code): beta = 20, the top-1 neighbour of each bank query.
QB_BETA = 20.0
QB_K = 1
#: training captions drawn into the querybank (vlret's cap; ``vlret eval --bank-size``).
QB_BANK_SIZE = 5000
#: seed of the draw of the querybank from the training captions.
QB_BANK_SEED = 0


def _dsl_lse(sim: torch.Tensor, t: float, spans: list[tuple[int, int]]):
    """``logsumexp`` of ``sim / T`` along each row and each column, in float64 by row blocks;
    ``sim / T`` must be finite, else the temperature is refused."""
    n_img, n_txt = sim.shape
    _check_logits(float(sim.abs().max().double()) / t, "temperature", t, "too small")
    row_lse = torch.empty(n_img, dtype=torch.float64, device=sim.device)
    col_lse = torch.full((n_txt,), -math.inf, dtype=torch.float64, device=sim.device)
    for r0, r1 in spans:
        z = sim[r0:r1].double() / t
        row_lse[r0:r1] = torch.logsumexp(z, dim=1)
        col_lse = torch.logaddexp(col_lse, torch.logsumexp(z, dim=0))
    return row_lse, col_lse


@torch.no_grad()
def dual_softmax(
    sim: torch.Tensor, *, temperature: float = DSL_TEMPERATURE
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dual softmax re-scoring of an ``(N_img, N_txt)`` test score matrix (CAMoE, Sec. 3.3).

    For ``s = sim`` and temperature ``T``:

    * image-to-text (an image ``i`` ranks the texts ``j``): ``i2t[i, j] = s[i, j] *
      softmax_i'(s[i', j] / T)[i]``, the prior of each text taken over **all test images**
      (dim 0, a column of ``sim``);
    * text-to-image (a text ``j`` ranks the images ``i``): ``t2i[i, j] = s[i, j] *
      softmax_j'(s[i, j'] / T)[j]``, the prior of each image taken over **all test texts**
      (dim 1, a row of ``sim``; CAMoE's ``softmax(dim=0)`` on its text x video matrix).

    CAMoE's constant factor ``N`` does not change a rank and is left out. The priors use every
    test query at once: the result depends on the whole test set (NON-STANDARD). Computed in
    float64, because the priors of low scores at ``T = 0.01`` underflow float32 (to exact
    ties at 0), and returned in float64. At small temperatures (``(s_max - s) / T`` above
    ~708) priors underflow float64 too: the values are then the nearest float64 (0), and
    ranking them ties; :func:`dual_softmax_rank_keys` ranks without underflow.

    Args:
        sim: ``(N_img, N_txt)`` finite scores (cosines for two-tower models).
        temperature: ``T`` of the priors; CAMoE's inference value is 1 on CLIP logits
            (100 x the cosine), i.e. the default 0.01 on cosines.

    Returns:
        ``(i2t, t2i)``: two ``(N_img, N_txt)`` float64 matrices, the first ranked along its rows
        (image queries), the second along its columns (text queries).

    Raises:
        ValueError: ``sim`` is not a non-empty finite 2-D float tensor, ``temperature`` is
            not a positive finite number, or ``sim / temperature`` overflows float64.
    """
    sim = _matrix(sim, "sim")
    t = _positive(temperature, "temperature")
    spans = _row_spans(*sim.shape)
    row_lse, col_lse = _dsl_lse(sim, t, spans)
    i2t = torch.empty(sim.shape, dtype=torch.float64, device=sim.device)
    t2i = torch.empty_like(i2t)
    for r0, r1 in spans:
        s = sim[r0:r1].double()
        z = s / t
        torch.mul(s, torch.exp(z - col_lse[None, :]), out=i2t[r0:r1])
        torch.mul(s, torch.exp(z - row_lse[r0:r1, None]), out=t2i[r0:r1])
    return i2t, t2i


def _log_terms(s: torch.Tensor, log_prior: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``log |s| + log_prior`` (the log of the product's magnitude) and the masks of the
    positive and negative scores."""
    return torch.log(s.abs()) + log_prior, s > 0, s < 0


def _extreme(values: torch.Tensor, mask: torch.Tensor, dim: int, high: bool) -> torch.Tensor:
    """The largest (``high``) or smallest of ``values`` under ``mask`` along ``dim``; -inf /
    inf where the mask is empty."""
    if high:
        return torch.where(mask, values, -math.inf).amax(dim=dim, keepdim=True)
    return torch.where(mask, values, math.inf).amin(dim=dim, keepdim=True)


def _tiered_key(log_mag, pos, neg, high_pos, low_pos, low_neg) -> torch.Tensor:
    """Positive products above zeros above negative products, in one float64 per entry.

    Positive products are keyed ``log_mag - high_pos`` (``<= 0``: the line's best ones keep
    every bit), zero scores ``2 x (low_pos - high_pos) - 1`` (below every positive one), and
    negative products below that by ``1 + log_mag - low_neg`` (the smallest magnitude
    highest). A per-line shift keeps the line's order.
    """
    span = torch.where(torch.isfinite(low_pos), low_pos - high_pos, 0.0)
    zero = 2.0 * span - 1.0
    key = torch.where(pos, log_mag - high_pos, zero)
    return torch.where(neg, zero - 1.0 - (log_mag - low_neg), key)


def _underflowed(s: torch.Tensor, rescored: torch.Tensor) -> bool:
    """Whether a non-zero score's re-scored value fell below float64's normal range (a zero
    or a subnormal with few significant bits), where ranks on the values would tie."""
    tiny = torch.finfo(torch.float64).tiny
    return bool(((rescored.abs() < tiny) & (s != 0)).any())


@torch.no_grad()
def dual_softmax_rank_keys(
    sim: torch.Tensor, *, temperature: float = DSL_TEMPERATURE
) -> tuple[torch.Tensor, torch.Tensor]:
    """Matrices that rank as :func:`dual_softmax`'s exact ``(i2t, t2i)`` products do, also
    where those underflow float64 (small temperatures).

    A direction none of whose values underflows is returned as :func:`dual_softmax` computes
    it (exact values). Otherwise the direction is an order-preserving key computed in log space
    (log-softmax priors, ``log |s| + log prior``: nothing underflows): positive products above
    zero scores above negative products, each tier ordered by its logs and shifted along the
    ranked line (a per-line shift keeps the line's order). ``i2t``'s keys order each row (image
    queries), ``t2i``'s each column (text queries); only those orders are meaningful.

    Args:
        sim: ``(N_img, N_txt)`` finite scores.
        temperature: ``T`` of the priors.

    Returns:
        ``(i2t, t2i)`` float64 ``(N_img, N_txt)``: rank ``i2t`` along rows, ``t2i`` along
        columns.

    Raises:
        ValueError: as :func:`dual_softmax`.
    """
    i2t, t2i = dual_softmax(sim, temperature=temperature)
    redo_i2t, redo_t2i = _underflowed(sim, i2t), _underflowed(sim, t2i)
    if not (redo_i2t or redo_t2i):
        return i2t, t2i
    t = float(temperature)
    spans = _row_spans(*sim.shape)
    row_lse, col_lse = _dsl_lse(sim, t, spans)
    # t2i's lines are columns: their extremes per tier need every row block first
    inf = torch.full((1, sim.shape[1]), math.inf, dtype=torch.float64, device=sim.device)
    high_pos, low_pos, low_neg = -inf, inf, inf
    if redo_t2i:
        for r0, r1 in spans:
            s = sim[r0:r1].double()
            log_mag, pos, neg = _log_terms(s, s / t - row_lse[r0:r1, None])
            high_pos = torch.maximum(high_pos, _extreme(log_mag, pos, 0, True))
            low_pos = torch.minimum(low_pos, _extreme(log_mag, pos, 0, False))
            low_neg = torch.minimum(low_neg, _extreme(log_mag, neg, 0, False))
    for r0, r1 in spans:
        s = sim[r0:r1].double()
        if redo_i2t:
            log_mag, pos, neg = _log_terms(s, s / t - col_lse[None, :])
            ends = (_extreme(log_mag, pos, 1, True), _extreme(log_mag, pos, 1, False))
            i2t[r0:r1] = _tiered_key(log_mag, pos, neg, *ends, _extreme(log_mag, neg, 1, False))
        if redo_t2i:
            log_mag, pos, neg = _log_terms(s, s / t - row_lse[r0:r1, None])
            t2i[r0:r1] = _tiered_key(log_mag, pos, neg, high_pos, low_pos, low_neg)
    return i2t, t2i


@torch.no_grad()
def querybank_activation(bank_sim: torch.Tensor, *, k: int = QB_K) -> torch.Tensor:
    """The activation set of the dynamic inverted softmax (QB-Norm, Sec. 3.2).

    A gallery item is active when it is among the top-``k`` items of some querybank query.
    Ties are inclusive: every item scoring at least a bank query's ``k``-th best score is in
    its top-``k`` (so the set does not depend on the order of the gallery).

    Args:
        bank_sim: ``(N_bank, N_gallery)`` scores of the querybank queries.
        k: neighbours per bank query (QB-Norm: 1); more than ``N_gallery`` means all.

    Returns:
        ``(N_gallery,)`` bool tensor.

    Raises:
        ValueError: ``bank_sim`` is not a non-empty finite 2-D float tensor, or ``k`` < 1.
    """
    bank_sim = _matrix(bank_sim, "bank_sim")
    k = min(_positive_int(k, "k"), bank_sim.shape[1])
    active = torch.zeros(bank_sim.shape[1], dtype=torch.bool, device=bank_sim.device)
    for r0, r1 in _row_spans(*bank_sim.shape):
        block = bank_sim[r0:r1]
        kth = block.topk(k, dim=1).values[:, -1:]
        active |= (block >= kth).any(dim=0)
    return active


@torch.no_grad()
def normalised_queries(sim: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
    """The queries the dynamic inverted softmax normalises: those whose top-1 gallery item is
    in the activation set (ties inclusive: any of its best-scoring items).

    Args:
        sim: ``(N_query, N_gallery)`` scores.
        active: ``(N_gallery,)`` bool, from :func:`querybank_activation`.

    Returns:
        ``(N_query,)`` bool tensor.

    Raises:
        ValueError: ``sim`` is not a non-empty finite 2-D float tensor, or ``active`` is not a
            bool tensor of one entry per gallery item.
    """
    sim = _matrix(sim, "sim")
    if (
        not isinstance(active, torch.Tensor)
        or active.dtype != torch.bool
        or active.shape != (sim.shape[1],)
    ):
        raise ValueError(f"active must be a ({sim.shape[1]},) bool tensor, got {_describe(active)}")
    out = torch.empty(sim.shape[0], dtype=torch.bool, device=sim.device)
    for r0, r1 in _row_spans(*sim.shape):
        block = sim[r0:r1]
        top = block >= block.amax(dim=1, keepdim=True)
        out[r0:r1] = (top & active.to(sim.device)[None, :]).any(dim=1)
    return out


@torch.no_grad()
def qb_norm(
    sim: torch.Tensor,
    bank_sim: torch.Tensor,
    *,
    beta: float = QB_BETA,
    k: int = QB_K,
    dynamic: bool = True,
) -> torch.Tensor:
    """QB-Norm with the (dynamic) inverted softmax (Bogolin et al., CVPR 2022, Eq. 3-5).

    For a query ``q``, gallery item ``g`` and querybank ``B``, the inverted softmax is::

        eta(q, g) = exp(beta * s(q, g)) / sum_{b in B} exp(beta * s(b, g))

    computed here in log space, ``log eta = beta * s(q, g) - logsumexp_b(beta * s(b, g))``
    (the same ranks, no overflow). ``dynamic=True`` (the paper's dynamic inverted softmax)
    normalises only the queries whose top-1 gallery item is in the activation set
    (:func:`querybank_activation`: the items that are some bank query's top-``k``); the other
    queries keep their raw scores ``s(q, g)`` (as the authors' code does). ``dynamic=False``
    normalises every query (plain inverted softmax). Each row is one query's ranking: rows
    differ in units, so columns of the result must not be ranked.

    Args:
        sim: ``(N_query, N_gallery)`` test scores, one row per query.
        bank_sim: ``(N_bank, N_gallery)`` scores of the querybank's queries against the same
            gallery.
        beta: inverse temperature (QB-Norm: 20).
        k: neighbours per bank query for the activation set (QB-Norm: 1).
        dynamic: the dynamic inverted softmax (default) or the plain one.

    Returns:
        ``(N_query, N_gallery)`` float64 scores: ``log eta`` in normalised rows, ``s`` elsewhere.

    Raises:
        ValueError: a matrix that is not a non-empty finite 2-D float tensor, matrices with
            different galleries, a non-positive ``beta`` or ``k``, or a non-bool ``dynamic``.
    """
    return _qb_norm_rows(sim, bank_sim, beta=beta, k=k, dynamic=dynamic)[0]


def _qb_norm_rows(
    sim: torch.Tensor, bank_sim: torch.Tensor, *, beta: float, k: int, dynamic: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`qb_norm`'s scores and the ``(N_query,)`` bool mask of the rows it normalised."""
    sim = _matrix(sim, "sim")
    bank_sim = _matrix(bank_sim, "bank_sim")
    if bank_sim.shape[1] != sim.shape[1]:
        raise ValueError(
            f"bank_sim scores {bank_sim.shape[1]} gallery items, sim {sim.shape[1]}: the "
            "querybank must be scored against the same gallery"
        )
    beta = _positive(beta, "beta")
    _check_logits(beta * float(bank_sim.abs().max().double()), "beta", beta, "too large")
    _check_logits(beta * float(sim.abs().max().double()), "beta", beta, "too large")
    if not isinstance(dynamic, bool):
        raise ValueError(f"dynamic must be a bool, got {dynamic!r}")
    bank_sim = bank_sim.to(sim.device)
    lse = torch.full((sim.shape[1],), -math.inf, dtype=torch.float64, device=sim.device)
    for r0, r1 in _row_spans(*bank_sim.shape):
        lse = torch.logaddexp(lse, torch.logsumexp(beta * bank_sim[r0:r1].double(), dim=0))
    if dynamic:
        rows = normalised_queries(sim, querybank_activation(bank_sim, k=k))
    else:
        _positive_int(k, "k")
        rows = torch.ones(sim.shape[0], dtype=torch.bool, device=sim.device)
    out = sim.to(torch.float64, copy=True)
    idx = torch.nonzero(rows).squeeze(1)
    for a, b in _row_spans(idx.numel(), sim.shape[1]):
        pick = idx[a:b]
        out[pick] = beta * out[pick] - lse[None, :]
    return out, rows


def draw_bank(n_captions: int, *, size: int, seed: int = QB_BANK_SEED) -> torch.Tensor:
    """The querybank's captions: ``size`` distinct indices of ``range(n_captions)`` drawn
    uniformly with a fixed ``seed`` (all of them when ``size >= n_captions``), sorted.

    Args:
        n_captions: number of training captions to draw from.
        size: number of captions in the bank.
        seed: seed of the draw (a private generator; the global RNG is untouched).

    Returns:
        ``(min(size, n_captions),)`` int64 tensor of increasing indices.

    Raises:
        ValueError: ``n_captions`` or ``size`` not a positive integer, or ``seed`` not an int.
    """
    n = _positive_int(n_captions, "n_captions")
    size = _positive_int(size, "size")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an int, got {seed!r}")
    if size >= n:
        return torch.arange(n)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return perm[:size].sort().values


@dataclass(frozen=True)
class Rescoring:
    """An inference re-scoring method and its parameters (always NON-STANDARD).

    Attributes:
        method: ``"dsl"`` (:func:`dual_softmax`) or ``"qbnorm"`` (:func:`qb_norm`).
        temperature: dual softmax temperature.
        beta: QB-Norm inverse temperature.
        k: QB-Norm neighbours per bank query.
        dynamic: QB-Norm's dynamic inverted softmax (else the plain one).
        bank_size: QB-Norm: training captions drawn into the querybank (at most).
        bank_seed: QB-Norm: seed of that draw.
    """

    method: str
    temperature: float = DSL_TEMPERATURE
    beta: float = QB_BETA
    k: int = QB_K
    dynamic: bool = True
    bank_size: int = QB_BANK_SIZE
    bank_seed: int = QB_BANK_SEED

    def __post_init__(self) -> None:
        if self.method not in RESCORE_METHODS:
            raise ValueError(
                f"rescore method must be one of {', '.join(RESCORE_METHODS)}, got {self.method!r}"
            )
        _positive(self.temperature, "temperature")
        _positive(self.beta, "beta")
        _positive_int(self.k, "k")
        _positive_int(self.bank_size, "bank_size")
        if not isinstance(self.dynamic, bool):
            raise ValueError(f"dynamic must be a bool, got {self.dynamic!r}")
        if isinstance(self.bank_seed, bool) or not isinstance(self.bank_seed, int):
            raise ValueError(f"bank_seed must be an int, got {self.bank_seed!r}")

    @property
    def needs_bank(self) -> bool:
        """Whether a querybank (training captions scored against the gallery) is needed."""
        return self.method == "qbnorm"

    def label(self, info: dict[str, Any] | None = None) -> str:
        """One line for the table title, starting with ``NON-STANDARD``; ``info`` from
        :func:`rescored_metrics` adds the bank size used and the fraction normalised."""
        info = info or {}
        if self.method == "dsl":
            return (
                "NON-STANDARD: dual softmax re-scoring (CAMoE DSL, temperature "
                f"{self.temperature:g}) of both directions; its priors use every test query at "
                "once (the test set's own statistics)"
            )
        kind = "dynamic inverted softmax" if self.dynamic else "inverted softmax"
        size = info.get("bank_size", self.bank_size)
        share = info.get("t2i_queries_normalised")
        normalised = "" if share is None else f", {100 * share:.1f}% of text queries normalised"
        return (
            f"NON-STANDARD: QB-Norm re-scoring ({kind}, beta {self.beta:g}, k {self.k}, querybank "
            f"of {size} training captions, seed {self.bank_seed}) of text->image only{normalised};"
            " image->text unchanged"
        )

    def record(self, info: dict[str, Any] | None = None) -> dict[str, Any]:
        """The JSON ``rescore`` record: the method, its parameters, ``standard: false``."""
        out: dict[str, Any] = {"method": self.method, "standard": False}
        if self.method == "dsl":
            out.update(temperature=self.temperature, directions="i2t and t2i")
            out["uses_test_statistics"] = True
        else:
            out.update(beta=self.beta, k=self.k, dynamic=self.dynamic)
            out.update(bank="training captions", bank_size=self.bank_size)
            out.update(bank_seed=self.bank_seed, directions="t2i only (i2t unchanged)")
            out["uses_test_statistics"] = False
        out.update(info or {})
        return out


#: the method each optional :class:`Rescoring` parameter belongs to (see :func:`make_rescoring`)
_METHOD_OF = {
    "temperature": "dsl",
    "beta": "qbnorm",
    "k": "qbnorm",
    "dynamic": "qbnorm",
    "bank_size": "qbnorm",
    "bank_seed": "qbnorm",
}


def make_rescoring(
    method: str | None, *, names: dict[str, str] | None = None, **params: Any
) -> Rescoring | None:
    """A :class:`Rescoring` from optional settings (a command line's flags).

    Args:
        method: ``"dsl"``, ``"qbnorm"`` or ``None`` (no re-scoring).
        names: how errors name each parameter (e.g. ``{"beta": "--qb-beta"}``).
        **params: :class:`Rescoring` fields; ``None`` = not given (the method's default).

    Returns:
        The re-scoring, or ``None`` when ``method`` is ``None``.

    Raises:
        ValueError: an unknown parameter, a parameter given for the other method or without a
            method, or an invalid value.
    """
    names = names or {}
    given = {name: value for name, value in params.items() if value is not None}
    for name in given:
        if name not in _METHOD_OF:
            raise ValueError(f"{name}: not a re-scoring parameter ({', '.join(_METHOD_OF)})")
        if method != _METHOD_OF[name]:
            raise ValueError(
                f"{names.get(name, name)}: only used with the {_METHOD_OF[name]} re-scoring "
                f"(--rescore {_METHOD_OF[name]})"
            )
    return None if method is None else Rescoring(method, **given)


def rescored_metrics(
    sim: torch.Tensor,
    txt_to_img: Any,
    rescoring: Rescoring,
    *,
    bank_sim: torch.Tensor | None = None,
    blocks: Sequence[tuple[int, int, int, int]] | None = None,
) -> tuple[RetrievalMetrics, dict[str, Any]]:
    """Retrieval metrics after re-scoring ``sim`` (NON-STANDARD).

    Each block (the COCO 1K folds' ``(img0, img1, txt0, txt1)``; default the whole matrix) is
    re-scored on its own, as its own test set, then ranked by the ranking core
    (:func:`~vlret.metrics.rank_queries`, ties against the query); folds are averaged by
    :func:`~vlret.metrics.average_metrics`.
    Dual softmax ranks image queries on its ``i2t`` matrix and text queries on its ``t2i``
    matrix. QB-Norm re-scores the text->image direction (text queries, the images as gallery,
    the bank's columns of the block's images) and leaves image->text as it was.

    Args:
        sim: ``(N_img, N_txt)`` scores (finite inside the blocks).
        txt_to_img: the image of each text.
        rescoring: the method and its parameters.
        bank_sim: ``(N_bank, N_img)`` scores of the querybank captions against the test images
            (QB-Norm only).
        blocks: diagonal blocks scored separately, or ``None``.

    Returns:
        ``(metrics, info)``; ``info`` has QB-Norm's ``bank_size`` and
        ``t2i_queries_normalised`` (the fraction of text queries normalised), else is empty.

    Raises:
        ValueError: a missing or unexpected ``bank_sim``, or shapes that do not match.
    """
    if not isinstance(rescoring, Rescoring):
        raise ValueError(f"rescoring must be a Rescoring, got {type(rescoring).__name__}")
    if not isinstance(sim, torch.Tensor) or sim.dim() != 2:
        raise ValueError(f"sim must be a 2-D (N_img, N_txt) tensor, got {_describe(sim)}")
    if rescoring.needs_bank != (bank_sim is not None):
        need = "needs" if rescoring.needs_bank else "takes no"
        raise ValueError(f"bank_sim: {rescoring.method} {need} querybank scores")
    if bank_sim is not None and (bank_sim.dim() != 2 or bank_sim.shape[1] != sim.shape[0]):
        raise ValueError(
            f"bank_sim must be (N_bank, {sim.shape[0]}) (one column per image), got "
            f"{tuple(bank_sim.shape)}"
        )
    t2i = torch.as_tensor(txt_to_img, dtype=torch.long)
    spans = [(0, sim.shape[0], 0, sim.shape[1])] if blocks is None else list(blocks)
    folds, normalised = [], []
    for i0, i1, t0, t1 in spans:
        block, local = sim[i0:i1, t0:t1], t2i[t0:t1] - i0
        if rescoring.method == "dsl":
            by_img, by_txt = dual_softmax_rank_keys(block, temperature=rescoring.temperature)
            txt_rows = by_txt.t()  # text queries rank the columns
        else:
            bank = bank_sim[:, i0:i1]  # type: ignore[index]
            by_img = block
            txt_rows, rows = _qb_norm_rows(
                block.t(), bank, beta=rescoring.beta, k=rescoring.k, dynamic=rescoring.dynamic
            )
            normalised.append(rows.cpu())
        folds.append(metrics_from_ranks(*retrieval_ranks_from_rows(by_img, txt_rows, local)))
    metrics = folds[0] if blocks is None else average_metrics(folds)
    info: dict[str, Any] = {}
    if bank_sim is not None:
        flags = torch.cat(normalised)
        info = {"bank_size": int(bank_sim.shape[0])}
        info["t2i_queries_normalised"] = float(flags.double().mean())
    return metrics, info


__all__ = [
    "DSL_TEMPERATURE",
    "QB_BANK_SEED",
    "QB_BANK_SIZE",
    "QB_BETA",
    "QB_K",
    "RESCORE_METHODS",
    "RescoreParameterError",
    "Rescoring",
    "draw_bank",
    "dual_softmax",
    "dual_softmax_rank_keys",
    "make_rescoring",
    "normalised_queries",
    "qb_norm",
    "querybank_activation",
    "rescored_metrics",
]
