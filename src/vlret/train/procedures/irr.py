"""IRRA's training step (``train.procedure = "irr"``; a config whose loss has the part ``mlm``,
IRRA's ``name = "sdm+mlm+id"``, gets it by default): the captions masked, one forward of the
model's CLIP towers and its IRR encoder, and the loss given the encoder's predictions
(docs/person_search.md, "Implicit relation reasoning").

Each step masks the batch's caption ids with IRRA's rule
(:func:`vlret.models.irr.mask_caption_tokens`) from a generator seeded by ``(train.seed,
epoch, step)``, so a resumed run masks as the run it continues; runs the images through the
vision tower once (their embeddings and their tokens), the captions through the text tower,
the masked captions once more for their tokens, and ``model.irr`` over the two
(:func:`vlret.models.irr.irr_forward`); then hands the loss ``mlm_logits`` and ``mlm_labels``
besides the embeddings and the pairs' ids (``sdm`` and ``id`` read those, ``mlm`` the former).
The step log gets ``mlm_acc`` (IRRA's: the share of masked tokens whose highest score is the
original id) on its logging steps.

The step calls the model's methods, not a DistributedDataParallel forward: it trains in one
process (IRRA's single-GPU setting), without gradient caching, a ring exchange or a momentum
encoder; each of those is refused by name.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..._modules import unwrap_model
from ...models.irr import irr_forward, mask_caption_tokens
from ...run.config import RunConfig
from ..context import TrainContext
from ..hooks.core import TrainHook
from ..loss_step import LossStep, StepLoss, pair_ids
from .registry import register_procedure


def step_generator(seed: int, epoch: int, step: int) -> torch.Generator:
    """The masking draws' generator of one step: a function of ``(seed, epoch, step)``."""
    state = np.random.SeedSequence([seed % 2**63, epoch, step]).generate_state(2, np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


class IRRStep(LossStep):
    """The loss of one batch with IRRA's masked-language part (see the module docstring)."""

    name = "irr"
    #: Why the dev loss is not computed (:func:`vlret.train.dev_loss.dev_loss_skipped`).
    dev_loss_note = (
        'train.procedure "irr" masks the training captions at random; the dev split has no '
        "masked-token loss"
    )

    def hooks(self, ctx: TrainContext) -> list[TrainHook]:
        """Checks the run can train IRR: a two-tower model with ``model.irr``, a loss that
        reads its predictions, one process, no gradient cache, ring exchange or momentum
        encoder."""
        model = unwrap_model(ctx.model)
        if getattr(model, "irr", None) is None or ctx.scores_pairs:
            raise ValueError(
                'train.procedure "irr": the loss part "mlm" needs IRRA\'s cross-modal '
                'encoder: set model.irr = true (a kind = "clip" model)'
            )
        if "mlm_logits" not in ctx.loss_fn.step_inputs():
            raise ValueError(
                'model.irr: IRRA\'s cross-modal encoder is trained by the loss part "mlm" '
                '(loss.name = "sdm+mlm+id"); add it or set model.irr = false'
            )
        refused = {
            "torchrun (one process only)": ctx.world_size > 1,
            "train.grad_cache_chunk": ctx.grad_cache is not None,
            "train.exchange": ctx.exchange != "gather",
            "train.momentum_encoder": ctx.momentum_encoder is not None,
        }
        for what, on in refused.items():
            if on:
                raise ValueError(f'train.procedure "irr" does not run with {what}')
        return []

    def __call__(self, ctx: TrainContext, batch: Any) -> StepLoss:
        model: Any = unwrap_model(ctx.model)
        captions, lengths = batch.captions, batch.lengths
        generator = step_generator(ctx.config.train.seed, ctx.epoch, ctx.step)
        masked, labels = mask_caption_tokens(
            captions.cpu(),
            lengths.cpu(),
            mask_token_id=model.irr.mask_token_id,
            special_ids=model.irr.special_ids,
            generator=generator,
        )
        masked, labels = masked.to(captions.device), labels.to(captions.device)
        with ctx.autocast():
            img, txt, logits = irr_forward(model, batch, masked)
        wide = torch.promote_types(img.dtype, torch.float32)
        img, txt = img.to(wide), txt.to(wide)
        ids = pair_ids(batch)
        try:
            loss = ctx.loss_fn(img, txt, ids, ids, mlm_logits=logits, mlm_labels=labels)
        except (ValueError, FloatingPointError) as err:
            self.explain_non_finite(ctx, batch, img, txt, err)
            raise
        logged = loss.detach()
        out: dict[str, Any] = {"img": img.detach(), "txt": txt.detach(), "ids": ids}
        held = (logits.detach(), labels)
        out["stats"] = lambda: {"mlm_acc": masked_accuracy(*held)}
        return self.scaled(ctx, loss, logged), logged, out


def masked_accuracy(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """The share of masked positions (``labels >= 0``) whose highest score is the label."""
    kept = labels >= 0
    if not bool(kept.any()):
        return float("nan")
    return float((logits.argmax(dim=-1)[kept] == labels[kept]).float().mean())


@register_procedure("irr")
def build(config: RunConfig) -> LossStep:
    """The ``"irr"`` procedure; it takes no ``train.procedure_options``."""
    if config.train.procedure_options:
        keys = ", ".join(sorted(config.train.procedure_options))
        raise ValueError(f"train.procedure_options: the irr procedure takes none, got {keys}")
    return IRRStep()


__all__ = ["IRRStep", "build", "masked_accuracy", "step_generator"]
