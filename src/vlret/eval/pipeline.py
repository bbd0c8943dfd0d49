"""The evaluation pipeline: :func:`evaluate` measures a scorer on a split under a protocol and
returns an :class:`Evaluation`, which knows its protocol, split and sizes and renders its own
table (:meth:`Evaluation.table`) and JSON record (:meth:`Evaluation.record`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ..metrics import RetrievalMetrics
from .protocols import EvalProtocol, get_protocol
from .scorers import Scorer

#: The relevance kinds whose ranks the retrieval pipeline counts (an image's or video's rank is
#: its best caption's, a caption's its own image's).
_RETRIEVAL_RELEVANCE = ("image-of-caption", "any-caption-of-video")


@dataclass
class Evaluation:
    """What :func:`evaluate` measured: the metrics, the protocol and split, their sizes."""

    metrics: RetrievalMetrics
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
    metrics: RetrievalMetrics, protocol: str | EvalProtocol, *, title: str | None = None
) -> str:
    """The paper-style table: R@1/5/10 both directions, rsum, medr (and each fold);
    ``title`` defaults to the protocol's paper label."""
    chosen = get_protocol(protocol)
    lines = [
        metrics.format_table(title if title is not None else chosen.title, visual=chosen.visual)
    ]
    for k, fold in enumerate(metrics.folds):
        row = fold.format_table().splitlines()[-1]
        lines.append(f"{row}   (fold {k + 1})")
    return "\n".join(lines)


def metrics_record(
    metrics: RetrievalMetrics, *, protocol: str, split: str, **extra: Any
) -> dict[str, Any]:
    """JSON record: the metrics' key names under ``metrics`` (and per fold under ``folds``)."""
    out: dict[str, Any] = {"protocol": protocol, "split": split, **extra}
    out["metrics"] = metrics.as_dict()
    if metrics.folds:
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
    if chosen.relevance not in _RETRIEVAL_RELEVANCE:
        raise ValueError(
            f"protocol {chosen.name}: relevance {chosen.relevance!r} is not ranked by the "
            f"retrieval pipeline (it ranks {', '.join(_RETRIEVAL_RELEVANCE)})"
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


__all__ = ["Evaluation", "evaluate", "format_table", "metrics_record"]
