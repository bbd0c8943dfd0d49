"""NCR as a training procedure: two co-trained networks, a per-epoch division of the training
pairs, label refinement and soft margins (Huang et al., NeurIPS 2021; ``docs/ncr.md``).

The trainer's model is network A; :class:`NCRStep` builds network B from the same config
(its initial weights drawn from ``model_b_seed`` on a forked generator, so A's run is the run
the same config trains without NCR up to the loss) and owns it as a submodule
(:meth:`NCRStep.networks`). It steps no optimiser: the trainer's one optimiser holds B's
parameters (``procedure.model_b.<name>``) in groups that mirror A's (the same learning-rate
factors and weight decays, :meth:`NCRStep.param_groups`), and each step returns the sum of both
networks' losses for the trainer's single backward pass. So the schedule, the AMP scaler, the
weight-decay rules and gradient clipping (B by its own norm, as released) reach B through the
trainer, as they reach A. Per epoch:

* epochs ``< warmup_epochs``: both networks train on every pair of the batch with the loss's
  all-negatives form (:meth:`~vlret.losses.PairLoss.set_all_negatives`: triplet sums the hinge
  over all negatives; the release averages it over the batch, a constant factor; a loss
  without that form, Unified, trains as configured);
* later epochs start with a loss pass (:meth:`NCRStep.before_epoch`): each network's
  :func:`~.division.per_pair_loss` over the whole training set in blocks of
  ``pass_batch_size`` consecutive pairs (no gradient, eval mode; a pair-scoring model scores
  each distinct image of a block once, :mod:`.blocks`), the clean probabilities of
  :func:`~.division.clean_probability` and the split of :func:`~.division.split_clean`.
  A resume inside the epoch finds the division in the checkpoint and does not redo it; a
  resume at the epoch's start redoes it identically (the mixture is seeded from
  ``train.seed`` and the epoch);
* each step: both networks' predictions on the batch (eval mode, no gradient), the refined
  labels (co-divide: A's clean pairs and their probabilities are B's division, and B's are
  A's), per-pair soft margins ``m s(y)``, and each network's loss with those margins on its
  clean pairs, joined by its noisy pairs from ``noisy_from`` on. The release draws the noisy
  pairs from a second loader into separate batches; here they share the batch's score matrix
  (before ``noisy_from`` they are left out of it, so only clean pairs are negatives then).

A checkpoint's ``procedure`` holds B's weights (``ensemble_models``: the networks whose score
matrices evaluation averages with the model's, :mod:`vlret.run.evaluate`) and the division;
B's optimiser moments are in the checkpoint's ``optimizer`` with A's. A checkpoint written
before B joined the trainer's optimiser (its ``procedure`` holds ``optimizer_b`` and
``scheduler_b``) is brought to this layout when it is resumed (:meth:`NCRStep.adapt_checkpoint`).
One process only (B is not wrapped for torchrun).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

from ...._progress import progress_bar
from ....eval import EnsembleScorer, PairModelScorer, TwoTowerScorer
from ....losses import available_losses, loss_capabilities
from ....run.builders import build_run_model
from ....run.checkpoint_members import ENSEMBLE_KEY
from ....run.config import RunConfig
from ....run.pair_scoring import dev_metrics_from_scores, pair_loss
from ...context import TrainContext
from ...hooks.core import PROCEDURE_PREFIX, TrainHook
from ...loss_step import LossStep, StepLoss, pair_ids
from ...optim_groups import ParamGroup
from ...run_log import LOG_FILE, append_record
from ...schedule import prepare_model
from .blocks import block_scores, distinct_images
from .division import (
    clean_probability,
    noisy_split_quality,
    per_pair_loss,
    predictions,
    refined_labels,
    soft_margin_factor,
    soft_margin_triplet,
    split_clean,
)
from .options import NCROptions

#: The ``kind`` of the per-epoch records this procedure writes to ``metrics.jsonl``.
RECORD_KIND = "ncr"
#: The ``procedure`` keys of a checkpoint written while B had its own optimiser, schedule and
#: scaler (:meth:`NCRStep.adapt_checkpoint` moves the first two into the trainer's).
OLDER_KEYS = ("optimizer_b", "scheduler_b", "scaler_b")


class NCRStep(LossStep, TrainHook):
    """``train.procedure = "ncr"`` (see the module doc); ``passes`` counts the loss passes this
    object ran (a resume inside an epoch runs none)."""

    name = "ncr"

    def __init__(self, config: RunConfig, options: NCROptions) -> None:
        self.config = config
        self.options = options
        self.noisy_from = options.noisy_start(config.train.epochs)
        #: The networks this procedure owns and trains besides the trainer's model: ``model_b``
        #: once :meth:`hooks` built it.
        self.nets = nn.ModuleDict()
        #: ``epoch``, ``prob_a`` / ``prob_b`` (float64) and ``clean_a`` / ``clean_b`` (bool),
        #: one entry per training pair; ``None`` before the first pass.
        self.division: dict[str, Any] | None = None
        #: The division's sizes and quality (``ncr_*`` keys of the epoch's record).
        self.report: dict[str, Any] = {}
        self.passes = 0
        self.margin = 0.2

    @property
    def model_b(self) -> nn.Module:
        """Network B (built by :meth:`hooks`)."""
        if "model_b" not in self.nets:
            raise RuntimeError("NCRStep.hooks(ctx) was not called: network B is not built")
        return self.nets["model_b"]

    # -- building ----------------------------------------------------------------------------

    def hooks(self, ctx: TrainContext) -> list[TrainHook]:
        """Check the run, build network B on the run's device and return this object as the
        run's hook."""
        self._check(ctx)
        tc = self.config.train
        seed = tc.seed + 1 if self.options.model_b_seed is None else self.options.model_b_seed
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model_b = build_run_model(self.config, ctx.vocab_size)
        self.nets["model_b"] = model_b.to(ctx.device)
        prepare_model(self.model_b, tc, source=self.config.source)
        self.margin = float(getattr(ctx.loss_fn.config, "margin", 0.2))
        return [self]

    def networks(self) -> nn.ModuleDict:
        """``model_b``: network B, trained by the trainer's optimiser."""
        return self.nets

    def _check(self, ctx: TrainContext) -> None:
        why = "train.procedure = 'ncr'"
        if ctx.world_size > 1:
            raise ValueError(
                f"{why} runs in one process (docs/ncr.md, 'Several processes'): its division "
                "fits the two mixtures to every training pair's loss and each step trains on "
                "the batch's clean pairs, both of which assume one process holds the whole "
                f"batch; got a world size of {ctx.world_size}"
            )
        if ctx.momentum_encoder is not None or ctx.grad_cache is not None:
            raise ValueError(f"{why} takes no train.momentum_encoder or train.grad_cache_chunk")
        if not hasattr(ctx.train_set, "txt_to_img") or not hasattr(ctx.train_set, "collate"):
            raise ValueError(
                f"{why} needs an indexed training split (precomp, karpathy), not a stream"
            )
        loss = ctx.loss_fn
        if any(True for _ in loss.parameters()) or any(True for _ in loss.buffers()):
            raise ValueError(
                f"{why}: loss {self.config.loss.name!r} holds parameters or buffers, but both "
                "networks train with the one loss module; use triplet or unified"
            )
        if not loss_capabilities(loss).soft_margins:
            takers = [n for n in available_losses() if loss_capabilities(n).soft_margins]
            raise ValueError(
                f"{why} feeds per-pair soft margins to the loss: loss.name must be "
                f"{' or '.join(takers)} (LossCapabilities.soft_margins); "
                f"{self.config.loss.name!r} takes none"
            )

    def param_groups(self, ctx: TrainContext, groups: list[ParamGroup]) -> list[ParamGroup]:
        """A's groups as they came (B's parameters taken out of them), then B's parameters in
        groups that mirror A's: the parameters of the same names, at the same learning-rate
        factors and weight decays (the loss's own parameters excepted)."""
        prefix = f"{PROCEDURE_PREFIX}.model_b."
        out = []
        for g in groups:
            pairs = zip(g.names, g.params, strict=True)
            kept = [(n, p) for n, p in pairs if not n.startswith(prefix)]
            if kept:
                names, params = tuple(n for n, _ in kept), tuple(p for _, p in kept)
                out.append(ParamGroup(names, params, g.lr_scale, g.weight_decay))
        named = dict(self.model_b.named_parameters())
        for g in list(out):
            mirror = [(n, named[n]) for n in g.names if n in named and named[n].requires_grad]
            if mirror:
                names = tuple(prefix + n for n, _ in mirror)
                params = tuple(p for _, p in mirror)
                out.append(ParamGroup(names, params, g.lr_scale, g.weight_decay))
        return out

    # -- checkpoint --------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            ENSEMBLE_KEY: [self.model_b.state_dict()],
            "division": None if self.division is None else dict(self.division),
            "report": dict(self.report),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if ENSEMBLE_KEY not in state:
            raise ValueError(
                f"the checkpoint holds no NCR state ({ENSEMBLE_KEY} missing); it was not "
                "trained with train.procedure = 'ncr'"
            )
        older = [k for k in OLDER_KEYS if k in state]
        if older:  # adapt_checkpoint takes them out first
            raise ValueError(
                f"the checkpoint's NCR state holds {', '.join(older)} of the layout before "
                "network B joined the trainer's optimiser; load it through the trainer"
            )
        self.model_b.load_state_dict(state[ENSEMBLE_KEY][0])
        self.division = None if state.get("division") is None else dict(state["division"])
        self.report = dict(state.get("report") or {})

    def adapt_checkpoint(self, state: dict[str, Any]) -> dict[str, Any]:
        """A checkpoint whose ``procedure`` holds B's own optimiser, schedule and scaler (the
        layout before B joined the trainer's optimiser) in this layout: B's optimiser groups
        and moments appended to the checkpoint's ``optimizer`` (whose groups then are A's and
        B's mirrors, as :meth:`param_groups` builds them), B's base learning rates to the
        schedule's, and B's AMP scaler dropped (the trainer's one scaler serves both)."""
        proc = state.get("procedure") or {}
        if "optimizer_b" not in proc:
            return state
        opt_a, opt_b = state["optimizer"], proc["optimizer_b"]
        offset = sum(len(g["params"]) for g in opt_a["param_groups"])
        groups = [dict(g) for g in opt_a["param_groups"]]
        for g in opt_b["param_groups"]:
            groups.append({**g, "params": [i + offset for i in g["params"]]})
        moments = dict(opt_a["state"])
        moments.update({int(k) + offset: v for k, v in opt_b["state"].items()})
        schedule = dict(state["scheduler"])
        schedule["base_lrs"] = [*schedule["base_lrs"], *proc["scheduler_b"]["base_lrs"]]
        rest = {k: v for k, v in proc.items() if k not in OLDER_KEYS}
        return {
            **state,
            "optimizer": {"state": moments, "param_groups": groups},
            "scheduler": schedule,
            "procedure": rest,
        }

    # -- the per-epoch division --------------------------------------------------------------

    def before_epoch(self, ctx: TrainContext) -> None:
        """The warm-up's all-negatives switch, then (after the warm-up) the loss pass and the
        division, unless the checkpoint already holds this epoch's."""
        warm = ctx.epoch < self.options.warmup_epochs
        if loss_capabilities(ctx.loss_fn).all_negatives_warmup:
            ctx.loss_fn.set_all_negatives(warm)
        if warm or (self.division is not None and self.division["epoch"] == ctx.epoch):
            return
        losses_a, losses_b = self.loss_pass(ctx)
        o, base = self.options, int(self.config.train.seed) * 7919 + 2 * ctx.epoch
        probs = [
            clean_probability(
                losses,
                max_iter=o.gmm_max_iter,
                tol=o.gmm_tol,
                reg_covar=o.gmm_reg_covar,
                random_state=(base + k) % 2**32,
            )
            for k, losses in enumerate((losses_a, losses_b))
        ]
        clean = [split_clean(p, o.p_threshold) for p in probs]
        self.division = {
            "epoch": ctx.epoch,
            "prob_a": torch.from_numpy(probs[0]),
            "prob_b": torch.from_numpy(probs[1]),
            "clean_a": torch.from_numpy(clean[0]),
            "clean_b": torch.from_numpy(clean[1]),
        }
        corrupted = getattr(ctx.train_set, "corrupted", None)
        truth = None if corrupted is None else torch.as_tensor(corrupted).numpy()
        report: dict[str, Any] = {}
        for suffix, c in (("", clean[0]), ("_b", clean[1])):
            for key, value in noisy_split_quality(c, truth).items():
                report[f"ncr_{key}{suffix}"] = value
        self.report = report
        self.passes += 1
        ctx.print(division_line(ctx.epoch, report))

    def loss_pass(self, ctx: TrainContext) -> tuple[np.ndarray, np.ndarray]:
        """Each network's :func:`~.division.per_pair_loss` of every training pair, ``(N,)``
        float64 each: blocks of ``pass_batch_size`` consecutive pairs, eval mode, no
        gradient, a progress bar when ``train.progress``. A block's pairs that share an image
        share its score row, computed once (:func:`~.blocks.block_scores`)."""
        ds = ctx.train_set
        size = self.options.pass_batch_size or self.config.train.batch_size
        loader = DataLoader(
            ds,
            batch_size=size,
            shuffle=False,
            collate_fn=ds.collate,
            num_workers=self.config.data.num_workers,
            generator=torch.Generator().manual_seed(0),  # the run's own stream is not drawn
        )
        show = self.config.train.progress and ctx.is_main
        desc = f"epoch {ctx.epoch}: NCR loss pass"
        bar = progress_bar(loader, show=show, desc=desc, unit="block", leave=False)
        out = [np.zeros(len(ds), dtype=np.float64) for _ in range(2)]
        nets = (ctx.model, self.model_b)
        with _eval_mode(*nets), torch.no_grad():
            for batch in bar:
                batch = batch.to(ctx.device)
                ids = pair_ids(batch)
                pos = ids[:, None] == ids[None, :]
                rows = batch.cap_index.cpu().numpy()
                distinct = distinct_images(batch) if ctx.scores_pairs else None
                for k, net in enumerate(nets):
                    sim = self._pass_scores(ctx, net, batch, distinct)
                    loss = per_pair_loss(sim, margin=self.margin, pos_mask=pos)
                    out[k][rows] = loss.double().cpu().numpy()
        return out[0], out[1]

    def after_epoch(self, ctx: TrainContext, record: Mapping[str, Any]) -> None:
        """One ``kind: ncr`` record in ``metrics.jsonl`` after the epoch's own (as the zero-shot
        check's): the epoch's division sizes and, on noisy data, its quality."""
        if not self.report or not ctx.is_main:
            return
        if self.division is None or self.division["epoch"] != record.get("epoch"):
            return
        line = {"kind": RECORD_KIND, "epoch": record.get("epoch"), "step": ctx.step}
        append_record(ctx.output_dir / LOG_FILE, {**line, **self.report})

    # -- one step ----------------------------------------------------------------------------

    def __call__(self, ctx: TrainContext, batch: Any) -> StepLoss:
        """Both networks' losses on ``batch``: B's first (its forward in train mode), then
        A's; the loss for backward is their sum (the graphs are disjoint: each network's
        gradient is its own loss's), the logged loss A's."""
        if ctx.epoch < self.options.warmup_epochs or self.division is None:
            return self._warmup(ctx, batch)
        return self._co_divided(ctx, batch)

    def _warmup(self, ctx: TrainContext, batch: Any) -> StepLoss:
        ids = pair_ids(batch)
        loss_b = self._loss_b(
            ctx, lambda: pair_loss(ctx.loss_fn, self._scores_grad(ctx, self.model_b, batch), ids)
        )
        sim = self._scores_grad(ctx, ctx.model, batch)
        loss = pair_loss(ctx.loss_fn, sim, ids)
        return self._out(ctx, loss, loss_b, sim, ids)

    def _co_divided(self, ctx: TrainContext, batch: Any) -> StepLoss:
        d = self.division
        assert d is not None
        rows = batch.cap_index.cpu()
        ids = pair_ids(batch)
        pos = ids[:, None] == ids[None, :]
        with _eval_mode(ctx.model, self.model_b), torch.no_grad():
            p_a = predictions(self._scores(ctx, ctx.model, batch), margin=self.margin, pos_mask=pos)
            p_b = predictions(
                self._scores(ctx, self.model_b, batch), margin=self.margin, pos_mask=pos
            )
        noisy_on = ctx.epoch >= self.noisy_from
        # co-divide: each network trains with the other's division
        plan_b = self._plan(d["clean_a"][rows], d["prob_a"][rows], p_b, (p_a + p_b) / 2, noisy_on)
        plan_a = self._plan(d["clean_b"][rows], d["prob_b"][rows], p_a, (p_a + p_b) / 2, noisy_on)
        loss_b = self._loss_b(ctx, lambda: self._soft_loss(ctx, self.model_b, batch, *plan_b))
        loss, sim, sub_ids = self._soft_loss(ctx, ctx.model, batch, *plan_a, keep=True)
        return self._out(ctx, loss, loss_b, sim, sub_ids)

    def _plan(
        self,
        clean: torch.Tensor,
        prob: torch.Tensor,
        own: torch.Tensor,
        mean: torch.Tensor,
        noisy_on: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(positions in the batch, their soft margins)``: the clean pairs with the refined
        labels, and from ``noisy_from`` on the noisy pairs with the networks' mean prediction."""
        clean = clean.to(own.device)
        labels = torch.where(clean, refined_labels(prob.to(own.device), own), mean)
        keep = torch.ones_like(clean) if noisy_on else clean
        where = keep.nonzero().flatten()
        margins = self.margin * soft_margin_factor(labels[where], self.options.soft_margin)
        return where, margins

    def _soft_loss(
        self,
        ctx: TrainContext,
        net: nn.Module,
        batch: Any,
        where: torch.Tensor,
        margins: torch.Tensor,
        *,
        keep: bool = False,
    ) -> Any:
        """The loss with per-pair ``margins`` on the batch's pairs ``where`` (fewer than two:
        a graph-attached zero, no forward pass: a single pair has no negative and BatchNorm
        cannot train on it)."""
        ids = pair_ids(batch)
        if len(where) < 2:
            zero = sum(p.sum() * 0 for p in net.parameters() if p.requires_grad)
            zero = torch.as_tensor(zero, device=ids.device, dtype=torch.float32)
            return (zero, None, ids[:0]) if keep else zero
        sub = _select(batch, where) if len(where) < len(ids) else batch
        sim = self._scores_grad(ctx, net, sub)
        sub_ids = pair_ids(sub)
        pos = sub_ids[:, None] == sub_ids[None, :]
        loss_fn = ctx.loss_fn
        if _takes_margins(loss_fn):
            loss = loss_fn.from_similarity(sim, pos, margins=margins)
        else:  # triplet: the per-anchor form with the module's own settings
            hardest = bool(getattr(loss_fn, "hardest", True))
            loss = soft_margin_triplet(
                sim, margins, pos_mask=pos, hardest=hardest, reduction=loss_fn.reduction
            )
        return (loss, sim, sub_ids) if keep else loss

    def _loss_b(self, ctx: TrainContext, loss_of_b: Callable[[], torch.Tensor]) -> torch.Tensor:
        """B's loss ``loss_of_b()`` with B in train mode (the trainer steps B with A)."""
        self.model_b.train()
        loss = loss_of_b()
        if not torch.isfinite(loss.detach()):
            raise FloatingPointError(
                f"network B: non-finite loss {float(loss)} at epoch {ctx.epoch} step {ctx.step}"
            )
        return loss

    def _out(
        self,
        ctx: TrainContext,
        loss: torch.Tensor,
        loss_b: torch.Tensor,
        sim: torch.Tensor | None,
        ids: torch.Tensor,
    ) -> StepLoss:
        out: dict[str, Any] = {"ids": ids}
        if sim is not None:
            out["sim"] = sim.detach()
        else:  # A trained on fewer than two pairs: no score matrix, no batch statistics
            out["batch_stats"] = {"pos_sim": None, "hardest_neg_sim": None}
        # B's loss was checked by _loss_b; one process (no world-size factor for B to take)
        return self.scaled(ctx, loss, loss.detach()) + loss_b, loss.detach(), out

    def _scores(self, ctx: TrainContext, net: nn.Module, batch: Any) -> torch.Tensor:
        """``net``'s ``(B, B)`` score matrix of the batch (a two-tower model's through the
        loss's similarity: cosines when the loss normalises), at least float32."""
        with ctx.autocast():
            if ctx.scores_pairs:
                sim = net(batch)
            else:
                img, txt = net(batch)
                sim = ctx.loss_fn.similarity_and_mask(img, txt)[0]
        return sim.to(torch.promote_types(sim.dtype, torch.float32))

    _scores_grad = _scores  # the same forward, named for where gradients flow

    def _pass_scores(
        self,
        ctx: TrainContext,
        net: nn.Module,
        batch: Any,
        distinct: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> torch.Tensor:
        """The loss pass's ``(B, B)`` block matrix: :meth:`_scores`' values, each distinct
        image of the block scored once (:func:`~.blocks.block_scores`) where that applies."""
        sim = block_scores(net, batch, distinct=distinct, autocast=ctx.autocast)
        if sim is None:
            return self._scores(ctx, net, batch)
        return sim.to(torch.promote_types(sim.dtype, torch.float32))

    # -- evaluation --------------------------------------------------------------------------

    def validate(self, ctx: TrainContext) -> dict[str, float]:
        """Dev metrics of the two-network ensemble: the mean of A's and B's score matrices
        (:class:`~vlret.eval.EnsembleScorer`; cosines for two-tower models), ranked as a pair
        scorer's dev metrics are (:func:`~vlret.run.pair_scoring.dev_metrics_from_scores`)."""
        size, device = self.config.train.eval_batch_size, ctx.device
        scorers: list[Any] = []
        for net in (ctx.model, self.model_b):
            if ctx.scores_pairs:
                scorers.append(PairModelScorer(net, batch_size=size, device=device))
            else:
                scoring = getattr(net, "scoring", "cosine")
                scorers.append(TwoTowerScorer(net, scoring=scoring, batch_size=size, device=device))
        with _eval_mode(ctx.model, self.model_b):
            sim = EnsembleScorer(scorers).scores(ctx.dev_set)
        return dev_metrics_from_scores(sim, torch.as_tensor(ctx.dev_set.txt_to_img))


def division_line(epoch: int, report: Mapping[str, Any]) -> str:
    """The console line of an epoch's division: ``epoch 3: NCR division: 81.2% / 80.7% clean
    (A / B), noisy precision 0.91 recall 0.88 (A)``."""

    def pct(v: Any) -> str:
        return "-" if v is None else f"{100 * v:.1f}%"

    line = (
        f"epoch {epoch}: NCR division: {pct(report.get('ncr_clean_fraction'))} / "
        f"{pct(report.get('ncr_clean_fraction_b'))} clean (A / B)"
    )
    if "ncr_noisy_precision" in report:
        fmt = {k: "-" if report[k] is None else f"{report[k]:.3f}" for k in report}
        line += (
            f", noisy precision {fmt['ncr_noisy_precision']} recall {fmt['ncr_noisy_recall']} (A)"
        )
    return line


def _takes_margins(loss: Any) -> bool:
    dense = getattr(type(loss), "dense", None)
    return dense is not None and "margins" in inspect.signature(dense).parameters


@contextmanager
def _eval_mode(*nets: nn.Module) -> Iterator[None]:
    """Every module of ``nets`` in eval mode inside; each module's own mode restored after
    (so a module a hook keeps in eval mode stays there)."""
    modes = [(m, m.training) for net in nets for m in net.modules()]
    for net in nets:
        net.eval()
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training


def _select(batch: Any, where: torch.Tensor) -> Any:
    """The batch's items at positions ``where`` (tensors indexed, lists picked)."""
    idx = where.to(batch.img_index.device)
    picks = idx.cpu().tolist()

    def part(value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, torch.Tensor):
            return value[idx.to(value.device)]
        if isinstance(value, list):
            return [value[i] for i in picks]
        raise ValueError(
            f"train.procedure = 'ncr': cannot select pairs of a {type(value).__name__} batch"
        )

    return type(batch)(*(part(getattr(batch, f)) for f in batch.__dataclass_fields__))


__all__ = ["ENSEMBLE_KEY", "NCRStep", "RECORD_KIND", "division_line"]
