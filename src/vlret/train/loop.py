"""The loop half of :class:`~vlret.train.Trainer`: :meth:`TrainLoop.fit`, an epoch, a step,
validation and the requests of ``ctx.control``.

What a step does, in order: every hook's ``before_step``; the learning rate set by the schedule;
the batch moved to the device; the procedure's losses (:class:`~vlret.train.loss_step.LossStep`,
given the :class:`~vlret.train.context.TrainContext`) and one backward pass (DDP's all-reduce
inside it), the gradient cache's second pass, the loss parameters' world-size correction;
``before_optimizer_step``; unscaling, clipping (``optim.grad_clip``: the model's and the loss's
parameters together, each of the procedure's own networks on its own), the optimiser step over
every trainable parameter, the scaler's update and the momentum encoder's; ``after_step``.
Then the loop honours Ctrl-C and the control's flags (:mod:`vlret.train.context` says when and
in which order) and writes the ``train.checkpoint_every`` / ``checkpoint_minutes`` checkpoint
when due.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from .._progress import progress_bar
from ..data.bad_samples import check_bad_fraction, epoch_skipped
from ..losses import PairLoss
from ..memory import MomentumEncoder
from ..run.config import RunConfig
from ..run.devices import DistEnv
from ..run.folder import save_run_files
from ..run.lock import RunLock
from .context import TrainContext
from .dev_loss import Validation
from .hooks.core import HookList, StepOutput, TrainResult
from .loss_step import LossStep, StepLoss
from .parallel.distributed import collective
from .parallel.grad_cache import GradCache
from .run_log import epoch_line, epoch_record, run_summary, selected_value, step_record
from .schedule import interrupt_flag


class TrainingInterrupted(KeyboardInterrupt):
    """Raised by :meth:`TrainLoop.fit` after Ctrl-C (or SIGTERM) once ``last.pt`` is written."""

    def __init__(self, checkpoint: Path | None) -> None:
        super().__init__(f"training interrupted; checkpoint: {checkpoint}")
        self.checkpoint = checkpoint


class TrainLoop:
    """The loop of :class:`~vlret.train.Trainer` (a mixin over the attributes it builds)."""

    # Built by vlret.train.trainer.Trainer.
    config: RunConfig
    context: TrainContext
    hooks: HookList
    loss_step: LossStep
    validation: Validation
    model: nn.Module
    ddp_model: nn.Module
    loss_fn: PairLoss
    loss_params: list[nn.Parameter]
    optimizer: torch.optim.Optimizer
    scheduler: Any
    scaler: torch.amp.GradScaler
    momentum_encoder: MomentumEncoder | None
    grad_cache: GradCache | None
    clip_sets: list[list[nn.Parameter]]
    sampler: Any
    train_set: Any
    dev_set: Any
    encoder: Any
    env: DistEnv
    device: torch.device
    world: int
    is_main: bool
    gather: bool
    local_shards: bool
    exchange: str
    check_only: bool
    output_dir: Path
    print_fn: Callable[[str], None] | None
    select_on: str
    epoch: int
    batch_in_epoch: int
    step: int
    best_metric: float | None
    best_epoch: int | None
    epoch_loss_sum: float
    epoch_batches: int
    epoch_skipped: int

    run_lock: RunLock | None

    if TYPE_CHECKING:  # the Trainer's own: checkpoints, the run folder's lock, the log

        def save(self, name: str = "last.pt") -> Path | None: ...
        def release_lock(self) -> None: ...
        def _lock_folder(self, folder: Path) -> None: ...
        def _log(self, record: dict[str, Any]) -> None: ...
        @property
        def best_rsum(self) -> float | None: ...

    # -- one step ----------------------------------------------------------------------------

    def compute_loss(self, batch: Any) -> StepLoss:
        """``(loss for backward, logged loss, context)`` of one local batch (:mod:`.loss_step`)."""
        return self.loss_step(self.context, batch)

    def train_step(self, batch: Any) -> tuple[float, dict[str, Any]]:
        """One optimisation step on a local batch; returns the (global) loss value."""
        oc = self.config.optim
        self.hooks.before_step(self.context, batch)
        lr = self.scheduler.apply(epoch=self.epoch, step=self.step)
        batch = batch.to(self.device, non_blocking=True)
        self.optimizer.zero_grad(set_to_none=True)
        scaled, loss, out = self.compute_loss(batch)
        # DDP's gradient all-reduce runs inside backward: a stalled rank ends it after
        # train.dist_timeout with the same one line as vlret's own collectives
        with collective("DDP's gradient all-reduce"):
            self.scaler.scale(scaled).backward()
            del scaled  # the loss's graph and what it holds: gone before re-encoding chunks
            if self.grad_cache is not None:  # the cached embedding gradients into the encoders
                self.grad_cache.backward()
            if self.gather:
                # Loss parameters (e.g. a learnable temperature) see the full global loss on
                # every rank and are not averaged by DDP: undo the world-size factor.
                for p in self.loss_params:
                    if p.grad is not None:
                        if self.local_shards or self.exchange != "gather":  # own share
                            torch.distributed.all_reduce(p.grad)
                        p.grad.div_(self.world)
        self.hooks.before_optimizer_step(self.context)
        self.scaler.unscale_(self.optimizer)
        if oc.grad_clip and oc.grad_clip > 0:
            for params in self.clip_sets:  # the model with the loss, each procedure network
                torch.nn.utils.clip_grad_norm_(params, oc.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        if self.momentum_encoder is not None:
            self.momentum_encoder.update(self.model)
        self.step += 1
        out["lr"] = lr
        done = StepOutput(loss=float(loss), lr=lr, context=out)
        self.hooks.after_step(self.context, done)
        return done.loss, out

    # -- validation --------------------------------------------------------------------------

    def validate(self) -> dict[str, float | None] | None:
        """Dev metrics (logged with a ``dev_`` prefix in the epoch record): the retrieval
        metrics, plus ``pos_sim``, the mean cosine of the matching (image, caption) pairs, and
        ``hardest_neg_sim``, the mean over every image and every caption query of its hardest
        non-matching cosine (Unified Fig. 4); for a pair scorer the same on its own scores
        (:func:`vlret.run.pair_scoring.pair_dev_metrics`); a procedure's own
        (:meth:`.loss_step.LossStep.validate`) instead where it has one. ``"loss"``: the dev
        loss from the same encoding (``None`` when not computed; :mod:`.dev_loss`). ``None``
        without a dev set."""
        if self.dev_set is None:
            return None
        return self.validation()

    # -- the loop ----------------------------------------------------------------------------

    def fit(self) -> TrainResult:
        """Train the remaining epochs; the run folder stays locked until this returns or
        raises (a second ``fit`` takes the lock again). Returns early, ``stopped`` set, when a
        hook or the procedure sets ``ctx.control.should_stop`` (:mod:`vlret.train.context`)."""
        if self.check_only:
            raise RuntimeError("a trainer built with check=True only checks; it cannot fit")
        if self.is_main and (self.run_lock is None or not self.run_lock.held):
            self._lock_folder(self.output_dir)
        try:
            return self._fit()
        finally:
            self.release_lock()

    def _fit(self) -> TrainResult:
        tc = self.config.train
        if self.print_fn is not None:
            self.print_fn(run_summary(self.context))
        if self.is_main:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            save_run_files(self.config, self.encoder, self.train_set, self.output_dir)
        last = self.output_dir / "last.pt"
        # Without a dev set (validate off, dev_split null, MSR-VTT 1k-A) best.pt = last epoch.
        best_path: Path | None = self.output_dir / "best.pt"
        stopped = False
        with interrupt_flag() as flag:
            self._check_stop(flag)  # a signal that came while the data was loading
            self.hooks.on_fit_start(self.context)
            while self.epoch < tc.epochs:
                started = time.perf_counter()
                if self._train_epoch(flag):
                    stopped = True
                    break
                self._end_epoch(started=started)
                if self.world > 1:
                    dist.barrier()
                if self._after_epoch_control(flag):
                    stopped = self.epoch < tc.epochs
                    break
        result = TrainResult(
            output_dir=self.output_dir,
            epochs_done=self.epoch,
            steps=self.step,
            best_rsum=self.best_rsum,
            last_checkpoint=last,
            best_checkpoint=best_path,
            best_metric=self.best_metric,
            select_on=self.select_on,
            stopped=stopped,
        )
        self.hooks.on_fit_end(self.context, result)
        return result

    def _train_epoch(self, flag: dict[str, bool]) -> bool:
        """The epoch's remaining batches; ``True`` when the control stopped training in it
        (``last.pt`` written after the step that asked)."""
        tc = self.config.train
        self.hooks.before_epoch(self.context)
        self.train_set.set_epoch(self.epoch)  # augmentation keys (seed, epoch, index)
        self.sampler.set_epoch(self.epoch, start_batch=self.batch_in_epoch)
        loader = self.sampler.loader(
            self.train_set, num_workers=self.config.data.num_workers, seed=tc.seed + self.epoch
        )
        self.ddp_model.train()
        self.loss_fn.train()
        t_log, n_log = time.perf_counter(), 0
        t_saved = time.monotonic()
        bar = self._progress(loader)
        stop = False
        for batch in bar:
            self.epoch_skipped += getattr(batch, "skipped", 0)
            loss, out = self.train_step(batch)
            self.batch_in_epoch += 1
            self.epoch_loss_sum += loss
            self.epoch_batches += 1
            n_log += len(batch.img_index) * self.world
            if tc.log_every and self.step % tc.log_every == 0:
                now = time.perf_counter()
                rate = n_log / max(now - t_log, 1e-9)
                self._log(step_record(self.context, loss, out, rate))
                if hasattr(bar, "set_postfix"):
                    bar.set_postfix(loss=f"{loss:.4g}", pairs_per_s=f"{rate:.0f}")
                t_log, n_log = now, 0
            stop, saved = self._after_step_control(flag)
            if stop:
                break
            due = tc.checkpoint_every and self.step % tc.checkpoint_every == 0
            if tc.checkpoint_minutes and time.monotonic() - t_saved >= 60 * tc.checkpoint_minutes:
                due = True
            if due and not saved:
                self.save()
            if due or saved:
                t_saved = time.monotonic()
        if hasattr(bar, "close"):
            bar.close()
        return stop

    def _end_epoch(self, *, started: float) -> None:
        """Validate, log, print the summary line and write the checkpoints: ``best.pt`` (when
        the dev value of ``train.select_on`` improved) before ``last.pt``, so a kill between
        the two never leaves a ``last.pt`` that claims a best epoch ``best.pt`` does not hold."""
        tc = self.config.train
        train_loss = self.epoch_loss_sum / max(self.epoch_batches, 1)
        dev = self.validate() if self.is_main else None
        dev_loss = dev.pop("loss", None) if dev is not None else None
        value = selected_value(dev, self.select_on)
        improved = False
        if value is not None and (self.best_metric is None or value > self.best_metric):
            self.best_metric, self.best_epoch, improved = float(value), self.epoch, True
        finished_epoch = self.epoch
        # the bad training samples over all ranks (every rank takes part; bad_samples)
        skipped = epoch_skipped(self.train_set, self.epoch_skipped, device=self.device)
        self.epoch += 1
        self.batch_in_epoch = 0
        self.epoch_loss_sum, self.epoch_batches, self.epoch_skipped = 0.0, 0, 0
        seconds = time.perf_counter() - started  # training and validation
        record = epoch_record(
            self.context,
            finished_epoch,
            train_loss=train_loss,
            dev_loss=dev_loss,
            seconds=seconds,
            dev=dev,
            skipped=skipped,
        )
        self._log(record)
        if self.print_fn is not None:
            self.print_fn(epoch_line(self.context, record, dev_value=value))
        used = self.sampler.num_batches() * tc.batch_size  # after the line
        check_bad_fraction(skipped, self.train_set, used=used)
        if self.dev_set is None and self.epoch == tc.epochs:
            self.best_epoch, improved = finished_epoch, True
        if improved:
            self.save("best.pt")
        self.save()
        if finished_epoch in tc.keep_epochs:  # train.keep_epochs: this epoch's own copy
            self.save(f"epoch_{finished_epoch}.pt")
        self.hooks.after_epoch(self.context, record)

    # -- Ctrl-C and the control's requests ---------------------------------------------------

    def _agreed(self, *flags: bool) -> list[bool]:
        """Each flag OR-ed over the ranks: one collective under torchrun (the one the loop
        always ran for Ctrl-C), the flags themselves in one process."""
        if self.world == 1:
            return list(flags)
        t = torch.tensor([1.0 if f else 0.0 for f in flags], device=self.device)
        with collective("all_reduce"):
            dist.all_reduce(t)
        return [v > 0 for v in t.tolist()]

    def _after_step_control(self, flag: dict[str, bool]) -> tuple[bool, bool]:
        """After a step: Ctrl-C (``last.pt``, :class:`TrainingInterrupted`), then the control's
        ``should_evaluate``, ``should_save`` and ``should_stop``, each reset once honoured.
        Returns ``(stop, saved)``: whether training stops now and whether ``last.pt`` was
        just written."""
        control = self.context.control
        interrupted, stop, save, evaluate = self._agreed(
            flag["set"], control.should_stop, control.should_save, control.should_evaluate
        )
        control.reset()
        if interrupted:
            self._interrupt(flag)
        if evaluate:
            self._evaluate_now()
        if save or stop:
            self.save()  # a mid-epoch checkpoint: --resume continues after this step
        return stop, save or stop

    def _after_epoch_control(self, flag: dict[str, bool]) -> bool:
        """After an epoch's end (validated, logged, checkpointed; ``after_epoch`` done):
        Ctrl-C, then ``should_stop``; ``should_save`` / ``should_evaluate`` are reset, the
        epoch's end having done both. Returns whether training stops now."""
        control = self.context.control
        interrupted, stop = self._agreed(flag["set"], control.should_stop)
        control.reset()
        if interrupted:
            self._interrupt(flag)
        return stop

    def _evaluate_now(self) -> None:
        """The validation ``should_evaluate`` asked for: rank 0 validates, logs a ``kind: dev``
        record and hands it to every hook's ``after_evaluate``; the model and the loss go back
        to training mode (the selection and ``best.pt`` are left to the epoch's end)."""
        dev = self.validate() if self.is_main else None
        if dev is not None:
            record: dict[str, Any] = {"kind": "dev", "epoch": self.epoch, "step": self.step}
            record.update({f"dev_{k}": v for k, v in dev.items()})
            self._log(record)
            self.hooks.after_evaluate(self.context, record)
        self.ddp_model.train()
        self.loss_fn.train()

    def _check_stop(self, flag: dict[str, bool]) -> None:
        """After Ctrl-C / SIGTERM (on any rank): :meth:`_interrupt`."""
        (interrupted,) = self._agreed(flag["set"])
        if interrupted:
            self._interrupt(flag)

    def _interrupt(self, flag: dict[str, bool]) -> None:
        """Write ``last.pt`` (a second signal meanwhile is ignored) and raise
        :class:`TrainingInterrupted`."""
        flag["saving"] = True
        try:
            path = self.save()
        finally:
            flag["saving"] = False
        raise TrainingInterrupted(path)

    def _progress(self, loader: Any) -> Any:
        """The epoch's batches behind a bar on rank 0 when ``train.progress`` (drawn only where
        :mod:`vlret._progress` draws bars: a terminal, bars not switched off); it is gone
        (``leave=False``) before the epoch's summary line is printed."""
        desc = f"epoch {self.epoch} ({self.epoch + 1}/{self.config.train.epochs})"
        show = self.config.train.progress and self.is_main
        return progress_bar(loader, show=show, desc=desc, unit="batch", leave=False)


__all__ = ["TrainLoop", "TrainingInterrupted"]
