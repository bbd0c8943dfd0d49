"""``train.procedure = "ncr"``: NCR's co-trained networks, per-epoch division, label refinement
and soft margins (Huang et al., NeurIPS 2021; ``docs/ncr.md``).

:mod:`.division` holds the arithmetic (per-pair losses, the Gaussian-mixture split, refined
labels, soft margins), :mod:`.options` the ``train.procedure_options`` and :mod:`.step` the
procedure itself (:class:`NCRStep`), registered here.
"""

from __future__ import annotations

from ....run.config import RunConfig
from ..registry import register_procedure
from .division import (
    SOFT_MARGINS,
    clean_probability,
    min_max,
    noisy_split_quality,
    per_pair_loss,
    predictions,
    refined_labels,
    soft_margin_factor,
    soft_margin_triplet,
    split_clean,
)
from .options import NCROptions
from .step import ENSEMBLE_KEY, RECORD_KIND, NCRStep, division_line


@register_procedure("ncr")
def build_ncr(config: RunConfig) -> NCRStep:
    """The NCR procedure of ``config`` (its ``train.procedure_options``: :class:`NCROptions`)."""
    return NCRStep(config, NCROptions.parse(config.train.procedure_options))


__all__ = [
    "ENSEMBLE_KEY",
    "NCROptions",
    "NCRStep",
    "RECORD_KIND",
    "SOFT_MARGINS",
    "build_ncr",
    "clean_probability",
    "division_line",
    "min_max",
    "noisy_split_quality",
    "per_pair_loss",
    "predictions",
    "refined_labels",
    "soft_margin_factor",
    "soft_margin_triplet",
    "split_clean",
]
