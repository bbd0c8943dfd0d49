"""Checks of the training-loop settings of a run config (:mod:`vlret.run.config`): the
schedule, the no-decay rule and the learning-rate multipliers of ``[optim]``; frozen and
locked modules, mixed precision, compilation and the procedure's name of ``[train]``.

Whether a module name exists, or a backend, is checked when the trainer builds the model
(:class:`vlret.train.hooks.core.FreezeModules`, :func:`vlret.train.schedule.prepare_model`); here
only what the config alone decides.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..data.formats import get_format
from .config_files import ConfigError

if TYPE_CHECKING:
    from ..losses import LossCapabilities

# ``optim`` / ``train`` below are vlret.run.config's OptimConfig / TrainConfig (typed Any:
# that module imports this one).

#: ``optim.schedule`` values (:func:`vlret.train.schedule.build_schedule`).
SCHEDULES = ("step", "cosine")
#: ``train.amp`` strings; ``true`` / ``false`` keep their old meaning
#: (:func:`vlret.train.schedule.amp_dtype`).
AMP_MODES = ("bf16", "fp16")
#: ``train.procedure`` of the one-model step (:mod:`vlret.train.procedures.registry`).
STANDARD_PROCEDURE = "standard"
#: ``train.freeze_bn`` values (:class:`vlret.train.hooks.core.FreezeModules`).
FREEZE_BN = ("eval", "train")


def lr_multipliers(raw: dict[str, Any], source: str) -> dict[str, float]:
    """``[optim] lr_multipliers`` as flat ``{dotted prefix: positive factor}``. A nested table
    (from ``--set optim.lr_multipliers.text_encoder.bert=0.1``) gives dotted keys; a key that
    holds dots itself (TOML's quoted ``"text_encoder.bert"``) is one prefix, so a prefix and a
    longer one inside it (``text_encoder`` and ``text_encoder.bert``) can both be given. One
    prefix reached twice (nested and quoted) is an error naming it."""
    out: dict[str, float] = {}

    def walk(table: dict[str, Any], prefix: str) -> None:
        for name, value in table.items():
            dotted = f"{prefix}.{name}" if prefix else str(name)
            key = f"optim.lr_multipliers.{dotted}"
            if not str(name).strip() or any(not part for part in dotted.split(".")):
                raise ConfigError(source, key, "empty parameter-name prefix")
            if isinstance(value, dict):
                walk(value, dotted)
            elif isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ConfigError(source, key, f"expected a positive number, got {value!r}")
            elif dotted in out:
                why = f"prefix {dotted!r} is given twice (as a nested table and a quoted key)"
                raise ConfigError(source, key, why)
            else:
                out[dotted] = float(value)

    walk(raw, "")
    return out


def check_loop_settings(optim: Any, train: Any, source: str) -> None:
    """Every check of this module, in the order of the keys."""
    check_schedule(optim, source)
    check_freeze(train, source)
    check_keep_epochs(train, source)
    check_lock(train, source)
    check_precision(train, source)
    check_procedure(train, source)


def check_keep_epochs(train: Any, source: str) -> None:
    """``keep_epochs`` names each epoch once, every one of them an epoch the run trains."""
    seen: set[int] = set()
    for i, epoch in enumerate(train.keep_epochs):
        if epoch in seen:
            raise ConfigError(source, f"train.keep_epochs[{i}]", f"epoch {epoch} listed twice")
        if not 0 <= epoch < train.epochs:
            why = (
                f"epoch {epoch} is not trained: epochs count from 0 and epochs = {train.epochs} "
                f"ends at {train.epochs - 1}"
            )
            raise ConfigError(source, f"train.keep_epochs[{i}]", why)
        seen.add(epoch)


def check_schedule(optim: Any, source: str) -> None:
    """``cosine`` has no step decay; ``no_decay`` patterns are not empty (the schedule's name is
    checked against its declaration, :mod:`vlret.run.config_sections`)."""
    if optim.schedule == "cosine":
        for key in ("decay_epochs", "decay_every"):
            if getattr(optim, key):
                why = f"the cosine schedule has no step decay: drop {key} or use schedule = 'step'"
                raise ConfigError(source, f"optim.{key}", why)
    for i, pattern in enumerate(optim.no_decay or []):
        if not pattern.strip():
            raise ConfigError(source, f"optim.no_decay[{i}]", "empty pattern")


def _names(names: list[str], key: str, source: str) -> None:
    for i, name in enumerate(names):
        if not name.strip() or name in names[:i]:
            why = "empty module name" if not name.strip() else f"{name!r} is listed twice"
            raise ConfigError(source, f"{key}[{i}]", why)


def check_freeze(train: Any, source: str) -> None:
    """``freeze`` names modules (each once) exactly when ``freeze_epochs`` is positive
    (``freeze_epochs >= 0`` and ``freeze_bn``'s values are declared,
    :mod:`vlret.run.config_sections`)."""
    _names(train.freeze, "train.freeze", source)
    if train.freeze and not train.freeze_epochs:
        why = "train.freeze lists modules: give freeze_epochs >= 1 (the epochs they stay frozen)"
        raise ConfigError(source, "train.freeze_epochs", why)
    if train.freeze_epochs and not train.freeze:
        why = f"freeze_epochs = {train.freeze_epochs} but no module to freeze: list them here"
        raise ConfigError(source, "train.freeze", why)


def check_lock(train: Any, source: str) -> None:
    """``lock`` names distinct modules, none of them inside, around or equal to a ``freeze``
    module (a module is locked for the run or frozen for some epochs, not both)."""
    _names(train.lock, "train.lock", source)
    for i, name in enumerate(train.lock):
        for other in train.freeze:
            if name == other or name.startswith(other + ".") or other.startswith(name + "."):
                why = f"{name!r} overlaps train.freeze's {other!r}: lock a module or freeze it"
                raise ConfigError(source, f"train.lock[{i}]", why)


def check_procedure(train: Any, source: str) -> None:
    """``procedure`` null or ``"none"`` (any case) is the standard step: resolved to
    ``"standard"`` here, so the resolved config, a resume's comparison and the procedure
    registry see one name; an empty name is an error (which procedure exists is checked when the
    trainer builds it, :func:`vlret.train.procedures.registry.build_procedure`)."""
    if train.procedure is None or train.procedure.strip().lower() == "none":
        train.procedure = STANDARD_PROCEDURE
    elif not train.procedure.strip():
        why = "empty; expected a procedure's name (standard, none or null: the standard step)"
        raise ConfigError(source, "train.procedure", why)


def check_precision(train: Any, source: str) -> None:
    """``compile`` is true, false or a backend name (``amp``'s values are declared,
    :mod:`vlret.run.config_sections`)."""
    if isinstance(train.compile, str) and not train.compile.strip():
        why = "expected true, false or a torch.compile backend name, got ''"
        raise ConfigError(source, "train.compile", why)


def check_schedule_length(optim: Any, train: Any, source: str, *, steps_per_epoch: int) -> None:
    """``optim.schedule = "cosine"`` needs more steps than its warm-up (the cosine decays over
    the steps after it): ``train.epochs x steps_per_epoch`` must exceed ``optim.warmup_steps``.

    Called twice with one message: by :func:`vlret.run.config.config_from_dict` where
    ``train.max_steps_per_epoch`` bounds the steps per epoch (so a shortened run is refused
    before any data is read), and by the trainer with the data's own count, before anything is
    written (:func:`vlret.train.check_run` reports it the same way)."""
    if optim.schedule != "cosine" or not optim.warmup_steps:
        return
    total = train.epochs * steps_per_epoch
    if total > optim.warmup_steps:
        return
    capped = train.max_steps_per_epoch is not None and steps_per_epoch >= train.max_steps_per_epoch
    per_epoch = (
        f"train.max_steps_per_epoch {steps_per_epoch}"
        if capped
        else f"{steps_per_epoch} steps per epoch"
    )
    raise ConfigError(
        source,
        "optim.warmup_steps",
        f"{optim.warmup_steps} must be below the run's {total} steps with optim.schedule = "
        f"'cosine' (train.epochs {train.epochs} x {per_epoch}); set "
        f"optim.warmup_steps below {total}, or raise train.epochs"
        + (" or train.max_steps_per_epoch" if capped else ""),
    )


def check_data_root(data: Any, source: str) -> None:
    """``data.root`` is an existing folder where the run reads files from it (precomp and
    MSR-VTT; person search without ``data.annotations`` and ``data.image_root`` /
    ``data.features_dir``; Karpathy, webdataset and CSV files are named by their own keys):
    one line naming ``data.root`` instead of the first file of the layout found missing.
    Called by the trainer before the vocabulary is built (and so by ``vlret train --check``)."""
    if not get_format(data.format).root_required(data):  # DataFormat.reads_root
        return
    root = Path(data.root)
    if not root.is_dir():
        what = "is not a folder" if root.exists() else "no such folder"
        why = f"{data.root}: {what} (relative paths start from the current folder, {Path.cwd()})"
        raise ConfigError(source, "data.root", why)


#: The values of ``train.exchange``.
EXCHANGES = ("gather", "ring", "bidir")
#: The config key, named in the errors.
EXCHANGE_KEY = "train.exchange"


def check_exchange(exchange: object, caps: LossCapabilities, loss_name: str, source: str) -> str:
    """``train.exchange`` checked against the loss: one of :data:`EXCHANGES`, and ``"ring"`` /
    ``"bidir"`` only for a loss that declares ``LossCapabilities.pairwise_sum``.

    Raises:
        ConfigError: Naming ``train.exchange`` and the value (or the loss).
    """
    if not isinstance(exchange, str) or exchange not in EXCHANGES:
        why = f"expected one of {', '.join(EXCHANGES)}, got {exchange!r}"
        raise ConfigError(source, EXCHANGE_KEY, why)
    if exchange != "gather" and not caps.pairwise_sum:
        why = (
            f"{exchange!r} needs a loss that is a sum over independent pairs "
            f"(LossCapabilities.pairwise_sum, e.g. siglip); loss {loss_name!r} is not: use gather"
        )
        raise ConfigError(source, EXCHANGE_KEY, why)
    return exchange


__all__ = [
    "AMP_MODES",
    "FREEZE_BN",
    "SCHEDULES",
    "STANDARD_PROCEDURE",
    "check_data_root",
    "check_freeze",
    "check_lock",
    "check_loop_settings",
    "check_precision",
    "check_procedure",
    "check_schedule",
    "check_schedule_length",
    "check_zeroshot",
    "lr_multipliers",
]


def check_zeroshot(train: Any, source: str) -> None:
    """When ``zeroshot_every`` is on, the set's name, folder and split are given
    (:mod:`vlret.train.hooks.zeroshot`)."""
    for key in ("zeroshot_dataset", "zeroshot_root", "zeroshot_split"):
        if train.zeroshot_every and not getattr(train, key).strip():
            why = f"required when zeroshot_every = {train.zeroshot_every}"
            raise ConfigError(source, f"train.{key}", why)
