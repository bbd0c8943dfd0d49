"""The contract between the training loop and what extends it: :class:`TrainContext` and
:class:`TrainControl`.

Hooks (:class:`vlret.train.hooks.core.TrainHook`) and training procedures
(:class:`vlret.train.loss_step.LossStep`) never receive the :class:`vlret.train.Trainer`
itself. They receive a :class:`TrainContext`: a typed, read-only view of what the trainer built
(the model, the loss, the optimiser, the AMP scaler and :meth:`~TrainContext.autocast`, the
data, the device, the processes) and of where training is (epoch, step), always current: it
reads the trainer's values when asked, so a hook sees the epoch the trainer is in. The one
thing a hook or a procedure writes is :attr:`TrainContext.control`, a :class:`TrainControl`
whose flags ask the trainer to stop, save or evaluate (HF transformers' ``TrainerControl`` is
the model).

When the trainer reads the flags
--------------------------------

The flags are read at two points, and every flag read there is reset to ``False`` once it has
been honoured:

1. **After each step**: after ``after_step`` of every hook, the step log and the step's
   counters (``ctx.step`` counts the step, ``ctx.batch_in_epoch`` the batches of the epoch
   done). Ctrl-C / SIGTERM is checked first (``last.pt``, then ``TrainingInterrupted``); then,
   in this order:

   * ``should_evaluate``: validation runs now (rank 0, as at an epoch's end) and writes a
     ``kind: dev`` record (``epoch``, ``step``, the dev metrics with a ``dev_`` prefix) to
     ``metrics.jsonl``; every hook's ``after_evaluate(ctx, record)`` then sees it. It does
     not touch the selection (``best.pt`` is chosen at epoch ends only), and the model and
     the loss are put back in training mode afterwards.
   * ``should_save``: ``last.pt`` is written now, a mid-epoch checkpoint exactly like
     ``train.checkpoint_every``'s (``--resume`` continues after this step).
   * ``should_stop``: ``last.pt`` is written as Ctrl-C writes it (a resume continues after
     this step, bit for bit as the uninterrupted run), the epoch is left without its end
     (no validation, no epoch record), ``on_fit_end`` runs and :meth:`~vlret.train.Trainer.fit`
     returns normally, its :class:`~vlret.train.hooks.core.TrainResult` saying ``stopped``.

   The ``train.checkpoint_every`` / ``checkpoint_minutes`` checkpoint follows when due (not
   written twice when ``should_save`` just wrote it).

2. **After each epoch's end**: after ``after_epoch`` of every hook (the epoch was validated,
   logged and checkpointed). ``should_stop`` ends training there (``last.pt`` already holds
   the finished epoch; ``on_fit_end`` runs, ``fit`` returns with ``stopped`` set when epochs
   remained); ``should_save`` and ``should_evaluate`` are reset, the epoch's end having just
   done both.

A flag set anywhere else (``on_fit_start``, ``before_epoch``, ``before_step``,
``before_optimizer_step``, a procedure's step) waits for the next of these two points. Under
torchrun the trainer ORs each flag over the ranks at these points (one collective, the one that
already checks for Ctrl-C), so a flag set on rank 0 alone, say after rank 0's validation, is
honoured by every rank at the same step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from ..losses import LossCapabilities, PairLoss
from ..memory import MomentumEncoder
from ..run.config import RunConfig
from ..run.devices import DistEnv
from .parallel.grad_cache import GradCache


@dataclass
class TrainControl:
    """Requests a hook or a procedure makes of the training loop (module doc: when each is
    honoured). Set a flag to ``True``; the trainer resets it once honoured.

    Attributes:
        should_stop: End training cleanly: ``last.pt`` written, ``fit()`` returns.
        should_save: Write ``last.pt`` now (a mid-epoch checkpoint).
        should_evaluate: Run validation now and log it as a ``kind: dev`` record.
    """

    should_stop: bool = False
    should_save: bool = False
    should_evaluate: bool = False

    def reset(self) -> None:
        """Every flag back to ``False``."""
        for f in fields(self):
            setattr(self, f.name, False)

    def requested(self) -> bool:
        """Whether any flag is set."""
        return self.should_stop or self.should_save or self.should_evaluate


class TrainerView(Protocol):
    """What a :class:`TrainContext` reads from its trainer (:class:`vlret.train.Trainer` has
    it all); a test may hand a context any object of this shape."""

    @property
    def config(self) -> RunConfig: ...
    @property
    def model(self) -> nn.Module: ...
    @property
    def ddp_model(self) -> nn.Module: ...
    @property
    def loss_fn(self) -> PairLoss: ...
    @property
    def loss_caps(self) -> LossCapabilities: ...
    @property
    def optimizer(self) -> torch.optim.Optimizer: ...
    @property
    def scheduler(self) -> Any: ...
    @property
    def scaler(self) -> torch.amp.GradScaler: ...
    @property
    def amp_dtype(self) -> torch.dtype | None: ...
    @property
    def device(self) -> torch.device: ...
    @property
    def env(self) -> DistEnv: ...
    @property
    def epoch(self) -> int: ...
    @property
    def step(self) -> int: ...
    @property
    def batch_in_epoch(self) -> int: ...
    @property
    def sampler(self) -> Any: ...
    @property
    def train_set(self) -> Any: ...
    @property
    def dev_set(self) -> Any: ...
    @property
    def encoder(self) -> Any: ...
    @property
    def vocab_size(self) -> int | None: ...
    @property
    def momentum_encoder(self) -> MomentumEncoder | None: ...
    @property
    def gather(self) -> bool: ...
    @property
    def local_shards(self) -> bool: ...
    @property
    def exchange(self) -> str: ...
    @property
    def scores_pairs(self) -> bool: ...
    @property
    def loss_step(self) -> Any: ...
    @property
    def grad_cache(self) -> GradCache | None: ...
    @property
    def output_dir(self) -> Path: ...
    @property
    def print_fn(self) -> Callable[[str], None] | None: ...
    @property
    def select_on(self) -> str: ...
    @property
    def best_metric(self) -> float | None: ...
    @property
    def best_epoch(self) -> int | None: ...


class TrainContext:
    """What hooks and procedures see of a run in training: a read-only view of the trainer's
    objects and counters (always current) plus :attr:`control` (see the module doc).

    Everything is available from the first hook call on (``param_groups``, while the trainer
    is built), except :attr:`optimizer`, :attr:`scheduler` and :attr:`steps_per_epoch`, which
    exist once ``param_groups`` of every hook has run (from ``on_fit_start`` on, and in a
    procedure's step).
    """

    def __init__(self, trainer: TrainerView) -> None:
        self._trainer = trainer
        #: The requests a hook or a procedure makes of the loop (:class:`TrainControl`).
        self.control = TrainControl()

    # -- the run -------------------------------------------------------------------------

    @property
    def config(self) -> RunConfig:
        """The run's config, as resolved and checked."""
        return self._trainer.config

    @property
    def output_dir(self) -> Path:
        """The run folder (``last.pt``, ``best.pt``, ``metrics.jsonl``)."""
        return self._trainer.output_dir

    @property
    def print_fn(self) -> Callable[[str], None] | None:
        """Where a console line goes: rank 0's ``print_fn`` (``None`` on the other ranks and
        when the caller asked for silence)."""
        return self._trainer.print_fn

    def print(self, line: str) -> None:
        """Print ``line`` through :attr:`print_fn` (nothing where that is ``None``)."""
        show = self._trainer.print_fn
        if show is not None:
            show(line)

    # -- the networks, the loss and the optimiser ----------------------------------------

    @property
    def model(self) -> nn.Module:
        """The model being trained (unwrapped: its parameters are the checkpoint's)."""
        return self._trainer.model

    @property
    def ddp_model(self) -> nn.Module:
        """The model to call in a training step: :attr:`model` wrapped in
        DistributedDataParallel under torchrun (its forward reduces the gradients), the model
        itself in one process."""
        return self._trainer.ddp_model

    @property
    def loss_fn(self) -> PairLoss:
        """The run's loss module."""
        return self._trainer.loss_fn

    @property
    def loss_caps(self) -> LossCapabilities:
        """What the loss needs and offers, as built (:func:`vlret.losses.loss_capabilities`)."""
        return self._trainer.loss_caps

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The one optimiser; it steps every trainable parameter (the model's, the loss's and
        a procedure's own networks, :meth:`vlret.train.loss_step.LossStep.networks`)."""
        return self._trainer.optimizer

    @property
    def scheduler(self) -> Any:
        """The learning-rate schedule (:mod:`vlret.train.schedule`); the trainer applies it
        before each step."""
        return self._trainer.scheduler

    @property
    def scaler(self) -> torch.amp.GradScaler:
        """The AMP gradient scaler (enabled with ``train.amp`` in float16 on CUDA only)."""
        return self._trainer.scaler

    @property
    def amp_dtype(self) -> torch.dtype | None:
        """The autocast dtype (``None``: AMP off)."""
        return self._trainer.amp_dtype

    def autocast(self) -> torch.autocast:
        """The run's autocast context for a forward pass (``train.amp``; a no-op context when
        AMP is off): ``with ctx.autocast(): out = ctx.ddp_model(batch)``."""
        dtype = self._trainer.amp_dtype
        device = self._trainer.device
        return torch.autocast(device_type=device.type, dtype=dtype, enabled=dtype is not None)

    @property
    def momentum_encoder(self) -> MomentumEncoder | None:
        """The momentum encoder (``train.momentum_encoder``), or ``None``."""
        return self._trainer.momentum_encoder

    # -- the processes -------------------------------------------------------------------

    @property
    def device(self) -> torch.device:
        """This process's device."""
        return self._trainer.device

    @property
    def world_size(self) -> int:
        """The number of processes (1 without torchrun)."""
        return self._trainer.env.world_size

    @property
    def rank(self) -> int:
        """This process's rank (0 without torchrun)."""
        return self._trainer.env.rank

    @property
    def is_main(self) -> bool:
        """Whether this is rank 0, the process that validates, logs and writes checkpoints."""
        return self._trainer.env.is_main

    @property
    def gather(self) -> bool:
        """Whether the loss sees the global batch gathered over the ranks (torchrun)."""
        return self._trainer.gather

    @property
    def local_shards(self) -> bool:
        """Whether each rank computes only its own pairs' loss terms against the gathered
        batch (:mod:`vlret.train.parallel.distributed`, "Local shards")."""
        return self._trainer.local_shards

    @property
    def exchange(self) -> str:
        """``train.exchange`` resolved: ``"gather"``, or ``"ring"`` / ``"bidir"``
        (:mod:`vlret.train.parallel.ring`)."""
        return self._trainer.exchange

    @property
    def scores_pairs(self) -> bool:
        """Whether the model scores (image, caption) pairs itself (SCAN, BFAN, SGRAF) instead
        of embedding each side (:mod:`vlret.run.pair_scoring`)."""
        return self._trainer.scores_pairs

    @property
    def procedure(self) -> str:
        """The name of the training procedure the run's steps compute, as resolved from
        ``train.procedure`` (:func:`vlret.train.procedures.registry.resolve_procedure`:
        ``"standard"`` becomes ``"aoq"`` or ``"pair_bank"`` where the loss and the model need
        them)."""
        return str(self._trainer.loss_step.name)

    @property
    def grad_cache(self) -> GradCache | None:
        """The gradient cache encoding the batch in chunks (``train.grad_cache_chunk``), or
        ``None``: the batch in one pass."""
        return self._trainer.grad_cache

    # -- the data ------------------------------------------------------------------------

    @property
    def train_set(self) -> Any:
        """The training split (an indexed dataset, or a shard stream)."""
        return self._trainer.train_set

    @property
    def dev_set(self) -> Any:
        """The dev split (rank 0 with ``train.validate``), or ``None``."""
        return self._trainer.dev_set

    @property
    def encoder(self) -> Any:
        """The caption encoder (a vocabulary or a tokenizer)."""
        return self._trainer.encoder

    @property
    def vocab_size(self) -> int | None:
        """The vocabulary's size for the model's text embedding (``None`` for a tokenizer's
        model that brings its own)."""
        return self._trainer.vocab_size

    @property
    def steps_per_epoch(self) -> int:
        """The optimiser steps of one epoch (this rank's batches)."""
        return int(self._trainer.sampler.num_batches())

    # -- where training is ---------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The current epoch (after an epoch's end: the number of epochs done)."""
        return self._trainer.epoch

    @property
    def step(self) -> int:
        """The optimiser steps taken so far (in ``after_step``: this one included)."""
        return self._trainer.step

    @property
    def batch_in_epoch(self) -> int:
        """The batches of the current epoch done (a resume re-enters the epoch there)."""
        return self._trainer.batch_in_epoch

    @property
    def select_on(self) -> str:
        """The dev metric ``best.pt`` maximises (``train.select_on`` resolved)."""
        return self._trainer.select_on

    @property
    def best_metric(self) -> float | None:
        """The best dev value of :attr:`select_on` so far (``None`` before any validation)."""
        return self._trainer.best_metric

    @property
    def best_epoch(self) -> int | None:
        """The epoch of :attr:`best_metric` (``None`` before any validation)."""
        return self._trainer.best_epoch


__all__ = ["TrainContext", "TrainControl", "TrainerView"]
