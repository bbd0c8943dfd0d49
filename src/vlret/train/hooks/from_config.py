"""The hooks a run config asks for (``[train]`` freeze, lock, the all-negatives warm-up and
the zero-shot check; ``[optim]`` learning-rate multipliers and weight-decay exemptions; AdaCL's
buffer sync under torchrun), built by the trainer before its optimiser, in a fixed order: the
config's hooks run before the caller's (:mod:`vlret.train.hooks.core` documents each)."""

from __future__ import annotations

from ..context import TrainContext
from ..optim_groups import no_decay_rule
from .core import (
    AllNegativesWarmup,
    FreezeModules,
    LockModules,
    LrMultipliers,
    NoWeightDecay,
    SyncedBuffers,
    SyncLossBuffers,
    TrainHook,
)
from .zeroshot import ZeroShotEvery


def config_hooks(ctx: TrainContext) -> list[TrainHook]:
    """The hooks ``ctx.config`` asks for, in their fixed order (see the module docstring),
    for its model and loss (called before the optimiser exists).

    Raises:
        ConfigError: A ``train.freeze`` or ``train.lock`` name that is no module of the model.
    """
    config, model, loss_fn, world = ctx.config, ctx.model, ctx.loss_fn, ctx.world_size
    tc, oc = config.train, config.optim
    hooks: list[TrainHook] = []
    if tc.all_negatives_epochs:
        hooks.append(AllNegativesWarmup(tc.all_negatives_epochs))
    if tc.freeze:
        freeze = FreezeModules(
            model, tc.freeze, epochs=tc.freeze_epochs, bn=tc.freeze_bn, source=config.source
        )
        hooks.append(freeze)
    if tc.lock:
        hooks.append(LockModules(model, tc.lock, source=config.source))
    if oc.lr_multipliers:
        hooks.append(LrMultipliers(oc.lr_multipliers, source=config.source))
    if no_decay_rule(oc):
        hooks.append(NoWeightDecay(no_decay_rule(oc)))
    if world > 1 and isinstance(loss_fn, SyncedBuffers) and loss_fn.synced_buffers():
        hooks.append(SyncLossBuffers(loss_fn.synced_buffers()))
    if tc.zeroshot_every > 0:
        hooks.append(ZeroShotEvery.from_config(ctx))
    return hooks


__all__ = ["config_hooks"]
