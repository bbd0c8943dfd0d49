"""Training procedures: what a step computes, chosen by ``train.procedure``.

A procedure is a :class:`~vlret.train.loss_step.LossStep` (or subclass) built from the run
config: ``"standard"`` is the one-model step every loss trains with (``"none"`` and null name
it too); the others change what a
step or an epoch does (NCR's two co-trained networks with a per-epoch split of the training
pairs, Meta-SPN's meta step, AOQ's offline negatives). A procedure may add training hooks
(:meth:`LossStep.hooks`) and keeps its own state in the checkpoint
(:meth:`LossStep.state_dict`, a checkpoint's ``procedure``), so a resume continues it.

Register one with :func:`register_procedure`; its module is imported when a config names it
(:data:`MODULES`), so the core never imports the procedures it does not run::

    @register_procedure("mine")
    def build(config: RunConfig) -> LossStep:
        return MyStep(**config.train.procedure_options)
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from ...losses import loss_capabilities
from ...run.config import RunConfig
from ...run.train_checks import STANDARD_PROCEDURE
from ..loss_step import LossStep

#: name -> factory(config) -> LossStep
PROCEDURES: dict[str, Callable[[RunConfig], LossStep]] = {}
#: name -> the module that registers it (imported on first use).
MODULES: dict[str, str] = {}
MODULES["aoq"] = "vlret.train.procedures.aoq"
MODULES["metaspn"] = "vlret.train.procedures.metaspn"
MODULES["ncr"] = "vlret.train.procedures.ncr"


def register_procedure(
    name: str,
) -> Callable[[Callable[[RunConfig], LossStep]], Callable[[RunConfig], LossStep]]:
    """Decorator: register ``factory(config) -> LossStep`` as ``train.procedure = name``."""

    def wrap(factory: Callable[[RunConfig], LossStep]) -> Callable[[RunConfig], LossStep]:
        if name in PROCEDURES and PROCEDURES[name] is not factory:
            raise ValueError(f"training procedure {name!r} is already registered")
        PROCEDURES[name] = factory
        return factory

    return wrap


@register_procedure(STANDARD_PROCEDURE)
def _standard(config: RunConfig) -> LossStep:
    if config.train.procedure_options:
        keys = ", ".join(sorted(config.train.procedure_options))
        raise ValueError(f"train.procedure_options: the standard procedure takes none, got {keys}")
    return LossStep()


def procedure_names() -> list[str]:
    """Every procedure a config may name."""
    return sorted(set(PROCEDURES) | set(MODULES))


def build_procedure(config: RunConfig) -> LossStep:
    """The procedure ``config.train.procedure`` names, built from ``config``.

    ``None`` and ``"none"`` (a config the checks did not resolve) are ``"standard"``
    (:func:`vlret.run.train_checks.check_procedure`). A config whose loss declares
    ``LossCapabilities.offline_negatives`` (AOQ's) and whose procedure is ``"standard"`` (the
    default) gets ``"aoq"``: such a loss needs the offline negatives only that step encodes.

    Raises:
        ValueError: An unknown name (the error lists the known ones) or bad options (the
            procedure's own message).
    """
    name = config.train.procedure
    if name is None or name.strip().lower() == "none":
        name = STANDARD_PROCEDURE
    if name == "standard" and loss_capabilities(config.loss.name).offline_negatives:
        name = "aoq"  # the one procedure that encodes each batch's offline negatives
    if name not in PROCEDURES and name in MODULES:
        importlib.import_module(MODULES[name])
    if name not in PROCEDURES:
        known = ", ".join(procedure_names())
        raise ValueError(f"train.procedure: unknown procedure {name!r}; known: {known}")
    return PROCEDURES[name](config)


__all__ = ["MODULES", "PROCEDURES", "build_procedure", "procedure_names", "register_procedure"]
