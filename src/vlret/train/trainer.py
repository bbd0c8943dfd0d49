"""The training loop: the one place that knows both the models and the losses.

``Trainer(config).fit()`` trains ``vlret.models.build_model(config.model)`` with the registered
loss ``config.loss.name`` (a model that scores pairs itself, SCAN, BFAN or SGRAF, through the
loss's ``from_similarity``: :mod:`vlret.run.pair_scoring`); the output folder receives
``config.yaml`` (resolved config), ``vocab.json``, ``metrics.jsonl``, ``last.pt`` (every epoch,
every ``checkpoint_every`` steps, every ``checkpoint_minutes``, and on Ctrl-C / SIGTERM) and
``best.pt`` (the best dev value of ``train.select_on``: rsum on the first 1000 images / 5000
captions, T->I R@1 over the whole validation split on person search; written before
``last.pt``). The folder rules (no training into another run's folder, what a resumed config may
change) are in :mod:`vlret.run.folder`.

Exact resume: the batch order of epoch ``e`` is a function of ``seed + e`` only, and a
checkpoint holds every other piece of state that a step reads (weights, optimiser, schedule,
AMP scaler, loss buffers and extra state, memory queues, momentum encoder, the Python / NumPy /
torch / CUDA generators, the position inside the epoch). A CPU run resumed from ``last.pt``
therefore ends with bit-identical weights to the uninterrupted run.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..data.caption_augment import build_text_augment
from ..data.caption_length import cap_caption_tokens
from ..data.formats import StreamOptions, get_format, open_dataset
from ..data.formats.pedes.augment import build_augment
from ..data.formats.shards import ShardStream
from ..losses import loss_capabilities
from ..memory import MomentumEncoder
from ..run.builders import (
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
)
from ..run.init_weights import load_init_weights
from ..run.lock import RunLock, acquire_run_lock
from ..run.loss_builder import build_run_loss
from ..run.pair_scoring import scores_pairs
from ..run.train_checks import check_data_root, check_schedule_length
from .context import TrainContext
from .dev_loss import Validation
from .hooks.core import HookList, TrainHook, TrainResult, param_groups
from .hooks.from_config import config_hooks
from .loop import TrainingInterrupted as TrainingInterrupted  # vlret.train's import path
from .loop import TrainLoop
from .loss_step import LossStep
from .optim_groups import build_optimizer, clip_sets, set_group_weight_decay
from .parallel.distributed import (
    ShardedBatchSampler,
    init_distributed,
    shutdown_distributed,
)
from .parallel.grad_cache import GradCache
from .parallel.ring import exchange_mode
from .procedures.registry import build_procedure
from .run_log import (
    LOG_FILE,
    append_record,
)
from .schedule import StepDecayWarmup as StepDecayWarmup  # vlret.train's import path
from .schedule import amp_dtype, build_schedule, prepare_model, seed_everything
from .trainer_state import TrainerState


class Trainer(TrainerState, TrainLoop):
    """Builds everything from a :class:`RunConfig` and runs :meth:`fit` (:mod:`.loop`), calling
    its hooks (:mod:`.hooks`) at fixed points with its :attr:`context`; a step hands the loss
    one :class:`~vlret.losses.StepInputs`."""

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
        #: What hooks and procedures see of this run (:mod:`.context`), never the trainer.
        self.context = TrainContext(self)
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
        #: The run folder's lock (:mod:`vlret.run.lock`), held by rank 0 until :meth:`fit` ends.
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
        try:  # data.max_caption_tokens: every caption the run encodes
            cap_caption_tokens(self.encoder, config.data.max_caption_tokens)
        except ValueError as err:
            raise ConfigError(config.source, "data.max_caption_tokens", str(err)) from None
        self.vocab_size = vocab_size(self.encoder)
        self.model = build_run_model(config, self.vocab_size).to(self.device)
        if tc.init_from is not None and resume_state is None:  # last.pt holds the weights
            start = load_init_weights(
                self.model, tc.init_from, encoder=encoder_state(self.encoder, config)
            )
            self._pending_records.append({"kind": "init_from", **start})
            if self.print_fn is not None:
                self.print_fn(f"{config.source}: model weights from {tc.init_from}")
        #: A score matrix instead of embeddings (SCAN, BFAN, SGRAF): :mod:`vlret.run.pair_scoring`.
        self.scores_pairs = scores_pairs(self.model)
        transform = getattr(self.model, "image_transform", None)
        validates = bool(tc.validate and config.data.dev_split and self.is_main)
        self.train_set, self.dev_set = self._open_splits(transform, validates=validates)
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
        #: ``train.exchange`` under torchrun (``"gather"`` in one process): :mod:`.parallel.ring`.
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
        self.grad_cache: GradCache | None = None
        if tc.grad_cache_chunk:  # the batch encoded in chunks
            self.grad_cache = GradCache(
                self.ddp_model, chunk_size=tc.grad_cache_chunk, autocast=self.context.autocast
            )
        self.loss_params = [p for p in self.loss_fn.parameters() if p.requires_grad]
        if loss_step is None:  # "standard" resolved from the loss's and model's capabilities
            loss_step = build_procedure(config, scores_pairs=self.scores_pairs)
        self.loss_step = loss_step
        self.validation = Validation(self.context, procedure=self.loss_step)  # dev metrics, loss
        self.epoch = 0
        self.batch_in_epoch = 0
        self.step = 0
        #: The config's hooks (:mod:`.config_hooks`), then the caller's, in call order.
        ctx = self.context
        self.hooks = HookList([*config_hooks(ctx), *self.loss_step.hooks(ctx), *hooks])
        networks = self.loss_step.networks()  # a procedure's own, built by its hooks()
        groups = param_groups(ctx, self.hooks, networks=networks)
        optimizer = build_optimizer(config.optim, groups)
        self.optimizer = set_group_weight_decay(optimizer, groups)  # optim.no_decay's groups
        self.clip_sets = clip_sets(self.optimizer, networks)
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

    def _open_splits(self, transform: Any, *, validates: bool) -> tuple[Any, Any]:
        """The training split (a stream for a streaming format, :mod:`vlret.data.formats`)
        augmented as ``data.train_transform`` says, and the dev split when this process
        validates (the format's :attr:`~vlret.data.formats.DataFormat.dev_split`, its first
        ``data.dev_max_images`` images); ``transform`` is the model's image transform."""
        data, tc = self.config.data, self.config.train
        record = get_format(data.format)
        augment = build_augment(data, transform)  # data.train_transform's
        stream = None
        if record.streams:
            stream = StreamOptions(
                batch_size=tc.batch_size,
                seed=tc.seed,
                rank=self.env.rank,
                world_size=self.env.world_size,
                max_batches=tc.max_steps_per_epoch,
                augment=augment,
            )
        train = build_train_dataset(
            data, data.train_split, self.encoder, image_transform=transform, stream=stream
        )
        if augment is not None and stream is None:
            train.set_augment(augment, seed=tc.seed)
        if data.text_augment != "none":  # data.text_augment's, on the training split only
            if stream is not None:
                why = f"a streamed format ({data.format}) is not augmented; use precomp/karpathy"
                raise ConfigError(self.config.source, "data.text_augment", why)
            try:
                train.set_text_augment(build_text_augment(data, self.encoder), seed=tc.seed)
            except ValueError as err:
                raise ConfigError(self.config.source, "data.text_augment", str(err)) from None
        dev_split = record.dev_split(data) if validates else None
        if dev_split is None:
            return train, None
        dev = open_dataset(
            data,
            dev_split,
            encoder=self.encoder,
            max_images=data.dev_max_images,
            image_transform=transform,
        )
        return train, dev

    def _log(self, record: dict[str, Any]) -> None:
        if self.is_main:
            append_record(self.output_dir / LOG_FILE, record)

    def save(self, name: str = "last.pt") -> Path | None:
        if not self.is_main:
            return None
        return save_checkpoint(self.state_dict(), self.output_dir / name)

    # -- the end ------------------------------------------------------------------------------

    def close(self) -> None:
        """Drop the DistributedDataParallel wrapper and the run folder's lock; call it when
        training is over.

        Its reducer must be gone before the interpreter exits or the process group is destroyed
        (:mod:`.parallel.distributed`, "Shutdown"); the group itself is left alone. Idempotent.
        """
        self.release_lock()
        if self.ddp_model is not self.model:
            self.ddp_model = self.model
            if self.grad_cache is not None:  # it holds the wrapper too
                self.grad_cache.model = self.model
            gc.collect()  # the wrapper sits in reference cycles; free its reducer now

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
