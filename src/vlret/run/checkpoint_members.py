"""The networks one checkpoint holds beside its model: where a checkpoint stores them.

A training procedure that trains further networks beside the model (NCR's network B,
:mod:`vlret.train.procedures.ncr`) stores their weights in the checkpoint's ``procedure`` under
:data:`ENSEMBLE_KEY` (a list of model state dicts, one per network); such a checkpoint evaluates
as the ensemble of its model and those networks, the mean of their score matrices
(:class:`~vlret.eval.EnsembleScorer`), as its dev metrics did during training. The procedure
writes the key; evaluation reads it (:func:`vlret.run.eval_members.checkpoint_networks`).
"""

from __future__ import annotations

#: The ``procedure`` key of a checkpoint listing the further networks' state dicts.
ENSEMBLE_KEY = "ensemble_models"

__all__ = ["ENSEMBLE_KEY"]
