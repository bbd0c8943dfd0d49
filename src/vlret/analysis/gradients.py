r"""The tangent components of a loss's gradient (Unified-loss paper, Sec. 3.3, Eq. 8-19).

The paper embeds images and texts on the unit hypersphere, writes the gradient of each loss
with respect to the features and keeps the part tangent to the sphere: the radial part only
changes the feature's length, which the normalisation removes. For Triplet-HN it reads
(Eq. 9-12, image anchor :math:`v_i`, its positive :math:`t_i`, its hardest negative
:math:`\hat t_i`)

.. math:: \|g(v_i)\| = \|\hat t_i - t_i\| \sin\theta(v_i, \hat t_i - t_i), \qquad
          \|g(\hat t_i)\| = \|v_i\| \sin\theta(v_i, \hat t_i)

and for the Unified loss and VLC (Eq. 14-19) the same with every negative :math:`t_j` weighted
by :math:`D_j / (1 + \sum_k D_k)`. :func:`gradient_components` computes these quantities for
any registered loss from **the loss's own autograd gradient** (no re-derived formula): it
scores the batch as the loss does, takes the derivative of the loss with respect to every score
:math:`s_{ac}` (anchor ``a``, candidate ``c``), and splits the anchor's gradient
:math:`\partial L / \partial a = \sum_c w_{ac} x_c` into

* ``positive``: the tangent part of :math:`\sum_{c \in P(a)} w_{ac} x_c`, the pull of the
  positive pair(s) (:math:`-\sin\theta(v_i, t_i)` times the weight: Eq. 9's :math:`-t_i`);
* ``negatives``: the tangent part of :math:`\sum_{c \in N(a)} w_{ac} x_c`, the push of the
  negatives (Eq. 9's :math:`\hat t_i`, Eq. 14's weighted :math:`t_j`);
* ``radial``: :math:`(a^\top g)\, a`, the part normalisation removes.

``positive + negatives`` is the projected gradient :math:`(I - a a^\top) g` and
``positive + negatives + radial`` is :math:`g`. Its norm ``tangent`` is Eq. 11 / Eq. 17. The
gradient the anchor's pairs put on its **negatives** (Eq. 10 / 15), tangent at each negative,
is ``on_negatives``: :math:`\sum_{c \in N(a)} |w_{ac}|\,\|a\| \sin\theta(a, x_c)`
(Eq. 12 / 18, summed over the anchor's negatives).

Readings chosen where the paper is ambiguous:

* **Which terms.** Sec. 3.3 analyses the image-anchor terms alone ("symmetric to the loss from
  language-to-vision"): ``terms="anchor"`` (the default) keeps only the anchors' own terms of
  the loss (the image-anchor terms for ``direction="i2t"``, Eq. 8 / 13).
  ``terms="all"`` takes the gradient of the whole loss as it trains, which adds to
  :math:`\partial L/\partial v_i` the terms where :math:`v_i` is a negative of a text anchor.
  The anchor terms are separated from the loss's per-index terms (``reduction="none"``, image
  term of row ``i`` plus text term of column ``i``) by differentiating their plain sum and
  their sum weighted by the index: an off-diagonal score :math:`s_{ij}` is read by the row term
  of ``i`` and the column term of ``j`` only, so the two derivatives give both. The positive
  score :math:`s_{ii}` is read by both terms of index ``i``; its share is the one every loss of
  pair-similarity differences has (the paper's unified form: a loss of :math:`s_{ij} - s_{ii}`),
  :math:`w_{ii} = -\sum_{j \ne i} w_{ij}`. This is checked against the whole loss's derivative
  of :math:`s_{ii}`; a loss that is not such a function (SigLIP's per-pair terms) is refused
  for ``terms="anchor"``.
* **Eq. 17 sums norms.** Eq. 17 writes :math:`\|g_\text{Unified}(v_i)\|` as the sum over the
  negatives of each term's tangent length, which is at least the length of the tangent of the
  sum (the triangle inequality) and equal to it when one negative carries the weight
  (Triplet-HN, Eq. 11). ``tangent`` is the length of the step the feature takes (the norm of
  the sum); ``tangent_sum`` is Eq. 17 read literally,
  :math:`\sum_{j \in N(i)} |w_{ij}|\,\|P_{v_i}(t_j - t_i)\|` (``terms="anchor"`` only: with
  the whole loss the positive weight is no longer minus the sum of the negatives').
* **Eq. 15's denominator.** Eq. 15 prints :math:`D(t_j) / (1 + D(t_j))`; the derivative of
  Eq. 13 is :math:`D(t_j) / (1 + \sum_k D(t_k))`, which is what autograd gives and what the
  tests compare with.
* **Scale.** The weights are those of the loss as configured, reduction included: a ``"mean"``
  loss (InfoNCE's default) divides them by the batch size, a ``"sum"`` loss (Triplet, Unified,
  and the paper's Eq. 1, 3, 5) does not. VLC is :math:`\gamma` times Unified at ``m = 0``
  (Eq. 7), so its gradients are :math:`\gamma` times larger at equal scores.

The anchors are the loss's own inputs: L2-normalised when the loss normalises
(``normalize=True``, the paper's setting), as given otherwise (then "tangent" is relative to
each embedding's direction, and the radial part does change the score). The computation is in
float64 and leaves the loss untouched (its state, training mode and the random generators are
restored). :func:`component_summary` gives a batch's means, the record
:class:`GradientLog` (a training hook) appends to ``gradients.jsonl`` in the run folder, and
:func:`plot_gradient_curves` draws them against steps (``vlret plot gradients``).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F

from ..losses._base import PairLoss
from ..similarity import Ids, positive_mask

#: The directions: which embeddings are the anchors (images for ``i2t``, texts for ``t2i``).
DIRECTIONS: tuple[Literal["i2t", "t2i"], ...] = ("i2t", "t2i")
#: Which terms of the loss: the anchors' own (Sec. 3.3) or the whole loss.
TERMS = ("anchor", "all")
#: The per-anchor lengths :meth:`GradientComponents.norms` returns, in the figure's order.
COMPONENTS = ("positive", "negatives", "tangent", "radial", "on_negatives", "tangent_sum")
#: Relative tolerance of the check that a loss is a function of score differences.
DIFFERENCE_RTOL = 1e-6


@dataclass(frozen=True)
class GradientComponents:
    """The gradient of a loss with respect to one modality's embeddings (the anchors), split
    as the Unified-loss paper's Sec. 3.3 splits it (module docstring).

    Attributes:
        direction: ``"i2t"`` (image anchors, text candidates) or ``"t2i"``.
        terms: ``"anchor"`` (the anchors' own terms) or ``"all"`` (the whole loss).
        anchors: ``(B, D)`` the anchors as the loss scores them (unit rows when it normalises).
        candidates: ``(B, D)`` the other modality, likewise.
        weights: ``(B, B)`` :math:`w_{ac} = \\partial L / \\partial s_{ac}`, rows anchors.
        positives: ``(B, B)`` bool, the positive pairs (the diagonal and equal ids).
        gradient: ``(B, D)`` :math:`\\partial L / \\partial a`, the whole gradient.
        positive: ``(B, D)`` the tangent pull of the positive pair(s).
        negatives: ``(B, D)`` the tangent push of the negatives.
        radial: ``(B, D)`` the radial part, removed by the normalisation.
        on_negatives: ``(B,)`` Eq. 12 / 18: the tangent lengths, each at its negative, of the
            gradient the anchor's negative pairs put on the negatives, summed.
        tangent_sum: ``(B,)`` Eq. 17 read literally (a sum of per-negative tangent lengths);
            ``None`` for ``terms="all"``.
    """

    direction: str
    terms: str
    anchors: torch.Tensor
    candidates: torch.Tensor
    weights: torch.Tensor
    positives: torch.Tensor
    gradient: torch.Tensor
    positive: torch.Tensor
    negatives: torch.Tensor
    radial: torch.Tensor
    on_negatives: torch.Tensor
    tangent_sum: torch.Tensor | None

    @property
    def tangent(self) -> torch.Tensor:
        """``(B, D)`` the tangent part of the gradient, ``positive + negatives`` (Eq. 11/17)."""
        return self.positive + self.negatives

    def norms(self) -> dict[str, torch.Tensor]:
        """The per-anchor lengths, keyed by :data:`COMPONENTS` (``tangent_sum`` left out when
        it is ``None``): ``positive``, ``negatives``, ``tangent`` (Eq. 11 / 17, the norm of the
        sum), ``radial``, ``on_negatives`` (Eq. 12 / 18) and ``tangent_sum``."""
        out = {
            "positive": self.positive.norm(dim=1),
            "negatives": self.negatives.norm(dim=1),
            "tangent": self.tangent.norm(dim=1),
            "radial": self.radial.norm(dim=1),
            "on_negatives": self.on_negatives,
        }
        if self.tangent_sum is not None:
            out["tangent_sum"] = self.tangent_sum
        return out


def _project(anchors: torch.Tensor, vectors: torch.Tensor) -> torch.Tensor:
    """The part of each row of ``vectors`` orthogonal to the direction of its anchor."""
    unit = F.normalize(anchors, dim=1)
    return vectors - (vectors * unit).sum(1, keepdim=True) * unit


@contextmanager
def _untouched(loss: PairLoss) -> Iterator[None]:
    """Run ``loss`` in eval mode (no margin re-estimation, no queue update) and give back its
    state, its mode and the random generators as they were."""
    state = copy.deepcopy(loss.state_dict())
    mode = loss.training
    devices = [torch.cuda.current_device()] if torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=devices):
        loss.eval()
        try:
            yield
        finally:
            loss.train(mode)
            loss.load_state_dict(state)


def check_analysable(loss: PairLoss) -> None:
    """Refuse a loss whose gradient is not a function of the batch's score matrix alone.

    Raises:
        ValueError: The loss owns a memory queue or reads momentum keys, needs the captions'
            semantics, offline negatives or other inputs besides the scores, or classifies
            identities (the ``id`` loss and combinations holding it); the message names it.
    """
    if not isinstance(loss, PairLoss):
        raise ValueError(f"loss must be a vlret loss module, got {type(loss).__name__}")
    caps = loss.current_capabilities()
    name = getattr(type(loss), "registry_name", type(loss).__name__)
    why = None
    if caps.owns_queue or caps.momentum_keys:
        why = "scores the batch against a memory queue"
    elif caps.needs_semantics:
        why = "reads the captions' semantics"
    elif caps.offline_negatives:
        why = "reads offline negatives"
    elif caps.train_identities:
        why = "classifies training identities"
    elif getattr(caps, "masked_language", False):
        why = "scores masked caption tokens"
    elif caps.similarity_inputs:
        why = f"needs {', '.join(caps.similarity_inputs)} besides the scores"
    if why is not None:
        raise ValueError(
            f"loss {name!r} {why}: its gradient is not a function of the batch's scores alone, "
            "which the gradient analysis needs"
        )


def _scale(loss: PairLoss, batch: int) -> float:
    return 1.0 / batch if loss.reduction == "mean" else 1.0


def _anchor_weights(
    loss: PairLoss,
    sim: torch.Tensor,
    pos_mask: torch.Tensor | None,
    total: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(F, G)``: the derivatives of the image-anchor terms (rows) and of the text-anchor
    terms (columns) with respect to the scores; the diagonal's share by the difference form
    (each row's, each column's derivatives sum to 0), checked against ``total`` (the whole
    loss's derivatives)."""
    name = getattr(type(loss), "registry_name", type(loss).__name__)
    dense = type(loss).dense
    if dense is None or type(loss).from_similarity is not PairLoss.from_similarity:
        raise ValueError(
            f"loss {name!r} has no per-anchor terms on a score matrix (a dense function): "
            "use terms='all'"
        )
    b = sim.shape[0]
    leaf = sim.detach().requires_grad_(True)
    per_index = dense(leaf, **loss.arguments(), pos_mask=pos_mask, reduction="none")
    if per_index.shape != (b,):
        raise ValueError(f"loss {name!r} gives no per-index terms: use terms='all'")
    r = torch.arange(b, dtype=sim.dtype, device=sim.device)
    plain = torch.autograd.grad(per_index.sum(), leaf, retain_graph=True)[0]
    weighted = torch.autograd.grad((r * per_index).sum(), leaf)[0]
    scale = _scale(loss, b)
    diff = r[:, None] - r[None, :]
    off = ~torch.eye(b, dtype=torch.bool, device=sim.device)
    safe = torch.where(off, diff, torch.ones_like(diff))
    rows = torch.where(off, (weighted - r[None, :] * plain) / safe, 0.0) * scale
    cols = torch.where(off, (r[:, None] * plain - weighted) / safe, 0.0) * scale
    row_pos, col_pos = -rows.sum(1), -cols.sum(0)
    rows = rows + torch.diag(row_pos)
    cols = cols + torch.diag(col_pos)
    # the anchor terms must make up the whole loss: off the diagonal by the separation (a
    # per-index form that is not the loss's own terms shows here), on it by the difference form
    tol = DIFFERENCE_RTOL * float(total.abs().max()) + 1e-12
    if float((rows + cols - total).abs().max()) > tol:
        raise ValueError(
            f"loss {name!r} is not a function of the score differences s_ij - s_ii (its "
            "positives' derivatives are not minus the sum of its negatives'), so its anchor "
            "terms cannot be told apart: use terms='all'"
        )
    return rows, cols


def gradient_components(
    loss: PairLoss,
    img_emb: torch.Tensor,
    txt_emb: torch.Tensor,
    *,
    img_ids: Ids | None = None,
    txt_ids: Ids | None = None,
    direction: Literal["i2t", "t2i"] = "i2t",
    terms: Literal["anchor", "all"] = "anchor",
) -> GradientComponents:
    """Split the gradient of ``loss`` on a batch into the paper's components, per anchor.

    Args:
        loss: A registered loss module (:func:`vlret.losses.build_loss`) whose gradient is a
            function of the batch's scores (:func:`check_analysable`).
        img_emb: ``(B, D)`` image embeddings (text ``i`` is image ``i``'s positive).
        txt_emb: ``(B, D)`` text embeddings.
        img_ids: Optional ids of the images; equal ids are further positives (as the loss
            reads them).
        txt_ids: Optional ids of the texts' images (default ``img_ids``).
        direction: ``"i2t"``: the images are the anchors (the paper's :math:`v_i`);
            ``"t2i"``: the texts.
        terms: ``"anchor"``: the anchors' own terms of the loss (Sec. 3.3's reading);
            ``"all"``: the whole loss as it trains.

    Returns:
        The components (:class:`GradientComponents`), in float64.

    Raises:
        ValueError: Bad embeddings, ids, ``direction`` or ``terms``; a loss that cannot be
            analysed (:func:`check_analysable`), or, for ``terms="anchor"``, one that is not
            a function of score differences.
    """
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {', '.join(DIRECTIONS)}, got {direction!r}")
    if terms not in TERMS:
        raise ValueError(f"terms must be one of {', '.join(TERMS)}, got {terms!r}")
    check_analysable(loss)
    for label, t in (("img_emb", img_emb), ("txt_emb", txt_emb)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2 or not t.dtype.is_floating_point:
            raise ValueError(f"{label} must be a 2-D float tensor (B, D)")
        if not bool(torch.isfinite(t).all()):
            raise ValueError(f"{label} contains NaN or inf")
    if img_emb.shape != txt_emb.shape or img_emb.shape[0] < 2:
        raise ValueError(
            f"img_emb and txt_emb must have one shape (B, D) with B >= 2, got "
            f"{tuple(img_emb.shape)} and {tuple(txt_emb.shape)}"
        )
    b = img_emb.shape[0]
    img = img_emb.detach().to(torch.float64)
    txt = txt_emb.detach().to(torch.float64)
    if loss.normalize:
        img, txt = F.normalize(img, dim=1), F.normalize(txt, dim=1)
    if img_ids is None and txt_ids is not None:
        raise ValueError("txt_ids given without img_ids")
    if img_ids is None:
        positives = torch.eye(b, dtype=torch.bool, device=img.device)
        pos_mask = None
    else:
        if txt_ids is None:
            txt_ids = img_ids
        for label, ids in (("img_ids", img_ids), ("txt_ids", txt_ids)):
            if len(ids) != b:
                raise ValueError(f"{label} must have one id per row ({b}), got {len(ids)}")
        pos_mask = positive_mask(img_ids, txt_ids)
        pos_mask = pos_mask.to(img.device)
        positives = pos_mask | torch.eye(b, dtype=torch.bool, device=img.device)
    with _untouched(loss), torch.enable_grad():
        sim = (img @ txt.t()).requires_grad_(True)
        value = loss.from_similarity(sim, pos_mask=pos_mask)
        if value.dim() != 0:
            value = value.sum()  # reduction="none": the terms' sum, as a training step would
        (total,) = torch.autograd.grad(value, sim)
        if terms == "anchor":
            rows, cols = _anchor_weights(loss, sim.detach(), pos_mask, total)
            weights = rows if direction == "i2t" else cols.t()
        else:
            weights = total if direction == "i2t" else total.t()
    if direction == "i2t":
        anchors, candidates, pos = img, txt, positives
    else:
        anchors, candidates, pos = txt, img, positives.t()
    return _split(direction, terms, anchors, candidates, weights.detach(), pos)


def _split(
    direction: str,
    terms: str,
    anchors: torch.Tensor,
    candidates: torch.Tensor,
    weights: torch.Tensor,
    pos: torch.Tensor,
) -> GradientComponents:
    pos_w = weights.masked_fill(~pos, 0.0)
    neg_w = weights.masked_fill(pos, 0.0)
    pull, push = pos_w @ candidates, neg_w @ candidates
    gradient = pull + push
    unit = F.normalize(anchors, dim=1)
    radial = (gradient * unit).sum(1, keepdim=True) * unit
    # Eq. 12 / 18: |w_ac| * ||a|| * sin(theta(a, x_c)) at each negative x_c, summed
    cos = F.normalize(anchors, dim=1) @ F.normalize(candidates, dim=1).t()
    sin = (1 - cos.square()).clamp(min=0).sqrt()
    on_negatives = (neg_w.abs() * sin * anchors.norm(dim=1, keepdim=True)).sum(1)
    tangent_sum = None
    if terms == "anchor":  # Eq. 17: sum_j |w_ij| ||P_a (x_j - x_i)|| over the negatives
        # x_c - x_a, where x_a (candidate a) is anchor a's own pair: (B, B, D)
        diffs = candidates[None, :, :] - candidates[:, None, :]
        along = (diffs * unit[:, None, :]).sum(-1, keepdim=True) * unit[:, None, :]
        lengths = (diffs - along).norm(dim=-1)
        tangent_sum = (neg_w.abs() * lengths).sum(1)
    return GradientComponents(
        direction=direction,
        terms=terms,
        anchors=anchors,
        candidates=candidates,
        weights=weights,
        positives=pos,
        gradient=gradient,
        positive=_project(anchors, pull),
        negatives=_project(anchors, push),
        radial=radial,
        on_negatives=on_negatives,
        tangent_sum=tangent_sum,
    )


def batch_similarities(components: GradientComponents) -> dict[str, float]:
    """The anchors' mean positive cosine and mean hardest-negative cosine (the condition of
    Sec. 3.3's argument: Triplet-HN's gradients vanish as both approach 1; cf. Fig. 4)."""
    a = F.normalize(components.anchors, dim=1)
    c = F.normalize(components.candidates, dim=1)
    cos = a @ c.t()
    negatives = cos.masked_fill(components.positives, -torch.inf).amax(1)
    kept = negatives[torch.isfinite(negatives)]
    return {
        "pos_sim": float(cos.diagonal().mean()),
        "hardest_neg_sim": float(kept.mean()) if kept.numel() else float("nan"),
    }


def component_summary(components: GradientComponents) -> dict[str, float]:
    """The batch means of :meth:`GradientComponents.norms`, keyed ``<direction>_<component>``
    (``i2t_tangent``), with the direction's ``pos_sim`` / ``hardest_neg_sim``
    (:func:`batch_similarities`) likewise prefixed."""
    d = components.direction
    out = {f"{d}_{k}": float(v.mean()) for k, v in components.norms().items()}
    out.update({f"{d}_{k}": v for k, v in batch_similarities(components).items()})
    return out


def gradient_record(
    loss: PairLoss,
    img_emb: torch.Tensor,
    txt_emb: torch.Tensor,
    *,
    img_ids: Ids | None = None,
    terms: Literal["anchor", "all"] = "anchor",
) -> dict[str, Any]:
    """Both directions' :func:`component_summary` of one batch in one flat record (the
    fields of a ``gradients.jsonl`` line besides ``kind``, ``epoch`` and ``step``).

    Raises:
        ValueError: As :func:`gradient_components`.
    """
    record: dict[str, Any] = {
        "loss": getattr(type(loss), "registry_name", type(loss).__name__),
        "terms": terms,
        "batch": int(img_emb.shape[0]),
    }
    for direction in DIRECTIONS:
        parts = gradient_components(
            loss, img_emb, txt_emb, img_ids=img_ids, direction=direction, terms=terms
        )
        record.update(component_summary(parts))
    return record


def summary_keys(record: Mapping[str, Any]) -> list[str]:
    """The component keys of a record, in :data:`DIRECTIONS` x :data:`COMPONENTS` order."""
    return [f"{d}_{c}" for d in DIRECTIONS for c in COMPONENTS if f"{d}_{c}" in record]


__all__ = [
    "COMPONENTS",
    "DIRECTIONS",
    "TERMS",
    "GradientComponents",
    "batch_similarities",
    "check_analysable",
    "component_summary",
    "gradient_components",
    "gradient_record",
    "summary_keys",
]
