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
    """Learning rate ``base * decay_factor ** n(epoch)``, times a linear warm-up
    ``min(1, (step + 1) / warmup_steps)`` over the first optimisation steps.

    ``n(epoch)`` counts the listed ``decay_epochs`` at or before ``epoch`` (VSE++: ``[15]``),
    or, with ``decay_every = k > 0``, is ``epoch // k`` (CE / MMT's x0.95 every epoch: ``k = 1``,
    the same as listing every epoch from 1 on). Epochs count from 0; the two are exclusive.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        *,
        decay_epochs: list[int],
        decay_factor: float = 0.1,
        warmup_steps: int = 0,
        decay_every: int = 0,
    ) -> None:
        if decay_every < 0:
            raise ValueError(f"decay_every must be >= 0 (0: off), got {decay_every}")
        if decay_every and decay_epochs:
            raise ValueError("give decay_epochs or decay_every, not both")
        self.optimizer = optimizer
        self.base_lrs = [float(g["lr"]) for g in optimizer.param_groups]
        self.decay_epochs = sorted(int(e) for e in decay_epochs)
        self.decay_factor = float(decay_factor)
        self.warmup_steps = int(warmup_steps)
        self.decay_every = int(decay_every)

    def factor(self, *, epoch: int, step: int) -> float:
        decays = sum(1 for e in self.decay_epochs if e <= epoch)
        if self.decay_every:
            decays += epoch // self.decay_every
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
            "decay_every": self.decay_every,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.base_lrs = [float(v) for v in state["base_lrs"]]
        self.decay_epochs = [int(e) for e in state["decay_epochs"]]
        self.decay_factor = float(state["decay_factor"])
        self.warmup_steps = int(state["warmup_steps"])
        self.decay_every = int(state.get("decay_every", 0))  # absent in older checkpoints


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
