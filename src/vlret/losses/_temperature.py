"""CLIP's temperature for the softmax losses: a fixed float, or a learnable clamped log-scale."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .._checks import FLAG, POSITIVE, Number
from .params import TiledLossParams, param


@dataclass(frozen=True, kw_only=True)
class CLIPTemperatureParams(TiledLossParams):
    """The temperature switches of a softmax family; the family declares ``temperature``
    with its default."""

    temperature: float = param(1.0, POSITIVE, "tau, the logits' temperature")

    learnable_temperature: bool = param(
        False, FLAG, "learn log(1/temperature), clamped like CLIP", passed=False
    )
    # the clamp interval [0, log(max_scale)] must not be empty
    max_scale: float = param(100.0, Number(ge=1), "the learnable scale's upper clamp", passed=False)


class CLIPTemperature(nn.Module):
    """A temperature as CLIP keeps it (mixed into a loss module, before ``PairLoss``).

    With ``learnable=True`` the module holds the parameter ``log_scale = log(1 / temperature)``,
    clamped in place to ``[0, log(max_scale)]`` before each use (so the clamp never cuts the
    gradient); otherwise the temperature is a plain float. Its family's ``Params`` derive from
    :class:`CLIPTemperatureParams` and declare ``temperature``.
    """

    #: The family's checked parameters (set by ``PairLoss.__init__``).
    config: CLIPTemperatureParams

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        c = self.config
        self.init_temperature(c.temperature, c.learnable_temperature, c.max_scale)

    def arguments(self) -> dict[str, Any]:
        # the mixin sits before PairLoss, whose arguments() this extends
        return {**super().arguments(), "temperature": self.current_temperature()}  # type: ignore[misc]

    def extra_repr(self) -> str:
        return self.config.describe(temperature=self.temperature)

    def init_temperature(self, temperature: float, learnable: bool, max_scale: float) -> None:
        """Set the temperature up (call after ``nn.Module.__init__``)."""
        self.learnable_temperature = bool(learnable)
        self.max_scale = float(max_scale)
        if self.learnable_temperature:
            init = min(math.log(1.0 / temperature), math.log(max_scale))
            self.log_scale = nn.Parameter(torch.tensor(max(init, 0.0)))
        else:
            self.fixed_temperature = float(temperature)

    @property
    def temperature(self) -> float:
        """The temperature in use now (a float, for logging)."""
        if self.learnable_temperature:
            return float(1.0 / self.log_scale.detach().clamp(0, math.log(self.max_scale)).exp())
        return self.fixed_temperature

    def current_temperature(self) -> float | torch.Tensor:
        """The temperature for a forward pass: the learnable one (clamped first) as a tensor."""
        if self.learnable_temperature:
            with torch.no_grad():
                self.log_scale.clamp_(0.0, math.log(self.max_scale))
            return torch.exp(-self.log_scale)
        return self.fixed_temperature
