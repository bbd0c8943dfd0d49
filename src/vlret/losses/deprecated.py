"""Every deprecated name of :mod:`vlret.losses`, each with its replacement and the version
that removes it.

Only names that 0.1.0 exported are kept here; a name added and renamed since was never
released and was simply renamed. :data:`OLD_NAMES` are served by the ``__getattr__`` of the
package that exported them (:mod:`vlret.losses`, :mod:`vlret.losses.goal`,
:mod:`vlret.losses.adacl`; :func:`vlret._deprecation.module_getattr`), each access with a
:class:`DeprecationWarning`. :data:`OLD_PARAMETERS` are keyword parameters of a loss that were
renamed: the loss's constructor, :func:`~vlret.losses.build_loss`, a config's ``[loss]``
section and the loss's pure functions accept the old name with a :class:`DeprecationWarning`
(``Params.renamed``, :mod:`vlret.losses.params`).

=====================================  ======================================  ============
0.1.0 name                             use instead                             removed in
=====================================  ======================================  ============
``vlret.losses.GoalConfig``            ``vlret.losses.GoalParams``             0.3.0
``vlret.losses.goal.GoalConfig``       ``vlret.losses.goal.GoalParams``        0.3.0
``vlret.losses.goal.GOAL_PARAMS``      ``GoalParams.specs()``                  0.3.0
``vlret.losses.adacl.AdaCLConfig``     ``vlret.losses.adacl.AdaCLParams``      0.3.0
``vsl`` parameter ``chunk_size``       ``rank_block``                          0.3.0
=====================================  ======================================  ============
"""

from __future__ import annotations

import importlib
from typing import Any

from .._deprecation import OldName

#: The version that removes every name below.
REMOVED_IN = "0.3.0"


def _old_goal_params() -> dict[str, Any]:
    """The old ``GOAL_PARAMS`` table: GOAL's own parameters and ``reduction`` with their
    constraints (not the ``normalize`` / ``chunk_size`` every loss declares now)."""
    params = importlib.import_module("vlret.losses.goal.weights").GoalParams
    return {**params.family_specs(), "reduction": params.specs()["reduction"]}


#: The names 0.1.0 exported that were renamed since (issue 25: one parameter declaration per
#: family replaced the config records and the constraint tables).
OLD_NAMES: tuple[OldName, ...] = (
    OldName(
        module="vlret.losses",
        name="GoalConfig",
        replacement="vlret.losses.GoalParams",
        removed_in=REMOVED_IN,
        target="vlret.losses.goal.weights:GoalParams",
    ),
    OldName(
        module="vlret.losses.goal",
        name="GoalConfig",
        replacement="vlret.losses.goal.GoalParams",
        removed_in=REMOVED_IN,
        target="vlret.losses.goal.weights:GoalParams",
    ),
    OldName(
        module="vlret.losses.goal",
        name="GOAL_PARAMS",
        replacement="vlret.losses.goal.GoalParams.specs()",
        removed_in=REMOVED_IN,
        compute=_old_goal_params,
    ),
    OldName(
        module="vlret.losses.adacl",
        name="AdaCLConfig",
        replacement="vlret.losses.adacl.AdaCLParams",
        removed_in=REMOVED_IN,
        target="vlret.losses.adacl.config:AdaCLParams",
    ),
)

#: Renamed keyword parameters by registered loss name: old name -> new name (VSL's smooth-rank
#: block was ``chunk_size``, the name every tiled loss gives its tile height).
OLD_PARAMETERS: dict[str, dict[str, str]] = {"vsl": {"chunk_size": "rank_block"}}

__all__ = ["OLD_NAMES", "OLD_PARAMETERS", "REMOVED_IN"]
