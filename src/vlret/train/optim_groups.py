"""Which parameters get weight decay (``[optim] no_decay``), and the optimiser groups' own
weight decay.

The rule is a list of patterns; a parameter is exempt from weight decay when one matches:

* ``"ndim<2"``: the parameter has fewer than two dimensions (norm gains and biases, every
  bias, a scalar temperature or logit scale, a CLS token);
* any other string: a case-insensitive substring of the parameter's dotted name (the model's
  ``named_parameters`` names; the loss's own parameters are ``loss.<name>``).

``optim.no_decay = None`` (the default) is open_clip's rule with ``adamw``
(:data:`OPEN_CLIP_NO_DECAY`) and no exemption with ``adam`` / ``sgd`` (their weight decay is an
L2 term: the configs that set one follow papers that decay everything). open_clip exempts a
parameter with ``ndim < 2`` or whose name holds ``bn``, ``ln``, ``bias`` or ``logit_scale``;
in its models (and in Hugging Face's) every ``bn`` / ``ln`` parameter is one-dimensional, so
``ndim<2`` covers them, and vlret's rule names ``norm`` instead of the bare two-letter
substrings (``ln`` would also match a name such as ``kiln_proj``). ``temperature`` covers
vlret's losses' learnable temperatures, which are one-element tensors (and so ``ndim<2``
anyway when scalar).

:class:`vlret.train.hooks.NoWeightDecay` splits every parameter group by the rule (after the
learning-rate multipliers, so both compose); :func:`set_group_weight_decay` gives each
optimiser group its :class:`~vlret.train.hooks.ParamGroup`'s ``weight_decay``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .config import OptimConfig

#: The pattern for "fewer than two dimensions".
NDIM_RULE = "ndim<2"
#: ``optim.no_decay`` when it is not given and ``optim.name = "adamw"``: open_clip's rule.
OPEN_CLIP_NO_DECAY = (NDIM_RULE, "bias", "norm", "logit_scale", "temperature")


def no_decay_rule(optim: OptimConfig) -> tuple[str, ...]:
    """The patterns in force: ``optim.no_decay``, or by default :data:`OPEN_CLIP_NO_DECAY`
    for ``adamw`` and none for the other optimisers; none at all without weight decay (the
    optimiser is then built exactly as before, one group)."""
    if not optim.weight_decay:
        return ()
    if optim.no_decay is not None:
        return tuple(optim.no_decay)
    return OPEN_CLIP_NO_DECAY if optim.name == "adamw" else ()


def exempt_from_decay(name: str, param: torch.Tensor, patterns: Sequence[str]) -> bool:
    """Whether the parameter ``name`` gets no weight decay under ``patterns``."""
    lowered = name.lower()
    for pattern in patterns:
        if pattern == NDIM_RULE:
            if param.ndim < 2:
                return True
        elif pattern.lower() in lowered:
            return True
    return False


def set_group_weight_decay(
    optimizer: torch.optim.Optimizer, groups: Sequence[object]
) -> torch.optim.Optimizer:
    """Give each optimiser group the ``weight_decay`` of its parameter group (the groups in
    the optimiser's order; a group whose ``weight_decay`` is None, or plain parameters, keep
    ``optim.weight_decay``); returns ``optimizer``."""
    if len(groups) != len(optimizer.param_groups):
        return optimizer  # plain parameters: one group at the optimiser's own weight decay
    for target, group in zip(optimizer.param_groups, groups, strict=True):
        decay = getattr(group, "weight_decay", None)
        if decay is not None:
            target["weight_decay"] = float(decay)
    return optimizer


__all__ = [
    "NDIM_RULE",
    "OPEN_CLIP_NO_DECAY",
    "exempt_from_decay",
    "no_decay_rule",
    "set_group_weight_decay",
]
