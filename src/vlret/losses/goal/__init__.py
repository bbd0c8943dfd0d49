"""GOAL: gradient-defined objectives, triplet weight x pair weight (Xuan & Chen, Eq. 3-13).

:mod:`~vlret.losses.goal.weights` holds the weights and the parameter declaration
(``GoalParams``; ``GoalConfig`` and ``GOAL_PARAMS`` are its deprecated old names),
:mod:`~vlret.losses.goal.objective` the dense and tiled objective and the module.
"""

from .objective import GoalFunction, GoalObjective, goal_objective, tiled_goal_objective
from .weights import (
    PAIR_WEIGHTS,
    TRIPLET_WEIGHTS,
    GoalParams,
    goal_pair_weights,
    goal_triplet_weight,
    triplet_weights_from_hardest,
)

__all__ = [
    "PAIR_WEIGHTS",
    "TRIPLET_WEIGHTS",
    "GoalParams",
    "GoalFunction",
    "GoalObjective",
    "goal_objective",
    "goal_pair_weights",
    "goal_triplet_weight",
    "tiled_goal_objective",
    "triplet_weights_from_hardest",
]


def __getattr__(name: str) -> object:
    # the deprecated names of GoalParams, resolved (and warned about) by the weights module
    from . import weights

    return getattr(weights, name)
