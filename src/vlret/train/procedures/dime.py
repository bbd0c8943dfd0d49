"""DIME's objective with its path regulariser (``train.procedure = "dime"``): the run's loss on
the ``(B, B)`` scores of a ``kind = "dime"`` model plus ``trade_off`` times the release's path
loss (:mod:`vlret.models.matchers.dime`).

The authors' release (``LgQu/DIME`` ``model.py`` ``DIME.train_emb``) trains

    L = L_rank + trade_off * L_path,   L_path = sum (P P^T - T T^T)^2 / B,

``L_rank`` VSE++'s hardest-negative hinge (here whatever loss the run names), ``P`` the 36
path probabilities of every pair averaged over the batch's captions (i2t; one row per image)
or images (t2i; one row per caption), mapped by ``path_mapping`` (36 -> ``path_hidden``) and
L2-normalised, ``T`` the frozen BERT's last layer averaged over the ``max_words`` positions,
detached and L2-normalised, of the batch's captions (item ``i``'s caption labels item ``i``'s
image), and ``trade_off`` 0.5 (``train.procedure_options.trade_off``).

The step calls the model's methods in one process (torchrun, gradient caching, ring exchanges
and a momentum encoder are refused by name; AdaCL's memory bank is the ``pair_bank``
procedure's, which the registry does not combine with another). The step log's ``sim`` is the
batch's scores; ``path_loss`` is logged on its own.
"""

from __future__ import annotations

from typing import Any

import torch

from ..._modules import unwrap_model
from ...losses import StepInputs
from ...models.text import check_batch, check_captions
from ...run.config import RunConfig
from ...run.pair_scoring import pair_loss
from ..context import TrainContext
from ..hooks.core import TrainHook
from ..loss_step import LossStep, StepLoss, pair_ids
from .registry import register_procedure

#: The release's weight of the path loss (``--trade_off``).
DEFAULT_TRADE_OFF = 0.5


def path_loss(sim_paths: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``sum (sim_paths - labels labels^T)^2 / B``: the release's path loss of ``(B, B)`` path
    cosines against ``(B, H)`` unit label vectors."""
    target = labels @ labels.t()
    return (sim_paths - target).square().sum() / labels.shape[0]


class DIMEStep(LossStep):
    """One step of DIME's objective (see the module docstring).

    Args:
        trade_off: Weight of the path loss.
    """

    name = "dime"
    #: Why the dev loss is not computed (:func:`vlret.train.dev_loss.dev_loss_skipped`).
    dev_loss_note = (
        'train.procedure "dime" adds the path loss to the ranking loss; the dev loss is one '
        "loss of one score matrix"
    )

    def __init__(self, *, trade_off: float = DEFAULT_TRADE_OFF) -> None:
        self.trade_off = trade_off

    def hooks(self, ctx: TrainContext) -> list[TrainHook]:
        """Checks the run can train the path loss: a dime model with ``path_mapping``, one
        process."""
        model = unwrap_model(ctx.model)
        interaction = getattr(model, "interaction", None)
        if getattr(interaction, "path_mapping", None) is None:
            raise ValueError(
                'train.procedure "dime": needs a kind = "dime" model with model.path_hidden set '
                f"(128 in the release), got {type(model).__name__}"
            )
        refused = {
            "torchrun (one process only)": ctx.world_size > 1,
            "train.grad_cache_chunk": ctx.grad_cache is not None,
            "train.exchange": ctx.exchange != "gather",
            "train.momentum_encoder": ctx.momentum_encoder is not None,
        }
        for what, on in refused.items():
            if on:
                raise ValueError(f'train.procedure "dime" does not run with {what}')
        return []

    def __call__(self, ctx: TrainContext, batch: Any) -> StepLoss:
        model: Any = unwrap_model(ctx.model)
        check_batch(batch)
        captions, lengths = check_captions(batch.captions, batch.lengths)
        paths: list[torch.Tensor] = []
        with ctx.autocast():
            images = model.encode_images(batch.features)
            texts, labels = model.text_encoder.encode(captions, lengths)
            rows = model.token_lengths(lengths).to(texts.device)
            sim = model.score(images, texts, rows, paths_out=paths)
        ids = pair_ids(batch)
        inputs = StepInputs(captions=self.captions(ctx, batch), epoch=ctx.epoch, step=ctx.step)
        wide = torch.float32
        try:
            sim_paths = model.interaction.path_similarity(paths[0].to(wide))
            extra = path_loss(sim_paths, labels.to(wide))
            total = pair_loss(ctx.loss_fn, sim.to(wide), ids, inputs) + self.trade_off * extra
        except (ValueError, FloatingPointError) as err:
            self.explain_non_finite(ctx, batch, None, None, err)
            raise
        logged = total.detach()
        held = extra.detach()
        extras: dict[str, Any] = {"sim": sim.detach().to(wide), "ids": ids}
        extras["stats"] = lambda: {"path_loss": float(held)}
        return self.scaled(ctx, total, logged), logged, extras


def _trade_off(options: dict[str, Any]) -> float:
    unknown = sorted(set(options) - {"trade_off"})
    if unknown:
        raise ValueError(
            f"train.procedure_options.{unknown[0]}: unknown option of the dime procedure; "
            "valid: trade_off"
        )
    value = options.get("trade_off", DEFAULT_TRADE_OFF)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(
            f"train.procedure_options.trade_off: a number >= 0 expected, got {value!r}"
        )
    return float(value)


@register_procedure("dime")
def build(config: RunConfig) -> LossStep:
    """The ``"dime"`` procedure; option ``trade_off`` (0.5)."""
    return DIMEStep(trade_off=_trade_off(dict(config.train.procedure_options or {})))


__all__ = ["DEFAULT_TRADE_OFF", "DIMEStep", "build", "path_loss"]
