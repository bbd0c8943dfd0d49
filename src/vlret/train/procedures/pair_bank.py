"""AdaCL's momentum memory bank for models that score pairs themselves (SCAN, BFAN, SGRAF):
the ``"pair_bank"`` training procedure.

A config gets it when its model scores pairs and its loss holds a memory queue
(``LossCapabilities.owns_queue``: AdaCL with ``loss.queue_size > 0``) and ``train.procedure``
is ``"standard"`` (the default), as :func:`~vlret.train.procedures.registry.build_procedure`
resolves it; naming ``train.procedure = "pair_bank"`` for another model or loss is refused with
one line naming the key, and so is another procedure for such a config (no other step fills a
pair scorer's bank). The run's start prints the bank's size and bytes, and ``vlret train
--check`` reports it.

The bank (:class:`~vlret.train.procedures.pair_memory.PairMemoryBank`) holds each past item's
encodings (an image's ``(R, D)`` regions, a caption's ``(W, D)`` words and its length, the
image id); AdaCL (Sec. 3.1, 4.1, A.9; its Table 12 trains SCAN with a bank of 2048 to 8192)
fills it, as MoCo does, from the momentum encoder (``train.momentum_encoder``, 0.99).

Each training step (:class:`PairBankStep`) encodes the batch, scores it as the standard step
does, then scores the current images against the queued captions ``(B, K)`` and the queued
images against the current captions ``(K, B)`` with the model's own ``score``
(:func:`~vlret.train.procedures.pair_memory.bank_scores`), and hands these to the loss's
``from_similarity`` as its ``extra_neg_txt`` / ``extra_neg_img`` with the masks of the entries
that are negatives (filled, and of another image than the row's), exactly as AdaCL's two-tower
queue hands its similarities. The batch's momentum encodings are enqueued after the optimiser
step (a hook), so the scores and their backward read the bank as it was before the step.

**Several processes** (torchrun). Every rank holds the same bank. Each rank encodes its ``B``
items, scores its images against every rank's captions (gathered as the standard step gathers
them, :mod:`vlret.train.parallel.distributed`, "Pair scorers") and its own images and captions
against the bank: ``(B, K)`` and ``(K, B)``. These blocks are gathered with their gradient into
the global ``(N*B, N*B)``, ``(N*B, K)`` and ``(K, N*B)`` scores, on which every rank computes
the whole loss; the model's gradients are averaged by hand
(:class:`~vlret.train.procedures.replicas.AverageReplicas`, the step calls the model's methods
rather than the DistributedDataParallel forward), so every rank holds the gradient of one
process on the concatenated batch. The momentum encodings of all ranks are gathered in rank
order and enqueued on every rank: the bank holds on every rank what one process holds (tested
with 2 gloo processes over several steps). Each rank scores ``2 x B x K`` queued pairs, so the
bank's cost is divided by the number of ranks; its memory is not (each rank holds all of it).
SGRAF in training mode normalises over the images of each call, which are the rank's own, as
for the standard step.

**Choices** (where the paper says nothing): the loss's own embedding queues (AdaCL's
``img_queue`` / ``txt_queue``, which the score-matrix path never reads) are dropped;
``loss.queue_size`` sizes the bank instead. The procedure takes no ``train.procedure_options``.
The bank is the procedure's state in a checkpoint (``procedure["pair_bank"]``, as before the
procedure had its own name).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import torch
from torch import nn

from ..._modules import unwrap_model
from ...losses import loss_capabilities
from ...models.pair_scorer import PairScoringModel
from ...models.text import check_batch, check_captions
from ...run.config import ConfigError, RunConfig
from ..context import TrainContext
from ..hooks.core import StepOutput, TrainHook
from ..loss_step import LossStep, StepLoss, pair_ids
from ..parallel.distributed import gather_no_grad, gather_tokens, gather_with_grad
from .pair_memory import DEFAULT_BLOCK_PAIRS, PairMemoryBank, bank_loss, bank_scores, positive_int
from .registry import register_procedure
from .replicas import AverageReplicas

#: The procedure's name (``train.procedure``) and its state's key in a checkpoint.
NAME = "pair_bank"


class EnqueueAfterStep(TrainHook):
    """Writes the step's momentum encodings into the bank after the optimiser step."""

    def __init__(self, step: PairBankStep) -> None:
        self.step = step

    def after_step(self, ctx: TrainContext, step: StepOutput) -> None:
        self.step.flush()


class PairBankStep(LossStep):
    """The standard step of a pair scorer with AdaCL's memory bank (see the module doc).

    The bank is built when the trainer asks for the procedure's hooks (:meth:`hooks`): the
    loss's ``queue_size`` entries shaped by the model's encodings of one training item and the
    longest training caption (:func:`build_bank`); a bank given here is used as it is.

    Args:
        bank: A bank to use instead of building one.
        block_pairs: Queued pairs per score call
            (:func:`~vlret.train.procedures.pair_memory.bank_scores`).
        checkpoint: Activation checkpointing of each block.

    Raises:
        ValueError: ``block_pairs`` is not a positive integer.
    """

    name = NAME
    #: Why ``dev_loss`` is null for these runs (:func:`vlret.train.dev_loss.dev_loss_skipped`).
    dev_loss_note = (
        "the pair scorer's memory bank (loss.queue_size) adds queued negatives to each step's "
        "loss, which a dev block has no counterpart of"
    )

    def __init__(
        self,
        *,
        bank: PairMemoryBank | None = None,
        block_pairs: int = DEFAULT_BLOCK_PAIRS,
        checkpoint: bool = True,
    ) -> None:
        self.bank = bank
        self.block_pairs = positive_int(block_pairs, "block_pairs")
        self.checkpoint = checkpoint
        self.pending: tuple[torch.Tensor, ...] | None = None

    def hooks(self, ctx: TrainContext) -> list[TrainHook]:
        """Checks the run fits the bank (a pair-scoring model, a loss with a queue), builds the
        bank on the run's device (its size printed; the loss's embedding queues dropped) and
        returns the hook that fills it, and under torchrun the one that averages the
        gradients.

        Raises:
            ConfigError: The model does not score pairs or the loss holds no queue (named
                ``train.procedure``).
        """
        config = ctx.config
        if not (ctx.scores_pairs and ctx.loss_caps.owns_queue):
            why = "a two-tower model" if not ctx.scores_pairs else "a loss without a queue"
            raise ConfigError(config.source, "train.procedure", misfit(config, why))
        if self.bank is None:
            self.bank = build_bank(ctx)
            ctx.print(f"{config.source}: {self.bank.describe()}")
        replicas: list[TrainHook] = [AverageReplicas()] if ctx.world_size > 1 else []
        return [*replicas, EnqueueAfterStep(self)]

    def ready_bank(self) -> PairMemoryBank:
        """The bank (built by :meth:`hooks`)."""
        if self.bank is None:
            raise RuntimeError("the pair bank is built by PairBankStep.hooks(ctx) before a step")
        return self.bank

    def state_dict(self) -> dict[str, Any]:
        return {NAME: self.ready_bank().state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if set(state) != {NAME}:
            raise ValueError(
                "the checkpoint holds no pair-scoring memory bank (procedure state "
                f"{sorted(state)}); it was trained without loss.queue_size"
            )
        self.ready_bank().load_state_dict(state[NAME])
        self.pending = None

    def flush(self) -> None:
        """Enqueue the last step's momentum encodings (once)."""
        if self.pending is not None:
            self.ready_bank().enqueue(*self.pending)
            self.pending = None

    def __call__(self, ctx: TrainContext, batch: Any) -> StepLoss:
        """The loss of the batch with the bank's scores as extra negatives; under torchrun of
        the global batch (module doc, "Several processes")."""
        bank = self.ready_bank()
        model = cast(PairScoringModel, unwrap_model(ctx.model))
        check_batch(batch)
        captions, lengths = check_captions(batch.captions, batch.lengths)
        with ctx.autocast():  # the standard step's forward, its encodings kept
            regions = model.encode_images(batch.features)
            words = model.encode_texts(captions, lengths)
            rows = model.token_lengths(lengths).to(words.device)
            every_words, every_rows = gather_tokens(words, rows)  # as they are in one process
            sim = model.score(regions, every_words, every_rows)  # (B, N*B)
            to_txt, to_img = bank_scores(
                model,
                regions,
                words,
                rows,
                bank,
                block_pairs=self.block_pairs,
                checkpoint=self.checkpoint,
            )
            momentum = ctx.momentum_encoder  # the config check: a momentum encoder
            assert momentum is not None
            keys = cast(PairScoringModel, momentum.module)
            with torch.no_grad():
                k_regions = keys.encode_images(batch.features)
                k_words = keys.encode_texts(captions, lengths)
                k_rows = keys.token_lengths(lengths).to(k_words.device)
        wide = torch.promote_types(sim.dtype, torch.float32)
        sim, to_txt, to_img = sim.to(wide), to_txt.to(wide), to_img.to(wide)
        # row blocks of each rank stacked in rank order (the batch itself in one process)
        sim = gather_with_grad(sim)
        if to_txt.shape[1]:  # the same K on every rank: the same bank
            to_txt = gather_with_grad(to_txt)
            to_img = gather_with_grad(to_img.t().contiguous()).t()  # each rank's columns
        else:
            to_txt = sim.new_zeros((sim.shape[0], 0))
            to_img = to_txt.t()
        ids = gather_no_grad(pair_ids(batch))
        try:
            loss = bank_loss(ctx.loss_fn, sim, ids, to_txt, to_img, bank)
        except (ValueError, FloatingPointError) as err:
            self.explain_non_finite(ctx, batch, None, None, err)
            raise
        with torch.no_grad():  # every rank enqueues every rank's keys, in rank order
            k_words, k_rows = gather_tokens(k_words, k_rows)
            self.pending = (gather_no_grad(k_regions), k_words, k_rows, ids)
        used = {"bank_entries": int(to_txt.shape[1])}  # the entries this step scored
        ctx_out = {"sim": sim.detach(), "ids": ids, "stats": lambda: used}
        return self.scaled(ctx, loss, loss.detach()), loss.detach(), ctx_out


def misfit(config: RunConfig, why: str) -> str:
    """The one line refusing ``train.procedure = "pair_bank"`` for a run it does not fit."""
    return (
        f'"{NAME}" is the memory bank of a pair-scoring model (SCAN, BFAN, SGRAF) whose loss '
        f"holds a queue (loss.queue_size > 0); this run has {why} (model.kind "
        f"{config.model.get('kind')!r}, loss.name {config.loss.name!r})"
    )


def build_bank(ctx: TrainContext) -> PairMemoryBank:
    """The bank of ``loss.queue_size`` entries for the run's model and training captions, on
    its device; the loss's own embedding queues (never read on the score-matrix path) are
    dropped."""
    loss_fn = ctx.loss_fn
    size = int(cast(Any, loss_fn).config.queue_size)
    for name in ("img_queue", "txt_queue"):
        if getattr(loss_fn, name, None) is not None:
            setattr(loss_fn, name, None)
    regions, dim, word_dim = encoding_shapes(ctx.model, ctx.train_set, ctx.device)
    words_max = longest_caption(ctx.train_set, ctx.encoder, ctx.model)
    return PairMemoryBank(size, regions, dim, words_max, word_dim=word_dim).to(ctx.device)


def longest_caption(train_set: Any, encoder: Any, model: nn.Module) -> int:
    """The most rows a training caption takes in the model (``token_lengths`` of the longest
    encoded caption): the bank's ``words_max``."""
    texts = getattr(train_set, "captions", None)
    if encoder is None or not isinstance(texts, Sequence) or not texts:
        raise ValueError("the memory bank of a pair scorer needs the training captions")
    longest = max(len(encoder.encode(t)) for t in texts)
    return int(
        cast(PairScoringModel, unwrap_model(model)).token_lengths(torch.tensor([longest]))[0]
    )


def encoding_shapes(model: nn.Module, train_set: Any, device: torch.device) -> tuple[int, int, int]:
    """``(R, D_region, D_word)`` of the model's encodings, from one training item."""
    scorer = cast(PairScoringModel, unwrap_model(model))
    batch = train_set.collate([train_set[0]]).to(device)
    was = scorer.training
    scorer.eval()
    try:
        with torch.no_grad():
            regions = scorer.encode_images(batch.features)
            captions, lengths = check_captions(batch.captions, batch.lengths)
            words = scorer.encode_texts(captions, lengths)
    finally:
        scorer.train(was)
    return int(regions.shape[1]), int(regions.shape[2]), int(words.shape[2])


@register_procedure(NAME)
def build(config: RunConfig) -> LossStep:
    """The pair bank's step with ``loss.queue_size`` entries (no ``train.procedure_options``).

    Raises:
        ConfigError: Options given, or a loss without a queue (named ``train.procedure``).
    """
    if config.train.procedure_options:
        keys = ", ".join(sorted(config.train.procedure_options))
        raise ConfigError(
            config.source, "train.procedure_options", f'"{NAME}" takes no options, got {keys}'
        )
    if not loss_capabilities(config.loss.name, config.loss.params).owns_queue:
        raise ConfigError(
            config.source, "train.procedure", misfit(config, "a loss without a queue")
        )
    return PairBankStep()


__all__ = [
    "NAME",
    "EnqueueAfterStep",
    "PairBankStep",
    "build",
    "build_bank",
    "encoding_shapes",
    "longest_caption",
    "misfit",
]
