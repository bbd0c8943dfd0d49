"""Retrieval metrics: ranks, recall@K and rsum of the papers' protocols, and the metrics that
need a full relevance matrix.

* :mod:`~vlret.metrics.ranking`: the ranking core: each query's rank counted from score blocks
  under a relevance kind (:func:`~vlret.metrics.rank_blocks`, ties against the query), and
  the metrics as functions of those counts (recall@K, medr, meanr, rsum, mAP, mINP,
  R-Precision, mAP@R, zero-shot accuracy).
* :mod:`~vlret.metrics.ranks`: 0-based ranks (ties count against the query), recall@K, rsum,
  median / mean rank, the COCO 5-fold 1K protocol (its folds: :func:`~vlret.metrics.coco_folds`).
* :mod:`~vlret.metrics.stats`: the positive and hardest-negative score statistics.
* :mod:`~vlret.metrics.relevance`: R-Precision and mAP@R in both directions and the ambiguity
  rate, from an ``(N_txt, N_img)`` relevance matrix.
* :mod:`~vlret.metrics.relevance_kinds`: what counts as relevant (image-of-caption,
  any-caption-of-video, same-identity, class-label) as objects with their capabilities, and
  their registry (:func:`~vlret.metrics.get_relevance`).
* :mod:`~vlret.metrics.identity`: identity-level retrieval (person search): R@1/5/10, mAP and
  mINP when every gallery item of the query's identity is relevant.
* :mod:`~vlret.metrics.subsets`: recall@K of a subset of the queries.
* :mod:`~vlret.metrics.zeroshot`: zero-shot classification accuracy (top-1, top-5) and mean
  per-class recall, CLIP_benchmark's metrics.
* :mod:`~vlret.metrics.keys`: the one casing of metric keys (lower case; person search's
  ``identity_t2i_r1``) and the reader of older spellings
  (:func:`~vlret.metrics.normalise_metric_key`).
* :mod:`~vlret.metrics.rescore`: NON-STANDARD inference re-scoring of a score matrix (dual
  softmax, QB-Norm), never to be mixed with standard results.

This package is core: it imports no data format, model, trainer or analysis code.
"""

from .identity import (
    IDENTITY_LABELS,
    IdentityMetrics,
    identity_retrieval_metrics,
    identity_retrieval_metrics_from_embeddings,
)
from .keys import (
    IDENTITY_KEYS,
    IDENTITY_METRIC_KEYS,
    IDENTITY_PREFIX,
    RETRIEVAL_METRIC_KEYS,
    ZEROSHOT_METRICS,
    normalise_metric_key,
    normalise_metric_record,
)
from .ranking import (
    QueryRanks,
    accuracy_at_k,
    block_rows,
    matrix_blocks,
    mean_average_precision,
    mean_inverse_negative_penalty,
    mean_per_class_recall,
    mean_rank,
    median_rank,
    rank_blocks,
    rank_queries,
    recall_at_k,
    rprecision_map_at_r_of,
    rsum,
)
from .ranks import (
    RECALL_KEYS,
    Fold,
    RetrievalMetrics,
    average_metrics,
    coco_5fold_metrics,
    coco_folds,
    fold_blocks,
    metrics_from_ranks,
    retrieval_metrics,
    retrieval_metrics_from_similarity,
    retrieval_ranks,
    retrieval_ranks_from_rows,
    retrieval_ranks_from_similarity,
)
from .relevance import ExtendedMetrics, ambiguity, extended_metrics, rprecision_map_at_r
from .relevance_kinds import (
    AnyCaptionOfVideo,
    ClassLabel,
    ImageOfCaption,
    Relevance,
    SameIdentity,
    get_relevance,
    register_relevance,
    relevance_names,
)
from .rescore import (
    Rescoring,
    draw_bank,
    dual_softmax,
    dual_softmax_rank_keys,
    make_rescoring,
    normalised_queries,
    qb_norm,
    querybank_activation,
    rescored_metrics,
)
from .stats import similarity_stats
from .subsets import SubsetRecall, subset_recalls
from .zeroshot import zeroshot_classification_metrics

__all__ = [
    "QueryRanks",
    "accuracy_at_k",
    "block_rows",
    "matrix_blocks",
    "mean_average_precision",
    "mean_inverse_negative_penalty",
    "mean_per_class_recall",
    "mean_rank",
    "median_rank",
    "rank_blocks",
    "rank_queries",
    "recall_at_k",
    "rprecision_map_at_r_of",
    "rsum",
    "RECALL_KEYS",
    "RETRIEVAL_METRIC_KEYS",
    "ZEROSHOT_METRICS",
    "IDENTITY_KEYS",
    "IDENTITY_LABELS",
    "IDENTITY_METRIC_KEYS",
    "IDENTITY_PREFIX",
    "AnyCaptionOfVideo",
    "ClassLabel",
    "ExtendedMetrics",
    "Fold",
    "IdentityMetrics",
    "ImageOfCaption",
    "Relevance",
    "Rescoring",
    "RetrievalMetrics",
    "SameIdentity",
    "SubsetRecall",
    "ambiguity",
    "average_metrics",
    "coco_5fold_metrics",
    "coco_folds",
    "draw_bank",
    "dual_softmax",
    "dual_softmax_rank_keys",
    "extended_metrics",
    "fold_blocks",
    "get_relevance",
    "identity_retrieval_metrics",
    "identity_retrieval_metrics_from_embeddings",
    "make_rescoring",
    "metrics_from_ranks",
    "normalise_metric_key",
    "normalise_metric_record",
    "normalised_queries",
    "qb_norm",
    "querybank_activation",
    "register_relevance",
    "relevance_names",
    "rescored_metrics",
    "retrieval_metrics",
    "retrieval_metrics_from_similarity",
    "retrieval_ranks",
    "retrieval_ranks_from_rows",
    "retrieval_ranks_from_similarity",
    "rprecision_map_at_r",
    "similarity_stats",
    "subset_recalls",
    "zeroshot_classification_metrics",
]
