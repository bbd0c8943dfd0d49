"""The training loop's machinery around the step: learning-rate schedules (step decay, and
open_clip's cosine with a linear warm-up), mixed precision, what is done to the model before
it is wrapped (locked towers, activation checkpointing, ``torch.compile``), seeding and the
interrupt flag."""

from __future__ import annotations

import contextlib
import math
import random
import signal
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from ..run.config import ConfigError
from .hooks.core import lock_modules

if TYPE_CHECKING:
    from ..run.config import OptimConfig, TrainConfig


class _FactorSchedule:
    """A schedule that sets every group's ``lr`` to its base rate times :meth:`factor`."""

    optimizer: torch.optim.Optimizer
    base_lrs: list[float]

    def factor(self, *, epoch: int, step: int) -> float:
        raise NotImplementedError

    def apply(self, *, epoch: int, step: int) -> float:
        f = self.factor(epoch=epoch, step=step)
        for group, base in zip(self.optimizer.param_groups, self.base_lrs, strict=True):
            group["lr"] = base * f
        return self.base_lrs[0] * f


class StepDecayWarmup(_FactorSchedule):
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


class CosineWarmup(_FactorSchedule):
    """open_clip's ``cosine_lr``, counted in optimisation steps: a linear warm-up
    ``base * (step + 1) / warmup_steps`` for ``step < warmup_steps``, then
    ``base * 0.5 * (1 + cos(pi * e / E))`` with ``e = step - warmup_steps`` and
    ``E = total_steps - warmup_steps`` (``total_steps``: epochs x steps per epoch), so the rate
    reaches 0 at the last step. The factor is a function of the step alone, so a resumed run
    continues it exactly. ``e / E`` is clamped to 1 (a step past the end stays at 0; open_clip
    would let the cosine rise again). Every parameter group's own base rate is scaled alike
    (learning-rate multipliers keep their ratios).

    Args:
        optimizer: Its groups' current ``lr`` are the base rates.
        total_steps: The run's optimisation steps, or a function returning them, read at the
            first :meth:`apply` (the trainer knows its steps per epoch only once its data is
            built); must exceed ``warmup_steps``.
        warmup_steps: Steps of the linear warm-up (0: none).
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        *,
        total_steps: int | Callable[[], int],
        warmup_steps: int = 0,
    ) -> None:
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        self.optimizer = optimizer
        self.base_lrs = [float(g["lr"]) for g in optimizer.param_groups]
        self.warmup_steps = int(warmup_steps)
        self._total = total_steps

    @property
    def total_steps(self) -> int:
        """The run's optimisation steps (resolved from the function on first use)."""
        if callable(self._total):
            self._total = int(self._total())
        if self._total <= self.warmup_steps:
            raise ValueError(
                f"optim.schedule = 'cosine': optim.warmup_steps = {self.warmup_steps} must be "
                f"below the run's {self._total} steps (train.epochs x steps per epoch)"
            )
        return self._total

    def factor(self, *, epoch: int, step: int) -> float:  # noqa: ARG002 (same call as step decay)
        total = self.total_steps  # checked at the first step, warm-up or not
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        span = total - self.warmup_steps
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, (step - self.warmup_steps) / span)))

    def state_dict(self) -> dict[str, Any]:
        return {
            "kind": "cosine",
            "base_lrs": list(self.base_lrs),
            "warmup_steps": self.warmup_steps,
            "total_steps": self.total_steps,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The base rates and warm-up of the checkpoint; the total stays this run's (a resumed
        run with the same config has the same total)."""
        if state.get("kind") != "cosine":
            raise ValueError("the checkpoint's schedule is not optim.schedule = 'cosine'")
        self.base_lrs = [float(v) for v in state["base_lrs"]]
        self.warmup_steps = int(state["warmup_steps"])


def build_schedule(
    optimizer: torch.optim.Optimizer,
    optim: OptimConfig,
    *,
    total_steps: int | Callable[[], int],
) -> StepDecayWarmup | CosineWarmup:
    """The schedule ``optim.schedule`` names over ``optimizer``'s groups: ``"step"``
    (:class:`StepDecayWarmup`, the default) or ``"cosine"`` (:class:`CosineWarmup` over
    ``total_steps``, an int or a function read at the first step)."""
    if optim.schedule == "cosine":
        return CosineWarmup(optimizer, total_steps=total_steps, warmup_steps=optim.warmup_steps)
    return StepDecayWarmup(
        optimizer,
        decay_epochs=optim.decay_epochs,
        decay_factor=optim.decay_factor,
        warmup_steps=optim.warmup_steps,
        decay_every=optim.decay_every,
    )


# -- precision and what is done to the model before it is wrapped ------------------------------


def amp_dtype(
    amp: bool | str, device: torch.device, *, source: str = "<config>"
) -> torch.dtype | None:
    """The autocast dtype ``train.amp`` asks for on ``device`` (None: full precision).

    ``true`` keeps its old meaning: float16 with a gradient scaler on CUDA, nothing on another
    device. ``"fp16"``: the same, and an error off CUDA (a scaler there is not worth having:
    use bf16). ``"bf16"``: bfloat16 autocast on any device (CPU included), without a scaler
    (bfloat16 has float32's exponent range). The losses compute in float32 either way
    (:func:`vlret._checks.compute_dtype` upcasts half inputs).

    Raises:
        ConfigError: ``"fp16"`` on a device that is not CUDA.
    """
    if amp is False:
        return None
    if amp == "bf16":
        return torch.bfloat16
    if device.type != "cuda":
        if amp == "fp16":
            why = f"'fp16' needs CUDA (a gradient scaler), the device is {device}; use 'bf16'"
            raise ConfigError(source, "train.amp", why)
        return None
    return torch.float16


#: torch.utils.checkpoint's mode for Hugging Face modules: non-reentrant.
NON_REENTRANT = {"use_reentrant": False}


def hf_submodules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The outermost Hugging Face models inside ``model`` that support gradient checkpointing
    (a ``BertModel``, a ``CLIPModel``, ...), named."""
    found: list[tuple[str, nn.Module]] = []
    for name, module in model.named_modules():
        if any(name == n or name.startswith(n + ".") for n, _ in found if n):
            continue
        methods = ("activation_checkpointing_enable", "gradient_checkpointing_enable")
        if getattr(module, "supports_gradient_checkpointing", False) and any(
            hasattr(module, m) for m in methods
        ):
            found.append((name, module))
    return found


def enable_activation_checkpointing(model: nn.Module, *, source: str = "<config>") -> list[str]:
    """``train.activation_checkpointing``: each Hugging Face submodule's
    ``activation_checkpointing_enable`` (``gradient_checkpointing_enable`` before transformers
    5), non-reentrant ( it works with frozen inputs, under DDP and
    with gradient caching; the RNG is replayed, so dropout gives the same gradients). The
    other towers (GRU, FC, precomputed features) are left as they are: their activations are
    small next to a transformer's. Returns the names of the checkpointed modules.

    Raises:
        ConfigError: The model holds no Hugging Face module (nothing would be checkpointed).
    """
    found = hf_submodules(model)
    if not found:
        why = (
            "the model holds no Hugging Face module (BERT, CLIP, ResNet, ViT) to checkpoint; "
            "its GRU / FC towers keep few activations: set it to false"
        )
        raise ConfigError(source, "train.activation_checkpointing", why)
    for _, module in found:
        hf: Any = module  # a PreTrainedModel: transformers 5 renamed the method
        if hasattr(hf, "activation_checkpointing_enable"):
            hf.activation_checkpointing_enable(activation_checkpointing_kwargs=NON_REENTRANT)
        else:
            hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs=NON_REENTRANT)
    return [name or "<model>" for name, _ in found]


def prepare_model(model: nn.Module, train: TrainConfig, *, source: str = "<config>") -> None:
    """What is done to the model before DistributedDataParallel wraps it: the ``train.lock``
    towers' parameters stop requiring gradients (DDP then never reduces them; see
    :class:`vlret.train.hooks.core.LockModules`), ``train.activation_checkpointing`` and
    ``train.compile`` (:meth:`torch.nn.Module.compile` in place: the forward is compiled, the
    parameter names and the checkpoint stay the model's; ``true``: torch's default backend,
    a string: that backend, e.g. ``"aot_eager"``).

    Raises:
        ConfigError: A ``train.lock`` name that is no module; activation checkpointing of a
            model without a Hugging Face module; an unknown ``train.compile`` backend.
    """
    lock_modules(model, train.lock, source=source)
    if train.activation_checkpointing:
        enable_activation_checkpointing(model, source=source)
    if train.compile:
        backend = train.compile if isinstance(train.compile, str) else "inductor"
        known = torch._dynamo.list_backends(exclude_tags=())
        if backend not in known:
            why = f"unknown torch.compile backend {backend!r}; known: {', '.join(known)}"
            raise ConfigError(source, "train.compile", why)
        model.compile(backend=backend)


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
