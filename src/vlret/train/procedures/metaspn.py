"""Meta-SPN (Wei et al., ACM MM 2021) as a training procedure: ``train.procedure = "metaspn"``.

Meta Self-Paced Network: a small fully connected network maps each (anchor, negative) pair's
**self-similarity** (the anchor's positive score ``s_ii``) and **relative similarity** (the
negative's score minus the positive's, ``s_ij - s_ii``) to a weight in (0, 1) (a sigmoid
output), and the model trains on the triplet loss whose hinge terms carry those weights. The
weighting network learns by meta-learning on clean held-out batches of the dev split, every
``meta_every`` steps:

1. a **virtual step**: one SGD step of the model's parameters on the weighted loss of the
   training batch, ``theta' = theta - lr * grad_theta L_w(theta, phi)``, kept differentiable in
   the weighting network's parameters ``phi`` (``create_graph``; no copy of the model:
   ``torch.func.functional_call`` runs the model's own forward with ``theta'``);
2. the **meta loss**: the unweighted triplet loss of a dev batch scored with ``theta'``;
3. a step of the weighting network's own Adam optimiser on ``d meta / d phi``;
4. the **real step**: the trainer back-propagates the weighted loss of the training batch, its
   weights recomputed by the updated network and detached, and steps the model's optimiser.

No official code exists. The reading taken here, where the paper leaves room:

* One network for both directions (image anchors with negative captions, caption anchors with
  negative images), input ``(s_ii, s_ij - s_ii)``, hidden ReLU layers of the sizes in
  ``hidden`` (default one layer of 100, the size of Meta-Weight-Net, Shu et al. 2019, which
  Meta-SPN builds on), sigmoid output. Its inputs are **detached** similarities, as in
  Meta-Weight-Net: the weights are a function of the scores, not a path for the model's
  gradient.
* The weighted hinge ``w_ij [m + s_ij - s_ii]_+`` over **all negatives** when the config's
  triplet loss has ``hardest = false`` (the pairs of the batch are what a self-paced weighting
  chooses among; the shipped configs use this), or over each anchor's hardest negative only
  (``hardest = true``, its weight from the same network). The margin, the mining and the
  reduction are the ``[loss]`` section's (which must be ``name = "triplet"``), so
  ``train.all_negatives_epochs`` switches the mining as for the plain loss.
* The meta loss is the unweighted triplet loss on the dev batch with the same margin and
  reduction; ``meta_loss = "hardest"`` (default: Triplet-HN, the matching models' own
  objective) or ``"all"`` (every negative's hinge).
* The virtual step is plain SGD (whatever optimiser the real step uses) at each parameter's
  current learning rate (its group's, after warm-up and decay), or at ``virtual_lr``; no
  gradient clipping. The dev forward runs in training mode (dropout on) on **copies** of the
  model's buffers, so BatchNorm statistics never see the dev batch.
* The real step reuses the training batch's forward of the virtual step (one forward per step:
  BatchNorm statistics and dropout masks as in a standard step).
* The dev batches come from the whole ``data.dev_split`` (not ``dev_max_images``), in a seeded
  order (``train.seed`` and the pass over the split) that a resume continues; a pass stops
  before an incomplete batch. As in the paper, the same split also selects ``best.pt``.

Models: two-tower models (the cosine of ``loss.normalize`` or the dot product) and pair
scorers (SCAN, BFAN, SGRAF: the functional call goes through the model's own forward, which
returns the dev batch's score matrix). One process only (DistributedDataParallel does not
differentiate through a virtual step) and no gradient caching; on CUDA, cuDNN is off during a
meta step of a model with recurrent layers (cuDNN's RNN has no double backward). With
float16 AMP the meta gradients are not loss-scaled.

Options (``[train] procedure_options``): ``hidden`` (list of hidden sizes, default
``[100]``), ``meta_lr`` (Adam, default ``1e-3``: not given by the paper), ``meta_every``
(default 1), ``virtual_lr`` (default: the current learning rate), ``meta_batch_size``
(default ``train.batch_size``), ``meta_loss`` (``"hardest"``). The checkpoint's ``procedure``
holds the weighting network, its optimiser and the dev batches' position, so ``--resume`` is
exact.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

from ..._modules import unwrap_model
from ...data.formats import get_format, open_dataset
from ...losses import available_losses, loss_capabilities
from ...losses._base import prepare, reduce_terms
from ...losses.triplet import triplet_loss
from ...run.config import ConfigError, RunConfig
from ...similarity import positive_mask
from ..context import TrainContext
from ..hooks.core import TrainHook
from ..loss_step import LossStep, StepLoss, pair_ids
from .options import MetaSPNOptions, metaspn_options
from .registry import register_procedure


class WeightingNetwork(nn.Module):
    """The meta self-paced network: ``(self-similarity, relative similarity) -> weight`` in
    (0, 1), a ReLU MLP with the ``hidden`` sizes and a sigmoid output."""

    def __init__(self, hidden: Sequence[int] = (100,)) -> None:
        super().__init__()
        sizes = [2, *hidden]
        layers: list[nn.Module] = []
        for a, b in zip(sizes[:-1], sizes[1:], strict=True):
            layers += [nn.Linear(a, b), nn.ReLU()]
        layers.append(nn.Linear(sizes[-1], 1))
        self.mlp = nn.Sequential(*layers)

    def forward(self, self_sim: torch.Tensor, relative_sim: torch.Tensor) -> torch.Tensor:
        """The weights of pairs with these similarities (any equal shapes, same shape out)."""
        dtype = next(self.mlp.parameters()).dtype
        x = torch.stack([self_sim, relative_sim], dim=-1).to(dtype)
        return torch.sigmoid(self.mlp(x).squeeze(-1)).to(self_sim.dtype)


def pair_weights(net: nn.Module, sim: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(w_i2t, w_t2i)``, both ``(B, B)``: ``w_i2t[i, j]`` weighs image ``i``'s hinge with
    caption ``j`` (inputs ``s_ii``, ``s_ij - s_ii``), ``w_t2i[i, j]`` caption ``j``'s hinge with
    image ``i`` (inputs ``s_jj``, ``s_ij - s_jj``). The similarities are detached."""
    s = sim.detach()
    pos = s.diagonal()
    rows, cols = pos[:, None].expand_as(s), pos[None, :].expand_as(s)
    return net(rows, s - rows), net(cols, s - cols)


def weighted_triplet_loss(
    sim: torch.Tensor,
    w_i2t: torch.Tensor,
    w_t2i: torch.Tensor,
    *,
    margin: float = 0.2,
    hardest: bool = False,
    pos_mask: torch.Tensor | None = None,
    reduction: str = "sum",
) -> torch.Tensor:
    r"""The triplet loss with a weight on every hinge term (Meta-SPN's weighted loss).

    .. math:: \sum_i \sum_{j \ne i} w^{i2t}_{ij} [m + s_{ij} - s_{ii}]_+
              + w^{t2i}_{ji} [m + s_{ji} - s_{ii}]_+

    over the negatives ``j`` of anchor ``i`` (``pos_mask`` marks further positives, never
    negatives); with ``hardest=True`` only each anchor's most similar negative (the first on a
    tie) enters, with its weight. ``reduction``: ``"sum"``, ``"mean"`` (over anchors) or
    ``"none"`` (each index's two terms). Weighted by ones it is :func:`triplet_loss`.

    Raises:
        ValueError: Bad ``sim`` / ``pos_mask``, or weights not of ``sim``'s shape.
    """
    s, negatives = prepare(sim, pos_mask)
    for name, w in (("w_i2t", w_i2t), ("w_t2i", w_t2i)):
        if not isinstance(w, torch.Tensor) or w.shape != s.shape:
            shape = tuple(w.shape) if isinstance(w, torch.Tensor) else type(w).__name__
            raise ValueError(f"{name} must be a {tuple(s.shape)} tensor like sim, got {shape}")
    pos = s.diagonal()
    hinge_i2t = ((margin + s - pos[:, None]).clamp(min=0) * w_i2t).masked_fill(~negatives, 0)
    hinge_t2i = ((margin + s - pos[None, :]).clamp(min=0) * w_t2i).masked_fill(~negatives, 0)
    if hardest:
        scores = s.detach().masked_fill(~negatives, torch.finfo(s.dtype).min)
        img_terms = hinge_i2t.gather(1, scores.argmax(dim=1)[:, None]).squeeze(1)
        txt_terms = hinge_t2i.gather(0, scores.argmax(dim=0)[None, :]).squeeze(0)
    else:
        img_terms, txt_terms = hinge_i2t.sum(dim=1), hinge_t2i.sum(dim=0)
    return reduce_terms(img_terms, txt_terms, reduction)


def virtual_step(
    loss: torch.Tensor,
    params: Mapping[str, torch.Tensor],
    lrs: Mapping[str, float] | float,
    *,
    create_graph: bool = True,
) -> dict[str, torch.Tensor]:
    """``{name: p - lr * d loss / d p}``: one SGD step of ``params`` on ``loss``, kept in the
    graph (``create_graph``) so a loss of the result differentiates back to what ``loss``'s
    gradient depends on. A parameter ``loss`` does not reach stays as it is."""
    names = list(params)
    grads = torch.autograd.grad(
        loss, [params[n] for n in names], create_graph=create_graph, allow_unused=True
    )
    out = {}
    for name, grad in zip(names, grads, strict=True):
        lr = lrs if isinstance(lrs, float | int) else lrs[name]
        out[name] = params[name] if grad is None else params[name] - lr * grad
    return out


def batch_similarity(
    loss_fn: Any, out: Any, ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``(B, B)`` scores of a model's output (a pair scorer's matrix, or the loss's cosine /
    dot product of ``(img_emb, txt_emb)``), at least float32, and the batch's positives."""
    if isinstance(out, torch.Tensor):
        sim = out
        mask = positive_mask(ids, ids).to(sim.device)
    else:
        img, txt = out
        sim, mask = loss_fn.similarity_and_mask(img, txt, ids, ids)
    return sim.to(torch.promote_types(sim.dtype, torch.float32)), mask


class DevBatches:
    """Clean meta batches cycling a dataset in a seeded order: pass ``c`` over the split is
    the permutation of ``numpy.random.default_rng([seed, c])``; a pass ends before an
    incomplete batch (a split smaller than ``batch_size`` gives the whole split each time)."""

    def __init__(self, dataset: Any, batch_size: int, *, seed: int) -> None:
        self.dataset = dataset
        self.size = min(int(batch_size), len(dataset))
        self.seed = int(seed) & 0xFFFFFFFF
        self.cycle = 0
        self.offset = 0
        self._order: tuple[int, np.ndarray] | None = None

    def order(self) -> np.ndarray:
        if self._order is None or self._order[0] != self.cycle:
            perm = np.random.default_rng([self.seed, self.cycle]).permutation(len(self.dataset))
            self._order = (self.cycle, perm)
        return self._order[1]

    def next(self) -> Any:
        """The next batch (a collated :class:`~vlret.data.RetrievalBatch`)."""
        if self.offset + self.size > len(self.dataset):
            self.cycle, self.offset = self.cycle + 1, 0
        rows = self.order()[self.offset : self.offset + self.size]
        self.offset += self.size
        return self.dataset.collate([self.dataset[int(i)] for i in rows])

    def state_dict(self) -> dict[str, int]:
        return {"cycle": self.cycle, "offset": self.offset}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.cycle, self.offset = int(state["cycle"]), int(state["offset"])


class MetaSPNStep(LossStep):
    """The Meta-SPN procedure (module doc): the weighted triplet loss of a step, after the
    weighting network's meta step on a dev batch every ``meta_every`` steps.

    Built by the ``"metaspn"`` factory from the config; :meth:`hooks` binds it to the run
    (the dev batches, the network on the run's device). ``last_meta_loss`` and
    ``last_mean_weight`` hold the last meta loss and the last step's mean pair weight.
    """

    name = "metaspn"

    def __init__(
        self, options: MetaSPNOptions, *, seed: int = 0, meta_batch_size: int = 128
    ) -> None:
        self.options = options
        self.seed = int(seed)
        self.meta_batch_size = options.meta_batch_size or int(meta_batch_size)
        with torch.random.fork_rng(devices=[]):  # the run's own random stream is untouched
            torch.manual_seed(self.seed)
            self.net = WeightingNetwork(options.hidden)
        self.meta_optimizer = torch.optim.Adam(self.net.parameters(), lr=options.meta_lr)
        self.dev: DevBatches | None = None
        self.last_meta_loss: float | None = None
        self.last_mean_weight: float | None = None

    # -- binding and state -------------------------------------------------------------------

    def hooks(self, ctx: TrainContext) -> list[TrainHook]:
        """Check the run (one process, no gradient caching), move the weighting network to
        its device and open the dev batches; no hook is needed (the meta step is part of the
        step). The weighting network is no member of :meth:`networks`: it learns from the meta
        loss of a dev batch inside the step, with its own optimiser, not from the step's
        loss."""
        if ctx.world_size > 1:
            raise ValueError(
                "train.procedure 'metaspn' runs in one process (docs/metaspn.md, 'Several "
                "processes'): its virtual step differentiates the batch's gradient "
                "(autograd.grad with create_graph), which DistributedDataParallel does not "
                f"reduce over ranks; got a world size of {ctx.world_size}"
            )
        if ctx.grad_cache is not None:
            raise ValueError(
                "train.grad_cache_chunk: Meta-SPN differentiates through the whole batch's "
                "forward (its virtual step); remove grad_cache_chunk"
            )
        data = ctx.config.data
        assert data.dev_split is not None  # build_metaspn refused a config without one
        dataset = open_dataset(data, data.dev_split, encoder=ctx.encoder)
        self.dev = DevBatches(dataset, self.meta_batch_size, seed=self.seed)
        self.net.to(ctx.device)
        return []

    def state_dict(self) -> dict[str, Any]:
        return {
            "net": self.net.state_dict(),
            "optimizer": self.meta_optimizer.state_dict(),
            "dev": self.dev.state_dict() if self.dev is not None else {"cycle": 0, "offset": 0},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if set(state) != {"net", "optimizer", "dev"}:
            raise ValueError(
                f"the checkpoint holds the state of another training procedure "
                f"({', '.join(sorted(state)) or 'none'}); this run's procedure is {self.name!r}"
            )
        self.net.load_state_dict(state["net"])
        self.meta_optimizer.load_state_dict(state["optimizer"])
        if self.dev is not None:
            self.dev.load_state_dict(state["dev"])

    # -- the step ----------------------------------------------------------------------------

    def __call__(self, ctx: TrainContext, batch: Any) -> StepLoss:
        model = unwrap_model(ctx.ddp_model)
        due = ctx.step % self.options.meta_every == 0
        recurrent = any(isinstance(m, nn.RNNBase) for m in model.modules())
        no_cudnn = due and recurrent and ctx.device.type == "cuda"
        flags = torch.backends.cudnn.flags(enabled=False) if no_cudnn else contextlib.nullcontext()
        with flags:
            with ctx.autocast():
                out = model(batch)
            ids = pair_ids(batch)
            sim, pos_mask = batch_similarity(ctx.loss_fn, out, ids)
            if due:
                if self.dev is None:
                    raise RuntimeError("MetaSPNStep.hooks(ctx) was not called")
                dev_batch = self.dev.next().to(ctx.device)
                lrs = self.learning_rates(model, ctx.optimizer)
                meta, grads = self.meta_gradients(
                    model, ctx.loss_fn, sim, pos_mask, dev_batch, lrs, ctx.autocast
                )
                self.meta_optimizer.zero_grad(set_to_none=True)
                for p, g in zip(self.net.parameters(), grads, strict=True):
                    p.grad = g
                self.meta_optimizer.step()
                self.last_meta_loss = float(meta)
            with torch.no_grad():
                w_i2t, w_t2i = pair_weights(self.net, sim)
            self.last_mean_weight = float(w_i2t.mean())
            loss = self.weighted_loss(ctx.loss_fn, sim, pos_mask, w_i2t, w_t2i)
        logged = loss.detach()
        if isinstance(out, torch.Tensor):
            context: dict[str, Any] = {"sim": sim.detach(), "ids": ids}
        else:
            context = {"img": out[0].detach(), "txt": out[1].detach(), "ids": ids}
        stats = {"metaspn_mean_weight": self.last_mean_weight}
        if self.last_meta_loss is not None:
            stats["metaspn_meta_loss"] = self.last_meta_loss
        context["stats"] = lambda: stats
        return self.scaled(ctx, loss, logged), logged, context

    @staticmethod
    def weighted_loss(
        loss_fn: Any,
        sim: torch.Tensor,
        pos_mask: torch.Tensor | None,
        w_i2t: torch.Tensor,
        w_t2i: torch.Tensor,
    ) -> torch.Tensor:
        """:func:`weighted_triplet_loss` with the ``[loss]`` section's margin, mining (the
        warm-up's too) and reduction."""
        return weighted_triplet_loss(
            sim,
            w_i2t,
            w_t2i,
            margin=loss_fn.config.margin,
            hardest=loss_fn.hardest,
            pos_mask=pos_mask,
            reduction=loss_fn.reduction,
        )

    def learning_rates(self, model: nn.Module, optimizer: Any) -> dict[str, float]:
        """The virtual step's learning rate of each trainable model parameter: ``virtual_lr``,
        or its optimiser group's current rate (parameters in no group are left out)."""
        group_lr = {id(p): float(g["lr"]) for g in optimizer.param_groups for p in g["params"]}
        out = {}
        for name, p in model.named_parameters():
            if p.requires_grad and id(p) in group_lr:
                fixed = self.options.virtual_lr
                out[name] = fixed if fixed is not None else group_lr[id(p)]
        return out

    def meta_gradients(
        self,
        model: nn.Module,
        loss_fn: Any,
        sim: torch.Tensor,
        pos_mask: torch.Tensor | None,
        dev_batch: Any,
        lrs: Mapping[str, float],
        autocast: Any = contextlib.nullcontext,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Steps 1-2 of the module doc: ``(meta loss, its gradient in each weighting-network
        parameter)``. ``sim`` is the training batch's score matrix, still attached to the
        model's parameters (its graph is kept for the real step); ``lrs`` the virtual step's
        rate per parameter name (:meth:`learning_rates`)."""
        params = dict(model.named_parameters())
        params = {n: params[n] for n in lrs}
        w_i2t, w_t2i = pair_weights(self.net, sim)
        loss = self.weighted_loss(loss_fn, sim, pos_mask, w_i2t, w_t2i)
        virtual = virtual_step(loss, params, lrs)
        buffers = {n: b.clone() for n, b in model.named_buffers()}  # BN never sees dev data
        with autocast():
            out = functional_call(model, {**virtual, **buffers}, (dev_batch,))
        dev_sim, dev_mask = batch_similarity(loss_fn, out, pair_ids(dev_batch))
        meta = triplet_loss(
            dev_sim,
            margin=loss_fn.config.margin,
            hardest=self.options.meta_loss == "hardest",
            pos_mask=dev_mask,
            reduction=loss_fn.reduction,
        )
        net_params = list(self.net.parameters())
        grads = torch.autograd.grad(meta, net_params, allow_unused=True)
        pairs = zip(net_params, grads, strict=True)
        return meta.detach(), [torch.zeros_like(p) if g is None else g for p, g in pairs]


@register_procedure("metaspn")
def build_metaspn(config: RunConfig) -> MetaSPNStep:
    """``train.procedure = "metaspn"``: check the options and what the procedure needs of the
    config (a triplet loss, a dense one; a dev split the meta batches index)."""
    options = metaspn_options(config.train.procedure_options, source=config.source)
    if not loss_capabilities(config.loss.name, config.loss.params).hinge_terms:
        takers = [n for n in available_losses() if loss_capabilities(n).hinge_terms]
        raise ConfigError(
            config.source,
            "loss.name",
            f"Meta-SPN weighs the {' or '.join(takers)} loss's per-anchor hinge terms "
            "(LossCapabilities.hinge_terms; its margin, hardest and reduction are used), "
            f"got {config.loss.name!r}",
        )
    if config.loss.params.get("chunk_size") is not None:
        raise ConfigError(
            config.source,
            "loss.chunk_size",
            "Meta-SPN weighs every pair of the B x B score matrix; remove chunk_size",
        )
    if not config.data.dev_split:
        raise ConfigError(
            config.source,
            "data.dev_split",
            "Meta-SPN's meta batches come from the dev split; set one",
        )
    if get_format(config.data.format).evaluated_as is not None:  # shards, CSV: train + dev
        raise ConfigError(
            config.source,
            "data.format",
            f"Meta-SPN indexes the dev split for its meta batches, which a "
            f"{config.data.format!r} stream does not allow; use an indexed format",
        )
    return MetaSPNStep(options, seed=config.train.seed, meta_batch_size=config.train.batch_size)


__all__ = [
    "DevBatches",
    "MetaSPNOptions",
    "MetaSPNStep",
    "WeightingNetwork",
    "batch_similarity",
    "build_metaspn",
    "metaspn_options",
    "pair_weights",
    "virtual_step",
    "weighted_triplet_loss",
]
