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
    ParamSpec,
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
ADACL_PARAMS: dict[str, ParamSpec] = {
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
    """Hyper-parameters of :class:`~vlret.losses.AdaCLLoss`, the paper's defaults (Sec. 4.1).

    Attributes:
        m1_init: Initial scale ``m1`` of the positive logit (Eq. 3).
        m2_init: Initial shift ``m2``.
        p_u: The anchor's probability under Eq. (3) (Eq. 4).
        eps: One minus the probability of a positive of similarity 1 (Eq. 6).
        anchor_selection: The rule on Delta S: ``"median"``, ``"min"``, ``"max"``, ``"random"``
            (Eq. 11, Table 5).
        top_k: Fit each GDA class on its ``top_k`` largest scores (A.10), or ``None``.
        margin_momentum: ``mu``: an accepted update is ``m <- mu m_prev + (1 - mu) m_new``.
        negative_temperature: Divides every negative logit (not in the paper; 1: Eq. 3).
        scale_negatives: Negative logits ``m1 s_ij`` (not in the paper); needs temperature 1.
        warmup_steps: Training batches trained with the initial margins.
        min_variance: A GDA variance at or below this is degenerate (a guard).
        max_anchor: Anchors at or above this are refused (a guard).
        max_m1: Cap on ``m1`` (``m2`` then from Eq. 22), or ``None``.
        seed: Seed of the module's own generator (``anchor_selection="random"``).
        queue_size: Entries of each memory queue (Sec. 4.1: 4096; 0: none).
        embed_dim: Key width of the queues, required with a queue.
        sync_margins: Broadcast rank 0's margins after each update (distributed).

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
    """Raise ``ValueError`` unless a margin of Eq. (3) is a real or a 0-dim tensor, finite
    (and > 0 if ``positive``)."""
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
    """``negative_temperature`` as a positive finite float; ``ValueError`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 < value < math.inf:
        raise ValueError(f"negative_temperature must be a positive finite number, got {value!r}")
    return float(value)


def check_scale_negatives(scale_negatives: bool, temperature: float) -> None:
    """Raise ``ValueError`` unless ``scale_negatives`` is a bool, and not ``True`` with a
    ``negative_temperature`` other than 1."""
    if not isinstance(scale_negatives, bool):
        raise ValueError(f"scale_negatives must be a bool, got {scale_negatives!r}")
    if scale_negatives and temperature != 1.0:
        raise ValueError(
            "scale_negatives=True scales the negatives by m1; it excludes a "
            f"negative_temperature other than 1, got {temperature!r}"
        )


def check_probabilities(p_u: float, eps: float) -> None:
    """Raise ``ValueError`` unless ``p_u`` and ``eps`` are in (0, 1) with ``p_u + eps < 1``
    (Eq. 20 needs a positive ``m1``)."""
    if not (isinstance(p_u, int | float) and 0.0 < p_u < 1.0):
        raise ValueError(f"p_u must be a probability in (0, 1), got {p_u!r}")
    if not (isinstance(eps, int | float) and 0.0 < eps < 1.0):
        raise ValueError(f"eps must be in (0, 1), got {eps!r}")
    if p_u + eps >= 1.0:
        raise ValueError(f"p_u + eps must be below 1, got p_u={p_u!r}, eps={eps!r}")


def check_selection(selection: str, top_k: int | None, min_variance: float) -> None:
    """Raise ``ValueError`` for an unknown ``selection`` (Eq. 11), a ``top_k`` that is not
    ``None`` or an int >= 2 (A.10), or a negative ``min_variance``."""
    if selection not in ANCHOR_SELECTIONS:
        raise ValueError(f"selection must be one of {ANCHOR_SELECTIONS}, got {selection!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 2):
        raise ValueError(f"top_k must be None or an integer >= 2, got {top_k!r}")
    if not (isinstance(min_variance, int | float) and min_variance >= 0):
        raise ValueError(f"min_variance must be a non-negative number, got {min_variance!r}")
