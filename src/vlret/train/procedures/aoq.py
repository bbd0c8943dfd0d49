"""AOQ's training procedure (``train.procedure = "aoq"``; a config whose loss is ``aoq`` gets it
by default): each step encodes the batch together with its offline negatives and hands the
loss the four offline inputs (docs/aoq.md, "Training").

The training set (:class:`~vlret.data.offline_negatives.OfflineNegativesDataset`, built when
``data.offline_negatives`` is set) gives each batch ``offline``: per item ``i`` the offline pair
``(I'_i, T'_i)`` and the quintuplet pair ``(I''_i, T''_i)``, so a step encodes three times the
images and captions of a plain batch, as the release does.

* **Two-tower models**: the batch and its offline rows go through the model in ONE forward of
  the concatenated ``3B`` items (features and padded captions stacked; a model with batch
  statistics sees all of them), or, when the features do not stack (image paths), two. The
  loss (:class:`~vlret.losses.AOQLoss`) gets ``offline_txt_emb`` (``T'``), ``offline_img_emb``
  (``I'``), ``quintuplet_img_emb`` (``I''``) and ``quintuplet_txt_emb`` (``T''``); under
  torchrun all of them are gathered with their gradients, as the batch's embeddings.
* **Pair-scoring models** (SCAN and BFAN; SGRAF, CE and MMT are refused by the config check):
  the ``3B`` images and captions are encoded once, the batch's ``(B, B)`` scores come from the
  model's own ``score``, and the four per-item scores ``s(I_i, T'_i)``, ``s(I'_i, T_i)``,
  ``s(I'_i, T'_i)`` and ``s(I''_i, T''_i)`` from the same ``score`` on the aligned pairs, in
  blocks of ``pair_block`` items whose diagonal is kept (the release scores them one pair at a
  time; a block of ``b`` items costs ``b`` times the pairs it keeps and ``1/b`` the calls).
  Under torchrun each rank scores its images against every rank's captions (the standard
  step's row blocks, :mod:`vlret.train.parallel.distributed`, "Pair scorers") and its own
  items' four aligned scores; the row blocks and the per-item scores are gathered with their
  gradient in rank order, every rank computes the whole loss, and the model's gradients are
  averaged by hand (:class:`~vlret.train.procedures.replicas.AverageReplicas`: the step calls
  the model's methods, not the DistributedDataParallel forward). An item's offline draws are a
  function of its caption index, not of the rank or the batch, so every rank holds the
  gradient of one process on the concatenated batch (tested with 2 gloo processes).

``train.procedure_options``: ``pair_block`` (default 16), the block of the aligned pair
scores. The step holds no state of its own: the draws are a function of ``(train.seed, epoch,
caption index)`` (:func:`~vlret.data.offline_negatives.draw_generator`), which a resume
recomputes; the procedure's hook gives the training set ``train.seed`` before each epoch.
Each step's context (``StepOutput.context``, what hooks see) carries ``stats``, a callable
returning the adaptive weights' statistics: ``aoq_weight_txt`` and ``aoq_weight_img`` (their
means over the batch) and ``aoq_weight_negative`` (the fraction of the ``2B`` weights below
zero; the release neither clamps nor detaches them). ``metrics.jsonl``'s step records call it
on the logging steps only, so the other steps pay nothing for it.
"""

from __future__ import annotations

from typing import Any, cast

import torch
import torch.nn.functional as F

from ..._modules import unwrap_model
from ..._settings import defaults
from ...data.dataset import RetrievalBatch
from ...models.text import check_captions
from ...run.config import RunConfig
from ...run.config_checks import OFFLINE_PAIR_KINDS
from ...similarity import positive_mask
from ..context import TrainContext
from ..hooks.core import TrainHook
from ..loss_step import LossStep, StepLoss, pair_ids
from ..parallel.distributed import gather_no_grad, gather_tokens, gather_with_grad
from .options import AOQOptions, aoq_options
from .registry import register_procedure
from .replicas import AverageReplicas

#: The procedure's options and their defaults (declared by :class:`~.options.AOQOptions`).
OPTIONS: dict[str, Any] = defaults(AOQOptions)


class AOQStep(LossStep):
    """The loss of one batch and its offline negatives (see the module docstring).

    Args:
        pair_block: Items per block of the aligned pair scores of a pair-scoring model.

    Raises:
        ValueError: ``pair_block`` is not a positive integer (named
            ``train.procedure_options.pair_block``).
    """

    name = "aoq"

    def __init__(self, *, pair_block: int = OPTIONS["pair_block"]) -> None:
        if isinstance(pair_block, bool) or not isinstance(pair_block, int) or pair_block < 1:
            raise ValueError(
                "train.procedure_options.pair_block: expected a positive integer, got "
                f"{pair_block!r}"
            )
        self.pair_block = pair_block

    def hooks(self, ctx: TrainContext) -> list[TrainHook]:
        """Checks the run can train AOQ (the training set carries offline negatives; a
        pair-scoring model is SCAN or BFAN) and returns the hook that gives the draws their
        seed, and for a pair-scoring model under torchrun the one that averages the
        gradients."""
        if not callable(getattr(ctx.train_set, "set_seed", None)):
            raise ValueError(
                'train.procedure "aoq": the training set has no offline negatives (set '
                "data.offline_negatives to the .npz `vlret mine-negatives` wrote)"
            )
        hooks: list[TrainHook] = [DrawSeed()]
        if ctx.scores_pairs:
            kind = ctx.config.model.get("kind")
            if kind not in OFFLINE_PAIR_KINDS:
                raise ValueError(
                    f"model.kind {kind!r}: AOQ scores the offline pairs of a pair-scoring "
                    f"model with {' or '.join(OFFLINE_PAIR_KINDS)} only"
                )
            if ctx.world_size > 1:  # the pair path calls the model's methods, not DDP's forward
                hooks.append(AverageReplicas())
        return hooks

    def __call__(self, ctx: TrainContext, batch: Any) -> StepLoss:
        if getattr(batch, "offline", None) is None:
            raise ValueError(
                "the AOQ procedure needs batches with their offline negatives (the training "
                "set of data.offline_negatives)"
            )
        if ctx.scores_pairs:
            return self.aoq_pair_loss(ctx, batch)
        return self.aoq_embedding_loss(ctx, batch)

    def aoq_embedding_loss(self, ctx: TrainContext, batch: RetrievalBatch) -> StepLoss:
        """A two-tower model: one forward of the ``3B`` items (two when they do not stack)."""
        n = len(batch.img_index)
        offline = batch.offline
        assert offline is not None  # __call__ checked it
        joined = join_batches(batch, offline)
        with ctx.autocast():
            if joined is not None:
                img_all, txt_all = ctx.ddp_model(joined)
                img, txt, off_img, off_txt = img_all[:n], txt_all[:n], img_all[n:], txt_all[n:]
            else:  # the second forward outside the DDP wrapper: one reducer pass per step
                img, txt = ctx.ddp_model(batch)
                off_img, off_txt = ctx.model(offline)
        wide = torch.promote_types(img.dtype, torch.float32)
        img, txt, off_img, off_txt = (t.to(wide) for t in (img, txt, off_img, off_txt))
        extra = {
            "offline_txt_emb": off_txt[0::2],
            "offline_img_emb": off_img[0::2],
            "quintuplet_img_emb": off_img[1::2],
            "quintuplet_txt_emb": off_txt[1::2],
        }
        if ctx.gather:
            img, txt = gather_with_grad(img), gather_with_grad(txt)
            extra = {k: gather_with_grad(v) for k, v in extra.items()}
        ids = gather_no_grad(pair_ids(batch))
        try:
            loss = ctx.loss_fn(img, txt, ids, ids, **extra)
            logged = loss.detach()
            out: dict[str, Any] = {"img": img.detach(), "txt": txt.detach(), "ids": ids}
            held = (img.detach(), txt.detach(), {k: v.detach() for k, v in extra.items()})
            # computed on logging steps only (run_log.step_record calls it)
            out["stats"] = lambda: self.embedding_weight_stats(ctx, *held[:2], ids, held[2])
            return self.scaled(ctx, loss, logged), logged, out
        except (ValueError, FloatingPointError) as err:
            self.explain_non_finite(ctx, batch, img, txt, err)
            raise

    def aoq_pair_loss(self, ctx: TrainContext, batch: RetrievalBatch) -> StepLoss:
        """A pair-scoring model: the ``3B`` images and captions encoded once, the batch's score
        matrix and the four aligned offline scores from the model's ``score``; under torchrun
        this rank's row block and its items' aligned scores, gathered (module doc)."""
        model: Any = unwrap_model(ctx.model)
        n = len(batch.img_index)
        offline = batch.offline
        assert offline is not None  # __call__ checked it
        joined = join_batches(batch, offline)
        with ctx.autocast():
            if joined is not None:
                regions = model.encode_images(joined.features)
                caps, lengths = check_captions(cast(torch.Tensor, joined.captions), joined.lengths)
                words = model.encode_texts(caps, lengths)
                rows = model.token_lengths(lengths).to(words.device)
                parts = [(regions[:n], words[:n], rows[:n]), (regions[n:], words[n:], rows[n:])]
            else:
                parts = []
                for b in (batch, offline):
                    caps, lengths = check_captions(cast(torch.Tensor, b.captions), b.lengths)
                    words = model.encode_texts(caps, lengths)
                    rows = model.token_lengths(lengths).to(words.device)
                    parts.append((model.encode_images(b.features), words, rows))
            (r, w, lw), (ro, wo, lo) = parts
            every_w, every_lw = gather_tokens(w, lw)  # every rank's captions (one process: w)
            sim = model.score(r, every_w, every_lw)  # this rank's row block
            block = self.pair_block
            scores = {
                "offline_txt_sim": aligned_scores(model, r, wo[0::2], lo[0::2], block),
                "offline_img_sim": aligned_scores(model, ro[0::2], w, lw, block),
                "offline_pair_sim": aligned_scores(model, ro[0::2], wo[0::2], lo[0::2], block),
                "quintuplet_sim": aligned_scores(model, ro[1::2], wo[1::2], lo[1::2], block),
            }
        wide = torch.promote_types(sim.dtype, torch.float32)
        sim = gather_with_grad(sim.to(wide))  # the rank blocks in rank order
        scores = {k: gather_with_grad(v.to(wide)) for k, v in scores.items()}
        ids = gather_no_grad(pair_ids(batch))
        try:
            pos_mask = positive_mask(ids, ids).to(sim.device)
            loss = ctx.loss_fn.from_similarity(sim, pos_mask, **scores)
            out: dict[str, Any] = {"sim": sim.detach(), "ids": ids}
            held_scores = {k: v.detach() for k, v in scores.items()}
            out["stats"] = lambda: self.weight_stats(ctx, sim.detach(), pos_mask, held_scores)
            return self.scaled(ctx, loss, loss.detach()), loss.detach(), out
        except (ValueError, FloatingPointError) as err:
            self.explain_non_finite(ctx, batch, None, None, err)
            raise

    def embedding_weight_stats(
        self,
        ctx: TrainContext,
        img: torch.Tensor,
        txt: torch.Tensor,
        ids: torch.Tensor,
        extra: dict[str, torch.Tensor],
    ) -> dict[str, float]:
        """:meth:`weight_stats` from embeddings, scored as the loss scores them."""
        with torch.no_grad():
            normalize = bool(getattr(ctx.loss_fn, "normalize", True))

            def unit(a: torch.Tensor) -> torch.Tensor:
                return F.normalize(a, dim=-1, eps=1e-8) if normalize else a

            i, t = unit(img), unit(txt)
            offline = {
                "offline_txt_sim": (i * unit(extra["offline_txt_emb"])).sum(-1),
                "offline_img_sim": (unit(extra["offline_img_emb"]) * t).sum(-1),
            }
            return self.weight_stats(ctx, i @ t.T, positive_mask(ids, ids), offline)

    @staticmethod
    def weight_stats(
        ctx: TrainContext,
        sim: torch.Tensor,
        pos_mask: torch.Tensor,
        scores: dict[str, torch.Tensor],
    ) -> dict[str, float]:
        """The means of the adaptive weights ``beta - (offline - hardest online) / alpha`` of
        the batch (caption side ``aoq_weight_txt``, image side ``aoq_weight_img``) and the
        fraction below zero (``aoq_weight_negative``); anchors without an online negative are
        left out."""
        config = getattr(ctx.loss_fn, "config", None)
        alpha, beta = getattr(config, "alpha", None), getattr(config, "beta", None)
        if alpha is None or beta is None:
            return {}
        with torch.no_grad():
            negatives = ~pos_mask.to(sim.device)
            filled = sim.masked_fill(~negatives, float("-inf"))
            out: dict[str, float] = {}
            weights = []
            for key, hard, has, off in (
                ("aoq_weight_txt", filled.amax(1), negatives.any(1), scores["offline_txt_sim"]),
                ("aoq_weight_img", filled.amax(0), negatives.any(0), scores["offline_img_sim"]),
            ):
                w = (beta - (off.to(sim.dtype) - hard) / alpha)[has]
                out[key] = float(w.mean()) if w.numel() else float("nan")
                weights.append(w)
            both = torch.cat(weights)
            out["aoq_weight_negative"] = float((both < 0).float().mean()) if both.numel() else 0.0
        return out


def join_batches(batch: RetrievalBatch, offline: RetrievalBatch) -> RetrievalBatch | None:
    """The batch followed by its offline rows as one batch (what one forward encodes), or None
    when the features or captions do not stack (image paths, texts, different widths)."""
    parts = (batch, offline)
    feats, caps = [b.features for b in parts], [b.captions for b in parts]
    if not all(isinstance(f, torch.Tensor) for f in feats):
        return None
    if not all(isinstance(c, torch.Tensor) for c in caps):
        return None
    f0, f1 = (f for f in feats if isinstance(f, torch.Tensor))
    c0, c1 = (c for c in caps if isinstance(c, torch.Tensor))
    if f0.shape[1:] != f1.shape[1:] or c0.shape[1:] != c1.shape[1:]:
        return None
    lengths = None
    if batch.lengths is not None and offline.lengths is not None:
        lengths = torch.cat([batch.lengths, offline.lengths])
    return RetrievalBatch(
        torch.cat([f0, f1]),
        torch.cat([c0, c1]),
        lengths,
        torch.cat([batch.img_index, offline.img_index]),
        torch.cat([batch.cap_index, offline.cap_index]),
    )


def aligned_scores(
    model: Any, regions: torch.Tensor, words: torch.Tensor, rows: torch.Tensor, block: int
) -> torch.Tensor:
    """``(n,)``: the model's score of image ``i`` with caption ``i``, from the diagonals of
    ``block x block`` calls of ``model.score`` (each pair's score depends on that pair alone for
    the kinds AOQ accepts, :data:`~vlret.run.config_checks.OFFLINE_PAIR_KINDS`)."""
    out = []
    for start in range(0, regions.shape[0], block):
        stop = start + block
        out.append(model.score(regions[start:stop], words[start:stop], rows[start:stop]).diagonal())
    return torch.cat(out)


class DrawSeed(TrainHook):
    """Gives the training set's offline draws the run seed (``train.seed``) before each epoch
    (and a resumed one), before the epoch's DataLoader copies the set into its workers."""

    def before_epoch(self, ctx: TrainContext) -> None:
        ctx.train_set.set_seed(ctx.config.train.seed)


@register_procedure("aoq")
def build(config: RunConfig) -> LossStep:
    """The AOQ step with ``train.procedure_options`` (:class:`~.options.AOQOptions`)."""
    return AOQStep(pair_block=aoq_options(config.train.procedure_options).pair_block)


__all__ = ["OPTIONS", "AOQStep", "DrawSeed", "aligned_scores", "join_batches"]
