"""``train.procedure_options`` of ``train.procedure = "ncr"``, with NCR's released defaults."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from .division import SOFT_MARGINS

_KEY = "train.procedure_options"


@dataclass(frozen=True)
class NCROptions:
    """NCR's settings (defaults: XLearning-SCU/2021-NeurIPS-NCR ``run.py``).

    Attributes:
        warmup_epochs: Epochs ``0 .. warmup_epochs - 1`` train both networks on every pair with
            the loss's all-negatives form (released default 1; its README uses 5 on F30K and 10
            on COCO).
        p_threshold: A pair is clean when its clean probability exceeds it (0.5).
        soft_margin: ``s(y)`` of the soft margin: ``exponential`` (default), ``linear``, ``sin``.
        noisy_from: The first epoch whose loss includes the noisy pairs (with their refined
            labels); ``None``: ``warmup_epochs + (epochs - warmup_epochs) // 2``, the release's
            half of the co-training schedule (its warm-up epochs come before its
            ``num_epochs``).
        gmm_max_iter: The mixture's EM iterations (10).
        gmm_tol: The mixture's convergence threshold (1e-2).
        gmm_reg_covar: Added to the mixture's variances (5e-4).
        model_b_seed: The torch seed network B is initialised with (``None``: ``train.seed +
            1``), drawn on a forked generator so the run's own random stream is untouched.
        pass_batch_size: The block size of the per-epoch loss pass, whose per-pair loss is
            measured against the block's other pairs (``None``: ``train.batch_size``, as
            released).
    """

    warmup_epochs: int = 1
    p_threshold: float = 0.5
    soft_margin: str = "exponential"
    noisy_from: int | None = None
    gmm_max_iter: int = 10
    gmm_tol: float = 1e-2
    gmm_reg_covar: float = 5e-4
    model_b_seed: int | None = None
    pass_batch_size: int | None = None

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> NCROptions:
        """The options from a config's ``procedure_options`` table.

        Raises:
            ValueError: An unknown key or a bad value, one line naming
                ``train.procedure_options.KEY``.
        """
        known = [f.name for f in fields(cls)]
        for key in options:
            if key not in known:
                raise ValueError(
                    f"{_KEY}.{key}: not an option of the ncr procedure; known: {', '.join(known)}"
                )
        o = dict(options)
        _integer(o, "warmup_epochs", 0)
        _integer(o, "noisy_from", 0, optional=True)
        _integer(o, "gmm_max_iter", 1)
        _integer(o, "model_b_seed", 0, optional=True)
        _integer(o, "pass_batch_size", 2, optional=True)
        _number(o, "gmm_tol", open_low=0.0)
        _number(o, "gmm_reg_covar", open_low=0.0)
        _number(o, "p_threshold", open_low=0.0, open_high=1.0)
        if "soft_margin" in o and o["soft_margin"] not in SOFT_MARGINS:
            raise ValueError(
                f"{_KEY}.soft_margin: expected one of {', '.join(SOFT_MARGINS)}, "
                f"got {o['soft_margin']!r}"
            )
        return cls(**o)

    def noisy_start(self, epochs: int) -> int:
        """The first epoch that trains on the noisy pairs (:attr:`noisy_from` resolved)."""
        if self.noisy_from is not None:
            return self.noisy_from
        return self.warmup_epochs + max(epochs - self.warmup_epochs, 0) // 2


def _integer(o: dict[str, Any], key: str, low: int, *, optional: bool = False) -> None:
    if key not in o or (optional and o[key] is None):
        return
    value = o[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{_KEY}.{key}: expected an integer >= {low}, got {value!r}")


def _number(
    o: dict[str, Any], key: str, *, open_low: float, open_high: float | None = None
) -> None:
    if key not in o:
        return
    value = o[key]
    bad = isinstance(value, bool) or not isinstance(value, int | float)
    if bad or not value > open_low or (open_high is not None and not value < open_high):
        span = f"in ({open_low:g}, {open_high:g})" if open_high is not None else f"> {open_low:g}"
        raise ValueError(f"{_KEY}.{key}: expected a number {span}, got {value!r}")
    o[key] = float(value)


__all__ = ["NCROptions"]
