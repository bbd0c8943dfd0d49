"""The options of the training procedures (``[train] procedure_options``), each a declared
record read by the one machinery of every setting (:mod:`vlret._settings`).

A procedure declares its options as a frozen dataclass of :func:`vlret._settings.setting`
fields (default, constraint, one-line description) and reads a config's table with
:func:`procedure_options`: an unknown key or a bad value is one line naming
``train.procedure_options.<key>`` and what was expected. The key reference
(``docs/reference/config.md``) lists the declared options of each procedure. Here are
Meta-SPN's (:class:`MetaSPNOptions`) and AOQ's (:class:`AOQOptions`); NCR's are
:class:`vlret.train.procedures.ncr.options.NCROptions`, beside its procedure (which reads
this module, never the other way).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from ..._settings import Items, OneOf, Range, SettingError, build, setting
from ...run.config_files import ConfigError

#: Where a procedure's options sit in a run config.
OPTIONS_KEY = "train.procedure_options"

_Options = TypeVar("_Options")


def procedure_options(cls: type[_Options], options: Mapping[str, Any], *, unknown: str) -> _Options:
    """The declared options ``cls`` read from a config's ``procedure_options`` table.

    Args:
        cls: The procedure's options record.
        options: The table as given.
        unknown: What an unknown key is called, before the list of the known ones.

    Raises:
        vlret._settings.SettingError: A ``ValueError`` ``train.procedure_options.<key>: ...``
            for an unknown key (listing the known ones) or a value its declaration refuses.
    """
    return build(cls, options, where=OPTIONS_KEY, unknown=unknown)


@dataclass(frozen=True)
class MetaSPNOptions:
    """The checked ``train.procedure_options`` of Meta-SPN
    (:mod:`vlret.train.procedures.metaspn`)."""

    hidden: tuple[int, ...] = setting(
        (100,),
        "the weighting network's hidden sizes",
        spec=Items(Range(integer=True, gt=0), words="a list of positive hidden sizes", typed=True),
    )
    meta_lr: float = setting(
        1e-3,
        "the weighting network's Adam learning rate (not given by the paper)",
        spec=Range(gt=0),
    )
    meta_every: int = setting(1, "a meta step every N steps", spec=Range(integer=True, ge=1))
    virtual_lr: float | None = setting(
        None,
        "the learning rate of the virtual step (null: the current learning rate)",
        spec=Range(gt=0),
    )
    meta_batch_size: int | None = setting(
        None,
        "the dev batch of a meta step (null: train.batch_size)",
        spec=Range(integer=True, ge=2),
    )
    meta_loss: str = setting(
        "hardest",
        "the meta loss on the dev batch: the hardest negative's hinge or the sum over all",
        spec=OneOf(("hardest", "all"), words="'hardest' or 'all'"),
    )


def metaspn_options(options: Mapping[str, Any], *, source: str = "<config>") -> MetaSPNOptions:
    """``train.procedure_options`` checked: a :class:`~vlret.run.config_files.ConfigError` (a
    ValueError) naming ``train.procedure_options.KEY`` and the value for an unknown key or a
    bad value."""
    try:
        return procedure_options(MetaSPNOptions, options, unknown="unknown Meta-SPN option; known")
    except SettingError as err:
        raise ConfigError(source, err.key, err.why) from None


@dataclass(frozen=True)
class AOQOptions:
    """The ``train.procedure_options`` of AOQ (:mod:`vlret.train.procedures.aoq`)."""

    pair_block: int = setting(
        16,
        "the block of the aligned pair scores of a pair-scoring model (items per scoring call)",
        spec=Range(integer=True, gt=0),
    )


def aoq_options(options: Mapping[str, Any]) -> AOQOptions:
    """AOQ's ``train.procedure_options`` checked (a ``ValueError`` naming
    ``train.procedure_options.KEY``)."""
    return procedure_options(
        AOQOptions, options, unknown="not an option of the aoq procedure; known"
    )


__all__ = [
    "OPTIONS_KEY",
    "AOQOptions",
    "MetaSPNOptions",
    "aoq_options",
    "metaspn_options",
    "procedure_options",
]
