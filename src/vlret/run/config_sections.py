"""The ``[optim]`` and ``[train]`` sections of a run config, one declaration per key, and how
every declared section is read (:func:`build_section`).

Each key is a dataclass field made by :func:`vlret._settings.setting`: its default, its
one-line description and its constraint (:class:`~vlret._settings.Setting`). That one
declaration feeds the dataclass (defaults and types), validation (:func:`build_section`, called
by :func:`vlret.run.config.config_from_dict` for ``[data]``, ``[optim]`` and ``[train]``:
every single-key constraint is checked there, in a config file's words) and the generated key
reference (``scripts/gen_reference.py`` writes ``docs/reference/config.md`` from
:func:`vlret._settings.declared`). The checks between keys stay functions
(:mod:`vlret.run.config_checks`, :mod:`vlret.run.train_checks`). The ``[data]`` section is the
data layer's (:class:`vlret.data.config.DataConfig`); the ``[loss]`` keys are each loss's
``param()`` fields (:mod:`vlret.losses.params`), the same declaration.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

from .._settings import (
    MAX_BATCH,
    MAX_EPOCHS,
    MAX_SEED,
    MAX_STEPS,
    Checked,
    Items,
    OneOf,
    Range,
    Setting,
    SettingError,
    build,
    check_values,
    setting,
)
from ..data.config import DataConfig
from .config_files import ConfigError
from .devices import DIST_TIMEOUT, parse_device
from .train_checks import AMP_MODES, EXCHANGES, FREEZE_BN, SCHEDULES

OPTIMIZERS = ("adam", "adamw", "sgd")
#: What ``train.amp`` takes, in a config file's words.
AMP_WORDS = f"true or false, or one of {', '.join(AMP_MODES)}"

_Section = TypeVar("_Section")


def build_section(cls: type[_Section], raw: Any, source: str, section: str) -> _Section:
    """The declared section ``cls`` read from the raw ``[section]`` table
    (:func:`vlret._settings.build`): an unknown key (the message lists the valid ones), a
    missing required one or a value its declaration refuses is a :class:`ConfigError` naming
    ``section.key``."""
    try:
        return build(cls, raw, where=section, unknown=f"unknown key; valid keys of [{section}]")
    except SettingError as err:
        raise ConfigError(source, err.key, err.why) from None


def check_declared(obj: Any, section: str, source: str) -> None:
    """Check every key of the built section ``obj`` against its declaration: a
    :class:`ConfigError` naming ``section.key`` (``expected one of a, b, got 'c'`` /
    ``expected >= 0, got -1``)."""
    try:
        check_values(obj, where=section)
    except SettingError as err:
        raise ConfigError(source, err.key, err.why) from None


@dataclass
class OptimConfig:
    """Optimiser and learning-rate schedule: the ``[optim]`` section (one
    :func:`~vlret._settings.setting` per key).

    The step schedule's rate is ``lr * decay_factor ** (number of decay_epochs <= epoch)``, or
    with ``decay_every = k > 0`` ``lr * decay_factor ** (epoch // k)`` (epochs count from 0),
    times a linear warm-up from ``lr / warmup_steps`` to ``lr`` over the first
    ``warmup_steps`` steps; ``schedule = "cosine"`` is open_clip's, over the run's steps
    (:class:`vlret.train.schedule.CosineWarmup`). ``lr_multipliers``: the longest matching
    parameter-name prefix wins; warm-up and decay scale every group alike
    (:class:`vlret.train.hooks.core.LrMultipliers`); a nested table is read as dotted prefixes, a
    quoted key holding dots sits beside a shorter prefix (``{ text_encoder = 0.5,
    "text_encoder.bert" = 0.1 }``). ``no_decay`` null: open_clip's rule with ``adamw``, none
    otherwise (:mod:`vlret.train.optim_groups`).
    """

    name: str = setting("adam", "the optimiser", choices=OPTIMIZERS)
    lr: float = setting(2e-4, "the base learning rate", spec=Range(gt=0, typed=False))
    weight_decay: float = setting(0.0, "weight decay", at_least=0)
    betas: list[float] = setting(
        doc="Adam's / AdamW's betas",
        factory=lambda: [0.9, 0.999],
        spec=Items(Range(ge=0, lt=1), length=2, words="two numbers in [0, 1)"),
    )
    momentum: float = setting(0.0, "SGD's momentum", at_least=0)
    decay_epochs: list[int] = setting(
        doc="step schedule: the epochs at which the rate is multiplied by `decay_factor`",
        factory=list,
        sane=(0, MAX_EPOCHS),
        constraint="not with decay_every or schedule cosine",
    )
    decay_factor: float = setting(
        0.1, "step schedule: the factor of each decay", spec=Range(gt=0, typed=False)
    )
    decay_every: int = setting(
        0,
        "step schedule: decay every k epochs (CE / MMT: x0.95 every epoch); 0: off",
        at_least=0,
        sane=(0, MAX_EPOCHS),
        constraint="not with decay_epochs",
    )
    warmup_steps: int = setting(
        0,
        "linear warm-up over the first N steps",
        at_least=0,
        sane=(0, MAX_STEPS),
        constraint="cosine: below the run's steps (train.epochs x steps per epoch)",
    )
    grad_clip: float | None = setting(
        2.0,
        "the largest total gradient norm (VSE++: 2.0)",
        at_least=0,
        reason="0 or null: no clipping",
    )
    lr_multipliers: dict[str, float] = setting(
        doc='parameter-name prefix -> factor of `lr` (`{ "text_encoder.bert" = 0.1 }`; `loss`: '
        "the loss's own parameters)",
        factory=dict,
        constraint="positive factors; a prefix must name a trainable parameter",
    )
    schedule: str = setting(
        "step", "`step` (the decays above) or `cosine` (open_clip's)", choices=SCHEDULES
    )
    no_decay: list[str] | None = setting(
        None,
        "patterns of the parameters without weight decay; null: open_clip's rule with adamw "
        "(norms, biases, the temperature), none otherwise",
    )
    eps: float = setting(
        1e-8,
        "Adam's / AdamW's denominator term (IRRA's Adam: 1e-3); unused by sgd",
        spec=Range(gt=0, lt=1),
    )


@dataclass
class TrainConfig:
    """Loop settings: the ``[train]`` section (one :func:`~vlret._settings.setting` per key).

    ``last.pt`` is written at the end of every epoch, every ``checkpoint_every`` steps and every
    ``checkpoint_minutes`` of training, so a killed run loses at most that much work;
    ``best.pt`` is written before ``last.pt`` (:mod:`vlret.run.folder`), and after it, at the end
    of each epoch listed in ``keep_epochs``, ``epoch_<N>.pt``: the same checkpoint, kept (a
    resumed run leaves those already written alone). A name in
    ``freeze`` or ``lock`` that is no module of the model, or modules holding every trainable
    parameter, is an error when the trainer is built, before anything is written
    (:func:`vlret.train.hooks.core.check_something_to_train`). ``all_negatives_epochs`` is
    VSE-infinity's warm-up (:mod:`vlret.run.warmup`); ``momentum_encoder`` fills a loss's
    memory queue (AdaCL: 0.99); ``grad_cache_chunk`` the exact full-batch step at one chunk's
    memory (:mod:`vlret.train.parallel.grad_cache`); ``dist_timeout``:
    :mod:`vlret.train.parallel.distributed`, "A stalled rank".
    """

    epochs: int = setting(doc="epochs to train", at_least=1, sane=(1, MAX_EPOCHS))
    batch_size: int = setting(
        doc="the global batch (split evenly over the ranks under torchrun)",
        at_least=2,
        reason="a batch needs negatives",
        sane=(2, MAX_BATCH),
    )
    seed: int = setting(
        0,
        "the seed of the model, the batch order and the augmentation",
        sane=(-MAX_SEED, MAX_SEED),
    )
    device: str = setting(
        "auto",
        "`auto` (CUDA when available), `cpu`, `cuda` or `cuda:N`",
        spec=Checked(parse_device),
        constraint="whether the device exists is checked when training starts",
    )
    amp: bool | str = setting(
        True,
        "mixed precision: `false`, `true` (float16 on CUDA only), `fp16` or `bf16` (CPU too)",
        spec=OneOf((False, True, *AMP_MODES), words=AMP_WORDS),
    )
    deterministic: bool = setting(True, "deterministic cuDNN kernels on CUDA")
    drop_last: bool = setting(True, "drop the last, smaller batch of an epoch")
    log_every: int = setting(
        10,
        "a step record in metrics.jsonl every N steps (0: none)",
        at_least=0,
        sane=(0, MAX_STEPS),
    )
    checkpoint_every: int = setting(
        0, "write last.pt every N steps (0: off)", at_least=0, sane=(0, MAX_STEPS)
    )
    checkpoint_minutes: float = setting(
        10.0, "write last.pt every N minutes of training (0: off)", at_least=0
    )
    keep_epochs: list[int] = setting(
        doc="epochs (counted from 0, as metrics.jsonl counts them) whose end-of-epoch checkpoint "
        "is also kept as `epoch_<N>.pt` in the run folder (AdaCL Fig. 3's epoch-10 map)",
        factory=list,
        sane=(0, MAX_EPOCHS),
        constraint="distinct epochs below `epochs`",
    )
    validate: bool = setting(True, "compute the dev metrics each epoch (false: best.pt = last)")
    eval_batch_size: int = setting(
        256, "the batch of dev and test encoding", at_least=1, sane=(1, MAX_BATCH)
    )
    all_negatives_epochs: int = setting(
        0,
        "VSE-infinity's warm-up: the first N epochs sum over all negatives, then the hardest",
        at_least=0,
        sane=(0, MAX_EPOCHS),
        constraint="a loss with a hardest-negative phase (triplet, GOAL, VSL, SSP, AOQ)",
    )
    momentum_encoder: float | None = setting(
        None,
        "EMA momentum of a key encoder filling the loss's memory queue (AdaCL: 0.99); null: "
        "the online embeddings",
        spec=Range(ge=0, le=1, words="a momentum in [0, 1]"),
        constraint="a loss that owns a queue and takes momentum keys",
    )
    max_steps_per_epoch: int | None = setting(
        None,
        "cut every epoch to at most N steps (a quick try, smoke tests, benchmarks); null: whole "
        "epochs",
        at_least=1,
        sane=(1, MAX_STEPS),
    )
    grad_cache_chunk: int | None = setting(
        None,
        "encode the batch in chunks of N items with gradient caching",
        at_least=1,
        sane=(1, MAX_BATCH),
    )
    progress: bool = setting(
        True,
        "a per-batch progress bar on stderr, drawn only where stderr is a terminal; `false` "
        "(or `vlret train --no-progress`) turns it off. The per-epoch line is printed either way",
    )
    freeze: list[str] = setting(
        doc="modules (`model.named_modules()` names, e.g. `image_encoder.backbone`) that get no "
        "update for the first `freeze_epochs` epochs",
        factory=list,
        constraint="distinct names, given with freeze_epochs >= 1",
    )
    freeze_epochs: int = setting(0, "the epochs `freeze` holds", at_least=0, sane=(0, MAX_EPOCHS))
    dist_timeout: float = setting(
        DIST_TIMEOUT,
        "under torchrun: seconds a rank waits in one collective before the job ends naming it",
        spec=Range(gt=0, le=10**9, typed=False, words="seconds in (0, 1e9]"),
    )
    zeroshot_every: int = setting(
        0,
        "zero-shot classification every N epochs (0: off; vlret.train.hooks.zeroshot)",
        at_least=0,
    )
    zeroshot_dataset: str = setting(
        "", "the zero-shot set's name", constraint="with zeroshot_every"
    )
    zeroshot_root: str = setting("", "the zero-shot set's folder", constraint="with zeroshot_every")
    zeroshot_split: str = setting("test", "the zero-shot set's split")
    zeroshot_templates: str = setting("", "the prompt templates (empty: the set's own)")
    freeze_bn: str = setting(
        "eval",
        "the mode of the `freeze` modules while frozen (`train`: VSE++'s quirk)",
        choices=FREEZE_BN,
    )
    lock: list[str] = setting(
        doc=(
            "LiT-style locked towers: modules that never train (vlret.train.hooks.core.LockModules)"
        ),
        factory=list,
        constraint="distinct names, none overlapping freeze",
    )
    compile: bool | str = setting(False, "torch.compile the model (`true` or a backend name)")
    activation_checkpointing: bool = setting(
        False, "recompute activations in backward to save memory"
    )
    select_on: str | None = setting(
        None,
        "the dev metric `best.pt` maximises (a higher-is-better key of the dev metrics); null: "
        "`identity_t2i_r1` on person search, `rsum` otherwise. A resumed run keeps the "
        "checkpoint's",
    )
    procedure: str | None = setting(
        "standard",
        "the training procedure (vlret.train.procedures.registry): `standard` (null and `none` "
        "say the "
        "same) or a registered one (two co-trained networks, a meta step, offline negatives)",
    )
    procedure_options: dict[str, Any] = setting(
        doc="the procedure's settings, checked by the procedure", factory=dict
    )
    init_from: str | None = setting(
        None,
        "a vlret checkpoint whose model weights the run starts from (optimiser, schedule and "
        "epochs fresh)",
    )
    dev_loss: bool = setting(
        True, "compute `dev_loss` each epoch, the training loss on the dev split (false: null)"
    )
    exchange: str = setting(
        "gather",
        "how the ranks of a torchrun job see each other's texts: `gather`, or `ring` / `bidir` "
        "(no all-gather; a loss that is a sum over independent pairs)",
        choices=EXCHANGES,
    )


#: The sections made of :func:`~vlret._settings.setting` fields, by name.
SECTION_CLASSES: dict[str, type] = {
    "data": DataConfig,
    "optim": OptimConfig,
    "train": TrainConfig,
}

__all__ = [
    "AMP_WORDS",
    "OPTIMIZERS",
    "SECTION_CLASSES",
    "DataConfig",
    "OptimConfig",
    "Setting",
    "TrainConfig",
    "build_section",
    "check_declared",
    "setting",
]
