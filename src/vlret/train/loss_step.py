"""What one training step computes from a local batch: the loss, through one ``StepInputs``.

:class:`LossStep` is the procedure :meth:`vlret.train.Trainer.compute_loss` runs: encode the
batch (or score its pairs), gather it across ranks, fill one :class:`~vlret.losses.StepInputs`
with what the loss declares (ids: the batch's person identities when set, else its image
indices, :func:`pair_ids`; a rank's shard, momentum keys, the gathered flag, the
columns' caption strings) and hand it to the loss: ``forward_step`` on embeddings,
``similarity_step`` on a pair scorer's score matrix. It holds no state of its own (the trainer
checkpoints everything a step reads); a training procedure that computes its loss differently
(two co-trained networks, a meta step) is a subclass given to the trainer, not a branch here.

The contract: a procedure receives the run as a :class:`~vlret.train.context.TrainContext`
(never the trainer) and returns its losses from :meth:`LossStep.__call__`. A network it trains
on the training loss (NCR's network B) is a submodule it owns and declares in
:meth:`LossStep.networks`; it steps no optimiser for it: the trainer puts the network's
trainable parameters into its one optimiser (named ``procedure.<network>.<name>``), so the
schedule, the AMP scaler, gradient clipping and the weight-decay rules apply to it as to the
model, and the loss the step returns for backward holds that network's loss too (open_clip's
``TrainingTask`` shape). A network learned on another objective than the step's loss
(Meta-SPN's weighting network, trained on a dev batch's meta loss inside the step) keeps its
own optimiser and is no member of :meth:`LossStep.networks`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..losses import StepInputs
from ..run.pair_scoring import pair_loss
from .context import TrainContext
from .hooks.core import TrainHook
from .parallel.distributed import (
    all_reduce_sum,
    gather_no_grad,
    gather_sum_grad,
    gather_tokens,
    gather_with_grad,
)
from .parallel.grad_cache import GradCache
from .parallel.ring import ring_loss
from .run_log import batch_similarity_stats

#: ``(loss for backward, logged global loss, context for the step log)``
StepLoss = tuple[torch.Tensor, torch.Tensor, dict[str, Any]]


class LossStep:
    """The loss of one local batch on a :class:`~vlret.train.Trainer` (see the module doc)."""

    #: The name :mod:`vlret.train.procedures.registry` registers the procedure under.
    name = "standard"

    def hooks(self, ctx: TrainContext) -> list[TrainHook]:
        """Training hooks the procedure needs (:class:`~vlret.train.hooks.core.TrainHook`; a
        per-epoch pass over the training set), added after the config's hooks; called once
        while the trainer is built, before :meth:`networks` is read and before the optimiser
        exists (the place to build and check the procedure's own networks). The standard step
        needs none."""
        return []

    def networks(self) -> nn.ModuleDict:
        """The procedure's own trainable networks, keyed by name (NCR: ``model_b``): modules
        it owns and has put on ``ctx.device``. The trainer's optimiser steps their trainable
        parameters (``procedure.<name>.<parameter>`` in parameter-group names; a hook's
        :meth:`~vlret.train.hooks.core.TrainHook.param_groups` may regroup them) and clips each
        network's gradients on its own, as it clips the model's. They are not put in training
        mode for the procedure: it sets their mode in its step. Their weights are the
        procedure's to checkpoint (:meth:`state_dict`); their optimiser state is the trainer's.
        Empty for the standard step."""
        return nn.ModuleDict()

    def validate(self, ctx: TrainContext) -> dict[str, float] | None:
        """The dev metrics of the procedure's model, when they are not the trainer's model's
        (NCR evaluates the mean of its two networks' scores); ``None``: the trainer's own
        validation, as for the standard step."""
        return None

    def state_dict(self) -> dict[str, Any]:
        """What the procedure holds besides the trainer's own state (a checkpoint's
        ``procedure``): a second network's weights, a weighting network and its optimiser.
        ``{}`` for the standard step, which holds nothing."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` on a resume; the standard step accepts only ``{}``."""
        if state:
            raise ValueError(
                f"the checkpoint holds the state of another training procedure "
                f"({', '.join(sorted(state))}); this run's procedure is {self.name!r}"
            )

    def adapt_checkpoint(self, state: dict[str, Any]) -> dict[str, Any]:
        """A whole checkpoint (``last.pt``'s dict) written by an earlier layout of this
        procedure, in its current layout, before a resume loads it (NCR: network B's own
        optimiser merged into the trainer's); the standard step's: ``state`` unchanged."""
        return state

    def __call__(self, ctx: TrainContext, batch: Any) -> StepLoss:
        if ctx.scores_pairs:
            return self.pair_loss(ctx, batch)
        return self.embedding_loss(ctx, batch)

    def embedding_loss(self, ctx: TrainContext, batch: Any) -> StepLoss:
        """A two-tower model's loss: under torchrun the loss sees the global batch, or with
        local shards each rank only its own pairs' terms (:mod:`.parallel.distributed`)."""
        cache = ctx.grad_cache if isinstance(ctx.grad_cache, GradCache) else None
        if cache is not None:  # leaves; train_step back-propagates into the model
            img, txt = cache.forward(batch)
        else:
            with ctx.autocast():
                img, txt = ctx.ddp_model(batch)
        wide = torch.promote_types(img.dtype, torch.float32)  # half -> float32, float64 kept
        img, txt = img.to(wide), txt.to(wide)
        keys: list[torch.Tensor] = []  # the momentum encoder's image and text keys
        if ctx.momentum_encoder is not None:
            chunks = cache.chunks(batch) if cache is not None else [batch]
            with ctx.autocast():
                outs = [ctx.momentum_encoder(chunk) for chunk in chunks]
            keys = [torch.cat(k).to(wide) for k in zip(*outs, strict=True)]
        exchange = ctx.exchange
        if exchange != "gather":  # neighbour exchange of the text blocks, no all-gather
            return self.ring_loss(ctx, batch, img, txt, bidir=exchange == "bidir")
        shard = None
        if ctx.local_shards:
            # Each rank computes only its own pairs' terms against the gathered batch; the
            # gather's backward brings back the gradients the other ranks' terms send here.
            start = ctx.rank * img.shape[0]
            shard = (start, start + img.shape[0])
            img, txt = gather_sum_grad(img), gather_sum_grad(txt)
        elif ctx.gather:
            img, txt = gather_with_grad(img), gather_with_grad(txt)
            keys = [gather_no_grad(k) for k in keys]
        ids = gather_no_grad(pair_ids(batch))  # the local ids in a single process
        inputs = StepInputs(
            img_ids=ids,
            txt_ids=ids,
            shard=shard,
            gathered=ctx.gather and not ctx.local_shards,
            img_keys=keys[0] if keys else None,
            txt_keys=keys[1] if keys else None,
            captions=self.captions(ctx, batch),
            epoch=ctx.epoch,
            step=ctx.step,
        )
        try:
            loss = ctx.loss_fn.forward_step(img, txt, inputs)
            logged = all_reduce_sum(loss) if ctx.local_shards else loss.detach()
            out = self.context(ctx, img, txt, ids, cached=cache is not None)
            return self.scaled(ctx, loss, logged), logged, out
        except (ValueError, FloatingPointError) as err:  # "sim contains NaN", a NaN loss
            self.explain_non_finite(ctx, batch, img, txt, err)
            raise

    def ring_loss(
        self, ctx: TrainContext, batch: Any, img: torch.Tensor, txt: torch.Tensor, *, bidir: bool
    ) -> StepLoss:
        """``train.exchange = "ring"`` / ``"bidir"`` (:mod:`.parallel.ring`): this rank's images
        against every rank's texts, passed from neighbour to neighbour; the logged loss is the
        sum over ranks, the step log's batch statistics are this rank's local batch."""
        ids = pair_ids(batch)
        try:
            loss = ring_loss(ctx.loss_fn, img, txt, ids, bidir=bidir)
            logged = all_reduce_sum(loss)
            cached = isinstance(ctx.grad_cache, GradCache)
            out = self.context(ctx, img, txt, ids, cached=cached)
            return self.scaled(ctx, loss, logged), logged, out
        except (ValueError, FloatingPointError) as err:
            self.explain_non_finite(ctx, batch, img, txt, err)
            raise

    def pair_loss(self, ctx: TrainContext, batch: Any) -> StepLoss:
        """A pair scorer's loss: under torchrun each rank scores its images against every
        rank's captions (gathered inside the DDP forward) and the row blocks are gathered into
        the global score matrix (:mod:`.parallel.distributed`, "Pair scorers")."""
        with ctx.autocast():
            sim = ctx.ddp_model(batch, gather_texts=gather_tokens if ctx.gather else None)
        sim, ids = sim.to(torch.promote_types(sim.dtype, torch.float32)), pair_ids(batch)
        if ctx.gather:
            sim, ids = gather_with_grad(sim), gather_no_grad(ids)
        inputs = StepInputs(captions=self.captions(ctx, batch), epoch=ctx.epoch, step=ctx.step)
        try:
            loss = pair_loss(ctx.loss_fn, sim, ids, inputs)
            out = {"sim": sim.detach(), "ids": ids}
            return self.scaled(ctx, loss, loss.detach()), loss.detach(), out
        except (ValueError, FloatingPointError) as err:
            self.explain_non_finite(ctx, batch, None, None, err)
            raise

    @staticmethod
    def explain_non_finite(
        ctx: TrainContext,
        batch: Any,
        img: torch.Tensor | None,
        txt: torch.Tensor | None,
        err: BaseException,
    ) -> None:
        """After a step failed on NaN / inf (``err``): raise :class:`NonFiniteFeatures` naming
        the epoch, step, side and dataset rows of this rank's batch whose input features (or,
        when those are finite, embeddings) are not finite; return when none are (``err``
        stands). The features' own check before training
        (``data.check_features``, on by default) names the file, row and value instead."""
        where = f"epoch {ctx.epoch} step {ctx.step}"
        data = ctx.config.data
        split = f"{data.train_split!r} split in {data.root}" if data is not None else "train split"
        skipped = (
            "; data.check_features = false skipped the check before training that names the "
            "file, row and value (set it to true to run it)"
            if data is not None and not data.check_features
            else ""
        )
        images, captions = batch.img_index.cpu(), batch.cap_index.cpu()
        for side, rows, values in (
            ("image", images, batch.features),
            ("text", captions, batch.captions),
        ):
            bad = _non_finite_rows(values)
            if bad:
                raise NonFiniteFeatures(
                    f"{where}: the {side} features of {_rows(rows, bad, side)} of the {split} "
                    f"are NaN or inf{skipped}"
                ) from err
        n = len(images)
        gathered = ctx.gather and img is not None and img.shape[0] > n  # not the ring's
        start = ctx.rank * n if gathered else 0
        for side, rows, emb in (("image", images, img), ("text", captions, txt)):
            bad = _non_finite_rows(emb[start : start + n]) if emb is not None else []
            if bad:
                raise NonFiniteFeatures(
                    f"{where}: the model's {side} embeddings of {_rows(rows, bad, side)} of the "
                    f"{split} are NaN or inf while their input features are finite: the "
                    "weights diverged (lower optim.lr, set optim.grad_clip, or train.amp = false)"
                ) from err

    @staticmethod
    def captions(ctx: TrainContext, batch: Any) -> list[str] | None:
        """The caption strings of the (global) batch's columns, in rank order, when the loss
        declares ``"captions"`` (VSL Eq. 7); ``None`` otherwise (no lookup, no collective)."""
        if "captions" not in ctx.loss_fn.step_inputs():
            return None
        cap_index = gather_no_grad(batch.cap_index)  # every rank holds the train set
        return [ctx.train_set.captions[i] for i in cap_index.tolist()]

    @staticmethod
    def context(
        ctx: TrainContext, img: torch.Tensor, txt: torch.Tensor, ids: torch.Tensor, *, cached: bool
    ) -> dict[str, Any]:
        """The step's context for the step log and the hooks: the detached embeddings, or with
        gradient caching (``cached``; keeping them would hold ``B x D`` through the chunks'
        re-encoding) their batch statistics, taken now and only on a logging step."""
        if not cached:
            return {"img": img.detach(), "txt": txt.detach(), "ids": ids}
        out: dict[str, Any] = {"ids": ids}
        every = ctx.config.train.log_every
        if every and (ctx.step + 1) % every == 0:  # train_step counts the step after
            out["batch_stats"] = batch_similarity_stats(img, txt, ids)
        return out

    @staticmethod
    def scaled(ctx: TrainContext, loss: torch.Tensor, logged: torch.Tensor) -> torch.Tensor:
        """The loss for backward (times the world size, see :mod:`.parallel.distributed`), after
        a check that the logged global loss is finite."""
        if not torch.isfinite(logged):
            raise FloatingPointError(
                f"non-finite loss {float(logged)} at epoch {ctx.epoch} step {ctx.step}"
            )
        return loss * ctx.world_size if ctx.gather else loss


def pair_ids(batch: Any) -> torch.Tensor:
    """The ids a loss gets for a batch's pairs: equal ids are positives. Person-search data
    sets ``RetrievalBatch.identity`` (the training identity, ``0..N-1``): every pair of the
    same person is a positive, and an identity classifier's labels are these ids. Elsewhere the
    image index (two captions of one image are positives)."""
    identity = getattr(batch, "identity", None)
    return batch.img_index if identity is None else identity


class NonFiniteFeatures(ValueError):
    """A training step met NaN / inf in a batch's features or embeddings (rows named)."""


def _non_finite_rows(values: Any) -> list[int]:
    """Positions (in the batch) of the items whose float values hold a NaN or inf: a tensor's
    rows, or an expert batch's (every expert's features); none for ids and texts."""
    tensors = values.features.values() if hasattr(values, "features") else [values]
    bad: set[int] = set()
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dim() > 0 and t.numel():
            rows = ~torch.isfinite(t.detach()).reshape(t.shape[0], -1).all(dim=1)
            bad.update(rows.nonzero().flatten().tolist())
    return sorted(bad)


def _rows(ids: torch.Tensor, positions: list[int], side: str) -> str:
    """``image rows 5, 9`` (the dataset's indices of the batch positions, at most 10)."""
    rows = sorted({int(ids[p]) for p in positions})
    shown = ", ".join(str(r) for r in rows[:10])
    more = f" and {len(rows) - 10} more" if len(rows) > 10 else ""
    kind = "image" if side == "image" else "caption"
    return f"{kind} row{'s' if len(rows) > 1 else ''} {shown}{more}"


__all__ = ["LossStep", "NonFiniteFeatures", "StepLoss", "pair_ids"]
