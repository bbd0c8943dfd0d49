"""The dev loss: the training loss on the dev split, every epoch, beside the retrieval metrics
(Unified Fig. 3a plots it against epochs), and the trainer's standard validation that computes
both from one encoding of the dev split.

Definition (``dev_loss`` in the epoch records of ``metrics.jsonl``; ``train.dev_loss = false``
turns it off):

* **Pairs.** Every caption of the dev split with its image (caption-level pairs, as the
  training set's items), in a fixed order that does not change between epochs, so epochs are
  comparable: by default ``"round"``, the first caption of every image (in image order), then
  the second of every image, and so on. A block then holds distinct images as a shuffled
  training batch does; the split's own order (``"split"``, the other reading) would put an
  image's ``k`` captions side by side, ``k - 1`` further positives in every row of a block.
* **Blocks.** Consecutive blocks of ``train.batch_size`` pairs. With ``train.drop_last`` (the
  default) a last partial block is dropped, as training never sees a batch of that size,
  unless it is the only block (a dev split smaller than one batch is one block); a last block
  of a single pair (no negatives) is dropped in any case.
* **The loss of a block** is what a training step computes: the run's loss module, in eval mode,
  without gradient, through ``forward_step`` (two-tower models) or ``similarity_step`` on the
  block's score matrix (pair-scoring models: :func:`vlret.run.pair_scoring.pair_loss`), with the
  ids a training step gives it (the image index, or the person identity on person search: equal
  ids are further positives) and the block's captions when the loss declares them.
  A loss with a warm-up (``train.all_negatives_epochs``) is evaluated in the definition of
  the epoch just trained.
* **dev_loss** is the mean of the blocks' losses weighted by their sizes (in float64).

No second encoding: a two-tower model's dev embeddings are the ones the retrieval metrics are
computed from (raw, as the loss receives them in training; float32, without autocast), a
pair-scoring model's scores the dev score matrix of its metrics. A row of a block is image
``txt_to_img[j]``'s embedding, which in eval mode is what the model gives that image in a
batch.

The loss is left as it was: everything a later step reads of it is its ``state_dict`` (the
trainer's exact resume relies on that), which is copied before and loaded back after (AdaCL's
margins, bookkeeping and random generator, memory queues, a learnable temperature that a
forward clamps); in eval mode AdaCL neither re-estimates its margins nor enqueues.

Not computed (``dev_loss`` null; the reason printed once per run): a training procedure other
than the standard step (NCR validates with its own two networks' scores, Meta-SPN weights its
pairs with a meta network, AOQ scores offline negatives of the training set: their step's
loss has no dev counterpart here), a loss that reads caption semantics fitted on the training
split (VSL, ``needs_semantics``), a loss holding a classifier over the training identities
(``id``: dev identities are other people), and any loss that refuses a dev block (its
``ValueError``, printed).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F

from .._modules import unwrap_model
from ..eval import encode_dataset, encode_tokens, score_matrix
from ..losses import PairLoss, StepInputs
from ..run.evaluate import dev_metrics
from ..run.pair_scoring import dev_metrics_from_scores, pair_loss
from .context import TrainContext
from .loss_step import LossStep

#: The pair orders of :func:`dev_pair_order`.
DEV_ORDERS = ("round", "split")


def dev_pair_order(txt_to_img: Any, *, order: str = "round") -> torch.Tensor:
    """The dev split's captions in the order their pairs are cut into blocks.

    Args:
        txt_to_img: ``(N_txt,)`` image index of each caption.
        order: ``"round"``: each image's first caption (images in split order), then each
            image's second, and so on; ``"split"``: the split's caption order.

    Returns:
        ``(N_txt,)`` long caption indices.

    Raises:
        ValueError: An unknown ``order``.
    """
    t2i = torch.as_tensor(txt_to_img, dtype=torch.long).reshape(-1)
    if order == "split":
        return torch.arange(t2i.numel())
    if order != "round":
        raise ValueError(f"order: expected one of {', '.join(DEV_ORDERS)}, got {order!r}")
    # captions grouped by image (split order within an image), then each one's rank there
    by_image = torch.sort(t2i, stable=True).indices
    grouped = t2i[by_image]
    starts = torch.ones_like(grouped, dtype=torch.bool)
    starts[1:] = grouped[1:] != grouped[:-1]
    position = torch.arange(t2i.numel())
    first = torch.cummax(torch.where(starts, position, torch.zeros_like(position)), dim=0).values
    # a stable sort by rank keeps the image order within each round
    return by_image[torch.sort(position - first, stable=True).indices]


def dev_blocks(num_pairs: int, batch_size: int, *, drop_last: bool) -> list[tuple[int, int]]:
    """``(start, stop)`` of consecutive blocks of ``batch_size`` pairs; with ``drop_last`` a
    last partial block is dropped unless it is the only one, and a last block of one pair
    (no negatives: a training step refuses it) is dropped in any case unless it is the only
    one."""
    if batch_size < 1:
        raise ValueError(f"batch_size: expected a positive integer, got {batch_size!r}")
    blocks = [(s, min(s + batch_size, num_pairs)) for s in range(0, num_pairs, batch_size)]
    last = blocks[-1][1] - blocks[-1][0] if blocks else 0
    if len(blocks) > 1 and (last == 1 or (drop_last and last < batch_size)):
        blocks.pop()
    return blocks


@contextmanager
def untouched(loss_fn: torch.nn.Module) -> Iterator[None]:
    """Run the body with ``loss_fn`` in eval mode and without gradient, then give it back its
    ``state_dict`` (a copy taken before) and its training mode."""
    saved = copy.deepcopy(loss_fn.state_dict())
    modes = [(m, m.training) for m in loss_fn.modules()]
    loss_fn.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        loss_fn.load_state_dict(saved)
        for module, training in modes:
            module.training = training


def _pair_ids(txt_to_img: torch.Tensor, image_ids: Any) -> torch.Tensor:
    """The id of each caption's pair: its image's id (``image_ids``), else its image index."""
    if image_ids is None:
        return txt_to_img
    return torch.as_tensor(image_ids, dtype=torch.long)[txt_to_img]


def _weighted_mean(values: Sequence[tuple[float, int]]) -> float:
    total = sum(n for _, n in values)
    if not total:
        return math.nan
    return math.fsum(v * n for v, n in values) / total


def _blocks_loss(
    loss_fn: PairLoss,
    block_loss: Callable[[torch.Tensor, torch.Tensor, StepInputs], torch.Tensor],
    txt_to_img: Any,
    batch_size: int,
    image_ids: Any,
    captions: Sequence[str] | None,
    drop_last: bool,
    order: str,
    device: torch.device | str,
    epoch: int,
    step: int,
) -> float:
    """The dev loss over the blocks of :func:`dev_blocks` in the order of
    :func:`dev_pair_order`, ``loss_fn`` :func:`untouched`: ``block_loss(images, captions,
    inputs)`` scores one block (the image and caption rows of its pairs; ``inputs.img_ids``
    holds the pairs' ids on ``device``), and the blocks' values are averaged weighted by their
    sizes (:func:`embedding_dev_loss`, :func:`score_dev_loss`)."""
    t2i = torch.as_tensor(txt_to_img, dtype=torch.long)
    pairs = dev_pair_order(t2i, order=order)
    ids = _pair_ids(t2i, image_ids)
    texts = captions if captions is not None and "captions" in loss_fn.step_inputs() else None
    values = []
    with untouched(loss_fn):
        for start, stop in dev_blocks(len(pairs), batch_size, drop_last=drop_last):
            cols = pairs[start:stop]
            inputs = StepInputs(
                img_ids=ids[cols].to(device),
                captions=None if texts is None else [texts[j] for j in cols.tolist()],
                epoch=epoch,
                step=step,
            )
            loss = block_loss(t2i[cols], cols, inputs)
            values.append((float(loss), stop - start))
    return _weighted_mean(values)


def embedding_dev_loss(
    loss_fn: PairLoss,
    img_emb: torch.Tensor,
    txt_emb: torch.Tensor,
    txt_to_img: Any,
    *,
    batch_size: int,
    image_ids: Any = None,
    captions: Sequence[str] | None = None,
    drop_last: bool = True,
    order: str = "round",
    device: torch.device | str | None = None,
    epoch: int = 0,
    step: int = 0,
) -> float:
    """The dev loss of a two-tower model (module docstring) from its dev embeddings.

    Args:
        loss_fn: The run's loss module (left untouched, :func:`untouched`).
        img_emb: ``(N_img, D)`` raw image embeddings (as the model returns them).
        txt_emb: ``(N_txt, D)`` raw caption embeddings.
        txt_to_img: ``(N_txt,)`` image index of each caption.
        batch_size: Pairs per block (``train.batch_size``).
        image_ids: ``(N_img,)`` id of each image (person search: the person), default the
            image index; equal ids are further positives.
        captions: The ``N_txt`` caption strings, handed to a loss that declares ``captions``.
        drop_last: Drop a last partial block (:func:`dev_blocks`).
        order: The pair order (:func:`dev_pair_order`).
        device: Where the loss runs (default: the embeddings').
        epoch: The epoch a step record would carry.
        step: The step a step record would carry.

    Returns:
        The block-size weighted mean of the blocks' losses (NaN when one is not finite).
    """
    wide = torch.promote_types(img_emb.dtype, torch.float32)
    device = img_emb.device if device is None else device

    def block_loss(images: torch.Tensor, cols: torch.Tensor, inputs: StepInputs) -> torch.Tensor:
        block_ids = inputs.img_ids
        inputs = dataclasses.replace(inputs, txt_ids=block_ids)
        img, txt = img_emb[images].to(device, wide), txt_emb[cols].to(device, wide)
        return loss_fn.forward_step(img, txt, inputs)

    return _blocks_loss(
        loss_fn,
        block_loss,
        txt_to_img,
        batch_size,
        image_ids,
        captions,
        drop_last,
        order,
        device,
        epoch,
        step,
    )


def score_dev_loss(
    loss_fn: PairLoss,
    sim: torch.Tensor,
    txt_to_img: Any,
    *,
    batch_size: int,
    image_ids: Any = None,
    captions: Sequence[str] | None = None,
    drop_last: bool = True,
    order: str = "round",
    device: torch.device | str | None = None,
    epoch: int = 0,
    step: int = 0,
) -> float:
    """The dev loss of a pair-scoring model (module docstring) from its dev score matrix.

    Args:
        loss_fn: The run's loss module (left untouched, :func:`untouched`).
        sim: ``(N_img, N_txt)`` scores of every dev image with every dev caption.
        txt_to_img: ``(N_txt,)`` image index of each caption.
        batch_size: Pairs per block (``train.batch_size``).
        image_ids: ``(N_img,)`` id of each image, default the image index.
        captions: The ``N_txt`` caption strings, handed to a loss that declares ``captions``.
        drop_last: Drop a last partial block (:func:`dev_blocks`).
        order: The pair order (:func:`dev_pair_order`).
        device: Where the loss runs (default: the matrix's).
        epoch: The epoch a step record would carry.
        step: The step a step record would carry.

    Returns:
        The block-size weighted mean of the blocks' losses: block rows are the images of its
        pairs, its columns their captions, ``B x B`` as a training step scores them.
    """
    wide = torch.promote_types(sim.dtype, torch.float32)
    device = sim.device if device is None else device

    def block_loss(images: torch.Tensor, cols: torch.Tensor, inputs: StepInputs) -> torch.Tensor:
        block_ids = inputs.img_ids
        assert block_ids is not None  # _blocks_loss sets them
        inputs = dataclasses.replace(inputs, img_ids=None)  # pair_loss takes the ids itself
        return pair_loss(loss_fn, sim[images][:, cols].to(device, wide), block_ids, inputs)

    return _blocks_loss(
        loss_fn,
        block_loss,
        txt_to_img,
        batch_size,
        image_ids,
        captions,
        drop_last,
        order,
        device,
        epoch,
        step,
    )


def dev_loss_skipped(loss_fn: PairLoss, loss_step: LossStep) -> str | None:
    """Why the dev loss of this run is not computed (module docstring), or ``None``."""
    if type(loss_step) is not LossStep:
        own = getattr(loss_step, "dev_loss_note", None)  # a step that says why itself
        return own or (
            f"train.procedure {loss_step.name!r} computes its own step's loss, which has no "
            "dev counterpart"
        )
    for module in loss_fn.modules():
        name = getattr(type(module), "registry_name", None)
        if isinstance(module, PairLoss) and module.current_capabilities().needs_semantics:
            return f"loss {name!r} reads caption semantics fitted on the training split"
        if isinstance(module, PairLoss) and module.current_capabilities().train_identities:
            return f"loss {name!r} classifies the training identities, which the dev split lacks"
    return None


class Validation:
    """The trainer's validation: a procedure's own (:meth:`LossStep.validate`) or the standard
    one, the dev metrics of :meth:`vlret.train.Trainer.validate` plus ``"loss"``, the dev loss
    (``None`` when not computed; the reason printed once).

    Args:
        ctx: The run in training (:class:`~vlret.train.context.TrainContext`).
        procedure: The run's training procedure (its own validation, if it has one, and what
            its step's loss means for the dev loss).
    """

    def __init__(self, ctx: TrainContext, *, procedure: LossStep) -> None:
        self.ctx = ctx
        self.procedure = procedure
        self.noted = False

    def note(self, reason: str) -> None:
        """Print why the dev loss is not computed, once per run."""
        if self.noted:
            return
        self.noted = True
        self.ctx.print(f"{self.ctx.config.source}: dev_loss not computed: {reason}")

    def reason(self) -> str | None:
        """Why the dev loss is not computed now (``None``: it is; ``"off"``: not asked)."""
        if not self.ctx.config.train.dev_loss:
            return "off"
        return dev_loss_skipped(self.ctx.loss_fn, self.procedure)

    def __call__(self) -> dict[str, float | None]:
        t = self.ctx
        own = self.procedure.validate(t)  # a procedure's own (NCR: both networks' scores)
        why = self.reason()
        if why not in (None, "off"):
            self.note(why)
        if own is not None:
            return {**own, "loss": None}
        size = t.config.train.eval_batch_size
        dev = t.dev_set
        common = {
            "batch_size": t.config.train.batch_size,
            "image_ids": dev.image_identity,
            "captions": dev.captions,
            "drop_last": t.config.train.drop_last,
            "device": t.device,
            "epoch": t.epoch,
            "step": t.step,
        }
        out: dict[str, float | None]
        if t.scores_pairs:  # in the model's score units, every dev pair scored
            regions, texts = encode_tokens(t.model, dev, batch_size=size, device=t.device)
            sim = score_matrix(t.model, regions, texts, device=t.device)
            out = {**dev_metrics_from_scores(sim, torch.as_tensor(dev.txt_to_img))}
            out["loss"] = (
                None if why else self.loss(score_dev_loss, sim, dev.txt_to_img, common=common)
            )
            return out
        # raw embeddings: the loss's inputs; the metrics use the model's own scoring
        img, txt = encode_dataset(t.model, dev, batch_size=size, device=t.device, normalize=False)
        cosine = unwrap_model(t.model).scoring == "cosine"
        out = {
            **dev_metrics(
                F.normalize(img, dim=1) if cosine else img,
                F.normalize(txt, dim=1) if cosine else txt,
                torch.as_tensor(dev.txt_to_img),
                image_identity=dev.image_identity,  # person search: identity_t2i_r1 ...
            )
        }
        args = (img, txt, dev.txt_to_img)
        out["loss"] = None if why else self.loss(embedding_dev_loss, *args, common=common)
        return out

    def loss(self, fn: Any, *args: Any, common: dict[str, Any]) -> float | None:
        """``fn(loss_fn, *args, **common)``; a loss that refuses a dev block: ``None``, noted."""
        try:
            return fn(self.ctx.loss_fn, *args, **common)
        except ValueError as err:
            self.note(f"the loss refused a dev block: {err}")
            return None


__all__ = [
    "DEV_ORDERS",
    "Validation",
    "dev_blocks",
    "dev_loss_skipped",
    "dev_pair_order",
    "embedding_dev_loss",
    "score_dev_loss",
    "untouched",
]
