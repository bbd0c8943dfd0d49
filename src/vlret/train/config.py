"""Run configuration: TOML or YAML files, ``--set section.key=value`` overrides, dataclasses.

A config file has the sections ``data``, ``model``, ``loss``, ``optim``, ``train`` and the
top-level key ``output_dir``::

    output_dir = "runs/vsepp_f30k_unified"

    [data]
    root = "data/f30k_precomp"
    format = "precomp"            # precomp | msrvtt | karpathy

    [model]                       # passed as is to vlret.models.build_model
    embed_dim = 1024
    image = { kind = "precomp", in_dim = 2048, pooling = "max" }
    text = { kind = "gru", word_dim = 300, bidirectional = true, pooling = "last" }

    [loss]
    name = "unified"              # any registered loss; the other keys are its parameters
    margin = 0.2
    gamma = 60.0

    [optim]                       # name, lr, decay_epochs, ...
    lr = 5e-4

    [train]                       # epochs, batch_size, seed, ...
    epochs = 20

``--set`` keys are dotted; a part holding dots itself is quoted as in TOML
(``optim.lr_multipliers."text_encoder.bert"=0.1``). ``--set loss.name=NEW`` on a config of
another loss drops the old loss's parameters that NEW does not declare, with a one-line note on
stderr (:func:`apply_overrides`).

A ``[compare]`` section (the settings of ``vlret compare``) is accepted and ignored for
training: it is neither validated here nor kept in the resolved config. Every other unknown
key is an error naming the file and the dotted key; so is a value of the wrong
type. Loss parameters are checked against the loss's one parameter declaration
(:mod:`vlret.losses.params`): their names (an old name the declaration renamed is mapped to the
new one with a DeprecationWarning, and the resolved config keeps the new name), their types as
the declared constraint takes them (a number, an integer, true/false, a string), then the
constraints themselves (:func:`vlret.losses.check_loss_params`; a nested one keyed like
``loss.base_params.margin``).
YAML files are read with a safe loader that also reads exponent floats without a dot
(``lr: 1e-3``) as numbers, as TOML does, and refuses aliases.
What is read is bounded before it is walked or built: nesting depth, the number of values and
finite numbers (:func:`vlret.train.config_files.check_tree`), integer settings and model sizes
within sane ranges (:mod:`vlret.train.config_checks`).
"""

from __future__ import annotations

import copy
import dataclasses
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._files import atomic_write_text
from .._moved import moved_names
from ..data.transforms import image_data_problem
from ..losses import loss_capabilities
from . import config_files
from .config_checks import (
    check_captions_files,
    check_int_ranges,
    check_model_sizes,
    check_msrvtt,
    check_noise,
    check_offline_negatives,
    check_person_search,
)
from .config_files import ConfigError, check_tree, stderr_note
from .config_types import check_type
from .distributed import DIST_TIMEOUT, check_timeout, parse_device
from .loss_config import (
    LossConfig,
    check_momentum_encoder,
    loss_config,
    model_with_scoring,
    switch_loss,
)
from .ring import check_exchange
from .train_checks import (
    check_loop_settings,
    check_schedule_length,
    check_zeroshot,
    lr_multipliers,
)
from .warmup import warmup_refusal

SECTIONS = ("data", "model", "loss", "optim", "train")
#: Sections of a run config that training ignores: ``[compare]`` belongs to ``vlret compare``
#: / ``vlret sweep`` (:mod:`vlret.analysis.compare`), so ``vlret train`` runs a compare config.
IGNORED_SECTIONS = ("compare",)
PERSON_SEARCH = ("cuhk-pedes", "icfg-pedes", "rstpreid")  # vlret.data.pedes
DATA_FORMATS = ("precomp", "msrvtt", "karpathy", "webdataset", "csv", *PERSON_SEARCH)
OPTIMIZERS = ("adam", "adamw", "sgd")


@dataclass
class DataConfig:
    """Where the data lives and how captions are encoded.

    ``format``: ``precomp`` (SCAN / VSE-infinity folder), ``msrvtt`` (with ``protocol`` full or
    1k-A, ``captions_per_video``) or ``karpathy`` (``karpathy_json`` + ``image_root``; images go
    through the model's transform).
    ``vocab``: a vocabulary JSON; by default one is built from the train (+dev) captions with
    ``min_count``. ``tokenizer``: a local Hugging Face tokenizer directory instead of a vocab.
    ``dev_max_images``: model selection uses the first 1000 dev images (5000 captions).
    ``dev_split``: ``None`` trains without validation; ``best.pt`` is then the last epoch.
    MSR-VTT 1k-A has no dev split (only train and test), so there it defaults to ``None``;
    another value than ``None`` or ``"test"`` is an error.
    ``check_features``: scan the train and dev features for NaN / inf and the feature size
    before training (:func:`vlret.data.check_features`; one pass over the files).
    ``experts`` (MSR-VTT): read multi-expert features (``"all"`` or a list of names,
    :mod:`vlret.data.experts`); a CE / MMT model defaults it to its own experts.
    """

    root: str
    format: str = "precomp"
    train_split: str = "train"
    dev_split: str | None = "dev"
    dev_max_images: int | None = 1000
    captions_per_image: int = 5
    captions_per_video: int = 20
    protocol: str = "full"
    features_dir: str | None = None
    experts: str | list[str] | None = None
    karpathy_json: str | None = None
    image_root: str | None = None
    vocab: str | None = None
    tokenizer: str | None = None
    min_count: int = 4
    num_workers: int = 0
    check_features: bool = True
    # Pixels: format "webdataset" (vlret.data.shards) or "csv" (vlret.data.csv_pairs), and
    # train_transform = "random_resized_crop" (vlret.data.transforms) for their train split.
    train_transform: str = "none"
    crop_scale: list[float] = field(default_factory=lambda: [0.08, 1.0])
    crop_ratio: list[float] = field(default_factory=lambda: [0.75, 1.3333])
    crop_interpolation: str = "bicubic"
    hflip: bool = False
    shards: str | list[str] | None = None
    dev_shards: str | list[str] | None = None
    train_num_samples: int | None = None
    shuffle_buffer: int = 1000
    resampled: bool = False
    max_bad_fraction: float = 0.01
    # The largest image (width x height, in pixels) any reader decodes, checked from the file's
    # header before decoding (vlret._images): a larger one is a skipped-and-counted sample in
    # training and a one-line error naming the file elsewhere. 25 M pixels (a 6000 x 4000
    # photograph fits) is well below PIL's own 89 M decompression-bomb warning.
    max_image_pixels: int = 25_000_000
    csv: str | None = None
    dev_csv: str | None = None
    csv_img_key: str = "filepath"
    csv_caption_key: str = "title"
    csv_separator: str = "\t"
    # Whether a CSV field may hold line breaks (a quoted caption over several lines). Off, such a
    # field is refused naming its lines: it is what a quote opened and not closed reads as, the
    # rows after it merged into one caption (vlret.data.csv_pairs). A quote never closed is
    # refused either way.
    csv_multiline: bool = False
    # Person search (vlret.data.pedes): the annotation JSON, default the format's file in root;
    # images under image_root (default root/imgs), or features_dir/{split}_ims.npy
    annotations: str | None = None
    # Noisy correspondence on the training split (vlret.data.noisy; precomp and karpathy only):
    # noise_index, a released .npy index (NCR's one image per caption or DECL's one per image,
    # told apart by length; noise_format "ncr" / "decl" where both lengths agree), or, without
    # one, noise_ratio > 0 generates an index with noise_seed (noise_format "auto" = "ncr").
    # Dev, test and `vlret eval` always read the clean pairs.
    noise_index: str | None = None
    noise_format: str = "auto"
    noise_ratio: float = 0.0
    noise_seed: int = 0
    # AOQ (loss "aoq", docs/aoq.md): offline_negatives, the .npz `vlret mine-negatives` wrote
    # for the training split; each caption item draws among the first offline_candidates of
    # its K candidates (the release: 300; None = K).
    offline_negatives: str | None = None
    offline_candidates: int | None = 300
    # Captions files (vlret.data.captioning, docs/captions.md; precomp and karpathy only): the
    # split reads its captions from FILE (one per line, the file's own k per image, in the
    # split's image order, e.g. `vlret caption` pseudo captions) instead of the annotations;
    # with train_captions the vocabulary is built from that file (plus dev_captions if set).
    # Evaluation reads the real test captions unless test_captions is set.
    train_captions: str | None = None
    dev_captions: str | None = None
    test_captions: str | None = None


@dataclass
class OptimConfig:
    """Optimiser and learning-rate schedule.

    The learning rate is ``lr * decay_factor ** (number of decay_epochs <= epoch)``, or with
    ``decay_every = k > 0`` ``lr * decay_factor ** (epoch // k)`` (CE / MMT: x0.95 every epoch;
    exclusive with ``decay_epochs``; epochs count from 0), times a
    linear warm-up from ``lr / warmup_steps`` to ``lr`` over the first ``warmup_steps`` steps.
    ``grad_clip`` is the max total gradient norm (VSE++: 2.0); 0 or ``None`` disables
    clipping; a negative value is an error.
    ``lr_multipliers``: parameter-name prefix -> factor of ``lr`` for those parameters
    (``{ "text_encoder.bert" = 0.1 }``: VSE-infinity's BERT at 0.1x; ``loss``: the loss's own
    parameters); the longest matching prefix wins, warm-up and decay scale every group alike
    (:class:`vlret.train.hooks.LrMultipliers`). A nested table is read as dotted prefixes; a
    quoted key holding dots sits beside a shorter prefix (``{ text_encoder = 0.5,
    "text_encoder.bert" = 0.1 }``, or ``--set 'optim.lr_multipliers."text_encoder.bert"=0.1'``).
    A prefix that names no trainable parameter is an error when the trainer is built.
    ``schedule``: ``"step"`` (the above) or ``"cosine"`` (open_clip's, over the run's steps:
    :class:`vlret.train.schedule.CosineWarmup`). ``no_decay``: patterns of the parameters without
    weight decay; ``None``: open_clip's rule with ``adamw``, none otherwise
    (:mod:`vlret.train.optim_groups`). ``eps``: Adam's / AdamW's denominator term (torch's
    1e-8; IRRA's Adam uses 1e-3); unused by ``sgd``.
    """

    name: str = "adam"
    lr: float = 2e-4
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    momentum: float = 0.0
    decay_epochs: list[int] = field(default_factory=list)
    decay_factor: float = 0.1
    decay_every: int = 0
    warmup_steps: int = 0
    grad_clip: float | None = 2.0
    lr_multipliers: dict[str, float] = field(default_factory=dict)
    schedule: str = "step"
    no_decay: list[str] | None = None
    eps: float = 1e-8


@dataclass
class TrainConfig:
    """Loop settings.

    ``batch_size`` is the global batch (split evenly over ranks under torchrun).
    ``all_negatives_epochs``: VSE-infinity's warm-up (its ``vse_mean_warmup_epochs``) for that
    many first epochs (0: none), for the losses that declare
    ``LossCapabilities.all_negatives_warmup`` (those with a hardest-negative phase: triplet,
    GOAL, VSL with a triplet base, SSP, AOQ); any other loss is an error. See
    :mod:`vlret.train.warmup`. A resumed run continues the schedule from its epoch.
    ``momentum_encoder``: EMA momentum of a key encoder whose outputs fill the loss's memory
    queue (AdaCL: 0.99), for a loss that owns a queue and takes momentum keys
    (``LossCapabilities.owns_queue``, ``momentum_keys``); ``None`` enqueues the online
    embeddings.
    ``max_steps_per_epoch`` truncates epochs (smoke tests, benchmarks).
    ``grad_cache_chunk``: encode the batch in chunks of that many items with gradient caching
    (:mod:`vlret.train.grad_cache`): the exact full-batch step at one chunk's activation memory.
    ``last.pt`` is written at the end of every epoch, every ``checkpoint_every`` steps (0: off)
    and every ``checkpoint_minutes`` of training (0: off), so a killed run loses at most that
    much work; ``best.pt`` is written before ``last.pt`` (see :mod:`vlret.train.run_folder`).
    ``device``: ``auto`` (CUDA when available), ``cpu``, ``cuda`` or ``cuda:N``.
    ``progress``: a per-batch progress bar; the per-epoch summary line is printed either way.
    ``freeze``: names of the model's modules (``model.named_modules()``, e.g.
    ``"image_encoder.backbone"``) that get no update for the first ``freeze_epochs`` epochs
    (:class:`vlret.train.hooks.FreezeModules`); a resumed run continues the phase. A name that
    is no module of the model, or modules holding every trainable parameter (with ``lock``'s:
    nothing left to train, :func:`vlret.train.hooks.check_something_to_train`), is an error when
    the trainer is built, before anything is written.
    ``dist_timeout``: under torchrun, seconds a rank waits in one collective for the others
    before the job ends with a message naming the rank (a stopped or stuck rank; see
    :mod:`vlret.train.distributed`, "A stalled rank").
    ``amp``: ``false``, ``true`` (float16 on CUDA only), ``"fp16"`` or ``"bf16"`` (CPU too):
    :func:`vlret.train.schedule.amp_dtype`. ``freeze_bn``: ``"eval"`` or ``"train"`` (VSE++'s
    quirk): the mode of the ``freeze`` modules while frozen. ``lock``: LiT-style locked towers
    (:class:`vlret.train.hooks.LockModules`; locking every trainable parameter is the same error
    naming ``train.lock``). ``compile`` (``true`` or a backend name) and
    ``activation_checkpointing``: :func:`vlret.train.schedule.prepare_model`.
    """

    epochs: int
    batch_size: int
    seed: int = 0
    device: str = "auto"
    amp: bool | str = True
    deterministic: bool = True
    drop_last: bool = True
    log_every: int = 10
    checkpoint_every: int = 0
    checkpoint_minutes: float = 10.0
    validate: bool = True
    eval_batch_size: int = 256
    all_negatives_epochs: int = 0
    momentum_encoder: float | None = None
    max_steps_per_epoch: int | None = None
    grad_cache_chunk: int | None = None
    progress: bool = True
    freeze: list[str] = field(default_factory=list)
    freeze_epochs: int = 0
    dist_timeout: float = DIST_TIMEOUT
    #: zero-shot classification every N epochs (0: off), :mod:`vlret.train.zeroshot_hook`
    zeroshot_every: int = 0
    zeroshot_dataset: str = ""
    zeroshot_root: str = ""
    zeroshot_split: str = "test"
    zeroshot_templates: str = ""
    freeze_bn: str = "eval"
    lock: list[str] = field(default_factory=list)
    compile: bool | str = False
    activation_checkpointing: bool = False
    #: The dev metric ``best.pt`` maximises, a "higher is better" key of the trainer's dev
    #: metrics (:func:`vlret.train.config_checks.selection_metric` lists them); ``None``: the
    #: format's default, ``"identity_t2i_r1"`` on the person-search formats (IRRA selects on
    #: R@1), ``"rsum"`` otherwise. A resumed run keeps the checkpoint's.
    select_on: str | None = None
    #: The training procedure (:mod:`vlret.train.procedures`): ``"standard"`` (one model, the
    #: loss of each batch; ``"none"`` or null say the same and resolve to it) or a registered
    #: one (two co-trained networks, a meta step, offline negatives); ``procedure_options``
    #: are its settings, checked by the procedure.
    procedure: str | None = "standard"
    procedure_options: dict[str, Any] = field(default_factory=dict)
    #: A vlret checkpoint whose model weights the run starts from (optimiser, schedule and
    #: epochs fresh): :mod:`vlret.train.init_weights`. ``None``: the model's own initialisation.
    init_from: str | None = None
    #: Compute ``dev_loss`` each epoch: the training loss on the dev split, logged beside
    #: ``train_loss`` (:mod:`vlret.train.dev_loss`); ``false``: logged as ``null``.
    dev_loss: bool = True
    #: How the ranks of a torchrun job see each other's texts (:mod:`vlret.train.ring`):
    #: ``"gather"`` (all-gather the embeddings), ``"ring"`` or ``"bidir"`` (pass the text blocks
    #: to the neighbours, no all-gather; a loss with ``LossCapabilities.pairwise_sum`` only).
    exchange: str = "gather"


@dataclass
class RunConfig:
    """A resolved run configuration (see the module docstring)."""

    data: DataConfig
    model: dict[str, Any]
    loss: LossConfig
    optim: OptimConfig
    train: TrainConfig
    output_dir: str
    source: str = "<dict>"

    def to_dict(self) -> dict[str, Any]:
        """The config as plain data, in the file layout (loss params flattened into ``loss``)."""
        return {
            "output_dir": self.output_dir,
            "data": dataclasses.asdict(self.data),
            "model": copy.deepcopy(self.model),
            "loss": {"name": self.loss.name, **copy.deepcopy(self.loss.params)},
            "optim": dataclasses.asdict(self.optim),
            "train": dataclasses.asdict(self.train),
        }


# --------------------------------------------------------------------------------------------
# Reading and overriding
# --------------------------------------------------------------------------------------------


def apply_overrides(
    raw: dict[str, Any],
    overrides: list[str] | None,
    *,
    note: Callable[[str], None] | None = stderr_note,
) -> dict[str, Any]:
    """A copy of ``raw`` with ``section.key[.sub]=value`` overrides applied (typed values).

    A key part may be quoted to hold dots (``optim.lr_multipliers."text_encoder.bert"=0.1``,
    :func:`~vlret.train.config_files.override_keys`). An override that sets ``loss.name`` to
    another loss drops the old loss's parameters that the new one does not declare (a one-line
    ``note`` lists them); those given with ``--set`` too are kept and checked against the new
    loss (:func:`~vlret.train.loss_config.switch_loss`)."""
    out = copy.deepcopy(raw)
    given: list[tuple[str, ...]] = []  # the key paths the overrides set, in order
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError("--set", item, "expected section.key=value")
        dotted, value = item.split("=", 1)
        dotted = dotted.strip()
        keys = config_files.override_keys(dotted)
        if not all(keys):
            raise ConfigError("--set", dotted, "empty key component")
        if keys[0] not in (*SECTIONS, "output_dir"):
            raise ConfigError(
                "--set",
                dotted,
                f"unknown section {keys[0]!r}; expected one of "
                f"{', '.join((*SECTIONS, 'output_dir'))}",
            )
        if keys[0] == "output_dir" and len(keys) > 1:
            raise ConfigError("--set", dotted, "output_dir has no sub-keys")
        parsed = config_files.parse_value(value, dotted)
        config_files.set_override(out, keys, parsed, given=given, dotted=dotted)
        given.append(tuple(keys))
    if ("loss", "name") in given:
        switch_loss(raw, out, {k[1] for k in given if k[0] == "loss" and len(k) > 1}, note=note)
    return out


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------


def _build(cls: type, raw: Any, source: str, section: str) -> Any:
    """The dataclass ``cls`` of the raw ``[section]`` table: an unknown key, a missing
    required one or a value of the wrong type is a :class:`ConfigError` naming
    ``section.key`` (an unknown key's message lists the valid ones)."""
    if not isinstance(raw, dict):
        raise ConfigError(source, section, f"expected a table/mapping, got {raw!r}")
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise ConfigError(
            source,
            f"{section}.{unknown[0]}",
            f"unknown key; valid keys of [{section}]: {', '.join(known)}",
        )
    kwargs = {}
    for name, f in known.items():
        key = f"{section}.{name}"
        if name not in raw:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ConfigError(source, key, "required key is missing")
            continue
        kwargs[name] = check_type(raw[name], hints[name], source, key)
    return cls(**kwargs)


def _check_choice(value: str, choices: tuple[str, ...], source: str, key: str) -> None:
    if value not in choices:
        raise ConfigError(source, key, f"expected one of {', '.join(choices)}, got {value!r}")


def config_from_dict(raw: dict[str, Any], *, source: str | Path = "<dict>") -> RunConfig:
    """Validate a raw mapping (file layout) into a :class:`RunConfig`."""
    source = str(source)
    if not isinstance(raw, dict):
        raise ConfigError(source, "", "expected a mapping of sections")
    check_tree(raw, source)  # depth, size and finite numbers, before anything walks it
    unknown = sorted(set(raw) - {*SECTIONS, *IGNORED_SECTIONS, "output_dir"})
    if unknown:
        raise ConfigError(
            source,
            unknown[0],
            f"unknown section; expected {', '.join(SECTIONS)}, output_dir "
            f"(and {', '.join(IGNORED_SECTIONS)}, read by vlret compare)",
        )
    for section in IGNORED_SECTIONS:
        if section in raw and not isinstance(raw[section], dict):
            raise ConfigError(source, section, f"expected a table/mapping, got {raw[section]!r}")
    for section in ("data", "loss", "train"):
        if section not in raw:
            raise ConfigError(source, section, "required section is missing")
    if "output_dir" not in raw:
        raise ConfigError(source, "output_dir", "required key is missing")
    output_dir = check_type(raw["output_dir"], str, source, "output_dir")
    if not output_dir.strip():
        raise ConfigError(
            source, "output_dir", "empty; expected a run folder (it would write into the cwd)"
        )
    data = _build(DataConfig, raw["data"], source, "data")
    _check_choice(data.format, DATA_FORMATS, source, "data.format")
    train_raw = raw["train"] if isinstance(raw["train"], dict) else {}
    validate = train_raw.get("validate", True)
    check_person_search(data, raw["data"], validate, source)
    check_msrvtt(data, raw["data"], validate, source)
    check_noise(data, source)
    check_captions_files(data, source)
    model = raw.get("model", {})
    if not isinstance(model, dict):
        raise ConfigError(source, "model", f"expected a table/mapping, got {model!r}")
    check_model_sizes(model, source)
    if (problem := image_data_problem(data, model)) is not None:
        raise ConfigError(source, f"data.{problem[0]}", problem[1])
    if data.format == "msrvtt" and data.experts is None and isinstance(model.get("experts"), dict):
        data.experts = list(model["experts"]) or None  # a CE / MMT model's own experts
    loss = loss_config(raw["loss"], source, model)
    optim = _build(OptimConfig, raw.get("optim", {}), source, "optim")
    _check_choice(optim.name, OPTIMIZERS, source, "optim.name")
    if optim.lr <= 0:
        raise ConfigError(source, "optim.lr", f"expected a positive number, got {optim.lr!r}")
    if optim.grad_clip is not None and optim.grad_clip < 0:
        raise ConfigError(
            source,
            "optim.grad_clip",
            f"expected a max gradient norm >= 0 (0 or null: no clipping), got {optim.grad_clip!r}",
        )
    optim.lr_multipliers = lr_multipliers(optim.lr_multipliers, source)
    if len(optim.betas) != 2 or not all(0.0 <= b < 1.0 for b in optim.betas):
        why = f"expected two numbers in [0, 1), got {optim.betas!r}"
        raise ConfigError(source, "optim.betas", why)
    if not (isinstance(optim.eps, int | float) and 0.0 < float(optim.eps) < 1.0):
        raise ConfigError(source, "optim.eps", f"expected a number in (0, 1), got {optim.eps!r}")
    _check_at_least(
        optim, "optim", source, weight_decay=0.0, momentum=0.0, warmup_steps=0, decay_every=0
    )
    if optim.decay_every and optim.decay_epochs:
        why = "give decay_epochs (a list) or decay_every (a period), not both"
        raise ConfigError(source, "optim.decay_every", why)
    if optim.decay_factor <= 0:
        why = f"expected a positive number, got {optim.decay_factor!r}"
        raise ConfigError(source, "optim.decay_factor", why)
    train = _build(TrainConfig, raw["train"], source, "train")
    if train.epochs < 1:
        raise ConfigError(source, "train.epochs", "expected a positive integer")
    if train.batch_size < 2:
        raise ConfigError(
            source,
            "train.batch_size",
            f"expected an integer >= 2 (a batch needs negatives), got {train.batch_size!r}",
        )
    _check_at_least(train, "train", source, log_every=0, checkpoint_every=0, checkpoint_minutes=0.0)
    _check_at_least(
        train, "train", source, eval_batch_size=1, max_steps_per_epoch=1, grad_cache_chunk=1
    )
    try:
        check_timeout(train.dist_timeout)
    except ValueError as err:
        raise ConfigError(source, "train.dist_timeout", str(err).partition(": ")[2]) from None
    try:  # "auto" or a device name (whether it exists is checked when training starts)
        parse_device(train.device)
    except ValueError as err:
        raise ConfigError(source, "train.device", str(err)) from None
    if train.all_negatives_epochs < 0:
        raise ConfigError(source, "train.all_negatives_epochs", "expected an integer >= 0")
    refusal = warmup_refusal(loss.name, loss.params) if train.all_negatives_epochs else None
    if refusal:
        raise ConfigError(source, "train.all_negatives_epochs", refusal)
    if train.momentum_encoder is not None:
        check_momentum_encoder(train.momentum_encoder, loss, source)
    if train.exchange != "gather":  # ring / bidir: a loss that is a sum over independent pairs
        check_exchange(train.exchange, loss_capabilities(loss.name, loss.params), loss.name, source)
    check_loop_settings(optim, train, source)  # schedule, no_decay, freeze, lock, amp, compile
    if train.max_steps_per_epoch is not None:  # a cosine's warm-up within the shortened run
        check_schedule_length(optim, train, source, steps_per_epoch=train.max_steps_per_epoch)
    check_zeroshot(train, source)
    check_offline_negatives(data, loss, model, train, source)  # AOQ's keys (docs/aoq.md)
    for section, built in (("data", data), ("optim", optim), ("train", train)):
        check_int_ranges(built, section, source)  # upper bounds: a run that can start
    return RunConfig(
        data=data,
        model=model_with_scoring(model, loss),
        loss=loss,
        optim=optim,
        train=train,
        output_dir=output_dir,
        source=source,
    )


def _check_at_least(obj: Any, section: str, source: str, **minimums: float) -> None:
    for key, minimum in minimums.items():
        value = getattr(obj, key)
        if value is not None and value < minimum:
            raise ConfigError(source, f"{section}.{key}", f"expected >= {minimum}, got {value!r}")


def load_config(
    path: str | Path,
    overrides: list[str] | None = None,
    *,
    note: Callable[[str], None] | None = stderr_note,
) -> RunConfig:
    """Read ``path`` (TOML or YAML), apply ``--set`` overrides and validate; ``note``: where
    :func:`apply_overrides` says what a change of ``loss.name`` dropped (default stderr)."""
    raw = apply_overrides(config_files.read_config_file(path), overrides, note=note)
    return config_from_dict(raw, source=path)


def save_config(config: RunConfig, path: str | Path) -> Path:
    """Write the resolved config as YAML (loadable by :func:`load_config`)."""
    yaml = config_files._yaml("the run folder's config.yaml")
    return atomic_write_text(path, yaml.safe_dump(config.to_dict(), sort_keys=False))


# Reading config files is vlret.train.config_files; its old import path here warns.
__getattr__ = moved_names(
    __name__,
    {"parse_value": "vlret.train.config_files", "read_config_file": "vlret.train.config_files"},
)
