"""NCR as a training procedure: two co-trained networks, a per-epoch division of the training
pairs, label refinement and soft margins (Huang et al., NeurIPS 2021; ``docs/ncr.md``).

The trainer's model is network A; :class:`NCRStep` builds network B from the same config
(its initial weights drawn from ``model_b_seed`` on a forked generator, so A's run is the run
the same config trains without NCR up to the loss), gives it an optimiser, schedule and AMP
scaler built by the trainer's own builders from A's parameter groups, and steps it inside each
training step. Per epoch:

* epochs ``< warmup_epochs``: both networks train on every pair of the batch with the loss's
  all-negatives form (:meth:`~vlret.losses.PairLoss.set_all_negatives`: triplet sums the hinge
  over all negatives; the release averages it over the batch, a constant factor; a loss
  without that form, Unified, trains as configured);
* later epochs start with a loss pass (:meth:`NCRStep.before_epoch`): each network's
  :func:`~.division.per_pair_loss` over the whole training set in blocks of
  ``pass_batch_size`` consecutive pairs (no gradient, eval mode), the clean probabilities of
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

A checkpoint's ``procedure`` holds B (``ensemble_models``: the networks whose score matrices
evaluation averages with the model's, :mod:`vlret.run.evaluate`), its optimiser, schedule
and scaler, and the division. One process only (B is not wrapped for torchrun).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

from ...._progress import progress_bar
from ....eval import EnsembleScorer, PairModelScorer, TwoTowerScorer
from ....losses import loss_capabilities
from ....run.builders import build_run_model
from ....run.checkpoint_members import ENSEMBLE_KEY
from ....run.config import RunConfig
from ....run.pair_scoring import dev_metrics_from_scores, pair_loss
from ...hooks.core import TrainHook
from ...loss_step import LossStep, StepLoss, pair_ids
from ...optim_groups import ParamGroup, build_optimizer, set_group_weight_decay
from ...run_log import LOG_FILE, append_record
from ...schedule import build_schedule, prepare_model
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


class NCRStep(LossStep, TrainHook):
    """``train.procedure = "ncr"`` (see the module doc); ``passes`` counts the loss passes this
    object ran (a resume inside an epoch runs none)."""

    name = "ncr"

    def __init__(self, config: RunConfig, options: NCROptions) -> None:
        self.config = config
        self.options = options
        self.noisy_from = options.noisy_start(config.train.epochs)
        self.model_b: nn.Module | None = None
        self.optimizer_b: torch.optim.Optimizer | None = None
        self.scheduler_b: Any = None
        self.scaler_b: torch.amp.GradScaler | None = None
        #: ``epoch``, ``prob_a`` / ``prob_b`` (float64) and ``clean_a`` / ``clean_b`` (bool),
        #: one entry per training pair; ``None`` before the first pass.
        self.division: dict[str, Any] | None = None
        #: The division's sizes and quality (``ncr_*`` keys of the epoch's record).
        self.report: dict[str, Any] = {}
        self.passes = 0
        self.margin = 0.2

    # -- building ----------------------------------------------------------------------------

    def hooks(self, trainer: Any) -> list[Any]:
        """Check the run, build network B and return this object as the run's hook."""
        self._check(trainer)
        tc = self.config.train
        seed = tc.seed + 1 if self.options.model_b_seed is None else self.options.model_b_seed
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model_b = build_run_model(self.config, trainer.vocab_size)
        self.model_b = model_b.to(trainer.device)
        prepare_model(self.model_b, tc, source=self.config.source)
        self.scaler_b = torch.amp.GradScaler("cuda", enabled=trainer.amp_dtype == torch.float16)
        self.margin = float(getattr(trainer.loss_fn.config, "margin", 0.2))
        return [self]

    def _check(self, trainer: Any) -> None:
        why = "train.procedure = 'ncr'"
        if trainer.world > 1:
            raise ValueError(f"{why} runs in one process; network B is not wrapped for torchrun")
        if trainer.momentum_encoder is not None or trainer.grad_cache:
            raise ValueError(f"{why} takes no train.momentum_encoder or train.grad_cache_chunk")
        if not hasattr(trainer.train_set, "txt_to_img") or not hasattr(
            trainer.train_set, "collate"
        ):
            raise ValueError(
                f"{why} needs an indexed training split (precomp, karpathy), not a stream"
            )
        loss = trainer.loss_fn
        if any(True for _ in loss.parameters()) or any(True for _ in loss.buffers()):
            raise ValueError(
                f"{why}: loss {self.config.loss.name!r} holds parameters or buffers, but both "
                "networks train with the one loss module; use triplet or unified"
            )
        if not loss_capabilities(loss).soft_margins:
            raise ValueError(
                f"{why} feeds per-pair soft margins to the loss: loss {self.config.loss.name!r} "
                "takes none (LossCapabilities.soft_margins: triplet, unified)"
            )

    def param_groups(self, trainer: Any, groups: list[ParamGroup]) -> list[ParamGroup]:
        """B's optimiser over B's parameters of the same names, groups, learning-rate factors
        and weight decays as A's (the loss's own parameters excepted); A's groups unchanged."""
        assert self.model_b is not None  # hooks() built it
        named = dict(self.model_b.named_parameters())
        groups_b = []
        for g in groups:
            kept = [(n, named[n]) for n in g.names if n in named]
            if kept:
                names, params = tuple(n for n, _ in kept), tuple(p for _, p in kept)
                groups_b.append(ParamGroup(names, params, g.lr_scale, g.weight_decay))
        plain = len(groups_b) == 1 and groups_b[0].lr_scale == 1.0
        built: list[Any] = (
            list(groups_b[0].params) if plain and groups_b[0].weight_decay is None else groups_b
        )
        self.optimizer_b = set_group_weight_decay(build_optimizer(self.config.optim, built), built)
        epochs = self.config.train.epochs
        self.scheduler_b = build_schedule(
            self.optimizer_b,
            self.config.optim,
            total_steps=lambda: epochs * trainer.sampler.num_batches(),
        )
        return groups

    # -- checkpoint --------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        assert self.model_b is not None and self.optimizer_b is not None
        assert self.scaler_b is not None
        return {
            ENSEMBLE_KEY: [self.model_b.state_dict()],
            "optimizer_b": self.optimizer_b.state_dict(),
            "scheduler_b": self.scheduler_b.state_dict(),
            "scaler_b": self.scaler_b.state_dict(),
            "division": None if self.division is None else dict(self.division),
            "report": dict(self.report),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        missing = [k for k in (ENSEMBLE_KEY, "optimizer_b", "scheduler_b") if k not in state]
        if missing:
            raise ValueError(
                f"the checkpoint holds no NCR state ({', '.join(missing)} missing); it was not "
                "trained with train.procedure = 'ncr'"
            )
        assert self.model_b is not None and self.optimizer_b is not None
        assert self.scaler_b is not None
        self.model_b.load_state_dict(state[ENSEMBLE_KEY][0])
        self.optimizer_b.load_state_dict(state["optimizer_b"])
        self.scheduler_b.load_state_dict(state["scheduler_b"])
        if state.get("scaler_b"):
            self.scaler_b.load_state_dict(state["scaler_b"])
        self.division = None if state.get("division") is None else dict(state["division"])
        self.report = dict(state.get("report") or {})

    # -- the per-epoch division --------------------------------------------------------------

    def before_epoch(self, trainer: Any) -> None:
        """The warm-up's all-negatives switch, then (after the warm-up) the loss pass and the
        division, unless the checkpoint already holds this epoch's."""
        warm = trainer.epoch < self.options.warmup_epochs
        if loss_capabilities(trainer.loss_fn).all_negatives_warmup:
            trainer.loss_fn.set_all_negatives(warm)
        if warm or (self.division is not None and self.division["epoch"] == trainer.epoch):
            return
        losses_a, losses_b = self.loss_pass(trainer)
        o, base = self.options, int(self.config.train.seed) * 7919 + 2 * trainer.epoch
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
            "epoch": trainer.epoch,
            "prob_a": torch.from_numpy(probs[0]),
            "prob_b": torch.from_numpy(probs[1]),
            "clean_a": torch.from_numpy(clean[0]),
            "clean_b": torch.from_numpy(clean[1]),
        }
        corrupted = getattr(trainer.train_set, "corrupted", None)
        truth = None if corrupted is None else torch.as_tensor(corrupted).numpy()
        report: dict[str, Any] = {}
        for suffix, c in (("", clean[0]), ("_b", clean[1])):
            for key, value in noisy_split_quality(c, truth).items():
                report[f"ncr_{key}{suffix}"] = value
        self.report = report
        self.passes += 1
        show = getattr(trainer, "print_fn", None)
        if show is not None:
            show(division_line(trainer.epoch, report))

    def loss_pass(self, trainer: Any) -> tuple[np.ndarray, np.ndarray]:
        """Each network's :func:`~.division.per_pair_loss` of every training pair, ``(N,)``
        float64 each: blocks of ``pass_batch_size`` consecutive pairs, eval mode, no
        gradient, a progress bar when ``train.progress``."""
        assert self.model_b is not None
        ds = trainer.train_set
        size = self.options.pass_batch_size or self.config.train.batch_size
        loader = DataLoader(
            ds,
            batch_size=size,
            shuffle=False,
            collate_fn=ds.collate,
            num_workers=self.config.data.num_workers,
            generator=torch.Generator().manual_seed(0),  # the run's own stream is not drawn
        )
        show = self.config.train.progress and trainer.is_main
        desc = f"epoch {trainer.epoch}: NCR loss pass"
        bar = progress_bar(loader, show=show, desc=desc, unit="block", leave=False)
        out = [np.zeros(len(ds), dtype=np.float64) for _ in range(2)]
        nets = (trainer.model, self.model_b)
        with _eval_mode(*nets), torch.no_grad():
            for batch in bar:
                batch = batch.to(trainer.device)
                ids = pair_ids(batch)
                pos = ids[:, None] == ids[None, :]
                rows = batch.cap_index.cpu().numpy()
                for k, net in enumerate(nets):
                    sim = self._scores(trainer, net, batch)
                    loss = per_pair_loss(sim, margin=self.margin, pos_mask=pos)
                    out[k][rows] = loss.double().cpu().numpy()
        return out[0], out[1]

    def after_epoch(self, trainer: Any, record: Mapping[str, Any]) -> None:
        """One ``kind: ncr`` record in ``metrics.jsonl`` after the epoch's own (as the zero-shot
        check's): the epoch's division sizes and, on noisy data, its quality."""
        if not self.report or not trainer.is_main:
            return
        if self.division is None or self.division["epoch"] != record.get("epoch"):
            return
        line = {"kind": RECORD_KIND, "epoch": record.get("epoch"), "step": trainer.step}
        append_record(trainer.output_dir / LOG_FILE, {**line, **self.report})

    # -- one step ----------------------------------------------------------------------------

    def __call__(self, trainer: Any, batch: Any) -> StepLoss:
        if trainer.epoch < self.options.warmup_epochs or self.division is None:
            return self._warmup(trainer, batch)
        return self._co_divided(trainer, batch)

    def _warmup(self, trainer: Any, batch: Any) -> StepLoss:
        assert self.model_b is not None
        ids = pair_ids(batch)
        self._train_b(
            trainer,
            lambda: pair_loss(
                trainer.loss_fn, self._scores_grad(trainer, self.model_b, batch), ids
            ),
        )
        sim = self._scores_grad(trainer, trainer.model, batch)
        loss = pair_loss(trainer.loss_fn, sim, ids)
        return self._out(trainer, loss, sim, ids)

    def _co_divided(self, trainer: Any, batch: Any) -> StepLoss:
        d = self.division
        assert d is not None and self.model_b is not None
        rows = batch.cap_index.cpu()
        ids = pair_ids(batch)
        pos = ids[:, None] == ids[None, :]
        with _eval_mode(trainer.model, self.model_b), torch.no_grad():
            p_a = predictions(
                self._scores(trainer, trainer.model, batch), margin=self.margin, pos_mask=pos
            )
            p_b = predictions(
                self._scores(trainer, self.model_b, batch), margin=self.margin, pos_mask=pos
            )
        noisy_on = trainer.epoch >= self.noisy_from
        # co-divide: each network trains with the other's division
        plan_b = self._plan(d["clean_a"][rows], d["prob_a"][rows], p_b, (p_a + p_b) / 2, noisy_on)
        plan_a = self._plan(d["clean_b"][rows], d["prob_b"][rows], p_a, (p_a + p_b) / 2, noisy_on)
        self._train_b(trainer, lambda: self._soft_loss(trainer, self.model_b, batch, *plan_b))
        loss, sim, sub_ids = self._soft_loss(trainer, trainer.model, batch, *plan_a, keep=True)
        return self._out(trainer, loss, sim, sub_ids)

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
        trainer: Any,
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
        sim = self._scores_grad(trainer, net, sub)
        sub_ids = pair_ids(sub)
        pos = sub_ids[:, None] == sub_ids[None, :]
        loss_fn = trainer.loss_fn
        if _takes_margins(loss_fn):
            loss = loss_fn.from_similarity(sim, pos, margins=margins)
        else:  # triplet: the per-anchor form with the module's own settings
            hardest = bool(getattr(loss_fn, "hardest", True))
            loss = soft_margin_triplet(
                sim, margins, pos_mask=pos, hardest=hardest, reduction=loss_fn.reduction
            )
        return (loss, sim, sub_ids) if keep else loss

    def _train_b(self, trainer: Any, loss_of_b: Any) -> None:
        """One optimiser step of B on ``loss_of_b()`` (train mode, its own schedule, scaler and
        the config's gradient clipping)."""
        assert self.model_b is not None and self.optimizer_b is not None
        assert self.scaler_b is not None
        self.scheduler_b.apply(epoch=trainer.epoch, step=trainer.step)
        self.model_b.train()
        self.optimizer_b.zero_grad(set_to_none=True)
        loss = loss_of_b()
        if not torch.isfinite(loss.detach()):
            raise FloatingPointError(
                f"network B: non-finite loss {float(loss)} at epoch {trainer.epoch} step "
                f"{trainer.step}"
            )
        self.scaler_b.scale(loss).backward()
        self.scaler_b.unscale_(self.optimizer_b)
        clip = self.config.optim.grad_clip
        if clip and clip > 0:
            params = [p for g in self.optimizer_b.param_groups for p in g["params"]]
            torch.nn.utils.clip_grad_norm_(params, clip)
        self.scaler_b.step(self.optimizer_b)
        self.scaler_b.update()

    def _out(self, trainer: Any, loss: torch.Tensor, sim: Any, ids: torch.Tensor) -> StepLoss:
        ctx: dict[str, Any] = {"ids": ids}
        ctx["sim"] = sim.detach() if sim is not None else torch.zeros(0, 0, device=ids.device)
        return self.scaled(trainer, loss, loss.detach()), loss.detach(), ctx

    def _scores(self, trainer: Any, net: nn.Module, batch: Any) -> torch.Tensor:
        """``net``'s ``(B, B)`` score matrix of the batch (a two-tower model's through the
        loss's similarity: cosines when the loss normalises), at least float32."""
        with trainer._autocast():
            if trainer.scores_pairs:
                sim = net(batch)
            else:
                img, txt = net(batch)
                sim = trainer.loss_fn.similarity_and_mask(img, txt)[0]
        return sim.to(torch.promote_types(sim.dtype, torch.float32))

    _scores_grad = _scores  # the same forward, named for where gradients flow

    # -- evaluation --------------------------------------------------------------------------

    def validate(self, trainer: Any) -> dict[str, float]:
        """Dev metrics of the two-network ensemble: the mean of A's and B's score matrices
        (:class:`~vlret.eval.EnsembleScorer`; cosines for two-tower models), ranked as a pair
        scorer's dev metrics are (:func:`~vlret.run.pair_scoring.dev_metrics_from_scores`)."""
        assert self.model_b is not None
        size, device = self.config.train.eval_batch_size, trainer.device
        scorers: list[Any] = []
        for net in (trainer.model, self.model_b):
            if trainer.scores_pairs:
                scorers.append(PairModelScorer(net, batch_size=size, device=device))
            else:
                scoring = getattr(net, "scoring", "cosine")
                scorers.append(TwoTowerScorer(net, scoring=scoring, batch_size=size, device=device))
        with _eval_mode(trainer.model, self.model_b):
            sim = EnsembleScorer(scorers).scores(trainer.dev_set)
        return dev_metrics_from_scores(sim, torch.as_tensor(trainer.dev_set.txt_to_img))


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
