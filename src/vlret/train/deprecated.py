"""Every deprecated name of :mod:`vlret.train`, each with its replacement and the version that
removes it.

In 0.1.0, ``vlret.train`` exported the whole harness: the run's config, its checkpoints and
evaluating a checkpoint as well as the training loop. Those now live in :mod:`vlret.run` (a run
is what ``vlret eval``, ``report`` or ``import-checkpoint`` share without the loop), and the
protocol table is the protocol registry's (:func:`vlret.eval.protocol_names`). The old names
stay importable from ``vlret.train`` (its ``__getattr__``,
:func:`vlret._deprecation.module_getattr`), each access with a :class:`DeprecationWarning`
naming the replacement, until :data:`REMOVED_IN`. Only names ``vlret.train`` exported in 0.1.0
are kept: its modules' own paths (``vlret.train.config``, ``vlret.train.evaluate`` ...) were
never on the API reference and are gone.

==================================================  ==================================
0.1.0 name                                          use instead
==================================================  ==================================
``vlret.train.PROTOCOLS``                           ``vlret.eval.protocol_names()``
``vlret.train.ConfigError``, ``DataConfig``,        the same name in :mod:`vlret.run`
``LossConfig``, ``OptimConfig``, ``RunConfig``,
``TrainConfig``, ``apply_overrides``,
``config_from_dict``, ``load_config``,
``save_config``, ``parse_value``,
``capture_rng_state``, ``restore_rng_state``,
``load_checkpoint``, ``save_checkpoint``,
``encode_dataset``, ``evaluate_checkpoint``,
``format_metrics_table``, ``metrics_json``,
``protocol_metrics``
==================================================  ==================================

Every name above is removed in 0.3.0.
"""

from __future__ import annotations

import importlib

from .._deprecation import OldName

#: The version that removes every name below.
REMOVED_IN = "0.3.0"

#: The names of 0.1.0's ``vlret.train`` that are :mod:`vlret.run`'s now (issue 41).
MOVED_TO_RUN: tuple[str, ...] = (
    "ConfigError",
    "DataConfig",
    "LossConfig",
    "OptimConfig",
    "RunConfig",
    "TrainConfig",
    "apply_overrides",
    "capture_rng_state",
    "config_from_dict",
    "encode_dataset",
    "evaluate_checkpoint",
    "format_metrics_table",
    "load_checkpoint",
    "load_config",
    "metrics_json",
    "parse_value",
    "protocol_metrics",
    "restore_rng_state",
    "save_checkpoint",
    "save_config",
)


def _protocol_names() -> tuple[str, ...]:
    """The old ``PROTOCOLS`` tuple: every registered protocol's name, read at each access."""
    names: tuple[str, ...] = importlib.import_module("vlret.eval").protocol_names()
    return names


#: Every deprecated name of ``vlret.train``.
OLD_NAMES: tuple[OldName, ...] = (
    OldName(
        module="vlret.train",
        name="PROTOCOLS",
        replacement="vlret.eval.protocol_names()",
        removed_in=REMOVED_IN,
        compute=_protocol_names,
    ),
    *(
        OldName(
            module="vlret.train",
            name=name,
            replacement=f"vlret.run.{name}",
            removed_in=REMOVED_IN,
            target=f"vlret.run:{name}",
        )
        for name in MOVED_TO_RUN
    ),
)


__all__ = ["MOVED_TO_RUN", "OLD_NAMES", "REMOVED_IN"]
