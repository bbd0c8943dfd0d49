"""CLIP's temperature for the softmax losses: a fixed float, or a learnable clamped log-scale."""

from __future__ import annotations

import math

import torch
from torch import nn


class CLIPTemperature(nn.Module):
    """A temperature as CLIP keeps it (mixed into a loss module, before ``PairLoss``).

    With ``learnable=True`` the module holds the parameter ``log_scale = log(1 / temperature)``,
    clamped in place to ``[0, log(max_scale)]`` before each use (so the clamp never cuts the
    gradient); otherwise the temperature is a plain float.
    """

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
