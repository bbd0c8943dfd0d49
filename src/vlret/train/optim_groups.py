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

:class:`vlret.train.hooks.core.NoWeightDecay` splits every parameter group by the rule (after the
learning-rate multipliers, so both compose); :func:`set_group_weight_decay` gives each
optimiser group its :class:`~vlret.train.hooks.core.ParamGroup`'s ``weight_decay``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

if TYPE_CHECKING:
    from ..run.config import OptimConfig

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


@dataclass(frozen=True)
class ParamGroup:
    """One optimiser parameter group: its parameters, their names, a learning-rate factor and
    its weight decay.

    The group's learning rate is ``optim.lr * lr_scale`` times the schedule's factor (warm-up
    and decay multiply every group alike); its weight decay is ``weight_decay``, or
    ``optim.weight_decay`` when that is None (:class:`NoWeightDecay` sets 0).
    """

    names: tuple[str, ...]
    params: tuple[nn.Parameter, ...]
    lr_scale: float = 1.0
    weight_decay: float | None = None


def build_optimizer(
    optim: OptimConfig, params: Sequence[nn.Parameter] | Sequence[ParamGroup]
) -> torch.optim.Optimizer:
    """The configured optimiser (``adam``, ``adamw`` or ``sgd``) over ``params``: parameters
    (one group at ``optim.lr``) or :class:`~vlret.train.hooks.core.ParamGroup` s (each at
    ``optim.lr * lr_scale``, in their order)."""
    groups: list[Any] = list(params)
    if any(isinstance(g, ParamGroup) for g in groups):
        groups = [{"params": list(g.params), "lr": optim.lr * g.lr_scale} for g in groups]
    if optim.name in ("adam", "adamw"):
        kind = torch.optim.Adam if optim.name == "adam" else torch.optim.AdamW
        betas = cast("tuple[float, float]", tuple(optim.betas))  # two (config_from_dict)
        return kind(
            groups, lr=optim.lr, betas=betas, eps=optim.eps, weight_decay=optim.weight_decay
        )
    return torch.optim.SGD(
        groups, lr=optim.lr, momentum=optim.momentum, weight_decay=optim.weight_decay
    )


def clip_sets(
    optimizer: torch.optim.Optimizer, networks: Mapping[str, nn.Module]
) -> list[list[nn.Parameter]]:
    """The parameter sets whose gradient norm ``optim.grad_clip`` bounds, each on its own, in
    the optimiser's order: the model's and the loss's parameters together (every one that is
    in no network of ``networks``), then each of a training procedure's own ``networks``
    (NCR's network B is clipped by its own norm, as the release clips each network); empty
    sets are left out."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    owner = {id(p): k for k, (_, net) in enumerate(networks.items()) for p in net.parameters()}
    sets: list[list[nn.Parameter]] = [[] for _ in range(len(networks) + 1)]
    for p in params:
        sets[owner.get(id(p), -1) + 1].append(p)
    return [s for s in sets if s]


__all__ = [
    "clip_sets",
    "NDIM_RULE",
    "OPEN_CLIP_NO_DECAY",
    "ParamGroup",
    "build_optimizer",
    "exempt_from_decay",
    "no_decay_rule",
    "set_group_weight_decay",
]
