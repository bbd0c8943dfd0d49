"""GOAL: gradient-defined objectives, triplet weight x pair weight (Xuan & Chen, Eq. 3-13).

:mod:`~vlret.losses.goal.weights` holds the weights and the config,
:mod:`~vlret.losses.goal.objective` the dense and tiled objective and the module.
"""

from .objective import GoalFunction, GoalObjective, goal_objective, tiled_goal_objective
from .weights import (
    GOAL_PARAMS,
    PAIR_WEIGHTS,
    TRIPLET_WEIGHTS,
    GoalConfig,
    goal_pair_weights,
    goal_triplet_weight,
    triplet_weights_from_hardest,
)

__all__ = [
    "GOAL_PARAMS",
    "PAIR_WEIGHTS",
    "TRIPLET_WEIGHTS",
    "GoalConfig",
    "GoalFunction",
    "GoalObjective",
    "goal_objective",
    "goal_pair_weights",
    "goal_triplet_weight",
    "tiled_goal_objective",
    "triplet_weights_from_hardest",
]
