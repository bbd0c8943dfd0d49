"""Trainer hooks: the extension points of :class:`vlret.train.Trainer`.

What differs between training procedures (VSE-infinity's all-negatives warm-up, a backbone
frozen for the first epochs, a smaller learning rate for BERT, AdaCL's margin sync, a
comparison's progress display) is a :class:`TrainHook`, not a branch of the step. A hook never
receives the trainer: every method gets a :class:`~vlret.train.context.TrainContext` ``ctx``,
the typed read-only view of the run in training, whose ``ctx.control``
(:class:`~vlret.train.context.TrainControl`) asks the loop to stop, save or evaluate. The
trainer calls every hook's methods in the order of its hook list, at fixed points:

1. ``param_groups(ctx, groups)`` once, while the trainer is built, before the optimiser:
   each hook may split or re-scale the parameter groups the previous one returned.
2. ``on_fit_start(ctx)`` when :meth:`~vlret.train.Trainer.fit` starts (after a resume).
3. For each epoch: ``before_epoch(ctx)`` (also when a resumed run re-enters an epoch in
   its middle), then for each batch ``before_step(ctx, batch)`` (before the learning
   rate is set and the batch moved to the device), the forward and backward pass,
   ``before_optimizer_step(ctx)`` (gradients final: after DDP's all-reduce, before
   unscaling, clipping and the optimiser step), the optimiser step and the momentum encoder's
   update, then ``after_step(ctx, step)``; then the control's flags are honoured
   (:mod:`vlret.train.context`), a requested validation ending in ``after_evaluate(ctx,
   record)``, and the mid-epoch checkpoint is written when due.
4. At the end of each epoch, after validation, the epoch record and the checkpoints:
   ``after_epoch(ctx, record)``; ``ctx.epoch`` is then the number of epochs done. The
   control's ``should_stop`` is read after it.
5. ``on_fit_end(ctx, result)`` when training ends without an interrupt: the last epoch
   done, or a stop the control asked for (``result.stopped``); not after Ctrl-C.

The hooks built from the config (:mod:`vlret.train.hooks.from_config`) come first, in the order
:class:`AllNegativesWarmup`, :class:`FreezeModules`, :class:`LockModules`,
:class:`LrMultipliers`, :class:`NoWeightDecay`, :class:`SyncLossBuffers`, then the zero-shot
check (:class:`vlret.train.hooks.zeroshot.ZeroShotEvery`); a training procedure's own hooks
(:meth:`vlret.train.loss_step.LossStep.hooks`) follow, then the hooks given to
``Trainer(..., hooks=...)`` in their order. Every hook method runs on every rank. A hook reads
the run's state (``ctx.epoch``, ``ctx.step``, ``ctx.model``, ``ctx.loss_fn``,
``ctx.optimizer``, ``ctx.world_size``) and keeps none of its own that a resume would need: what
it does is a function of that state, so ``--resume`` stays exact.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch
from torch import nn

from ...run.config import ConfigError, RunConfig
from ..context import TrainContext
from ..optim_groups import ParamGroup, exempt_from_decay
from ..parallel.distributed import broadcast_from_main

if TYPE_CHECKING:
    from ...data.dataset import RetrievalBatch

#: The key under which the loss's own parameters (a learnable temperature) appear in
#: parameter names: ``loss.<name>``; the model's keep their ``named_parameters`` names.
LOSS_PREFIX = "loss"
#: The key under which a training procedure's own networks' parameters appear in parameter
#: names: ``procedure.<network>.<name>`` (NCR's network B: ``procedure.model_b.<name>``).
PROCEDURE_PREFIX = "procedure"


@dataclass
class TrainResult:
    """What :meth:`vlret.train.Trainer.fit` returns (and :meth:`TrainHook.on_fit_end` sees).

    ``best_metric`` is the best dev value of ``select_on``, the metric ``best.pt`` maximises
    (``train.select_on``); ``best_rsum`` is the same value when that metric is ``"rsum"`` and
    ``None`` otherwise (``None`` too without validation). ``stopped``: a hook or a procedure
    ended training before ``train.epochs`` through ``ctx.control.should_stop``
    (``last.pt`` holds where it stopped; ``--resume`` continues from there)."""

    output_dir: Path
    epochs_done: int
    steps: int
    best_rsum: float | None
    last_checkpoint: Path
    best_checkpoint: Path | None
    best_metric: float | None = None
    select_on: str = "rsum"
    stopped: bool = False


@dataclass(frozen=True)
class StepOutput:
    """What :meth:`TrainHook.after_step` sees of a finished step.

    Attributes:
        loss: The step's (global) loss value.
        lr: The learning rate of the first parameter group during the step.
        context: The detached embeddings or scores and ids of the step (``img``, ``txt``,
            ``ids`` or ``sim``, ``ids``). With gradient caching (``train.grad_cache_chunk``)
            the embeddings are not kept (they would be held through the chunks'
            re-encoding): ``ids`` and, on a logging step, ``batch_stats`` (the step log's
            ``pos_sim`` / ``hardest_neg_sim``).
    """

    loss: float
    lr: float
    context: Mapping[str, Any] = field(default_factory=dict)


class TrainHook:
    """An extension point of the training loop; every method does nothing by default.

    See the module docstring for when each method runs.
    """

    def param_groups(self, ctx: TrainContext, groups: list[ParamGroup]) -> list[ParamGroup]:
        """The parameter groups of the optimiser (default: ``groups`` unchanged)."""
        return groups

    def on_fit_start(self, ctx: TrainContext) -> None:
        """Training starts (or continues after a resume)."""

    def before_epoch(self, ctx: TrainContext) -> None:
        """Epoch ``ctx.epoch`` starts (or is re-entered by a resume)."""

    def before_step(self, ctx: TrainContext, batch: RetrievalBatch) -> None:
        """A step on the local ``batch`` starts (``ctx.step`` steps taken before it)."""

    def before_optimizer_step(self, ctx: TrainContext) -> None:
        """The gradients of the step are final; the optimiser has not stepped yet."""

    def after_step(self, ctx: TrainContext, step: StepOutput) -> None:
        """A step is done (``ctx.step`` counts it); the control's flags are read next."""

    def after_evaluate(self, ctx: TrainContext, record: Mapping[str, Any]) -> None:
        """A validation ``ctx.control.should_evaluate`` asked for is done: ``record`` is its
        ``kind: dev`` record (the dev metrics with a ``dev_`` prefix). Rank 0 only, the rank
        that validates. The epoch's own validation reaches hooks as ``after_epoch``'s record."""

    def after_epoch(self, ctx: TrainContext, record: Mapping[str, Any]) -> None:
        """An epoch is done: validated, logged as ``record`` and checkpointed."""

    def on_fit_end(self, ctx: TrainContext, result: TrainResult) -> None:
        """Training ended: every epoch done, or a stop the control asked for
        (``result.stopped``)."""


class HookList(TrainHook):
    """Hooks called one after another in list order: what the trainer calls at each point."""

    def __init__(self, hooks: Sequence[TrainHook] = ()) -> None:
        for hook in hooks:
            if not isinstance(hook, TrainHook):
                raise TypeError(f"hooks must be TrainHook instances, got {type(hook).__name__}")
        self.hooks = list(hooks)

    def __iter__(self) -> Iterator[TrainHook]:
        return iter(self.hooks)

    def __len__(self) -> int:
        return len(self.hooks)

    def param_groups(self, ctx: TrainContext, groups: list[ParamGroup]) -> list[ParamGroup]:
        for hook in self.hooks:
            groups = hook.param_groups(ctx, groups)
        return groups

    def on_fit_start(self, ctx: TrainContext) -> None:
        for hook in self.hooks:
            hook.on_fit_start(ctx)

    def before_epoch(self, ctx: TrainContext) -> None:
        for hook in self.hooks:
            hook.before_epoch(ctx)

    def before_step(self, ctx: TrainContext, batch: RetrievalBatch) -> None:
        for hook in self.hooks:
            hook.before_step(ctx, batch)

    def before_optimizer_step(self, ctx: TrainContext) -> None:
        for hook in self.hooks:
            hook.before_optimizer_step(ctx)

    def after_step(self, ctx: TrainContext, step: StepOutput) -> None:
        for hook in self.hooks:
            hook.after_step(ctx, step)

    def after_evaluate(self, ctx: TrainContext, record: Mapping[str, Any]) -> None:
        for hook in self.hooks:
            hook.after_evaluate(ctx, record)

    def after_epoch(self, ctx: TrainContext, record: Mapping[str, Any]) -> None:
        for hook in self.hooks:
            hook.after_epoch(ctx, record)

    def on_fit_end(self, ctx: TrainContext, result: TrainResult) -> None:
        for hook in self.hooks:
            hook.on_fit_end(ctx, result)


def named_trainable(
    model: nn.Module, loss_fn: nn.Module, networks: Mapping[str, nn.Module] | None = None
) -> list[tuple[str, nn.Parameter]]:
    """The parameters the optimiser updates, named: the model's, then the loss's as
    ``loss.<name>``, then those of a training procedure's own ``networks``
    (:meth:`vlret.train.loss_step.LossStep.networks`) as ``procedure.<network>.<name>``
    (the order of the single default group)."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    named += [(f"{LOSS_PREFIX}.{n}", p) for n, p in loss_fn.named_parameters() if p.requires_grad]
    for key, net in (networks or {}).items():
        prefix = f"{PROCEDURE_PREFIX}.{key}"
        named += [(f"{prefix}.{n}", p) for n, p in net.named_parameters() if p.requires_grad]
    return named


def param_groups(
    ctx: TrainContext, hooks: TrainHook, *, networks: Mapping[str, nn.Module] | None = None
) -> list[nn.Parameter] | list[ParamGroup]:
    """The optimiser's parameters: one group of :func:`named_trainable` (the model, the loss
    and the procedure's ``networks``) refined by each hook's :meth:`~TrainHook.param_groups`
    in turn; a single group at factor 1 and the optimiser's weight decay comes back as the
    plain parameter list (the optimiser built exactly as without hooks), after
    :func:`check_something_to_train` (asked of the model's and the loss's parameters: a
    procedure's second network does not make a run whose own model trains nothing valid)."""
    named = named_trainable(ctx.model, ctx.loss_fn, networks)
    groups = [ParamGroup(tuple(n for n, _ in named), tuple(p for _, p in named))]
    groups = hooks.param_groups(ctx, groups)
    own = []  # the groups without the procedure's networks
    for g in groups:
        kept = [(n, p) for n, p in zip(g.names, g.params, strict=True) if not _procedure(n)]
        names, params = tuple(n for n, _ in kept), tuple(p for _, p in kept)
        own.append(ParamGroup(names, params, g.lr_scale, g.weight_decay))
    check_something_to_train(ctx.config, own, hooks)
    if len(groups) == 1 and groups[0].lr_scale == 1.0 and groups[0].weight_decay is None:
        return list(groups[0].params)
    return groups


def _procedure(name: str) -> bool:
    return name.startswith(PROCEDURE_PREFIX + ".")


def check_something_to_train(
    config: RunConfig, groups: Sequence[ParamGroup], hooks: TrainHook
) -> None:
    """Refuse a run with nothing to train, naming the key that took everything away: the
    ``train.lock`` modules holding every trainable parameter (the optimiser would get an
    empty parameter list), or the ``train.freeze`` modules (:class:`FreezeModules` among
    ``hooks``) holding every one that is left, for the first ``freeze_epochs`` epochs (the
    first backward pass would find no gradient to compute). A learnable parameter of the loss
    (a temperature) or of the model outside the named modules is something to train.
    Called while the trainer is built, before anything is written into the run folder.

    Raises:
        ConfigError: Nothing left to train.
    """
    tc, source = config.train, config.source
    trainable = {id(p) for g in groups for p in g.params}
    elsewhere = "none in the rest of the model, none in the loss"
    if not trainable:
        if tc.lock:
            why = (
                f"locking {', '.join(tc.lock)} leaves no trainable parameter ({elsewhere}): "
                "nothing to train; lock fewer modules (LiT locks the image tower only)"
            )
            raise ConfigError(source, "train.lock", why)
        raise ConfigError(source, "model", "the model and the loss have no trainable parameter")
    members = hooks if isinstance(hooks, HookList) else [hooks]
    frozen = {id(p) for h in members if isinstance(h, FreezeModules) for p in h.params}
    if trainable <= frozen:
        also = f" (with train.lock's {', '.join(tc.lock)})" if tc.lock else ""
        epochs = f"{tc.freeze_epochs} epoch" + ("s" if tc.freeze_epochs != 1 else "")
        why = (
            f"freezing {', '.join(tc.freeze)}{also} leaves no trainable parameter in the first "
            f"{epochs} ({elsewhere}): nothing to train in them; freeze fewer modules (VSE++ "
            "freezes the image backbone only)"
        )
        raise ConfigError(source, "train.freeze", why)


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _nearby(names: Sequence[str]) -> str:
    """The distinct first two components of ``names``: what a prefix could have been."""
    heads = dict.fromkeys(".".join(n.split(".")[:2]) for n in names)
    shown = list(heads)[:12]
    return ", ".join(shown) + (", ..." if len(heads) > len(shown) else "")


class LrMultipliers(TrainHook):
    """Parameter groups with learning-rate multipliers (``[optim] lr_multipliers``).

    ``multipliers`` maps a parameter-name prefix (``"text_encoder.bert"``: that module's
    parameters; ``"loss"``: the loss's own) to a factor of ``optim.lr``; a parameter takes the
    factor of its longest matching prefix (VSE-infinity trains BERT at 0.1x). The parameters
    without a multiplier stay in the first group at factor 1, in their original order; then one
    group per prefix, in the order given. The schedule scales every group's own learning rate,
    so warm-up and decay keep the ratios, and a checkpoint stores each group's base rate.

    Raises:
        ConfigError: From :meth:`param_groups`: a prefix that names no trainable parameter.
    """

    def __init__(self, multipliers: Mapping[str, float], *, source: str = "<hooks>") -> None:
        for prefix, scale in multipliers.items():
            if not isinstance(scale, int | float) or isinstance(scale, bool) or not scale > 0:
                key = f"optim.lr_multipliers.{prefix}"
                raise ConfigError(source, key, f"expected a positive number, got {scale!r}")
        self.multipliers = dict(multipliers)
        self.source = source

    def param_groups(self, ctx: TrainContext, groups: list[ParamGroup]) -> list[ParamGroup]:
        names = [n for g in groups for n in g.names]
        # keyed by an incoming group's (lr_scale, weight_decay)
        by_prefix: dict[str, list[tuple[str, nn.Parameter, tuple[float, float | None]]]] = {
            p: [] for p in self.multipliers
        }
        rest: dict[tuple[float, float | None], list[tuple[str, nn.Parameter]]] = {}
        for group in groups:
            key = (group.lr_scale, group.weight_decay)
            for name, param in zip(group.names, group.params, strict=True):
                matches = [p for p in self.multipliers if _under(name, p)]
                if matches:
                    by_prefix[max(matches, key=len)].append((name, param, key))
                else:
                    rest.setdefault(key, []).append((name, param))
        for prefix in by_prefix:
            if not any(_under(n, prefix) for n in names):
                raise ConfigError(
                    self.source,
                    f"optim.lr_multipliers.{prefix}",
                    f"matches no trainable parameter; parameter names begin with {_nearby(names)}",
                )
        out = [
            ParamGroup(tuple(n for n, _ in m), tuple(p for _, p in m), s, wd)
            for (s, wd), m in rest.items()
        ]
        for prefix, members in by_prefix.items():
            keys = dict.fromkeys(k for _, _, k in members)
            for scale, decay in keys:  # one group per incoming group kind (hooks compose)
                kept = [(n, p) for n, p, k in members if k == (scale, decay)]
                out.append(
                    ParamGroup(
                        tuple(n for n, _ in kept),
                        tuple(p for _, p in kept),
                        scale * self.multipliers[prefix],
                        decay,
                    )
                )
        return [g for g in out if g.params]


def _modules(
    model: nn.Module, names: Sequence[str], key: str, source: str
) -> list[tuple[str, nn.Module]]:
    """The named modules of ``model`` (``model.named_modules()`` names); a name that is none is
    a ConfigError keyed ``key[i]``, listing the model's top-level modules."""
    modules = dict(model.named_modules())
    out = []
    for i, name in enumerate(names):
        if name not in modules or not name:
            children = ", ".join(n for n, _ in model.named_children())
            why = f"{name!r} is not a module of the model (its top-level modules: {children})"
            raise ConfigError(source, f"{key}[{i}]", why)
        out.append((name, modules[name]))
    return out


class FreezeModules(TrainHook):
    """Modules frozen for the first ``epochs`` epochs (``[train] freeze``, ``freeze_epochs``,
    ``freeze_bn``): VSE++'s step 1 (the backbone fixed while the rest trains) then step 2.

    In epochs ``< epochs`` the modules' parameters get no update: their gradients are dropped
    before the optimiser step (the optimiser then skips them: no step, no weight decay, no
    moment update) and, in a single process, ``requires_grad`` is off so the backward pass does
    not compute them. DistributedDataParallel fixes at construction which parameters it
    reduces, so under torchrun they stay differentiable and only the update is skipped. From
    epoch ``epochs`` on they train. The phase is read from ``ctx.epoch`` at each epoch
    start, so a run resumed inside the frozen phase continues identically.

    ``bn``: the modules' mode while frozen. ``"eval"`` (default): put in eval mode before every
    step, so BatchNorm running statistics stay fixed and dropout is off: the frozen module is a
    fixed function. ``"train"``: left in train mode like the rest of the model, so BatchNorm
    layers keep updating their running statistics from the training batches although their
    weights do not move. That is VSE++'s step 1 (its backbone is left out of the optimiser but
    the model is in train mode): set it to reproduce VSE++, not by accident. (VSE-infinity's
    WSL backbone instead keeps BatchNorm in eval mode for the whole run.)

    Raises:
        ConfigError: A name that is no module of the model (``train.freeze``).
    """

    def __init__(
        self,
        model: nn.Module,
        names: Sequence[str],
        *,
        epochs: int,
        bn: str = "eval",
        source: str = "<hooks>",
    ) -> None:
        if bn not in ("eval", "train"):
            raise ConfigError(source, "train.freeze_bn", f"expected eval or train, got {bn!r}")
        self.modules = [m for _, m in _modules(model, names, "train.freeze", source)]
        params: dict[int, nn.Parameter] = {}
        for module in self.modules:
            for p in module.parameters():
                if p.requires_grad:  # a parameter the model keeps fixed anyway stays fixed
                    params[id(p)] = p
        self.params = list(params.values())
        self.epochs = int(epochs)
        self.bn = bn
        self.frozen = False

    def before_epoch(self, ctx: TrainContext) -> None:
        self.frozen = ctx.epoch < self.epochs
        if ctx.world_size == 1:
            for p in self.params:
                p.requires_grad_(not self.frozen)

    def before_step(self, ctx: TrainContext, batch: RetrievalBatch) -> None:
        if self.frozen and self.bn == "eval":  # after the epoch's model.train()
            for module in self.modules:
                module.eval()

    def before_optimizer_step(self, ctx: TrainContext) -> None:
        if self.frozen:
            for p in self.params:
                p.grad = None

    def on_fit_end(self, ctx: TrainContext, result: TrainResult) -> None:
        for p in self.params:  # a run shorter than the phase leaves the model trainable
            p.requires_grad_(True)


def lock_modules(
    model: nn.Module, names: Sequence[str], *, source: str = "<hooks>"
) -> list[nn.Module]:
    """The ``train.lock`` modules of ``model``, their parameters made not to require gradients
    (idempotent). The trainer calls it before DistributedDataParallel wraps the model
    (:func:`vlret.train.schedule.prepare_model`), which then never reduces them.

    Raises:
        ConfigError: A name that is no module of the model (``train.lock``).
    """
    modules = [m for _, m in _modules(model, names, "train.lock", source)]
    for module in modules:
        module.requires_grad_(False)
    return modules


class LockModules(TrainHook):
    """LiT-style locked towers (``[train] lock``): modules frozen for the whole run.

    Their parameters never require gradients (:func:`lock_modules`, so the backward pass stops
    at them and DistributedDataParallel leaves them out), they are in no optimiser group (no
    optimiser state, no weight decay) and they are put in eval mode before every step (BatchNorm
    statistics fixed, dropout off): the locked tower is a fixed function of its input, as in
    LiT. A checkpoint still holds their weights (the model's ``state_dict``).

    Raises:
        ConfigError: A name that is no module of the model (``train.lock``).
    """

    def __init__(self, model: nn.Module, names: Sequence[str], *, source: str = "<hooks>") -> None:
        self.modules = lock_modules(model, names, source=source)

    def before_step(self, ctx: TrainContext, batch: RetrievalBatch) -> None:
        for module in self.modules:
            module.eval()


class NoWeightDecay(TrainHook):
    """Parameters without weight decay (``[optim] no_decay``, :mod:`vlret.train.optim_groups`):
    each incoming group is split into the decayed parameters (as they came) then the exempt
    ones at ``weight_decay = 0``, keeping the group's learning-rate factor; so it composes with
    :class:`LrMultipliers` (which runs before it). No pattern: the groups unchanged."""

    def __init__(self, patterns: Sequence[str]) -> None:
        self.patterns = tuple(patterns)

    def param_groups(self, ctx: TrainContext, groups: list[ParamGroup]) -> list[ParamGroup]:
        if not self.patterns:
            return groups
        out: list[ParamGroup] = []
        for group in groups:
            pairs = list(zip(group.names, group.params, strict=True))
            free = [exempt_from_decay(n, p, self.patterns) for n, p in pairs]
            for exempt, decay in ((False, group.weight_decay), (True, 0.0)):
                kept = [pair for pair, f in zip(pairs, free, strict=True) if f == exempt]
                if kept:
                    names = tuple(n for n, _ in kept)
                    params = tuple(p for _, p in kept)
                    out.append(ParamGroup(names, params, group.lr_scale, decay))
        return out


class AllNegativesWarmup(TrainHook):
    """VSE-infinity's warm-up (``[train] all_negatives_epochs``): all negatives instead of the
    hardest for the first ``epochs`` epochs (:mod:`vlret.run.warmup`), read from
    ``ctx.epoch`` so a resume keeps the schedule. When the warm-up ends, a note goes to the
    run's ``print_fn`` (rank 0's console): the loss changes scale from that epoch."""

    def __init__(self, epochs: int) -> None:
        self.epochs = int(epochs)

    def before_epoch(self, ctx: TrainContext) -> None:
        ctx.loss_fn.set_all_negatives(ctx.epoch < self.epochs)
        if ctx.epoch == self.epochs and self.epochs > 0:
            ctx.print(warmup_end_note(self.epochs))


def warmup_end_note(epochs: int) -> str:
    """The console note at the start of epoch ``epochs``, the first after the warm-up."""
    return (
        f"epoch {epochs}: the all-negatives warm-up is over; the loss now takes the hardest "
        "negative instead of the sum over all negatives, so the loss column changes scale "
        f"(drops) from epoch {epochs} on: compare losses within one phase only"
    )


@runtime_checkable
class SyncedBuffers(Protocol):
    """A loss whose buffers every rank must hold equal (AdaCL's margins with ``sync_margins``)."""

    def synced_buffers(self) -> tuple[torch.Tensor, ...]: ...


class SyncLossBuffers(TrainHook):
    """After each step, every rank takes rank 0's values of the buffers the loss declares in
    ``synced_buffers()`` (AdaCL: ``m1``, ``m2``), so per-rank rounding never lets them drift."""

    def __init__(self, buffers: Sequence[torch.Tensor]) -> None:
        self.buffers = tuple(buffers)

    def after_step(self, ctx: TrainContext, step: StepOutput) -> None:
        broadcast_from_main(self.buffers)


class EpochCallback(TrainHook):
    """Calls ``callback(epochs_done)`` on rank 0 after each epoch (a progress display)."""

    def __init__(self, callback: Callable[[int], None]) -> None:
        self.callback = callback

    def after_epoch(self, ctx: TrainContext, record: Mapping[str, Any]) -> None:
        if ctx.is_main:
            self.callback(ctx.epoch)


__all__ = [
    "AllNegativesWarmup",
    "EpochCallback",
    "FreezeModules",
    "HookList",
    "LockModules",
    "LrMultipliers",
    "NoWeightDecay",
    "ParamGroup",
    "StepOutput",
    "SyncLossBuffers",
    "SyncedBuffers",
    "TrainHook",
    "TrainResult",
    "check_something_to_train",
    "lock_modules",
    "warmup_end_note",
    "named_trainable",
    "param_groups",
]
