"""Retrieval: one task per registered retrieval protocol (``f30k``, ``coco1k``, ``coco5k``,
``msrvtt-full``, ``msrvtt-1ka``, the person-search protocols, and any protocol registered
later whose relevance the retrieval pipeline ranks, :func:`ranks_by_retrieval`).

It runs as ``vlret eval`` always has: the harness loads the checkpoint(s) or CLIP folder,
opens the split and builds the scorer (:func:`vlret.run.evaluate.prepare_evaluation`), and
:func:`vlret.eval.evaluate` measures it; the table and record are the
:class:`~vlret.eval.Evaluation`'s own, or CLIP_benchmark's ``zeroshot_retrieval`` record
(:func:`vlret.eval.clip_benchmark.retrieval_record`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..clip_benchmark import check_retrieval_request, retrieval_record
from ..pipeline import Evaluation
from ..protocols import EvalProtocol, get_protocol, protocol_names
from .base import EvalRequest, EvalTask, Harness, TaskNeeds


def ranks_by_retrieval(protocol: EvalProtocol) -> bool:
    """Whether :func:`vlret.eval.evaluate` ranks ``protocol``'s relevance (a caption's image
    or video, or a person's every image: a :class:`~vlret.metrics.Relevance` with captions or
    identities), i.e. whether it is a retrieval task."""
    kind = protocol.relevance_kind
    return kind.captions or kind.identities


def retrieval_protocol_names() -> tuple[str, ...]:
    """The registered protocols the retrieval pipeline ranks (:func:`ranks_by_retrieval`), in
    registry order: what ``vlret report``, ``vlret compare`` and ``vlret plot tsne`` accept
    (zero-shot classification ranks classes, not captions or persons: ``vlret eval`` runs it)."""
    return tuple(name for name in protocol_names() if ranks_by_retrieval(get_protocol(name)))


@dataclass(frozen=True)
class RetrievalResult:
    """A retrieval task's result: the :class:`~vlret.eval.Evaluation`."""

    evaluation: Evaluation

    def table(self) -> str:
        """The paper-style table (:meth:`Evaluation.table`)."""
        return self.evaluation.table()

    def record(self, *, json_format: str = "vlret") -> dict[str, Any]:
        """vlret's record (:meth:`Evaluation.record`) or CLIP_benchmark's
        ``zeroshot_retrieval`` record."""
        if json_format == "clip_benchmark":
            return retrieval_record(self.evaluation)
        return self.evaluation.record()


@dataclass(frozen=True)
class PreparedRetrieval:
    """A retrieval evaluation prepared by the harness (a
    :class:`vlret.run.evaluate.PreparedEvaluation`), with what ``--check`` prints."""

    prepared: Any
    request: EvalRequest

    @property
    def notes(self) -> tuple[str, ...]:
        """The defaults taken: checkpoint, data, split."""
        return tuple(self.prepared.notes)

    def summary(self) -> list[str]:
        """Model(s), data, split, protocol, the table's title and the split's size."""
        prepared = self.prepared
        images, texts = prepared.sizes

        def why(key: str) -> str:
            return f" ({prepared.why[key]})" if key in prepared.why else ""

        models = [f"{c}{why(str(c))}" for c in prepared.checkpoints]
        models = models or [f"{self.request.model_dir} (a local Hugging Face CLIP folder)"]
        ensemble = len(prepared.members) > 1
        return [
            f"model: {', '.join(models)}"
            + (f"; an ensemble of {len(prepared.members)}" if ensemble else ""),
            f"data: {prepared.root}{why('data')}",
            f"split: {prepared.split}{why('split')}",
            f"protocol: {prepared.protocol.name}",
            f"title: {prepared.protocol.title_for(prepared.split, images, texts)}",
            f"size: {images} {prepared.protocol.visual}s x {texts} captions",
        ]

    def run(self) -> RetrievalResult:
        """Encode and score: :func:`vlret.eval.evaluate` on what the harness prepared."""
        from .. import evaluate  # looked up when it runs (a caller may wrap it)

        p = self.prepared
        return RetrievalResult(evaluate(p.scorer, p.data, p.protocol, split=p.split))


class RetrievalTask(EvalTask):
    """Retrieval under one protocol: texts query visuals and visuals query texts."""

    options = ("shortlist", "shortlist_from", "rescore", "captions_per_image", "captions_per_video")
    kind = "retrieval"

    @property
    def needs(self) -> TaskNeeds:
        """Checkpoints or a CLIP folder, the protocol's data formats and splits."""
        protocol = self.protocol
        model = (
            "a vlret checkpoint or run folder (its best.pt, else last.pt); several: an ensemble "
            "(the mean of their score matrices); or --model-dir (a local Hugging Face CLIP, on "
            "Karpathy JSON + images)"
        )
        default = "/".join(protocol.paper_splits)
        return TaskNeeds(
            model=model,
            data=f"{' or '.join(protocol.splits)} data (default: the checkpoint's data.root)",
            split=f"{protocol.accepted()} (default: the paper's test split, {default})",
        )

    def check_json_format(self, json_format: str, request: EvalRequest) -> None:
        """CLIP_benchmark's retrieval record holds neither person search, a shortlist nor a
        re-scoring (:func:`vlret.eval.clip_benchmark.check_retrieval_request`)."""
        super().check_json_format(json_format, request)
        if json_format == "clip_benchmark":
            check_retrieval_request(
                self.protocol,
                approximate=request.options.get("shortlist") is not None,
                rescored=request.options.get("rescore") is not None,
            )

    def prepare(self, request: EvalRequest, *, harness: Harness) -> PreparedRetrieval:
        """The harness's :func:`~vlret.run.evaluate.prepare_evaluation` of ``request``."""
        self.check_options(request, flags={})
        return PreparedRetrieval(harness.prepare_retrieval(self.protocol, request), request)


__all__ = [
    "PreparedRetrieval",
    "RetrievalResult",
    "RetrievalTask",
    "ranks_by_retrieval",
    "retrieval_protocol_names",
]
