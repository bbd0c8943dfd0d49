"""GOAL: gradient-defined objectives, triplet weight x pair weight (Xuan & Chen, Eq. 3-13).

:mod:`~vlret.losses.goal.weights` holds the weights and the parameter declaration
(``GoalParams``; ``GoalConfig`` and ``GOAL_PARAMS``, its old names, are deprecated:
:mod:`vlret.losses.deprecated`),
:mod:`~vlret.losses.goal.objective` the dense and tiled objective and the module.
"""

from ..._deprecation import module_getattr
from ..deprecated import OLD_NAMES
from .objective import GoalFunction, GoalObjective, goal_objective, tiled_goal_objective
from .weights import (
    PAIR_WEIGHTS,
    TRIPLET_WEIGHTS,
    GoalParams,
    goal_anchor_weights,
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
    "goal_anchor_weights",
    "goal_objective",
    "goal_pair_weights",
    "goal_triplet_weight",
    "tiled_goal_objective",
    "triplet_weights_from_hardest",
]


# 0.1.0's GoalConfig and GOAL_PARAMS, each warned about (vlret.losses.deprecated)
__getattr__ = module_getattr(__name__, OLD_NAMES)
