"""AdaCL hyper-parameters and argument checks, validated in one place.

:class:`AdaCLConfig` holds the hyper-parameters of :class:`~vlret.losses.AdaCLLoss`;
``ADACL_PARAMS`` declares the constraint of each (read by the module, the registry and the
config) and :func:`check_relations` the constraints between them. The ``check_*`` functions
validate the arguments of the pure functions (:func:`~vlret.losses.adacl_loss`,
:func:`~vlret.losses.adacl_margins`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ..._checks import (
    FLAG,
    NON_NEGATIVE,
    POSITIVE,
    REAL,
    Choice,
    Number,
    ParamError,
    check_declared,
)

#: Anchor selection rules on Delta S (paper Table 5).
ANCHOR_SELECTIONS = ("median", "min", "max", "random")

#: Reasons for keeping the previous margins, in the order they are checked.
GUARDS = ("degenerate_variance", "empty_clone_set", "anchor_ge_one", "nonfinite_margins")

#: The paper's settings (Sec. 4.1): p_u = 0.03, eps = e^-7, m1 = 20 and m2 = 0.1 initially.
DEFAULT_P_U = 0.03
DEFAULT_EPS = math.exp(-7)

#: Constraints of the hyper-parameters: ``m2`` is a shift (any real), ``p_u`` and ``eps`` are
#: probabilities (Eq. 4, 6), anchors are similarities.
ADACL_PARAMS = {
    "m1_init": POSITIVE,
    "m2_init": REAL,
    "p_u": Number(gt=0, lt=1),
    "eps": Number(gt=0, lt=1),
    "anchor_selection": Choice(ANCHOR_SELECTIONS),
    "top_k": Number(integer=True, ge=2, optional=True),
    "margin_momentum": Number(ge=0, lt=1),
    "negative_temperature": POSITIVE,
    "scale_negatives": FLAG,
    "warmup_steps": Number(integer=True, ge=0),
    "min_variance": NON_NEGATIVE,
    "max_anchor": Number(le=1),
    "max_m1": Number(gt=0, optional=True),
    "seed": Number(integer=True),
    "queue_size": Number(integer=True, ge=0),
    "embed_dim": Number(integer=True, ge=1, optional=True),
    "sync_margins": FLAG,
}


@dataclass(frozen=True)
class AdaCLConfig:
    """Hyper-parameters of :class:`~vlret.losses.AdaCLLoss`; validated on construction.

    Defaults are the paper's (Sec. 4.1, A.10). The module's docstring describes each one.

    Raises:
        ParamError: A value outside ``ADACL_PARAMS`` or a violated :func:`check_relations`.
    """

    m1_init: float = 20.0
    m2_init: float = 0.1
    p_u: float = DEFAULT_P_U
    eps: float = DEFAULT_EPS
    anchor_selection: str = "median"
    top_k: int | None = None
    margin_momentum: float = 0.0
    negative_temperature: float = 1.0
    scale_negatives: bool = False
    warmup_steps: int = 0
    min_variance: float = 1e-12
    max_anchor: float = 1.0
    max_m1: float | None = None
    seed: int = 0
    queue_size: int = 0
    embed_dim: int | None = None
    sync_margins: bool = True

    def __post_init__(self) -> None:
        values = dataclasses.asdict(self)
        check_declared(ADACL_PARAMS, values)
        check_relations(values)


def check_relations(params: Mapping[str, Any]) -> None:
    """Constraints between the hyper-parameters (each one already valid).

    Args:
        params: Every hyper-parameter by name.

    Raises:
        ParamError: ``p_u + eps >= 1`` (Eq. 20 then gives no positive ``m1``),
            ``scale_negatives`` with a ``negative_temperature`` other than 1, or a queue
            (``queue_size > 0``) without ``embed_dim``.
    """
    if params["p_u"] + params["eps"] >= 1.0:
        raise ParamError(
            "p_u", f"p_u + eps must be below 1, got p_u={params['p_u']!r}, eps={params['eps']!r}"
        )
    try:
        check_scale_negatives(params["scale_negatives"], params["negative_temperature"])
    except ValueError as err:
        raise ParamError("scale_negatives", str(err)) from None
    if params["queue_size"] and params["embed_dim"] is None:
        raise ParamError("embed_dim", "embed_dim is required when queue_size > 0")


def check_margin(value: float | torch.Tensor, name: str, *, positive: bool) -> None:
    """A margin of Eq. (3): a real number or a 0-dim tensor, finite (and > 0 if ``positive``).

    Raises:
        ValueError: Naming ``name``.
    """
    if isinstance(value, torch.Tensor):
        if value.dim() != 0:
            raise ValueError(f"{name} must be a scalar, got shape {tuple(value.shape)}")
        v = float(value.detach())
    elif isinstance(value, int | float) and not isinstance(value, bool):
        v = float(value)
    else:
        raise ValueError(f"{name} must be a real number, got {type(value).__name__}")
    if not math.isfinite(v) or (positive and v <= 0):
        kind = "a positive finite number" if positive else "a finite number"
        raise ValueError(f"{name} must be {kind}, got {v!r}")


def check_temperature(value: float) -> float:
    """``negative_temperature`` as a positive finite float.

    Raises:
        ValueError: Any other value.
    """
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 < value < math.inf:
        raise ValueError(f"negative_temperature must be a positive finite number, got {value!r}")
    return float(value)


def check_scale_negatives(scale_negatives: bool, temperature: float) -> None:
    """``scale_negatives`` is a bool and excludes a ``negative_temperature`` other than 1.

    Raises:
        ValueError: Either rule is broken.
    """
    if not isinstance(scale_negatives, bool):
        raise ValueError(f"scale_negatives must be a bool, got {scale_negatives!r}")
    if scale_negatives and temperature != 1.0:
        raise ValueError(
            "scale_negatives=True scales the negatives by m1; it excludes a "
            f"negative_temperature other than 1, got {temperature!r}"
        )


def check_probabilities(p_u: float, eps: float) -> None:
    """``p_u`` and ``eps`` in (0, 1) with ``p_u + eps < 1`` (Eq. 20 needs a positive ``m1``).

    Raises:
        ValueError: Naming the argument.
    """
    if not (isinstance(p_u, int | float) and 0.0 < p_u < 1.0):
        raise ValueError(f"p_u must be a probability in (0, 1), got {p_u!r}")
    if not (isinstance(eps, int | float) and 0.0 < eps < 1.0):
        raise ValueError(f"eps must be in (0, 1), got {eps!r}")
    if p_u + eps >= 1.0:
        raise ValueError(f"p_u + eps must be below 1, got p_u={p_u!r}, eps={eps!r}")


def check_selection(selection: str, top_k: int | None, min_variance: float) -> None:
    """The anchor selection's arguments (Eq. 11, A.10).

    Raises:
        ValueError: An unknown ``selection``, a ``top_k`` that is not ``None`` or an int >= 2,
            or a negative ``min_variance``.
    """
    if selection not in ANCHOR_SELECTIONS:
        raise ValueError(f"selection must be one of {ANCHOR_SELECTIONS}, got {selection!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 2):
        raise ValueError(f"top_k must be None or an integer >= 2, got {top_k!r}")
    if not (isinstance(min_variance, int | float) and min_variance >= 0):
        raise ValueError(f"min_variance must be a non-negative number, got {min_variance!r}")
