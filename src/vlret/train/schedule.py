"""Learning-rate schedule, seeding and the interrupt flag of the training loop."""

from __future__ import annotations

import contextlib
import random
import signal
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch


class StepDecayWarmup:
    """Learning rate ``base * decay_factor ** #(decay_epochs <= epoch)``, times a linear warm-up
    ``min(1, (step + 1) / warmup_steps)`` over the first optimisation steps."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        *,
        decay_epochs: list[int],
        decay_factor: float = 0.1,
        warmup_steps: int = 0,
    ) -> None:
        self.optimizer = optimizer
        self.base_lrs = [float(g["lr"]) for g in optimizer.param_groups]
        self.decay_epochs = sorted(int(e) for e in decay_epochs)
        self.decay_factor = float(decay_factor)
        self.warmup_steps = int(warmup_steps)

    def factor(self, *, epoch: int, step: int) -> float:
        decays = sum(1 for e in self.decay_epochs if e <= epoch)
        f = self.decay_factor**decays
        if self.warmup_steps > 0:
            f *= min(1.0, (step + 1) / self.warmup_steps)
        return f

    def apply(self, *, epoch: int, step: int) -> float:
        f = self.factor(epoch=epoch, step=step)
        for group, base in zip(self.optimizer.param_groups, self.base_lrs, strict=True):
            group["lr"] = base * f
        return self.base_lrs[0] * f

    def state_dict(self) -> dict[str, Any]:
        return {
            "base_lrs": list(self.base_lrs),
            "decay_epochs": list(self.decay_epochs),
            "decay_factor": self.decay_factor,
            "warmup_steps": self.warmup_steps,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.base_lrs = [float(v) for v in state["base_lrs"]]
        self.decay_epochs = [int(e) for e in state["decay_epochs"]]
        self.decay_factor = float(state["decay_factor"])
        self.warmup_steps = int(state["warmup_steps"])


@contextlib.contextmanager
def interrupt_flag() -> Iterator[dict[str, bool]]:
    """SIGINT / SIGTERM set a flag that the loop checks between steps; a second one raises
    ``KeyboardInterrupt``, except while ``flag["saving"]`` (the interrupt checkpoint)."""
    flag = {"set": False, "saving": False}
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return

    def handler(signum, frame):  # noqa: ARG001
        # A second signal while the interrupt checkpoint is written is ignored: last.pt first.
        if flag["set"] and not flag["saving"]:
            raise KeyboardInterrupt
        flag["set"] = True

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield flag
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
