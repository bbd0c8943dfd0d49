"""The networks one checkpoint holds, as ensemble members of an evaluation.

A training procedure that trains further networks beside the model (NCR's network B,
:mod:`vlret.train.procedures.ncr`) stores their weights in the checkpoint's ``procedure`` under
``ensemble_models`` (a list of model state dicts); such a checkpoint evaluates as the ensemble
of its model and those networks, the mean of their score matrices
(:class:`~vlret.eval.EnsembleScorer`), as its dev metrics did during training.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from torch import nn

from .checkpoint import load_checkpoint

#: The ``procedure`` key of a checkpoint listing the further networks' state dicts.
ENSEMBLE_KEY = "ensemble_models"


def checkpoint_members(
    checkpoint: str | Path, member: tuple[nn.Module, Any, Any]
) -> list[tuple[nn.Module, Any, Any]]:
    """``member`` (a checkpoint's ``(model, stored run, encoder)``) followed by one member per
    network in the checkpoint's ``procedure["ensemble_models"]``: a copy of the model holding
    those weights, with the same run and encoder. A plain checkpoint is one member.

    Raises:
        ValueError: A stored network does not fit the model (the checkpoint named).
    """
    state = load_checkpoint(checkpoint)
    extra = (state.get("procedure") or {}).get(ENSEMBLE_KEY) or []
    model, run, encoder = member
    out = [member]
    for i, weights in enumerate(extra):
        twin = copy.deepcopy(model)
        try:
            twin.load_state_dict(weights)
        except RuntimeError as err:
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise ValueError(
                f"{checkpoint}: procedure network {i} does not fit ({first})"
            ) from None
        out.append((twin.eval(), run, encoder))
    return out


def member_names(checkpoint: str | Path, count: int) -> list[str]:
    """How an evaluation names a checkpoint's members: the path, or ``PATH (network A)``,
    ``PATH (network B)``, ... when it holds several networks."""
    if count == 1:
        return [str(checkpoint)]
    return [f"{checkpoint} (network {chr(ord('A') + i)})" for i in range(count)]


__all__ = ["ENSEMBLE_KEY", "checkpoint_members", "member_names"]
