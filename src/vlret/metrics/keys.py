"""Metric key names: one casing across protocols, and the reader of older spellings.

Every metric key vlret writes is lower-case snake case, a qualifier first where one is needed:
``i2t_r1``, ``t2i_r10``, ``rsum``, ``t2i_map_at_r``, ``secondary_t2i_r1``, ``acc1``,
``mean_per_class_recall``, and the person-search (identity-level) metrics
``identity_t2i_r1``, ``identity_t2i_r5``, ``identity_t2i_r10``, ``identity_t2i_map``,
``identity_t2i_minp`` (and ``identity_i2t_...``).

Earlier releases wrote the identity-level metrics ``t2i_R1`` ... ``i2t_mINP`` (IRRA's labels),
in ``vlret eval --json`` records, ``metrics.jsonl`` (``dev_t2i_R1``, ``best_t2i_R1``,
``select_on``), ``vlret compare`` results and checkpoints (``select_on``): keys that differed
from the caption-level ``t2i_r1`` only by case, which a person-search run logs too (its own
image only counts). Lower-casing them alone would have given two metrics one name, hence the
``identity_`` qualifier.

:func:`normalise_metric_key` is the one place that maps an older spelling to today's; every
reader of a stored result (metrics logs, evaluation records, comparison results, checkpoints,
``train.select_on``) passes what it reads through it (or :func:`normalise_metric_record` for a
whole record), so files written before the rename read as if written today. Tables keep IRRA's
labels (``R1 ... mINP``) for display: only keys changed.

This module is core: it imports nothing of vlret.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

#: The qualifier of the identity-level (person-search) metric keys: ``identity_t2i_r1``.
IDENTITY_PREFIX = "identity_"
#: The keys of :func:`~vlret.metrics.identity_retrieval_metrics` (one direction), in the order
#: IRRA's table prints them.
IDENTITY_KEYS = ("r1", "r5", "r10", "map", "minp")
#: The keys of :meth:`~vlret.metrics.IdentityMetrics.as_dict` (a person-search record, the dev
#: metrics of a person-search run): ``identity_t2i_r1`` ... ``identity_i2t_minp``, text to
#: image first.
IDENTITY_METRIC_KEYS = tuple(
    f"{IDENTITY_PREFIX}{d}_{k}" for d in ("t2i", "i2t") for k in IDENTITY_KEYS
)
#: The keys of :func:`~vlret.metrics.zeroshot_classification_metrics`, in CLIP_benchmark's
#: order.
ZEROSHOT_METRICS = ("acc1", "acc5", "mean_per_class_recall")
#: The keys of :meth:`~vlret.metrics.RetrievalMetrics.as_dict`, in its field order: the
#: recalls, rsum, then the median and mean ranks.
RETRIEVAL_METRIC_KEYS = (
    "i2t_r1",
    "i2t_r5",
    "i2t_r10",
    "t2i_r1",
    "t2i_r5",
    "t2i_r10",
    "rsum",
    "i2t_medr",
    "t2i_medr",
    "i2t_meanr",
    "t2i_meanr",
)
#: The person-search metric suffixes as written before the rename -> as written today.
OLD_IDENTITY_SUFFIXES: Mapping[str, str] = {
    "R1": "r1",
    "R5": "r5",
    "R10": "r10",
    "mAP": "map",
    "mINP": "minp",
}

# A direction and an old suffix as a whole word of the key (``dev_t2i_R1``, ``best_i2t_mAP``,
# ``t2i_R1_std``), never inside a longer name (``t2i_R10x``) or a different word.
_OLD_KEY = re.compile(
    r"(?<![A-Za-z0-9])(t2i|i2t)_(" + "|".join(OLD_IDENTITY_SUFFIXES) + r")(?![A-Za-z0-9])"
)
# A string value that is one metric key as a whole, with its prefixes (``dev_t2i_R1``): a
# caption or a path that merely contains one is not a key.
_WHOLE_KEY = re.compile(
    r"(?:[a-z0-9]+_)*(t2i|i2t)_(" + "|".join(OLD_IDENTITY_SUFFIXES) + r")(?:_[a-z0-9]+)*"
)


def normalise_metric_key(key: str) -> str:
    """``key`` as vlret writes it today: an older person-search spelling (``t2i_R1``,
    ``dev_i2t_mINP``, ``best_t2i_mAP``) becomes today's (``identity_t2i_r1``,
    ``dev_identity_i2t_minp``, ``best_identity_t2i_map``); any other key is returned
    unchanged (``T2I_R1`` or ``R1`` alone were never written by vlret and stay as they are, so
    a checker still refuses them).

    Args:
        key: A metric key as read from a stored file or a config.

    Returns:
        The key as vlret writes it today.
    """
    return _OLD_KEY.sub(
        lambda m: f"{IDENTITY_PREFIX}{m.group(1)}_{OLD_IDENTITY_SUFFIXES[m.group(2)]}", key
    )


def normalise_metric_record(record: Any) -> Any:
    """A copy of a stored result (a ``metrics.jsonl`` record, an evaluation record, a
    comparison result) with every dictionary key, and every string value that is a whole
    metric key (``"select_on": "t2i_R1"``), in today's spelling (:func:`normalise_metric_key`),
    at any depth (``metrics``, ``folds``, ``synthetic.metrics``). Other values are kept as
    they are (lists are copied, scalars returned).

    Args:
        record: The parsed JSON value.

    Returns:
        The same structure with today's key names.
    """
    if isinstance(record, Mapping):
        return {
            (normalise_metric_key(k) if isinstance(k, str) else k): normalise_metric_record(v)
            for k, v in record.items()
        }
    if isinstance(record, list):
        return [normalise_metric_record(v) for v in record]
    if isinstance(record, str) and _WHOLE_KEY.fullmatch(record):
        return normalise_metric_key(record)
    return record


__all__ = [
    "IDENTITY_KEYS",
    "IDENTITY_METRIC_KEYS",
    "IDENTITY_PREFIX",
    "OLD_IDENTITY_SUFFIXES",
    "RETRIEVAL_METRIC_KEYS",
    "ZEROSHOT_METRICS",
    "normalise_metric_key",
    "normalise_metric_record",
]
