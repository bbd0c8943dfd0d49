"""Argument checks and row blocks shared by the re-scoring methods of
:mod:`vlret.metrics.rescore` (dual softmax, QB-Norm): the score matrices they accept, their
positive parameters, the parameters whose scaled scores float64 could not hold
(:class:`RescoreParameterError`), and the row blocks of their chunked computations.

This module is core: it imports torch and :mod:`vlret._checks` only.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .._checks import check_finite

#: scores per row block of the chunked computations (float64: 128 MiB)
_BLOCK_SCORES = 1 << 24
#: the largest |score| / temperature (|beta x score|) re-scored: float64 holds it, and the logs
#: of the re-scored values (a few times it) with room to spare
_MAX_LOGIT = 1e300


def _matrix(sim: Any, name: str) -> torch.Tensor:
    if not isinstance(sim, torch.Tensor) or sim.dim() != 2 or not sim.dtype.is_floating_point:
        raise ValueError(f"{name} must be a 2-D floating-point tensor, got {_describe(sim)}")
    if 0 in sim.shape:
        raise ValueError(f"{name} must not be empty, got shape {tuple(sim.shape)}")
    check_finite(sim, name)
    return sim


def _describe(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"a {x.dim()}-D {x.dtype} tensor"
    return type(x).__name__


def _positive(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return float(value)


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


class RescoreParameterError(ValueError):
    """A re-scoring parameter that the scores cannot be re-scored with; :attr:`param` is the
    :class:`Rescoring` field (a command line names its flag instead)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param} {message}")
        self.param = param
        self.detail = message


def _check_logits(largest: float, param: str, value: float, which: str) -> None:
    """Refuse a temperature / beta that scales the largest |score| beyond :data:`_MAX_LOGIT`."""
    if not largest <= _MAX_LOGIT:
        raise RescoreParameterError(
            param,
            f"{value!r} is {which} for these scores: the largest |score| scaled by it is "
            f"{largest:.3g}, above {_MAX_LOGIT:g} (float64 would overflow)",
        )


def _row_spans(n_rows: int, n_cols: int) -> list[tuple[int, int]]:
    step = max(1, _BLOCK_SCORES // max(n_cols, 1))
    return [(a, min(a + step, n_rows)) for a in range(0, n_rows, step)]


__all__ = ["RescoreParameterError"]
