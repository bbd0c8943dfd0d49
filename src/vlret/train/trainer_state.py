"""What a :class:`~vlret.train.Trainer` checkpoint holds, and how a resume reads it back.

``last.pt`` / ``best.pt`` are :meth:`TrainerState.state_dict`: the model, optimiser, scheduler,
scaler, the loss module's state (AdaCL margins and queues, an identity classifier), the
momentum encoder, the RNG state, the position in training (epoch, batch in epoch, step), the
selection state, the config and the caption encoder, and ``procedure``: the state of the
training procedure (:meth:`vlret.train.loss_step.LossStep.state_dict`; ``{}`` for the standard
step, NCR's network B and its division, Meta-SPN's weighting network and its optimiser; the
optimiser state of a procedure's own networks is in ``optimizer``, the trainer's).
:meth:`TrainerState._load` restores all of it, so a resumed run continues where it stopped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..run.builders import encoder_state
from ..run.checkpoint import (
    CHECKPOINT_VERSION,
    best_selection,
    capture_rng_state,
    restore_rng_state,
)
from ..run.folder import RunFolderError, restore_best
from .run_log import LOG_FILE, copy_log, truncate_log


class TrainerState:
    """The checkpoint half of :class:`~vlret.train.Trainer` (a mixin over its attributes)."""

    # The attributes read here are the trainer's (see vlret.train.trainer).
    model: Any
    optimizer: Any
    scheduler: Any
    scaler: Any
    loss_fn: Any
    loss_step: Any
    momentum_encoder: Any
    epoch: int
    batch_in_epoch: int
    step: int
    select_on: str
    best_metric: float | None
    best_epoch: int | None
    epoch_loss_sum: float
    epoch_batches: int
    epoch_skipped: int
    world: int
    config: Any
    encoder: Any
    vocab_size: int | None
    is_main: bool
    check_only: bool
    output_dir: Path
    print_fn: Any

    @property
    def best_rsum(self) -> float | None:
        """The best dev rsum when ``best.pt`` is selected on rsum, else ``None``."""
        return self.best_metric if self.select_on == "rsum" else None

    def state_dict(self) -> dict[str, Any]:
        return {
            "version": CHECKPOINT_VERSION,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "loss": self.loss_fn.state_dict(),
            "momentum_encoder": (
                self.momentum_encoder.state_dict() if self.momentum_encoder is not None else None
            ),
            "procedure": self.loss_step.state_dict(),
            "rng": capture_rng_state(),
            "epoch": self.epoch,
            "batch_in_epoch": self.batch_in_epoch,
            "step": self.step,
            "select_on": self.select_on,
            "best_metric": self.best_metric,
            "best_rsum": self.best_rsum,
            "best_epoch": self.best_epoch,
            "epoch_loss_sum": self.epoch_loss_sum,
            "epoch_batches": self.epoch_batches,
            "epoch_skipped": self.epoch_skipped,
            "world_size": self.world,
            "config": self.config.to_dict(),
            "encoder": encoder_state(self.encoder, self.config),
            "vocab_size": self.vocab_size,
        }

    def _load(self, path: str | Path, state: dict[str, Any]) -> None:
        state = self.loss_step.adapt_checkpoint(state)  # a procedure's earlier layout
        try:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
            if state.get("scaler"):
                self.scaler.load_state_dict(state["scaler"])
            self.loss_fn.load_state_dict(state["loss"])
            # checkpoints before training procedures had none: the standard step's empty state
            self.loss_step.load_state_dict(state.get("procedure") or {})
        except (RuntimeError, KeyError, ValueError) as err:  # e.g. another vocabulary size
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise RunFolderError(f"{path}: does not fit this run's model ({first})") from None
        if self.momentum_encoder is not None:
            if state.get("momentum_encoder") is None:
                raise ValueError(f"{path}: holds no momentum encoder but the config uses one")
            self.momentum_encoder.load_state_dict(state["momentum_encoder"])
        restore_rng_state(state["rng"])
        self.epoch = int(state["epoch"])
        self.batch_in_epoch = int(state["batch_in_epoch"])
        self.step = int(state["step"])
        self.best_metric = best_selection(state)[1]  # check_select_on: the same metric
        self.best_epoch = state.get("best_epoch")
        self.epoch_loss_sum = float(state["epoch_loss_sum"])
        self.epoch_batches = int(state["epoch_batches"])
        self.epoch_skipped = int(state.get("epoch_skipped", 0))
        if self.is_main and not self.check_only:  # check_run writes nothing
            log = self.output_dir / LOG_FILE
            source_log = Path(path).parent / LOG_FILE
            if not log.exists() and source_log.is_file():  # resumed into another folder
                copy_log(source_log, log)
            truncate_log(log, step=self.step, epoch=self.epoch)
            note = restore_best(path, state, self.output_dir)
            if note and self.print_fn is not None:
                self.print_fn(note)


__all__ = ["TrainerState"]
