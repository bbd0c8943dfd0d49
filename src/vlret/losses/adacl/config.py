"""AdaCL hyper-parameters and argument checks, validated in one place.

:class:`AdaCLParams` declares the hyper-parameters of :class:`~vlret.losses.AdaCLLoss`
(default, constraint and description of each; read by the module, the registry and the
config; its 0.1.0 name ``AdaCLConfig`` is deprecated: :mod:`vlret.losses.deprecated`) and
:func:`check_relations` the constraints between them. The ``check_*`` functions
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
)
from ..params import TiledLossParams, param

#: Anchor selection rules on Delta S (paper Table 5).
ANCHOR_SELECTIONS = ("median", "min", "max", "random")

#: Reasons for keeping the previous margins, in the order they are checked.
GUARDS = ("degenerate_variance", "empty_clone_set", "anchor_ge_one", "nonfinite_margins")

#: The paper's settings (Sec. 4.1): p_u = 0.03, eps = e^-7, m1 = 20 and m2 = 0.1 initially.
DEFAULT_P_U = 0.03
DEFAULT_EPS = math.exp(-7)

_PROBABILITY = Number(gt=0, lt=1)


@dataclass(frozen=True, kw_only=True)
class AdaCLParams(TiledLossParams):
    """Parameters of :class:`~vlret.losses.AdaCLLoss`, the paper's defaults (Sec. 4.1): the one
    declaration read by the module (as ``loss.config``), the registry and the config checks.
    ``m2`` is a shift (any real), ``p_u`` and ``eps`` are probabilities (Eq. 4, 6), anchors are
    similarities. ``chunk_size`` is the tile height of :class:`TiledAdaCLBatch`.

    Raises:
        ParamError: A value outside its declared constraint or a violated
            :func:`check_relations`.
    """

    m1_init: float = param(20.0, POSITIVE, "initial scale m1 of the positive logit (Eq. 3)")
    m2_init: float = param(0.1, REAL, "initial shift m2 of the positive logit")
    p_u: float = param(DEFAULT_P_U, _PROBABILITY, "the anchor's probability under Eq. 3 (Eq. 4)")
    eps: float = param(DEFAULT_EPS, _PROBABILITY, "1 - the probability of a positive at 1 (Eq. 6)")
    anchor_selection: str = param(
        "median", Choice(ANCHOR_SELECTIONS), "the rule on Delta S (Eq. 11, Table 5)"
    )
    top_k: int | None = param(
        None, Number(integer=True, ge=2, optional=True), "fit each GDA class on its top_k (A.10)"
    )
    margin_momentum: float = param(
        0.0, Number(ge=0, lt=1), "mu: an update is m <- mu m_prev + (1 - mu) m_new"
    )
    negative_temperature: float = param(
        1.0, POSITIVE, "divides every negative logit (not in the paper; 1: Eq. 3)"
    )
    scale_negatives: bool = param(
        False, FLAG, "negative logits m1 s_ij (not in the paper); needs temperature 1"
    )
    warmup_steps: int = param(
        0, Number(integer=True, ge=0), "training batches trained with the initial margins"
    )
    min_variance: float = param(1e-12, NON_NEGATIVE, "a GDA variance at or below is degenerate")
    max_anchor: float = param(1.0, Number(le=1), "anchors at or above this are refused (guard)")
    max_m1: float | None = param(
        None, Number(gt=0, optional=True), "cap on m1 (m2 then from Eq. 22), or None"
    )
    seed: int = param(0, Number(integer=True), "seed of the generator of the random rule")
    queue_size: int = param(
        0, Number(integer=True, ge=0), "entries of each memory queue (Sec. 4.1: 4096; 0: none)"
    )
    embed_dim: int | None = param(
        None, Number(integer=True, ge=1, optional=True), "key width of the queues"
    )
    sync_margins: bool = param(
        True, FLAG, "declare the margins for rank 0's broadcast after each step (distributed)"
    )

    def check_relations(self) -> None:
        check_relations(dataclasses.asdict(self))


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
