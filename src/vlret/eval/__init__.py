"""Evaluation: protocols (:mod:`vlret.eval.protocols`, one record each in a registry), scorers
(:mod:`vlret.eval.scorers`: two-tower, pair-scoring, ensemble, shortlist, re-scored), the one
pipeline :func:`evaluate`, which returns an :class:`Evaluation` that renders its own table and
JSON record, and the tasks (:mod:`vlret.eval.tasks`: retrieval under each protocol and zero-shot
classification, one registry), which ``vlret eval`` runs and ``vlret protocols`` lists.

It sits between the harness (:mod:`vlret.train`, which loads checkpoints and builds datasets,
and the command line) above and the models and data formats below; it never imports the
trainer or a loss.
"""

from .encode import TextTokens, encode_dataset, encode_tokens, pack_words
from .pipeline import (
    Evaluation,
    evaluate,
    format_table,
    identity_ids,
    identity_metrics,
    metrics_record,
)
from .protocols import (
    IDENTITY_METRICS,
    RELEVANCE_KINDS,
    EvalProtocol,
    default_protocol,
    eval_splits,
    get_protocol,
    protocol_names,
    register_protocol,
)
from .scorers import (
    SCORINGS,
    EnsembleScorer,
    EnsembleSplit,
    MatrixScorer,
    Measured,
    PairModelScorer,
    RescoredScorer,
    Scorer,
    ShortlistScorer,
    TwoTowerScorer,
)
from .scores import embedding_scores, mean_pooled_scores, metrics_from_scores, score_matrix
from .shortlist import ShortlistResult, shortlist_metrics
from .tasks import EvalRequest, EvalTask, TaskNeeds, get_task, register_task, task_names

__all__ = [
    "IDENTITY_METRICS",
    "RELEVANCE_KINDS",
    "SCORINGS",
    "EnsembleScorer",
    "EnsembleSplit",
    "EvalProtocol",
    "EvalRequest",
    "EvalTask",
    "Evaluation",
    "MatrixScorer",
    "Measured",
    "PairModelScorer",
    "RescoredScorer",
    "Scorer",
    "ShortlistResult",
    "ShortlistScorer",
    "TaskNeeds",
    "TextTokens",
    "TwoTowerScorer",
    "default_protocol",
    "embedding_scores",
    "encode_dataset",
    "encode_tokens",
    "eval_splits",
    "evaluate",
    "format_table",
    "get_protocol",
    "get_task",
    "identity_ids",
    "identity_metrics",
    "mean_pooled_scores",
    "metrics_from_scores",
    "metrics_record",
    "pack_words",
    "protocol_names",
    "register_protocol",
    "register_task",
    "score_matrix",
    "shortlist_metrics",
    "task_names",
]
