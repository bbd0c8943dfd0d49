"""The ``[data]``, ``[optim]`` and ``[train]`` sections of a run config: one declaration per key.

Each key is a dataclass field made by :func:`setting`, which carries its default, its one-line
description and its declared constraint (:class:`Setting`: ``choices``, ``at_least`` and, for
what other code checks, a ``constraint`` in words). That one declaration feeds the dataclass
(defaults and types), validation (:func:`check_declared`, called by
:func:`vlret.run.config.config_from_dict` for every section; the cross-checks between keys
stay in :mod:`vlret.run.config`, :mod:`vlret.run.config_checks` and
:mod:`vlret.run.train_checks`) and the generated key reference (``scripts/gen_reference.py``
writes ``docs/reference/config.md`` from :func:`settings`). It is the pattern of the losses'
``param()`` declaration (:mod:`vlret.losses.params`), which declares the ``[loss]`` keys.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..data.noisy import NOISE_FORMATS
from ..data.transforms import INTERPOLATIONS, TRAIN_TRANSFORMS
from .config_files import ConfigError
from .devices import DIST_TIMEOUT
from .train_checks import EXCHANGES, FREEZE_BN, SCHEDULES

PERSON_SEARCH = ("cuhk-pedes", "icfg-pedes", "rstpreid")  # vlret.data.pedes
DATA_FORMATS = ("precomp", "msrvtt", "karpathy", "webdataset", "csv", *PERSON_SEARCH)
OPTIMIZERS = ("adam", "adamw", "sgd")


@dataclass(frozen=True)
class Setting:
    """What a :func:`setting` field declares besides its default.

    Attributes:
        doc: One line (or a few sentences) saying what the key does.
        choices: The values it takes (checked by :func:`check_declared`; ``None`` passes where
            the default is ``None``).
        at_least: Its smallest value (checked by :func:`check_declared`; ``None`` passes).
        constraint: What else is checked, in words, where other code checks it (a cross-check
            with another key, a range with its own message).
        reason: Why the lower bound, said in its error message.
    """

    doc: str
    choices: tuple[Any, ...] | None = None
    at_least: float | None = None
    constraint: str = ""
    reason: str = ""

    def constraint_text(self) -> str:
        """The constraint in words: the choices, the lower bound, then the rest."""
        parts = []
        if self.choices is not None:
            parts.append("one of " + ", ".join(f"`{c}`" for c in self.choices))
        if self.at_least is not None:
            parts.append(f">= {self.at_least:g}" + (f" ({self.reason})" if self.reason else ""))
        if self.constraint:
            parts.append(self.constraint)
        return "; ".join(parts)


def setting(
    default: Any = dataclasses.MISSING,
    doc: str = "",
    *,
    factory: Any = dataclasses.MISSING,
    choices: tuple[Any, ...] | None = None,
    at_least: float | None = None,
    constraint: str = "",
    reason: str = "",
) -> Any:
    """A config key: a dataclass field with its default (or ``factory`` for a list or table;
    neither: a required key) and its :class:`Setting`."""
    info = Setting(doc, choices, at_least, constraint, reason)
    if factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=factory, metadata={"vlret": info})
    return dataclasses.field(default=default, metadata={"vlret": info})


def info(f: dataclasses.Field) -> Setting:
    """The :class:`Setting` of a section's field."""
    return f.metadata["vlret"]


def settings(cls: type) -> Iterator[tuple[dataclasses.Field, Setting]]:
    """The fields of a section dataclass with their declarations, in file order."""
    for f in dataclasses.fields(cls):
        yield f, info(f)


def check_declared(obj: Any, section: str, source: str) -> None:
    """Check every key of the built section ``obj`` against its declared ``choices`` and
    ``at_least``: a :class:`~vlret.train.ConfigError` naming ``section.key``
    (``expected one of a, b, got 'c'`` / ``expected >= 0, got -1``)."""
    for f in dataclasses.fields(obj):
        declared = f.metadata.get("vlret")
        if not isinstance(declared, Setting):
            continue
        value = getattr(obj, f.name)
        key = f"{section}.{f.name}"
        if value is None:
            continue
        if declared.choices is not None and value not in declared.choices:
            why = f"expected one of {', '.join(map(str, declared.choices))}, got {value!r}"
            raise ConfigError(source, key, why)
        if declared.at_least is not None and value < declared.at_least:
            why = f" ({declared.reason})" if declared.reason else ""
            raise ConfigError(source, key, f"expected >= {declared.at_least:g}{why}, got {value!r}")


@dataclass
class DataConfig:
    """Where the data lives and how captions are encoded: the ``[data]`` section.

    Each key's description, default and constraint is its field's declaration
    (:func:`setting`); the key reference of the docs lists them all. ``format``: ``precomp``
    (SCAN / VSE-infinity folder), ``msrvtt``, ``karpathy`` (``karpathy_json`` + ``image_root``;
    images go through the model's transform), ``webdataset`` shards or ``csv`` pairs
    (:mod:`vlret.data.shards`, :mod:`vlret.data.csv_pairs`) or a person-search set
    (:mod:`vlret.data.pedes`). Relative paths start from the current folder
    (:mod:`vlret.data.paths`).
    """

    root: str = setting(
        doc="the data folder (precomp and MSR-VTT files, person search's defaults are in it)"
    )
    format: str = setting("precomp", "the data layout", choices=DATA_FORMATS)
    train_split: str = setting("train", "the split trained on")
    dev_split: str | None = setting(
        "dev",
        "the split of model selection (`best.pt`); null: no validation, `best.pt` is the last "
        "epoch",
        constraint="MSR-VTT 1k-A: null or `test` (it has no dev split; null by default)",
    )
    dev_max_images: int | None = setting(
        1000, "model selection uses the first N dev images (1000: 5000 captions); null: all"
    )
    captions_per_image: int = setting(5, "captions per image (precomp, Karpathy)")
    captions_per_video: int = setting(20, "captions per video (MSR-VTT)")
    protocol: str = setting("full", "MSR-VTT's split protocol: `full` or `1k-A`")
    features_dir: str | None = setting(
        None, "a folder of precomputed features read instead of `root`'s (`{split}_ims.npy`)"
    )
    experts: str | list[str] | None = setting(
        None,
        "MSR-VTT multi-expert features: `all` or a list of names (vlret.data.experts); a CE / "
        "MMT model defaults it to its own experts",
    )
    karpathy_json: str | None = setting(
        None, "the Karpathy split JSON (`dataset_coco.json`, ...)", constraint="format karpathy"
    )
    image_root: str | None = setting(
        None,
        "the folder the image paths of a Karpathy JSON, a CSV or a person-search set start from",
    )
    vocab: str | None = setting(
        None, "a vocabulary JSON; null: built from the train (+dev) captions with `min_count`"
    )
    tokenizer: str | None = setting(
        None, "a local Hugging Face tokenizer folder used instead of a vocabulary"
    )
    min_count: int = setting(4, "a word enters the built vocabulary from this many occurrences")
    num_workers: int = setting(0, "data-loading worker processes (0: in the training process)")
    check_features: bool = setting(
        True,
        "scan the train and dev features for NaN / inf and their size before training (one "
        "pass over the files)",
    )
    train_transform: str = setting(
        "none",
        "the training augmentation of the images (webdataset, csv, Karpathy, person search); "
        "`irra`: IRRA's person-search one",
        choices=TRAIN_TRANSFORMS,
        constraint="a format that serves images",
    )
    crop_scale: list[float] = setting(
        doc="random-resized crop: the area fraction range",
        factory=lambda: [0.08, 1.0],
        constraint="two numbers, 0 < low <= high <= 1",
    )
    crop_ratio: list[float] = setting(
        doc="random-resized crop: the aspect-ratio range",
        factory=lambda: [0.75, 1.3333],
        constraint="two numbers, 0 < low <= high",
    )
    crop_interpolation: str = setting(
        "bicubic", "random-resized crop: the resampling", choices=INTERPOLATIONS
    )
    hflip: bool = setting(False, "random horizontal flips in training")
    shards: str | list[str] | None = setting(
        None,
        "webdataset: the training shards, a brace pattern (`train/{00000..00003}.tar`) or a list",
        constraint="format webdataset",
    )
    dev_shards: str | list[str] | None = setting(None, "webdataset: the dev shards")
    train_num_samples: int | None = setting(
        None, "webdataset: the samples in one epoch (no file gives a stream's size)"
    )
    shuffle_buffer: int = setting(1000, "webdataset: the sample shuffle buffer")
    resampled: bool = setting(False, "webdataset: draw shards with replacement (open_clip's)")
    max_bad_fraction: float = setting(
        0.01,
        "the share of training samples that may be skipped as unreadable before the run stops",
    )
    max_image_pixels: int = setting(
        25_000_000,
        "the largest image (width x height) any reader decodes, checked from the header: a "
        "larger one is a skipped sample in training, an error naming the file elsewhere",
    )
    csv: str | None = setting(None, "csv: the training pairs file", constraint="format csv")
    dev_csv: str | None = setting(None, "csv: the dev pairs file")
    csv_img_key: str = setting("filepath", "csv: the image path column")
    csv_caption_key: str = setting("title", "csv: the caption column")
    csv_separator: str = setting("\t", "csv: the field separator (a tab: TSV)")
    csv_multiline: bool = setting(
        False,
        "csv: a quoted field may hold line breaks (off: refused naming its lines, as an "
        "unclosed quote reads)",
    )
    annotations: str | None = setting(
        None, "person search: the annotation JSON (default: the format's file in `root`)"
    )
    noise_index: str | None = setting(
        None,
        "noisy correspondence: a released `.npy` index of the shuffled training pairs (NCR's "
        "or DECL's)",
        constraint="precomp and karpathy only",
    )
    noise_format: str = setting(
        "auto",
        "which layout `noise_index` has (`auto`: told apart by length, NCR's by default)",
        choices=NOISE_FORMATS,
    )
    noise_ratio: float = setting(
        0.0,
        "without `noise_index`: the share of training captions to shuffle (an index generated "
        "with `noise_seed`)",
        constraint="in [0, 1)",
    )
    noise_seed: int = setting(0, "the seed of a generated noise index")
    offline_negatives: str | None = setting(
        None,
        "AOQ: the `.npz` of `vlret mine-negatives` for the training split",
        constraint="loss aoq",
    )
    offline_candidates: int | None = setting(
        300, "AOQ: an item draws among its first N candidates (null: all K)"
    )
    train_captions: str | None = setting(
        None,
        "a captions file read instead of the training annotations (one per line, e.g. `vlret "
        "caption`'s); the vocabulary is built from it",
        constraint="precomp and karpathy only",
    )
    dev_captions: str | None = setting(None, "a captions file for the dev split")
    test_captions: str | None = setting(
        None, "a captions file evaluation reads instead of the real test captions"
    )


@dataclass
class OptimConfig:
    """Optimiser and learning-rate schedule: the ``[optim]`` section (one :func:`setting` per
    key).

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
    lr: float = setting(2e-4, "the base learning rate", constraint="> 0")
    weight_decay: float = setting(0.0, "weight decay", at_least=0)
    betas: list[float] = setting(
        doc="Adam's / AdamW's betas",
        factory=lambda: [0.9, 0.999],
        constraint="two numbers in [0, 1)",
    )
    momentum: float = setting(0.0, "SGD's momentum", at_least=0)
    decay_epochs: list[int] = setting(
        doc="step schedule: the epochs at which the rate is multiplied by `decay_factor`",
        factory=list,
        constraint="not with decay_every or schedule cosine",
    )
    decay_factor: float = setting(0.1, "step schedule: the factor of each decay", constraint="> 0")
    decay_every: int = setting(
        0,
        "step schedule: decay every k epochs (CE / MMT: x0.95 every epoch); 0: off",
        at_least=0,
        constraint="not with decay_epochs",
    )
    warmup_steps: int = setting(
        0,
        "linear warm-up over the first N steps",
        at_least=0,
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
        constraint="in (0, 1)",
    )


@dataclass
class TrainConfig:
    """Loop settings: the ``[train]`` section (one :func:`setting` per key).

    ``last.pt`` is written at the end of every epoch, every ``checkpoint_every`` steps and every
    ``checkpoint_minutes`` of training, so a killed run loses at most that much work;
    ``best.pt`` is written before ``last.pt`` (:mod:`vlret.run.folder`). A name in
    ``freeze`` or ``lock`` that is no module of the model, or modules holding every trainable
    parameter, is an error when the trainer is built, before anything is written
    (:func:`vlret.train.hooks.core.check_something_to_train`). ``all_negatives_epochs`` is
    VSE-infinity's warm-up (:mod:`vlret.run.warmup`); ``momentum_encoder`` fills a loss's
    memory queue (AdaCL: 0.99); ``grad_cache_chunk`` the exact full-batch step at one chunk's
    memory (:mod:`vlret.train.parallel.grad_cache`); ``dist_timeout``:
    :mod:`vlret.train.parallel.distributed`, "A stalled rank".
    """

    epochs: int = setting(doc="epochs to train", at_least=1)
    batch_size: int = setting(
        doc="the global batch (split evenly over the ranks under torchrun)",
        at_least=2,
        reason="a batch needs negatives",
    )
    seed: int = setting(0, "the seed of the model, the batch order and the augmentation")
    device: str = setting("auto", "`auto` (CUDA when available), `cpu`, `cuda` or `cuda:N`")
    amp: bool | str = setting(
        True,
        "mixed precision: `false`, `true` (float16 on CUDA only), `fp16` or `bf16` (CPU too)",
    )
    deterministic: bool = setting(True, "deterministic cuDNN kernels on CUDA")
    drop_last: bool = setting(True, "drop the last, smaller batch of an epoch")
    log_every: int = setting(
        10, "a step record in metrics.jsonl every N steps (0: none)", at_least=0
    )
    checkpoint_every: int = setting(0, "write last.pt every N steps (0: off)", at_least=0)
    checkpoint_minutes: float = setting(
        10.0, "write last.pt every N minutes of training (0: off)", at_least=0
    )
    validate: bool = setting(True, "compute the dev metrics each epoch (false: best.pt = last)")
    eval_batch_size: int = setting(256, "the batch of dev and test encoding", at_least=1)
    all_negatives_epochs: int = setting(
        0,
        "VSE-infinity's warm-up: the first N epochs sum over all negatives, then the hardest",
        at_least=0,
        constraint="a loss with a hardest-negative phase (triplet, GOAL, VSL, SSP, AOQ)",
    )
    momentum_encoder: float | None = setting(
        None,
        "EMA momentum of a key encoder filling the loss's memory queue (AdaCL: 0.99); null: "
        "the online embeddings",
        constraint="a loss that owns a queue and takes momentum keys",
    )
    max_steps_per_epoch: int | None = setting(
        None,
        "cut every epoch to at most N steps (a quick try, smoke tests, benchmarks); null: whole "
        "epochs",
        at_least=1,
    )
    grad_cache_chunk: int | None = setting(
        None, "encode the batch in chunks of N items with gradient caching", at_least=1
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
    freeze_epochs: int = setting(0, "the epochs `freeze` holds", at_least=0)
    dist_timeout: float = setting(
        DIST_TIMEOUT,
        "under torchrun: seconds a rank waits in one collective before the job ends naming it",
        constraint="> 0",
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


#: The sections made of :func:`setting` fields, by name.
SECTION_CLASSES: dict[str, type] = {
    "data": DataConfig,
    "optim": OptimConfig,
    "train": TrainConfig,
}

__all__ = [
    "DATA_FORMATS",
    "OPTIMIZERS",
    "PERSON_SEARCH",
    "SECTION_CLASSES",
    "DataConfig",
    "OptimConfig",
    "Setting",
    "TrainConfig",
    "check_declared",
    "info",
    "setting",
    "settings",
]
