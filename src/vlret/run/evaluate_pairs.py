"""Deprecated: the evaluation of pair-scoring models moved to :mod:`vlret.eval` (encoding in
:mod:`vlret.eval.encode`, score matrices in :mod:`vlret.eval.scores`, the shortlist protocol in
:mod:`vlret.eval.shortlist`) and the COCO 1K folds to :func:`vlret.metrics.fold_blocks`. The
old names still import from here, with a ``DeprecationWarning``."""

from __future__ import annotations

from .._moved import moved_names

_MOVED = {
    "TextTokens": "vlret.eval.encode",
    "pack_words": "vlret.eval.encode",
    "encode_tokens": "vlret.eval.encode",
    "encoded_images": "vlret.eval.encode",
    "IMAGE_BLOCK": "vlret.eval.scores",
    "TEXT_BLOCK": "vlret.eval.scores",
    "score_matrix": "vlret.eval.scores",
    "metrics_from_scores": "vlret.eval.scores",
    "embedding_scores": "vlret.eval.scores",
    "mean_pooled_scores": "vlret.eval.scores",
    "ShortlistResult": "vlret.eval.shortlist",
    "shortlist_metrics": "vlret.eval.shortlist",
    "fold_blocks": "vlret.metrics",
    "dev_metrics_from_scores": "vlret.run.pair_scoring",
}


__getattr__ = moved_names(__name__, _MOVED)


def __dir__() -> list[str]:
    return sorted(_MOVED)
