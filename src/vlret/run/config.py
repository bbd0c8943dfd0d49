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
training: it is neither validated here nor kept in the resolved config. ``[data]``,
``[optim]`` and ``[train]`` are read by their keys' declarations
(:class:`vlret.data.config.DataConfig`, :mod:`vlret.run.config_sections`,
:mod:`vlret._settings`): an unknown key, a value of the wrong type or one its declaration
refuses is an error naming the file and the dotted key; the checks between keys and sections
follow (:mod:`vlret.run.config_checks`, :mod:`vlret.run.train_checks`), in the order
:func:`config_from_dict` composes them. Loss parameters are checked against the loss's one
parameter declaration
(:mod:`vlret.losses.params`): their names (an old name the declaration renamed is mapped to the
new one with a DeprecationWarning, and the resolved config keeps the new name), their types as
the declared constraint takes them (a number, an integer, true/false, a string), then the
constraints themselves (:func:`vlret.losses.check_loss_params`; a nested one keyed like
``loss.base_params.margin``).
YAML files are read with a safe loader that also reads exponent floats without a dot
(``lr: 1e-3``) as numbers, as TOML does, and refuses aliases.
What is read is bounded before it is walked or built: nesting depth, the number of values and
finite numbers (:func:`vlret.run.config_files.check_tree`), integer settings within their
declared sane ranges and model sizes within those of :mod:`vlret.run.config_checks`.
"""

from __future__ import annotations

import copy
import dataclasses
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._files import atomic_write_text
from .._settings import default_of
from ..data.config import DataConfig
from ..data.formats import get_format
from ..data.formats.checks import image_data_problem
from ..losses import loss_capabilities
from . import config_files
from .config_checks import (
    check_captions_files,
    check_model_sizes,
    check_msrvtt,
    check_noise,
    check_offline_negatives,
    check_person_search,
)
from .config_files import ConfigError, check_tree, stderr_note
from .config_sections import OptimConfig, TrainConfig, build_section
from .loss_config import (
    LossConfig,
    check_momentum_encoder,
    loss_config,
    model_with_scoring,
    switch_loss,
)
from .train_checks import (
    check_exchange,
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
    :func:`~vlret.run.config_files.override_keys`). An override that sets ``loss.name`` to
    another loss drops the old loss's parameters that the new one does not declare (a one-line
    ``note`` lists them); those given with ``--set`` too are kept and checked against the new
    loss (:func:`~vlret.run.loss_config.switch_loss`).

    ``null`` (``none``, ``~``) deletes the key, so the declared default applies (a parameter of
    the old loss is removed this way when switching loss families). Where the key's declaration
    accepts None and has another default (``data.dev_split``: null is "no validation"), null
    sets None instead, as before; where the default is None, deleting gives that None anyway."""
    out = copy.deepcopy(raw)
    given: list[tuple[str, ...]] = []  # the key paths the overrides set, in order
    nulled: list[list[str]] = []  # the key paths a null override deleted, in order
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
        if parsed is None:
            config_files.delete_override(out, keys, dotted=dotted)
            nulled.append(keys)
        else:
            config_files.set_override(out, keys, parsed, given=given, dotted=dotted)
        given.append(tuple(keys))
    if ("loss", "name") in given:
        switch_loss(raw, out, {k[1] for k in given if k[0] == "loss" and len(k) > 1}, note=note)
    for keys in nulled:  # judged on the final config (a later loss.name picks the declaration)
        section = out.get(keys[0]) if len(keys) == 2 else None
        if isinstance(section, dict) and keys[1] not in section and _null_is_a_value(out, keys):
            section[keys[1]] = None
    return out


def _null_is_a_value(raw: dict[str, Any], keys: list[str]) -> bool:
    """Whether ``section.key`` is declared (a ``[data]``, ``[optim]`` or ``[train]`` key, or a
    parameter of the config's loss) to accept None with another default, so that ``--set
    section.key=null`` means None rather than the default."""
    section, key = keys
    records: dict[str, type] = {"data": DataConfig, "optim": OptimConfig, "train": TrainConfig}
    record = records.get(section)
    if section == "loss":
        from ..losses import loss_class

        name = raw["loss"].get("name")
        name = "+".join(name) if isinstance(name, list) else name
        try:
            record = loss_class(str(name)).Params
        except (ValueError, TypeError):
            return False  # no loss of that name: loss_config's error names it
    if record is None:
        return False
    fields = {f.name: f for f in dataclasses.fields(record)}
    if key not in fields or default_of(fields[key]) in (None, dataclasses.MISSING):
        return False
    hint = typing.get_type_hints(record)[key]
    return hint is type(None) or type(None) in typing.get_args(hint)


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------


def _top_level(raw: Any, source: str) -> str:
    """The sections a run config has (each known; ``[data]``, ``[loss]`` and ``[train]`` given;
    an ignored one a table) and its ``output_dir``, which is returned."""
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
    output_dir = raw["output_dir"]
    if not isinstance(output_dir, str):
        raise ConfigError(source, "output_dir", f"expected a string, got {output_dir!r}")
    if not output_dir.strip():
        raise ConfigError(
            source, "output_dir", "empty; expected a run folder (it would write into the cwd)"
        )
    return output_dir


def _model_section(raw: dict[str, Any], source: str) -> dict[str, Any]:
    """The ``[model]`` table (passed as is to ``vlret.models.build_model``) with sane sizes."""
    model = raw.get("model", {})
    if not isinstance(model, dict):
        raise ConfigError(source, "model", f"expected a table/mapping, got {model!r}")
    check_model_sizes(model, source)
    return model


def _data_checks(data: DataConfig, model: dict[str, Any], raw: dict[str, Any], source: str) -> None:
    """The checks between ``[data]`` keys and the other sections, in order (person search and
    MSR-VTT may clear ``dev_split`` before the captions files read it; a CE / MMT model names
    MSR-VTT's experts)."""
    validate = raw["train"].get("validate", True) if isinstance(raw["train"], dict) else True
    check_person_search(data, raw["data"], validate, source)
    check_msrvtt(data, raw["data"], validate, source)
    check_noise(data, source)
    check_captions_files(data, source)
    if (problem := image_data_problem(data, model)) is not None:
        raise ConfigError(source, f"data.{problem[0]}", problem[1])
    experts = model.get("experts")
    if get_format(data.format).experts and data.experts is None and isinstance(experts, dict):
        data.experts = list(experts) or None  # a CE / MMT model's own experts


def _loop_checks(
    data: DataConfig,
    model: dict[str, Any],
    loss: LossConfig,
    optim: OptimConfig,
    train: TrainConfig,
    source: str,
) -> None:
    """The checks between ``[optim]`` / ``[train]`` keys and the other sections, in order."""
    if optim.decay_every and optim.decay_epochs:
        why = "give decay_epochs (a list) or decay_every (a period), not both"
        raise ConfigError(source, "optim.decay_every", why)
    refusal = warmup_refusal(loss.name, loss.params) if train.all_negatives_epochs else None
    if refusal:
        raise ConfigError(source, "train.all_negatives_epochs", refusal)
    if train.momentum_encoder is not None:
        check_momentum_encoder(train.momentum_encoder, loss, source)
    if train.exchange != "gather":  # ring / bidir: a loss that is a sum over independent pairs
        check_exchange(train.exchange, loss_capabilities(loss.name, loss.params), loss.name, source)
    check_loop_settings(optim, train, source)  # schedule, no_decay, freeze, lock, compile
    if train.max_steps_per_epoch is not None:  # a cosine's warm-up within the shortened run
        check_schedule_length(optim, train, source, steps_per_epoch=train.max_steps_per_epoch)
    check_zeroshot(train, source)
    check_offline_negatives(data, loss, model, train, source)  # AOQ's keys (docs/aoq.md)
    caps = loss_capabilities(loss.name, loss.params)
    if data.semantic_captions is not None and not caps.needs_semantics:
        why = (
            "read only by a loss that fits a caption TF-IDF (vsl); loss.name = "
            f"{loss.name!r} fits none: unset it or choose such a loss"
        )
        raise ConfigError(source, "data.semantic_captions", why)
    irr = model.get("irr")
    if irr not in (None, False) and not caps.masked_language:
        why = (
            'IRRA\'s cross-modal encoder is trained only by the loss part "mlm" (loss.name = '
            f'"sdm+mlm+id"); loss.name = {loss.name!r} has none, so it would train nothing: '
            "add the part or set model.irr = false"
        )
        raise ConfigError(source, "model.irr", why)


def config_from_dict(raw: dict[str, Any], *, source: str | Path = "<dict>") -> RunConfig:
    """Validate a raw mapping (file layout) into a :class:`RunConfig`: each section is read by
    its declaration (:func:`~vlret.run.config_sections.build_section`; the ``[loss]`` keys by
    the loss's, :func:`~vlret.run.loss_config.loss_config`), then the checks between
    sections run."""
    source = str(source)
    output_dir = _top_level(raw, source)
    data = build_section(DataConfig, raw["data"], source, "data")
    model = _model_section(raw, source)
    _data_checks(data, model, raw, source)
    loss = loss_config(raw["loss"], source, model)
    optim = build_section(OptimConfig, raw.get("optim", {}), source, "optim")
    optim.lr_multipliers = lr_multipliers(optim.lr_multipliers, source)
    train = build_section(TrainConfig, raw["train"], source, "train")
    _loop_checks(data, model, loss, optim, train, source)
    return RunConfig(
        data=data,
        model=model_with_scoring(model, loss),
        loss=loss,
        optim=optim,
        train=train,
        output_dir=output_dir,
        source=source,
    )


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
