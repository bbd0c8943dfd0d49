"""Training procedures: what a step computes, chosen by ``train.procedure``.

A procedure is a :class:`~vlret.train.loss_step.LossStep` (or subclass) built from the run
config: ``"standard"`` is the one-model step every loss trains with (``"none"`` and null name
it too); the others change what a step or an epoch does (NCR's two co-trained networks with a
per-epoch split of the training pairs, Meta-SPN's meta step, AOQ's offline negatives, AdaCL's
memory bank of a pair scorer). ``"standard"`` is resolved from what the loss and the model
need (:func:`resolve_procedure`). A procedure may add training hooks (:meth:`LossStep.hooks`)
and keeps its own state in the checkpoint (:meth:`LossStep.state_dict`, a checkpoint's
``procedure``), so a resume continues it.

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
from ...run.config import ConfigError, RunConfig
from ...run.train_checks import STANDARD_PROCEDURE
from ..loss_step import LossStep

#: name -> factory(config) -> LossStep
PROCEDURES: dict[str, Callable[[RunConfig], LossStep]] = {}
#: name -> the module that registers it (imported on first use).
MODULES: dict[str, str] = {}
MODULES["aoq"] = "vlret.train.procedures.aoq"
MODULES["cvse"] = "vlret.train.procedures.cvse"
MODULES["dime"] = "vlret.train.procedures.dime"
MODULES["irr"] = "vlret.train.procedures.irr"
MODULES["metaspn"] = "vlret.train.procedures.metaspn"
MODULES["ncr"] = "vlret.train.procedures.ncr"
MODULES["pair_bank"] = "vlret.train.procedures.pair_bank"


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


def resolve_procedure(config: RunConfig, *, scores_pairs: bool = False) -> str:
    """The name of the procedure ``config`` trains with.

    ``None`` and ``"none"`` (a config the checks did not resolve) are ``"standard"``
    (:func:`vlret.run.train_checks.check_procedure`). ``"standard"`` (the default) is resolved
    from what the loss and the model can do: a loss that declares
    ``LossCapabilities.offline_negatives`` (AOQ's) gets ``"aoq"``, the one step that encodes
    each batch's offline negatives; one that declares ``masked_language`` (IRRA's ``mlm``)
    gets ``"irr"``, the one step that masks the captions and runs the model's IRR encoder;
    a pair-scoring model (``scores_pairs``) whose loss holds a queue
    (``LossCapabilities.owns_queue``: AdaCL's ``queue_size``) gets ``"pair_bank"``, the one
    step that fills a pair scorer's bank (:mod:`.pair_bank`).

    Raises:
        ConfigError: Another procedure named for a pair scorer whose loss holds a queue
            (``train.procedure``).
    """
    name = config.train.procedure
    if name is None or name.strip().lower() == "none":
        name = STANDARD_PROCEDURE
    caps = loss_capabilities(config.loss.name, config.loss.params)
    bank = scores_pairs and caps.owns_queue
    if name == STANDARD_PROCEDURE and caps.offline_negatives:
        return "aoq"
    if name == STANDARD_PROCEDURE and caps.masked_language:
        return "irr"
    if name == STANDARD_PROCEDURE and bank:
        return "pair_bank"
    if bank and name != "pair_bank":
        why = (
            f'the memory bank of a pair scorer (loss.queue_size) trains with the "pair_bank" '
            f"procedure (or standard), not {name!r}"
        )
        raise ConfigError(config.source, "train.procedure", why)
    return name


def build_procedure(config: RunConfig, *, scores_pairs: bool = False) -> LossStep:
    """The procedure ``config.train.procedure`` names (:func:`resolve_procedure`: ``"standard"``
    resolved from the loss's capabilities and ``scores_pairs``, whether the run's model scores
    pairs), built from ``config``.

    Raises:
        ValueError: An unknown name (the error lists the known ones) or bad options (the
            procedure's own message).
    """
    name = resolve_procedure(config, scores_pairs=scores_pairs)
    if name not in PROCEDURES and name in MODULES:
        importlib.import_module(MODULES[name])
    if name not in PROCEDURES:
        known = ", ".join(procedure_names())
        raise ValueError(f"train.procedure: unknown procedure {name!r}; known: {known}")
    return PROCEDURES[name](config)


__all__ = [
    "MODULES",
    "PROCEDURES",
    "build_procedure",
    "procedure_names",
    "register_procedure",
    "resolve_procedure",
]
