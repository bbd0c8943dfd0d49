"""``train.procedure_options`` of ``train.procedure = "ncr"``, with NCR's released defaults."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...._settings import OneOf, Range, setting
from ..options import procedure_options
from .division import SOFT_MARGINS


@dataclass(frozen=True)
class NCROptions:
    """NCR's settings (defaults: XLearning-SCU/2021-NeurIPS-NCR ``run.py``), one declared field
    per option (:func:`vlret._settings.setting`: its default, constraint and description; the
    key reference lists them as ``train.procedure_options.<key>``)."""

    warmup_epochs: int = setting(
        1,
        "epochs 0 .. warmup_epochs - 1 train both networks on every pair with the loss's "
        "all-negatives form (released default 1; its README uses 5 on F30K and 10 on COCO)",
        spec=Range(integer=True, ge=0),
    )
    p_threshold: float = setting(
        0.5,
        "a pair is clean when its clean probability exceeds it",
        spec=Range(gt=0, lt=1),
    )
    soft_margin: str = setting(
        "exponential", "s(y) of the soft margin", spec=OneOf(tuple(SOFT_MARGINS))
    )
    noisy_from: int | None = setting(
        None,
        "the first epoch whose loss includes the noisy pairs (with their refined labels); null: "
        "warmup_epochs + (epochs - warmup_epochs) // 2, the release's half of the co-training "
        "schedule (its warm-up epochs come before its num_epochs)",
        spec=Range(integer=True, ge=0),
    )
    gmm_max_iter: int = setting(10, "the mixture's EM iterations", spec=Range(integer=True, ge=1))
    gmm_tol: float = setting(1e-2, "the mixture's convergence threshold", spec=Range(gt=0))
    gmm_reg_covar: float = setting(5e-4, "added to the mixture's variances", spec=Range(gt=0))
    model_b_seed: int | None = setting(
        None,
        "the torch seed network B is initialised with (null: train.seed + 1), drawn on a forked "
        "generator so the run's own random stream is untouched",
        spec=Range(integer=True, ge=0),
    )
    pass_batch_size: int | None = setting(
        None,
        "the block size of the per-epoch loss pass, whose per-pair loss is measured against the "
        "block's other pairs (null: train.batch_size, as released)",
        spec=Range(integer=True, ge=2),
    )

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> NCROptions:
        """The options from a config's ``procedure_options`` table.

        Raises:
            ValueError: An unknown key or a bad value, one line naming
                ``train.procedure_options.KEY``.
        """
        return procedure_options(cls, options, unknown="not an option of the ncr procedure; known")

    def noisy_start(self, epochs: int) -> int:
        """The first epoch that trains on the noisy pairs (:attr:`noisy_from` resolved)."""
        if self.noisy_from is not None:
            return self.noisy_from
        return self.warmup_epochs + max(epochs - self.warmup_epochs, 0) // 2


__all__ = ["NCROptions"]
