"""The evaluation pipeline: :func:`evaluate` measures a scorer on a split under a protocol and
returns an :class:`Evaluation`, which knows its protocol, split and sizes and renders its own
table (:meth:`Evaluation.table`) and JSON record (:meth:`Evaluation.record`).

A ``same-identity`` protocol (person search: ``cuhk-pedes``, ``icfg-pedes``, ``rstpreid``) is
ranked by :func:`~vlret.metrics.identity_retrieval_metrics` in both directions, with the data
set's ``image_identity`` as each image's person and ``image_identity[txt_to_img]`` as each
caption's; its :class:`Evaluation` holds an :class:`~vlret.metrics.IdentityMetrics`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ..metrics import (
    IdentityMetrics,
    RetrievalMetrics,
    get_relevance,
    identity_retrieval_metrics,
    identity_retrieval_metrics_from_embeddings,
    relevance_names,
)
from .protocols import EvalProtocol, get_protocol
from .scorers import EnsembleSplit, MatrixScorer, Scorer, TwoTowerScorer


@dataclass
class Evaluation:
    """What :func:`evaluate` measured: the metrics, the protocol and split, their sizes."""

    #: the retrieval metrics; an :class:`~vlret.metrics.IdentityMetrics` (both directions) under
    #: a ``same-identity`` protocol
    metrics: RetrievalMetrics | IdentityMetrics
    n_images: int
    n_texts: int
    #: the checkpoints whose score matrices were averaged (empty or one: a single model)
    members: tuple[str, ...] = ()
    #: the approximate shortlist protocol's settings and coverage; ``None`` = exact protocol
    shortlist: dict[str, Any] | None = None
    #: the exact ``(N_img, N_txt)`` score matrix of pair-scoring models and ensembles (NaN
    #: outside the COCO 1K fold blocks), kept so a caller can compute more from it
    scores: torch.Tensor | None = None
    #: NON-STANDARD re-scoring: the JSON ``rescore`` record and the title's label; else ``None``
    rescore: dict[str, Any] | None = None
    rescore_label: str | None = None
    #: the protocol and the split name it was measured under (``None`` when not given)
    protocol: EvalProtocol | None = None
    split: str | None = None
    #: a two-tower scorer's ``(img_emb, txt_emb)`` as it scored them (normalised for cosine)
    embeddings: tuple[torch.Tensor, torch.Tensor] | None = field(
        default=None, repr=False, compare=False
    )
    #: the scorer and the split it measured, so a caller computes more from the same inputs
    #: (the comparison's synthetic-world extras) instead of rebuilding them
    scorer: Scorer | None = field(default=None, repr=False, compare=False)
    data: Any = field(default=None, repr=False, compare=False)

    @property
    def approximate(self) -> bool:
        return self.shortlist is not None

    def _protocol(self, protocol: str | EvalProtocol | None) -> EvalProtocol:
        chosen = protocol if protocol is not None else self.protocol
        if chosen is None:
            raise ValueError("protocol: this evaluation does not carry one; pass it")
        return get_protocol(chosen)

    def title(self, *, protocol: str | EvalProtocol | None = None, split: str | None = None) -> str:
        """The protocol's title for what was scored (:meth:`EvalProtocol.title_for`), plus
        the ensemble's members, the approximate protocol and the re-scoring label."""
        split = split if split is not None else self.split
        title = self._protocol(protocol).title_for(split, self.n_images, self.n_texts)
        if len(self.members) > 1:
            members = ", ".join(self.members)
            title += f"\nensemble of {len(self.members)} (mean of score matrices): {members}"
        if self.shortlist is not None:
            info = self.shortlist
            capped = ""
            if min(info["k_i2t"], info["k_t2i"]) < info["k"]:  # fewer candidates than K
                capped = f" (at most the candidates: i2t {info['k_i2t']}, t2i {info['k_t2i']})"
            title += (
                f"\napproximate protocol (not the exact evaluation): top-{info['k']}{capped} "
                "shortlists by "
                f"the {info['source']}, re-ranked by exact scores; ground truth shortlisted for "
                f"{100 * info['i2t_ground_truth_in_shortlist']:.1f}% of i2t and "
                f"{100 * info['t2i_ground_truth_in_shortlist']:.1f}% of t2i queries"
            )
        if self.rescore_label is not None:
            title = f"{self.rescore_label}\n{title}"
        return title

    def table(self, *, protocol: str | EvalProtocol | None = None, split: str | None = None) -> str:
        """The paper-style table under :meth:`title` (:func:`format_table`)."""
        chosen = self._protocol(protocol)
        return format_table(self.metrics, chosen, title=self.title(protocol=chosen, split=split))

    def record(
        self, *, protocol: str | EvalProtocol | None = None, split: str | None = None
    ) -> dict[str, Any]:
        """The ``--json`` record: :func:`metrics_record` with the checkpoint(s), title, sizes,
        ``approximate``, (approximate protocol) ``shortlist``, (re-scored) ``standard: false``
        and ``rescore``."""
        chosen = self._protocol(protocol)
        split = split if split is not None else self.split
        if split is None:
            raise ValueError("split: this evaluation does not carry one; pass it")
        names: dict[str, Any] = {}
        if len(self.members) == 1:
            names = {"checkpoint": self.members[0]}
        elif len(self.members) > 1:
            names = {"checkpoints": list(self.members), "ensemble": "mean of score matrices"}
        extra: dict[str, Any] = {"approximate": self.approximate}
        if self.shortlist is not None:
            extra["shortlist"] = dict(self.shortlist)
        if self.rescore is not None:
            extra.update(standard=False, rescore=dict(self.rescore))
        return metrics_record(
            self.metrics,
            protocol=chosen.name,
            split=split,
            **names,
            title=self.title(protocol=chosen, split=split),
            n_images=self.n_images,
            n_texts=self.n_texts,
            **extra,
        )


def format_table(
    metrics: RetrievalMetrics | IdentityMetrics,
    protocol: str | EvalProtocol,
    *,
    title: str | None = None,
) -> str:
    """The paper-style table: R@1/5/10 both directions, rsum, medr (and each fold); person
    search (:class:`~vlret.metrics.IdentityMetrics`): IRRA's rows t2i and i2t of R1 R5 R10 mAP
    mINP. ``title`` defaults to the protocol's paper label."""
    chosen = get_protocol(protocol)
    if isinstance(metrics, IdentityMetrics):
        return metrics.format_table(title if title is not None else chosen.title)
    lines = [
        metrics.format_table(title if title is not None else chosen.title, visual=chosen.visual)
    ]
    for k, fold in enumerate(metrics.folds):
        row = fold.format_table().splitlines()[-1]
        lines.append(f"{row}   (fold {k + 1})")
    return "\n".join(lines)


def metrics_record(
    metrics: RetrievalMetrics | IdentityMetrics, *, protocol: str, split: str, **extra: Any
) -> dict[str, Any]:
    """JSON record: the metrics' key names under ``metrics`` (and per fold under ``folds``;
    person search: ``identity_t2i_r1`` ... ``identity_i2t_minp`` and the split's
    ``n_identities``)."""
    out: dict[str, Any] = {"protocol": protocol, "split": split, **extra}
    out["metrics"] = metrics.as_dict()
    if isinstance(metrics, IdentityMetrics):
        out["n_identities"] = metrics.identities
    elif metrics.folds:
        out["folds"] = [f.as_dict() for f in metrics.folds]
    return out


def evaluate(
    scorer: Scorer, data: Any, protocol: str | EvalProtocol, *, split: str | None = None
) -> Evaluation:
    """Measure ``scorer`` on ``data`` (a dataset with ``txt_to_img``, ``num_images`` and
    ``num_captions``; an :class:`~vlret.eval.scorers.EnsembleSplit` for an ensemble) under
    ``protocol`` (a registered name or record); ``split`` names the split in the title and
    record."""
    chosen = get_protocol(protocol)
    kind = chosen.relevance_kind
    if kind.identities:
        return _identity_evaluation(scorer, data, chosen, split)
    if not kind.captions:
        ranked = (get_relevance(name) for name in relevance_names())
        ranks = ", ".join(k.name for k in ranked if k.captions or k.identities)
        raise ValueError(
            f"protocol {chosen.name}: relevance {chosen.relevance!r} is not ranked by the "
            f"retrieval pipeline (it ranks {ranks})"
        )
    if not isinstance(scorer, Scorer):
        raise ValueError(f"scorer: expected a vlret.eval Scorer, got {type(scorer).__name__}")
    chosen.check_folds(int(data.num_images))  # the protocol's words before the core's
    measured = scorer.measure(data, folds=chosen.folds)
    return Evaluation(
        measured.metrics,
        n_images=int(data.num_images),
        n_texts=int(data.num_captions),
        members=scorer.members,
        shortlist=measured.shortlist,
        scores=measured.scores,
        rescore=measured.rescore,
        rescore_label=measured.rescore_label,
        protocol=chosen,
        split=split,
        embeddings=measured.embeddings,
        scorer=scorer,
        data=data,
    )


def identity_ids(data: Any, protocol: EvalProtocol) -> tuple[torch.Tensor, torch.Tensor]:
    """``(caption ids, image ids)``: the person of each caption (its image's,
    ``image_identity[txt_to_img]``) and of each image, from ``data`` (a dataset with
    ``image_identity``; an ensemble's first part). A data set without identities is refused in
    ``protocol``'s words."""
    first = data.parts[0] if isinstance(data, EnsembleSplit) else data
    ids = getattr(first, "image_identity", None)
    if ids is None:
        raise ValueError(
            f"protocol {protocol.name} ranks by person identity, and this "
            f"{type(first).__name__} has none (image_identity is None): evaluate "
            f"{' or '.join(protocol.splits)} data"
        )
    img_ids = torch.as_tensor(ids)
    if img_ids.dim() != 1 or img_ids.numel() != int(data.num_images):
        raise ValueError(
            f"image_identity must hold one id per image ({int(data.num_images)}), got shape "
            f"{tuple(img_ids.shape)}"
        )
    img_ids = img_ids.to(torch.long)
    return img_ids[torch.as_tensor(data.txt_to_img, dtype=torch.long)], img_ids


def identity_metrics(
    scorer: Scorer, data: Any, protocol: EvalProtocol
) -> tuple[IdentityMetrics, tuple[torch.Tensor, torch.Tensor] | None, torch.Tensor | None]:
    """Both directions of a same-identity protocol: ``(metrics, embeddings, scores)``. A
    two-tower scorer's embeddings are scored block by block as they are ranked (no full
    matrix); another :class:`~vlret.eval.scorers.MatrixScorer`'s ``(N_img, N_txt)`` matrix is
    ranked as it is (captions x images through its transpose)."""
    txt_ids, img_ids = identity_ids(data, protocol)
    if isinstance(scorer, TwoTowerScorer):
        img, txt = scorer.embeddings(data)
        t2i = identity_retrieval_metrics_from_embeddings(txt, img, txt_ids, img_ids)
        i2t = identity_retrieval_metrics_from_embeddings(img, txt, img_ids, txt_ids)
        n = len(torch.unique(img_ids))
        return IdentityMetrics(t2i, i2t, identities=n), (img, txt), None
    if not isinstance(scorer, MatrixScorer):
        raise ValueError(
            f"protocol {protocol.name}: {type(scorer).__name__} has no exact score matrix to "
            "rank by identity (a two-tower, pair-scoring or ensemble scorer has)"
        )
    sim = scorer.scores(data)
    t2i = identity_retrieval_metrics(sim.t(), txt_ids, img_ids)
    i2t = identity_retrieval_metrics(sim, img_ids, txt_ids)
    return IdentityMetrics(t2i, i2t, identities=len(torch.unique(img_ids))), None, sim


def _identity_evaluation(
    scorer: Scorer, data: Any, protocol: EvalProtocol, split: str | None
) -> Evaluation:
    if not isinstance(scorer, Scorer):
        raise ValueError(f"scorer: expected a vlret.eval Scorer, got {type(scorer).__name__}")
    metrics, embeddings, scores = identity_metrics(scorer, data, protocol)
    return Evaluation(
        metrics,
        n_images=int(data.num_images),
        n_texts=int(data.num_captions),
        members=scorer.members,
        scores=scores,
        protocol=protocol,
        split=split,
        embeddings=embeddings,
        scorer=scorer,
        data=data,
    )


__all__ = [
    "Evaluation",
    "evaluate",
    "format_table",
    "identity_ids",
    "identity_metrics",
    "metrics_record",
]
