"""Scorers: what gives the scores of a split's images x texts, behind one interface.

A :class:`Scorer` measures a split (:meth:`Scorer.measure`); a :class:`MatrixScorer` does so
from its score matrix (:meth:`MatrixScorer.scores`: the blocks asked for, in one CPU float32
``(N_img, N_txt)`` matrix, NaN elsewhere). The implementations:

* :class:`TwoTowerScorer`: a model that embeds images and texts apart; its own metrics are
  counted from the embeddings tile by tile (never a full matrix), its matrix is dot products
  (cosines when its scoring is ``cosine``).
* :class:`PairModelScorer`: a :class:`~vlret.models.PairScorer` (SCAN, BFAN, SGRAF, CE, MMT),
  every image and caption encoded once, pairs scored block by block.
* :class:`EnsembleScorer`: the mean of its members' matrices (each member on its own copy of
  the split, encoded with its own data settings and vocabulary: an :class:`EnsembleSplit`).
* :class:`RescoredScorer`: a NON-STANDARD re-scoring (dual softmax, QB-Norm;
  :mod:`vlret.metrics.rescore`) of another scorer's matrix. It has no score matrix of its own
  (each direction is ranked on its own re-scored matrix), so it is not a :class:`MatrixScorer`
  and is refused as an ensemble member or a shortlist source: re-score the ensemble instead.
* :class:`ShortlistScorer`: the approximate protocol, each query's top-``k`` candidates by a
  two-tower score re-ranked by exact pair scores (:mod:`vlret.eval.shortlist`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import nn

from .._modules import unwrap_model
from ..metrics import (
    RetrievalMetrics,
    coco_5fold_metrics,
    fold_blocks,
    retrieval_metrics,
)
from ..metrics.rescore import Rescoring, rescored_metrics
from ..models import PairScorer
from .encode import TextTokens, encode_dataset, encode_tokens
from .scores import Block, embedding_scores, mean_pooled_scores, metrics_from_scores, score_matrix
from .shortlist import shortlist_metrics

#: How a two-tower model's embeddings are compared: cosine (L2-normalised) or raw dot product.
SCORINGS = ("cosine", "dot")


@dataclass(frozen=True)
class EnsembleSplit:
    """One split as each member of an ensemble reads it (the same images and texts, in the
    same order, each encoded with the member's own settings)."""

    parts: tuple[Any, ...]

    @property
    def txt_to_img(self) -> Any:
        return self.parts[0].txt_to_img

    @property
    def num_images(self) -> int:
        return int(self.parts[0].num_images)

    @property
    def num_captions(self) -> int:
        return int(self.parts[0].num_captions)


@dataclass
class Measured:
    """What a scorer measured on a split: the metrics and what the record says about them."""

    metrics: RetrievalMetrics
    #: the exact score matrix (NaN outside the folds' blocks) when one was built
    scores: torch.Tensor | None = None
    #: the approximate protocol's settings and coverage (JSON ``shortlist``)
    shortlist: dict[str, Any] | None = None
    #: NON-STANDARD re-scoring: the JSON ``rescore`` record and the title's label
    rescore: dict[str, Any] | None = None
    rescore_label: str | None = None
    #: a two-tower scorer's ``(img_emb, txt_emb)`` as scored (normalised for cosine)
    embeddings: tuple[torch.Tensor, torch.Tensor] | None = None


def _blocks(data: Any, folds: int) -> list[Block] | None:
    if folds == 1:
        return None
    return fold_blocks(data.txt_to_img, folds, n_images=int(data.num_images))


class Scorer(ABC):
    """Measures the retrieval metrics of a split under a protocol's folds."""

    #: the checkpoints (or models) behind the scores, for the record
    members: tuple[str, ...] = ()

    @abstractmethod
    def measure(self, data: Any, *, folds: int = 1) -> Measured:
        """The metrics of ``data`` (a dataset; an :class:`EnsembleSplit` for ensembles), the
        mean over ``folds`` equal folds of images (:func:`~vlret.metrics.coco_folds`)."""


class MatrixScorer(Scorer):
    """A scorer with a score matrix; its metrics are the ranks of that matrix."""

    @abstractmethod
    def scores(self, data: Any, *, blocks: Sequence[Block] | None = None) -> torch.Tensor:
        """``(N_img, N_txt)`` float32 CPU scores of the ``blocks`` (all if ``None``), NaN
        elsewhere."""

    def measure(self, data: Any, *, folds: int = 1) -> Measured:
        blocks = _blocks(data, folds)
        sim = self.scores(data, blocks=blocks)
        return Measured(metrics_from_scores(sim, data.txt_to_img, blocks=blocks), scores=sim)


@dataclass
class TwoTowerScorer(MatrixScorer):
    """A two-tower model (``encode_images`` / ``encode_texts``): ``scoring`` ``cosine``
    normalises the embeddings, ``dot`` takes their dot products as they are. ``None`` (the
    default) is the model's own ``scoring`` (:class:`~vlret.models.RetrievalModel`'s, stored
    with its spec), ``cosine`` for a model that does not declare one. ``progress``: bars
    while the images and captions are encoded (:mod:`vlret._progress`)."""

    model: nn.Module
    scoring: str | None = None
    batch_size: int = 256
    device: torch.device | str = "cpu"
    progress: bool = False
    members: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.scoring is None:
            self.scoring = getattr(unwrap_model(self.model), "scoring", "cosine")
        if self.scoring not in SCORINGS:
            raise ValueError(f"scoring must be one of {', '.join(SCORINGS)}, got {self.scoring!r}")
        if isinstance(self.model, PairScorer):
            raise ValueError(f"{type(self.model).__name__} scores pairs: use PairModelScorer")

    def embeddings(self, data: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """``(img_emb, txt_emb)`` of ``data``, normalised when the scoring is cosine."""
        return encode_dataset(
            self.model,
            data,
            batch_size=self.batch_size,
            device=self.device,
            normalize=self.scoring == "cosine",
            progress=self.progress,
        )

    def scores(self, data: Any, *, blocks: Sequence[Block] | None = None) -> torch.Tensor:
        img, txt = self.embeddings(data)
        return embedding_scores(img, txt, blocks=blocks)

    def measure(self, data: Any, *, folds: int = 1) -> Measured:
        # counted from the embeddings tile by tile, without a full score matrix
        img, txt = self.embeddings(data)
        if folds > 1:
            metrics = coco_5fold_metrics(img, txt, data.txt_to_img, n_folds=folds)
        else:
            metrics = retrieval_metrics(img, txt, data.txt_to_img)
        return Measured(metrics, embeddings=(img, txt))


@dataclass
class PairModelScorer(MatrixScorer):
    """A pair-scoring model: every image's regions and caption's words encoded once
    (:func:`~vlret.eval.encode.encode_tokens`), pairs scored block by block on ``device``.
    ``progress``: bars while they are encoded and while the pairs are scored
    (:mod:`vlret._progress`)."""

    model: nn.Module
    batch_size: int = 256
    device: torch.device | str = "cpu"
    progress: bool = False
    members: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.model, PairScorer):
            raise ValueError(
                f"{type(self.model).__name__} is not a PairScorer (encode_images, "
                "encode_texts, token_lengths, score); use TwoTowerScorer"
            )

    def tokens(self, data: Any) -> tuple[torch.Tensor, TextTokens]:
        """``(regions, words)`` of every image and caption of ``data``."""
        return encode_tokens(
            self.model, data, batch_size=self.batch_size, device=self.device, progress=self.progress
        )

    def scores(self, data: Any, *, blocks: Sequence[Block] | None = None) -> torch.Tensor:
        regions, texts = self.tokens(data)
        return score_matrix(
            self.model, regions, texts, device=self.device, blocks=blocks, progress=self.progress
        )


@dataclass
class EnsembleScorer(MatrixScorer):
    """The mean of the members' score matrices; member ``i`` scores ``data.parts[i]``."""

    scorers: Sequence[MatrixScorer]
    members: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.scorers:
            raise ValueError("scorers: an ensemble needs at least one member")
        for i, scorer in enumerate(self.scorers):
            if not isinstance(scorer, MatrixScorer):
                raise ValueError(
                    f"scorers[{i}]: an ensemble averages score matrices; "
                    f"{type(scorer).__name__} has none (to re-score an ensemble, wrap it: "
                    "RescoredScorer(EnsembleScorer([...])))"
                )

    def scores(self, data: Any, *, blocks: Sequence[Block] | None = None) -> torch.Tensor:
        parts = _parts(data, len(self.scorers))
        sim: torch.Tensor | None = None
        for scorer, part in zip(self.scorers, parts, strict=True):
            scores = scorer.scores(part, blocks=blocks)
            sim = scores if sim is None else sim.add_(scores)
        assert sim is not None  # one member at least
        sim /= len(self.scorers)
        return sim


def _parts(data: Any, n: int) -> tuple[Any, ...]:
    parts = data.parts if isinstance(data, EnsembleSplit) else (data,) * n
    if len(parts) != n:
        raise ValueError(f"data: one split per ensemble member expected ({n}), got {len(parts)}")
    return parts


@dataclass
class RescoredScorer(Scorer):
    """NON-STANDARD: ``inner``'s score matrix re-scored by ``rescoring`` before the ranks
    (:func:`~vlret.metrics.rescored_metrics`; COCO 1K: each fold's block on its own). QB-Norm's
    querybank is ``bank``: the test images with the bank's captions as texts, scored by
    ``inner`` (text x image)."""

    inner: MatrixScorer
    rescoring: Rescoring
    bank: Any = None
    members: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if not isinstance(self.inner, MatrixScorer):
            raise ValueError(
                f"inner: re-scoring needs a score matrix; {type(self.inner).__name__} has none"
            )
        if self.rescoring.needs_bank and self.bank is None:
            raise ValueError(f"rescore {self.rescoring.method}: needs a querybank (bank)")
        self.members = self.members or self.inner.members

    def scores(self, data: Any, *, blocks: Sequence[Block] | None = None) -> torch.Tensor:
        """Refused: a re-scoring ranks image queries and text queries on different matrices
        (dual softmax: one per direction; QB-Norm: text queries only), so no single matrix
        stands for it; returning the inner matrix would silently drop the re-scoring."""
        raise ValueError(
            f"rescore {self.rescoring.method} ranks each direction on its own re-scored matrix "
            "and has no single score matrix (to use as an ensemble member or a shortlist "
            "source): re-score the ensemble instead, RescoredScorer(EnsembleScorer([...]))"
        )

    def measure(self, data: Any, *, folds: int = 1) -> Measured:
        blocks = _blocks(data, folds)
        sim = self.inner.scores(data, blocks=blocks)
        bank = self.inner.scores(self.bank).t() if self.rescoring.needs_bank else None
        metrics, info = rescored_metrics(
            sim, data.txt_to_img, self.rescoring, bank_sim=bank, blocks=blocks
        )
        return Measured(
            metrics,
            scores=sim,
            rescore=self.rescoring.record(info),
            rescore_label=self.rescoring.label(info),
        )


@dataclass
class ShortlistScorer(Scorer):
    """Approximate: each query's top-``k`` candidates by a two-tower score, re-ranked by the
    exact scores of ``pairs`` (their mean). The two-tower score is ``source`` (a two-tower
    scorer and its copy of the split) or, by default, the cosine of each pair model's own
    mean-pooled region and word features (the members' mean)."""

    pairs: Sequence[PairModelScorer]
    k: int
    source: tuple[TwoTowerScorer, Any] | None = None
    source_name: str = ""
    members: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise ValueError(f"shortlist: expected a positive number of candidates, got {self.k!r}")
        if not self.pairs:
            raise ValueError("pairs: the shortlist re-ranks with at least one pair scorer")
        for i, pair in enumerate(self.pairs):
            if not isinstance(pair, PairModelScorer):
                raise ValueError(
                    f"pairs[{i}]: the shortlist re-ranks by exact pair scores, a "
                    f"PairModelScorer's; got {type(pair).__name__}"
                )
        if self.source is not None and not isinstance(self.source[0], TwoTowerScorer):
            raise ValueError(
                "source: the shortlists come from a TwoTowerScorer's scores; got "
                f"{type(self.source[0]).__name__}"
            )

    def measure(self, data: Any, *, folds: int = 1) -> Measured:
        blocks = _blocks(data, folds)
        parts = _parts(data, len(self.pairs))
        tokens = [p.tokens(part) for p, part in zip(self.pairs, parts, strict=True)]
        if self.source is None:
            what = "cosine of the mean-pooled region and word features"
            pooled = sum(mean_pooled_scores(r, t, blocks=blocks) for r, t in tokens)
            tt = cast(torch.Tensor, pooled) / len(tokens)  # a sum of one tensor or more
        else:
            what = f"cosine of the two-tower checkpoint {self.source_name}"
            tt = self.source[0].scores(self.source[1], blocks=blocks)
        first = self.pairs[0]
        result = shortlist_metrics(
            [p.model for p in self.pairs],
            [r for r, _ in tokens],
            [t for _, t in tokens],
            data.txt_to_img,
            tt,
            k=self.k,
            device=first.device,
            blocks=blocks,
            progress=first.progress,
        )
        info = {
            "k": self.k,
            "k_i2t": result.k_i2t,
            "k_t2i": result.k_t2i,
            "source": what,
            "i2t_ground_truth_in_shortlist": result.i2t_in_shortlist,
            "t2i_ground_truth_in_shortlist": result.t2i_in_shortlist,
            "pairs_scored": result.pairs_scored,
        }
        return Measured(result.metrics, shortlist=info)


__all__ = [
    "SCORINGS",
    "EnsembleScorer",
    "EnsembleSplit",
    "MatrixScorer",
    "Measured",
    "PairModelScorer",
    "RescoredScorer",
    "Scorer",
    "ShortlistScorer",
    "TwoTowerScorer",
]
