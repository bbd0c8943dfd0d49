"""The training loop: the one place that knows both the models and the losses.

``Trainer(config).fit()`` trains ``vlret.models.build_model(config.model)`` with the registered
loss ``config.loss.name`` (a model that scores pairs itself, SCAN, BFAN or SGRAF, through the
loss's ``from_similarity``: :mod:`.pair_scoring`); the output folder receives ``config.yaml``
(resolved config), ``vocab.json``, ``metrics.jsonl``, ``last.pt`` (every epoch, every
``checkpoint_every`` steps, every ``checkpoint_minutes``, and on Ctrl-C / SIGTERM) and
``best.pt`` (the best dev value of ``train.select_on``: rsum on the first 1000 images / 5000
captions, T->I R@1 over the whole validation split on person search; written before
``last.pt``). The folder rules (no training into another run's folder, what a resumed config
may change) are in :mod:`.run_folder`.

Exact resume: the batch order of epoch ``e`` is a function of ``seed + e`` only, and a
checkpoint holds every other piece of state that a step reads (weights, optimiser, schedule,
AMP scaler, loss buffers and extra state, memory queues, momentum encoder, the Python / NumPy /
torch / CUDA generators, the position inside the epoch). A CPU run resumed from ``last.pt``
therefore ends with bit-identical weights to the uninterrupted run.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .._progress import progress_bar
from ..data.bad_samples import check_bad_fraction, epoch_skipped
from ..data.image_sets import build_image_sets
from ..data.shards import IMAGE_FORMATS, ShardStream
from ..losses import loss_capabilities
from ..memory import MomentumEncoder
from ..run.builders import (
    build_dataset,
    build_encoder,
    build_run_model,
    build_train_dataset,
    check_model_config,
    check_split_features,
    encoder_state,
    vocab_size,
)
from ..run.checkpoint import save_checkpoint
from ..run.config import ConfigError, RunConfig
from ..run.config_checks import selection_metric
from ..run.devices import resolve_device
from ..run.folder import (
    check_folder_unwritten,
    check_noise_record,
    check_resume_config,
    check_select_on,
    check_stream_resume,
    clear_run_folder,
    missing_folders,
    prepare_run_folder,
    read_state,
    replaces_run,
    run_input_paths,
    save_run_files,
)
from ..run.init_weights import load_init_weights
from ..run.lock import RunLock, acquire_run_lock
from ..run.loss_builder import build_run_loss
from ..run.pair_scoring import scores_pairs
from ..run.train_checks import check_data_root, check_schedule_length
from .dev_loss import Validation
from .hooks.core import HookList, StepOutput, TrainHook, TrainResult, param_groups
from .hooks.from_config import config_hooks
from .loss_step import LossStep, StepLoss
from .optim_groups import build_optimizer, set_group_weight_decay
from .parallel.distributed import (
    ShardedBatchSampler,
    any_rank,
    collective,
    init_distributed,
    shutdown_distributed,
)
from .parallel.grad_cache import GradCache
from .parallel.ring import exchange_mode
from .procedures.pair_bank import with_pair_bank
from .procedures.registry import build_procedure
from .run_log import (
    LOG_FILE,
    append_record,
    epoch_line,
    epoch_record,
    run_summary,
    selected_value,
    step_record,
)
from .schedule import StepDecayWarmup as StepDecayWarmup  # vlret.train's import path
from .schedule import amp_dtype, build_schedule, interrupt_flag, prepare_model, seed_everything
from .trainer_state import TrainerState


class TrainingInterrupted(KeyboardInterrupt):
    """Raised by :meth:`Trainer.fit` after Ctrl-C (or SIGTERM) once ``last.pt`` is written."""

    def __init__(self, checkpoint: Path | None) -> None:
        super().__init__(f"training interrupted; checkpoint: {checkpoint}")
        self.checkpoint = checkpoint


class Trainer(TrainerState):
    """Builds everything from a :class:`RunConfig` and runs :meth:`fit`, calling its hooks
    (:mod:`.hooks`) at fixed points; a step hands the loss one :class:`~vlret.losses.StepInputs`."""

    def __init__(
        self,
        config: RunConfig,
        *,
        resume: str | Path | None = None,
        overwrite: bool = False,
        print_fn: Callable[[str], None] | None = print,
        hooks: Sequence[TrainHook] = (),
        loss_step: LossStep | None = None,
        check: bool = False,
    ) -> None:
        """``resume``: a ``last.pt`` (or ``best.pt``) to continue exactly; ``overwrite``: replace
        the run that ``config.output_dir`` holds (refused otherwise, see
        :mod:`vlret.run.folder`); ``print_fn``: where the per-epoch summary line goes on
        rank 0 (None: nowhere); ``hooks``: run after the config's own (:mod:`.hooks`);
        ``loss_step``: what a step computes (default :class:`.loss_step.LossStep`); ``check``:
        build and check everything as a run would, creating, locking and writing nothing
        (:func:`vlret.train.check_run`; such a trainer cannot :meth:`fit`)."""
        self.config = config
        #: Built by :func:`vlret.train.check_run`: nothing is created, locked or written.
        self.check_only = check
        tc = config.train
        #: The dev metric ``best.pt`` maximises (``train.select_on`` resolved).
        self.select_on = selection_metric(config)
        self.env = init_distributed(timeout=tc.dist_timeout)
        self.world = self.env.world_size
        self.is_main = self.env.is_main
        self.print_fn = print_fn if self.is_main else None
        try:
            self.device = resolve_device(tc.device, local_rank=self.env.local_rank)
        except ValueError as err:
            raise ConfigError(config.source, "train.device", str(err)) from None
        #: The run folder's lock (:mod:`.run_lock`), held by rank 0 until :meth:`fit` ends.
        self.run_lock: RunLock | None = None
        # Folder and checkpoint problems before the (slow) vocabulary and data; the folder is
        # locked before anything in it is read, and nothing in it is written or deleted before
        # every check has passed (the end of _build).
        created = [] if check else missing_folders(config.output_dir)
        writes = self.is_main and not check
        #: Records for metrics.jsonl made while building, written once the checks passed.
        self._pending_records: list[dict[str, Any]] = []
        try:
            self.output_dir = prepare_run_folder(
                config.output_dir,
                resume=resume,
                overwrite=overwrite,
                create=writes,
                lock=self._lock_folder if writes else None,
                inputs=run_input_paths(config, resume=resume),
            )
            if check and self.is_main:  # what the lock and the first write would meet
                check_folder_unwritten(self.output_dir)
            self._replace_run = writes and replaces_run(
                self.output_dir, resume=resume, overwrite=overwrite
            )
            self._build(config, resume, hooks, loss_step)
        except BaseException:
            self.release_lock()
            if self.is_main:  # a refused run leaves none of the folders it made behind
                for folder in created:
                    with contextlib.suppress(OSError):  # one that now holds a file stays
                        folder.rmdir()
            raise

    def _lock_folder(self, folder: Path) -> None:
        self.run_lock = acquire_run_lock(folder, notify=self.print_fn)

    def release_lock(self) -> None:
        """Let another process use the run folder (done when :meth:`fit` ends; idempotent)."""
        if self.run_lock is not None:
            self.run_lock.release()

    def _build(
        self,
        config: RunConfig,
        resume: str | Path | None,
        hooks: Sequence[TrainHook],
        loss_step: LossStep | None,
    ) -> None:
        tc = config.train
        resume_state = None
        if resume is not None:
            resume_state = read_state(resume, self.device)
            check_resume_config(resume_state.get("config"), config.to_dict(), resume)
            check_select_on(resume_state, self.select_on, resume)
            check_stream_resume(  # shards: the same readers and stream
                resume_state.get("config"),
                config.to_dict(),
                resume,
                stored_world=resume_state.get("world_size"),
                world=self.world,
            )
        self.amp_dtype = amp_dtype(tc.amp, self.device, source=config.source)  # None: off
        if tc.deterministic and self.device.type == "cuda":
            torch.backends.cudnn.deterministic = True
            torch.backends.cudnn.benchmark = False
        seed_everything(tc.seed)

        check_model_config(config)  # model-section errors before the (slow) vocabulary
        check_data_root(config.data, config.source)  # one line naming data.root
        self.encoder = build_encoder(config.data, model=config.model, source=config.source)
        self.vocab_size = vocab_size(self.encoder)
        self.model = build_run_model(config, self.vocab_size).to(self.device)
        if tc.init_from is not None and resume_state is None:  # last.pt holds the weights
            start = load_init_weights(
                self.model, tc.init_from, encoder=encoder_state(self.encoder, config)
            )
            self._pending_records.append({"kind": "init_from", **start})
            if self.print_fn is not None:
                self.print_fn(f"{config.source}: model weights from {tc.init_from}")
        #: A score matrix instead of embeddings (SCAN, BFAN, SGRAF): see :mod:`.pair_scoring`.
        self.scores_pairs = scores_pairs(self.model)
        transform = getattr(self.model, "image_transform", None)
        validates = bool(tc.validate and config.data.dev_split and self.is_main)
        self.train_set, self.dev_set = build_image_sets(  # webdataset / csv, augmentation
            config, self.encoder, transform, env=self.env, dev=validates, other=build_train_dataset
        )
        if validates and config.data.dev_split and config.data.format not in IMAGE_FORMATS:
            self.dev_set = build_dataset(
                config.data,
                config.data.dev_split,
                self.encoder,
                max_images=config.data.dev_max_images,
                image_transform=transform,
            )
        if config.data.check_features:  # rank 0 reads the files; every rank stops on a problem
            in_dim = getattr(getattr(self.model, "image_encoder", None), "in_dim", None)
            sets = (self.train_set, self.dev_set) if self.is_main else ()
            check_split_features(sets, in_dim=in_dim, world=self.world, device=self.device)
        self.loss_fn = build_run_loss(config, self.train_set, model=self.model).to(self.device)
        #: What the loss needs and offers as built (:class:`vlret.losses.LossCapabilities`).
        self.loss_caps = loss_capabilities(self.loss_fn)
        # Every loss sees the global batch; a loss's queue is then told (gathered=True) that its
        # keys are global already, so it enqueues them once without gathering them again.
        self.gather = self.world > 1
        #: ``train.exchange`` under torchrun (``"gather"`` in one process): :mod:`.ring`.
        self.exchange = exchange_mode(tc.exchange, self.world)
        #: Multi-process with a tiled loss that takes local shards: each rank computes only the
        #: terms of its own pairs (``vlret.train.parallel.distributed``, "Local shards").
        self.local_shards = bool(
            self.gather
            and self.exchange == "gather"
            and self.loss_caps.local_shards
            and self.loss_fn.chunk_size is not None
        )
        self.momentum_encoder = None
        if tc.momentum_encoder is not None:  # the config checked the loss takes its keys
            self.momentum_encoder = MomentumEncoder(self.model, momentum=tc.momentum_encoder)
        prepare_model(self.model, tc, source=config.source)  # lock, checkpointing, compile
        if self.world > 1:
            ddp_ids = [self.device.index] if self.device.type == "cuda" else None
            self.ddp_model: nn.Module = nn.parallel.DistributedDataParallel(
                self.model, device_ids=ddp_ids
            )
        else:
            self.ddp_model = self.model
        self.grad_cache = tc.grad_cache_chunk and GradCache(  # the batch encoded in chunks
            self.ddp_model, chunk_size=tc.grad_cache_chunk, autocast=self._autocast
        )
        self.loss_params = [p for p in self.loss_fn.parameters() if p.requires_grad]
        self.loss_step = build_procedure(config) if loss_step is None else loss_step
        self.loss_step = with_pair_bank(self, self.loss_step)  # SCAN/SGRAF + loss.queue_size
        self.validation = Validation(self)  # the dev metrics and the dev loss
        self.epoch = 0
        self.batch_in_epoch = 0
        self.step = 0
        #: The config's hooks (:mod:`.config_hooks`), then the caller's, in call order.
        self.hooks = HookList([*config_hooks(self), *self.loss_step.hooks(self), *hooks])
        groups = param_groups(self, self.hooks)
        optimizer = build_optimizer(config.optim, groups)
        self.optimizer = set_group_weight_decay(optimizer, groups)  # optim.no_decay's groups
        self.scheduler = build_schedule(  # a cosine's total steps are read at the first step
            self.optimizer,
            config.optim,
            total_steps=lambda: tc.epochs * self.sampler.num_batches(),
        )
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.amp_dtype == torch.float16)
        stream = self.train_set if isinstance(self.train_set, ShardStream) else None
        self.sampler: ShardStream | ShardedBatchSampler = stream or ShardedBatchSampler(
            len(self.train_set),
            tc.batch_size,
            seed=tc.seed,
            rank=self.env.rank,
            world_size=self.world,
            drop_last=tc.drop_last,
            max_batches=tc.max_steps_per_epoch,
        )
        self.best_metric: float | None = None  # the best dev value of select_on
        self.best_epoch: int | None = None
        self.epoch_loss_sum = 0.0
        self.epoch_batches = self.epoch_skipped = 0  # epoch_skipped: bad samples (bad_samples)
        check_schedule_length(  # the warm-up within the run's steps, as the data count them
            config.optim, tc, config.source, steps_per_epoch=self.sampler.num_batches()
        )
        if self.is_main and not self._replace_run:  # a resumed run's recorded noise index
            check_noise_record(self.train_set, self.output_dir)
        # Every check has passed: the old run's files go now (--overwrite), before the first
        # write (the resumed checkpoint's log and best.pt, the records above).
        if self._replace_run:
            clear_run_folder(self.output_dir)
            self._replace_run = False
        for record in self._pending_records if not self.check_only else ():
            self._log(record)
        self._pending_records.clear()
        if resume_state is not None:
            assert resume is not None  # resume_state was read from it
            self._load(resume, resume_state)

    # -- checkpoints (state_dict and _load: TrainerState) ----------------------------------

    def _log(self, record: dict[str, Any]) -> None:
        if self.is_main:
            append_record(self.output_dir / LOG_FILE, record)

    def save(self, name: str = "last.pt") -> Path | None:
        if not self.is_main:
            return None
        return save_checkpoint(self.state_dict(), self.output_dir / name)

    # -- one step ----------------------------------------------------------------------------

    def compute_loss(self, batch) -> StepLoss:
        """``(loss for backward, logged loss, context)`` of one local batch (:mod:`.loss_step`)."""
        return self.loss_step(self, batch)

    def _autocast(self) -> torch.autocast:
        on = self.amp_dtype is not None
        return torch.autocast(device_type=self.device.type, dtype=self.amp_dtype, enabled=on)

    def train_step(self, batch) -> tuple[float, dict[str, Any]]:
        """One optimisation step on a local batch; returns the (global) loss value."""
        oc = self.config.optim
        self.hooks.before_step(self, batch)
        lr = self.scheduler.apply(epoch=self.epoch, step=self.step)
        batch = batch.to(self.device, non_blocking=True)
        self.optimizer.zero_grad(set_to_none=True)
        scaled, loss, ctx = self.compute_loss(batch)
        # DDP's gradient all-reduce runs inside backward: a stalled rank ends it after
        # train.dist_timeout with the same one line as vlret's own collectives
        with collective("DDP's gradient all-reduce"):
            self.scaler.scale(scaled).backward()
            del scaled  # the loss's graph and what it holds: gone before re-encoding chunks
            if self.grad_cache:  # the cached embedding gradients into the encoders
                self.grad_cache.backward()
            if self.gather:
                # Loss parameters (e.g. a learnable temperature) see the full global loss on
                # every rank and are not averaged by DDP: undo the world-size factor.
                for p in self.loss_params:
                    if p.grad is not None:
                        if self.local_shards or self.exchange != "gather":  # own share
                            torch.distributed.all_reduce(p.grad)
                        p.grad.div_(self.world)
        self.hooks.before_optimizer_step(self)
        self.scaler.unscale_(self.optimizer)
        if oc.grad_clip and oc.grad_clip > 0:
            params = [p for g in self.optimizer.param_groups for p in g["params"]]
            torch.nn.utils.clip_grad_norm_(params, oc.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        if self.momentum_encoder is not None:
            self.momentum_encoder.update(self.model)
        self.step += 1
        ctx["lr"] = lr
        done = StepOutput(loss=float(loss), lr=lr, context=ctx)
        self.hooks.after_step(self, done)
        return done.loss, ctx

    # -- validation --------------------------------------------------------------------------

    def validate(self) -> dict[str, float | None] | None:
        """Dev metrics (logged with a ``dev_`` prefix in the epoch record): the retrieval
        metrics, plus ``pos_sim``, the mean cosine of the matching (image, caption) pairs, and
        ``hardest_neg_sim``, the mean over every image and every caption query of its hardest
        non-matching cosine (Unified Fig. 4); for a pair scorer the same on its own scores
        (:func:`.pair_scoring.pair_dev_metrics`); a procedure's own
        (:meth:`.loss_step.LossStep.validate`) instead where it has one. ``"loss"``: the dev
        loss from the same encoding (``None`` when not computed; :mod:`.dev_loss`). ``None``
        without a dev set."""
        if self.dev_set is None:
            return None
        return self.validation()

    # -- the loop ----------------------------------------------------------------------------

    def close(self) -> None:
        """Drop the DistributedDataParallel wrapper and the run folder's lock; call it when
        training is over.

        Its reducer must be gone before the interpreter exits or the process group is destroyed
        (:mod:`.distributed`, "Shutdown"); the group itself is left alone. Idempotent.
        """
        self.release_lock()
        if self.ddp_model is not self.model:
            self.ddp_model = self.model
            if self.grad_cache:  # it holds the wrapper too
                self.grad_cache.model = self.model
            gc.collect()  # the wrapper sits in reference cycles; free its reducer now

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def fit(self) -> TrainResult:
        """Train the remaining epochs; the run folder stays locked until this returns or
        raises (a second ``fit`` takes the lock again)."""
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
            self.print_fn(run_summary(self))
        if self.is_main:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            save_run_files(self.config, self.encoder, self.train_set, self.output_dir)
        last = self.output_dir / "last.pt"
        # Without a dev set (validate off, dev_split null, MSR-VTT 1k-A) best.pt = last epoch.
        best_path: Path | None = self.output_dir / "best.pt"
        with interrupt_flag() as flag:
            self._check_stop(flag)  # a signal that came while the data was loading
            self.hooks.on_fit_start(self)
            while self.epoch < tc.epochs:
                started = time.perf_counter()
                self._train_epoch(flag)
                self._end_epoch(started=started)
                if self.world > 1:
                    dist.barrier()
                self._check_stop(flag)
        result = TrainResult(
            output_dir=self.output_dir,
            epochs_done=self.epoch,
            steps=self.step,
            best_rsum=self.best_rsum,
            last_checkpoint=last,
            best_checkpoint=best_path,
            best_metric=self.best_metric,
            select_on=self.select_on,
        )
        self.hooks.on_fit_end(self, result)
        return result

    def _train_epoch(self, flag: dict[str, bool]) -> None:
        tc = self.config.train
        self.hooks.before_epoch(self)
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
        for batch in bar:
            self.epoch_skipped += getattr(batch, "skipped", 0)
            loss, ctx = self.train_step(batch)
            self.batch_in_epoch += 1
            self.epoch_loss_sum += loss
            self.epoch_batches += 1
            n_log += len(batch.img_index) * self.world
            if tc.log_every and self.step % tc.log_every == 0:
                now = time.perf_counter()
                rate = n_log / max(now - t_log, 1e-9)
                self._log_step(loss, ctx, rate)
                if hasattr(bar, "set_postfix"):
                    bar.set_postfix(loss=f"{loss:.4g}", pairs_per_s=f"{rate:.0f}")
                t_log, n_log = now, 0
            self._check_stop(flag)
            due = tc.checkpoint_every and self.step % tc.checkpoint_every == 0
            if tc.checkpoint_minutes and time.monotonic() - t_saved >= 60 * tc.checkpoint_minutes:
                due = True
            if due:
                self.save()
                t_saved = time.monotonic()
        if hasattr(bar, "close"):
            bar.close()

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
            self,
            finished_epoch,
            train_loss=train_loss,
            dev_loss=dev_loss,
            seconds=seconds,
            dev=dev,
            skipped=skipped,
        )
        self._log(record)
        if self.print_fn is not None:
            self.print_fn(epoch_line(self, record, dev_value=value))
        used = self.sampler.num_batches() * tc.batch_size  # after the line
        check_bad_fraction(skipped, self.train_set, used=used)
        if self.dev_set is None and self.epoch == tc.epochs:
            self.best_epoch, improved = finished_epoch, True
        if improved:
            self.save("best.pt")
        self.save()
        self.hooks.after_epoch(self, record)

    def _check_stop(self, flag: dict[str, bool]) -> None:
        """After Ctrl-C / SIGTERM: write ``last.pt`` (a second signal meanwhile is ignored)
        and raise :class:`TrainingInterrupted`."""
        if not any_rank(flag["set"], device=self.device):
            return
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

    def _log_step(self, loss: float, ctx: dict[str, Any], rate: float) -> None:
        self._log(step_record(self, loss, ctx, rate))


def train(
    config: RunConfig,
    *,
    resume: str | Path | None = None,
    overwrite: bool = False,
    hooks: Sequence[TrainHook] = (),
) -> TrainResult:
    """Build a :class:`Trainer` (with the extra ``hooks``, :mod:`.hooks`), run it, then release
    the DDP wrapper and the process group this call created
    (:func:`~vlret.train.parallel.distributed.shutdown_distributed`)."""
    try:
        with Trainer(config, resume=resume, overwrite=overwrite, hooks=hooks) as trainer:
            return trainer.fit()
    finally:
        shutdown_distributed()
