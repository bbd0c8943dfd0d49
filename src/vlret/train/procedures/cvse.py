"""CVSE's multi-level objective (``train.procedure = "cvse"``): the run's loss applied to three
score matrices of a ``kind = "cvse"`` model, plus the KL divergence of the two sides' concept
distributions (:mod:`vlret.models.matchers.cvse`).

The authors' release (``BruceW91/CVSE`` ``CVSE.forward_loss``) trains

    L = 3 * triplet(fused) + 5 * triplet(instance) + 1 * triplet(consensus) + 2 * KL,

each triplet VSE++'s hardest-negative hinge (margin 0.2, summed) on the ``(B, B)`` products of
one level's vectors, and ``KL = sum_b sum_c w_t (log w_t - log w_v)``, ``w_v`` / ``w_t`` the
image's and the caption's distributions over the concepts (the caption's with its labels mixed
in), summed over the batch, both sides trained through it. Here the triplet is whatever loss the
run names (``loss.name``: triplet, unified, ...), applied to each level with the weights
``train.procedure_options.levels`` (``[3, 5, 1]``: fused, instance, consensus) and the KL
term weighted ``kl_weight`` (2).

The caption side's concept labels are, with ``labels = "image"`` (the default, the release's
training), those of the caption's IMAGE from the concept folder's
``all_<ds>_concept_label.json`` (the union over the image's captions; ``1 / C`` everywhere for
an image the file lacks), with ``labels = "caption"`` the caption's own (what evaluation uses).

The KL term is summed over the batch as the release's is; with
a base loss that averages over the batch instead, its weight relative to the levels is ``B``
times the release's (lower ``kl_weight`` to compensate).

Each level's loss is called once a step, so a loss that keeps state between calls (a queue, a
margin it re-estimates) sees three calls per step; AdaCL's memory bank of a pair scorer trains
on the combined score with the ``pair_bank`` procedure instead (the registry refuses another
procedure with a bank). The step calls the model's ``image_levels`` / ``text_levels`` directly
(one process: torchrun, gradient caching, ring exchanges and a momentum encoder are refused by
name). The step log's ``sim`` is the combined retrieval score ``model.score``.
"""

from __future__ import annotations

from typing import Any

import torch

from ..._modules import unwrap_model
from ...losses import StepInputs
from ...models.matchers.cvse_files import find_labels_file, image_label_matrix
from ...models.text import check_batch, check_captions
from ...run.config import RunConfig
from ...run.pair_scoring import pair_loss
from ..context import TrainContext
from ..hooks.core import TrainHook
from ..loss_step import LossStep, StepLoss, pair_ids
from .registry import register_procedure

#: The release's weights: fused, instance and consensus triplets, then the KL term.
DEFAULT_LEVELS = (3.0, 5.0, 1.0)
DEFAULT_KL_WEIGHT = 2.0
LEVELS = ("fused", "instance", "consensus")
#: Where the caption side's training labels come from.
LABEL_SOURCES = ("image", "caption")


def concept_kl(image_weights: torch.Tensor, text_weights: torch.Tensor) -> torch.Tensor:
    """``sum_b sum_c w_t (log w_t - log w_v)``: the release's ``KLDivLoss(log w_v, w_t)``,
    unreduced then summed (no eps, as there)."""
    return (text_weights * (text_weights.log() - image_weights.log())).sum()


class CVSEStep(LossStep):
    """One step of CVSE's multi-level objective (see the module docstring).

    Args:
        levels: Weights of the fused, instance and consensus levels' losses.
        kl_weight: Weight of the concept KL term.
    """

    name = "cvse"
    #: Why the dev loss is not computed (:func:`vlret.train.dev_loss.dev_loss_skipped`).
    dev_loss_note = (
        'train.procedure "cvse" sums the loss over three levels and a KL term; the dev loss '
        "is one loss of one score matrix"
    )

    def __init__(
        self,
        *,
        levels: tuple[float, float, float] = DEFAULT_LEVELS,
        kl_weight: float = DEFAULT_KL_WEIGHT,
        labels: str = "image",
    ) -> None:
        if labels not in LABEL_SOURCES:
            raise ValueError(
                f"train.procedure_options.labels: one of {list(LABEL_SOURCES)}, got {labels!r}"
            )
        self.levels = levels
        self.kl_weight = kl_weight
        self.labels = labels
        #: ``(n_train_images, C)`` the training images' labels (``labels = "image"``).
        self.table: torch.Tensor | None = None

    def hooks(self, ctx: TrainContext) -> list[TrainHook]:
        """Checks the run can train CVSE's levels: a cvse model in one process."""
        model: Any = unwrap_model(ctx.model)
        if not hasattr(model, "image_levels") or not hasattr(model, "text_levels"):
            raise ValueError(
                f'train.procedure "cvse": needs a kind = "cvse" model, got {type(model).__name__}'
            )
        refused = {
            "torchrun (one process only)": ctx.world_size > 1,
            "train.grad_cache_chunk": ctx.grad_cache is not None,
            "train.exchange": ctx.exchange != "gather",
            "train.momentum_encoder": ctx.momentum_encoder is not None,
        }
        for what, on in refused.items():
            if on:
                raise ValueError(f'train.procedure "cvse" does not run with {what}')
        if self.labels == "image":
            path = find_labels_file(model.config["concepts"])
            ids = list(getattr(ctx.train_set, "image_ids", None) or [])
            rows, missing = image_label_matrix(path, ids, model.num_concepts)
            if missing == len(ids):
                raise ValueError(
                    f'train.procedure_options.labels = "image": {path} holds none of the '
                    "training images' ids (written for another split or data folder?)"
                )
            if missing:
                ctx.print(f"{path.name}: {missing} training images lack labels (1/C each)")
            self.table = torch.from_numpy(rows).to(ctx.device)
        return []

    def __call__(self, ctx: TrainContext, batch: Any) -> StepLoss:
        model: Any = unwrap_model(ctx.model)
        check_batch(batch)
        captions, lengths = check_captions(batch.captions, batch.lengths)
        with ctx.autocast():
            img = model.image_levels(batch.features)
            given = None if self.table is None else self.table[batch.img_index]
            txt = model.text_levels(captions, lengths, labels=given)
        ids = pair_ids(batch)
        inputs = StepInputs(captions=self.captions(ctx, batch), epoch=ctx.epoch, step=ctx.step)
        wide = torch.float32
        try:
            total = self.kl_weight * concept_kl(img.weights.to(wide), txt.weights.to(wide))
            for weight, level in zip(self.levels, LEVELS, strict=True):
                if weight:
                    a, b = getattr(img, level).to(wide), getattr(txt, level).to(wide)
                    total = total + weight * pair_loss(ctx.loss_fn, a @ b.t(), ids, inputs)
        except (ValueError, FloatingPointError) as err:
            self.explain_non_finite(ctx, batch, None, None, err)
            raise
        with torch.no_grad():
            rows = model.token_lengths(lengths).to(txt.fused.device)
            sim = model.score(img.rows().detach(), txt.rows().detach(), rows).to(wide)
        logged = total.detach()
        return self.scaled(ctx, total, logged), logged, {"sim": sim, "ids": ids}


def _weights(options: dict[str, Any]) -> tuple[tuple[float, float, float], float]:
    unknown = sorted(set(options) - {"levels", "kl_weight", "labels"})
    if unknown:
        raise ValueError(
            f"train.procedure_options.{unknown[0]}: unknown option of the cvse procedure; "
            "valid: kl_weight, labels, levels"
        )
    levels = options.get("levels", list(DEFAULT_LEVELS))
    if (
        not isinstance(levels, (list, tuple))
        or len(levels) != 3
        or any(isinstance(x, bool) or not isinstance(x, (int, float)) or x < 0 for x in levels)
        or not any(levels)
    ):
        raise ValueError(
            "train.procedure_options.levels: three non-negative weights (fused, instance, "
            f"consensus), not all 0, expected, got {levels!r}"
        )
    kl = options.get("kl_weight", DEFAULT_KL_WEIGHT)
    if isinstance(kl, bool) or not isinstance(kl, (int, float)) or kl < 0:
        raise ValueError(f"train.procedure_options.kl_weight: a number >= 0 expected, got {kl!r}")
    return (float(levels[0]), float(levels[1]), float(levels[2])), float(kl)


@register_procedure("cvse")
def build(config: RunConfig) -> LossStep:
    """The ``"cvse"`` procedure; options ``levels`` ([3, 5, 1]), ``kl_weight`` (2) and
    ``labels`` (``"image"``)."""
    options = dict(config.train.procedure_options or {})
    levels, kl = _weights(options)
    return CVSEStep(levels=levels, kl_weight=kl, labels=options.get("labels", "image"))


__all__ = [
    "LABEL_SOURCES",
    "CVSEStep",
    "DEFAULT_KL_WEIGHT",
    "DEFAULT_LEVELS",
    "build",
    "concept_kl",
]
