"""The trainer's path for models that score pairs themselves (SCAN, BFAN, SGRAF).

Such a model (a ``PairScorer``, :mod:`vlret.models.cross_model`) maps a batch to its
``(B, B)`` score matrix; the loss consumes it through ``from_similarity(sim, pos_mask, ...)``
with the positives of the batch's image indices, plus whatever else the loss declares in
``LossCapabilities.similarity_inputs`` (VSL: ``img_ids`` and ``txt_ids``, to look up its
semantic matrix) and in ``step_inputs()`` (VSL's ``text_side``: the batch's captions), from one
:class:`~vlret.losses.StepInputs` (:meth:`vlret.losses.PairLoss.similarity_step`). What
needs embeddings cannot work on a score matrix and is refused before any data is read
(:func:`check_pair_scoring`): a tiled loss (``loss.chunk_size``, the tile height of the
embedding path; a nested loss's ``chunk_size`` too), gradient caching
(``train.grad_cache_chunk``) and a memory queue of embeddings (a loss that ``owns_queue``
with its parameters but whose ``from_similarity`` takes no queue similarities). AdaCL's
``queue_size`` instead sizes the bank of encoded regions and words of
:mod:`vlret.train.procedures.pair_bank`, which the momentum encoder (``train.momentum_encoder``)
fills (required with it). Validation scores the dev pairs with :mod:`vlret.eval`
(:func:`pair_dev_metrics`). The distributed contract is in
:mod:`vlret.train.parallel.distributed` ("Pair scorers").
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from .._modules import unwrap_model
from ..eval import encode_tokens, score_matrix
from ..losses import StepInputs
from ..losses._base import LossCapabilities, PairLoss
from ..losses.registry import loss_capabilities, loss_class, loss_parameters
from ..metrics import retrieval_metrics_from_similarity, similarity_stats
from ..models import PairScorer
from .config import ConfigError, RunConfig


def scores_pairs(model: nn.Module) -> bool:
    """Whether ``model`` (or the model a DDP wrapper holds) is a
    :class:`~vlret.models.PairScorer`, which returns a score matrix instead of
    ``(img_emb, txt_emb)``."""
    return isinstance(unwrap_model(model), PairScorer)


def check_pair_scoring(config: RunConfig) -> None:
    """Raise a :class:`ConfigError` naming the key of a setting that needs embeddings, which a
    pair-scoring model does not produce."""
    why = "the model scores pairs itself (model.kind {kind!r}) and gives the loss a score matrix"
    why = why.format(kind=config.model.get("kind"))
    if config.train.grad_cache_chunk is not None:
        raise ConfigError(
            config.source,
            "train.grad_cache_chunk",
            f"gradient caching back-propagates per-item embeddings, but {why} (cross-attention "
            "couples each image with each caption); remove grad_cache_chunk",
        )
    name, params = config.loss.name, config.loss.params
    try:
        cls = loss_class(name)
    except ValueError:
        return  # an unknown loss name: the loss section's own check reports it
    if cls.dense is None and cls.from_similarity is PairLoss.from_similarity:
        raise ConfigError(config.source, "loss.name", f"{name} has no from_similarity, but {why}")
    caps = loss_capabilities(name, params)
    tiled = [("chunk_size", params.get("chunk_size"))]
    # a loss configured inside this one (``base_params``) is called on the score matrix too
    tiled += [(f"{k}.chunk_size", v.get("chunk_size")) for k, v in params.items() if _nested(v)]
    for key, value in tiled:
        if value is not None:
            raise ConfigError(
                config.source,
                f"loss.{key}",
                f"a tiled loss works on embeddings, but {why}; remove chunk_size",
            )
    if (
        caps.owns_queue
    ):  # AdaCL's queue_size: the bank of encodings (vlret.train.procedures.pair_bank)
        key = f"loss.{_switched_on_by(name, params, lambda c: c.owns_queue)}"
        if not _takes_extra_negatives(cls):
            raise ConfigError(
                config.source,
                key,
                f"the memory queue holds embeddings, but {why}; configure the loss without one",
            )
        if config.train.momentum_encoder is None:
            raise ConfigError(
                config.source,
                key,
                f"{why}: its memory bank holds the momentum encoder's regions and words; set "
                "train.momentum_encoder (AdaCL: 0.99), or queue_size = 0",
            )


#: The keyword arguments of a ``from_similarity`` that takes a queue's similarities (AdaCL).
EXTRA_NEGATIVES = ("extra_neg_txt", "extra_neg_img", "extra_neg_txt_mask", "extra_neg_img_mask")


def _takes_extra_negatives(cls: type[PairLoss]) -> bool:
    """The loss's ``from_similarity`` takes a queue's similarities (:data:`EXTRA_NEGATIVES`)."""
    params = inspect.signature(cls.from_similarity).parameters
    return all(name in params for name in EXTRA_NEGATIVES)


def _nested(value: Any) -> bool:
    """A table of parameters of a loss configured inside the loss (``base_params``)."""
    return isinstance(value, dict)


def _switched_on_by(
    name: str, params: dict[str, Any], declares: Callable[[LossCapabilities], bool]
) -> str:
    """The configured parameter of loss ``name`` without which (at its default) the loss would
    not declare a capability (AdaCL's ``queue_size`` for ``owns_queue``); ``"name"`` when the
    loss declares it with its defaults."""
    defaults = loss_parameters(name)
    for key in (k for k in params if k in defaults):
        if not declares(loss_capabilities(name, {**params, key: defaults[key]})):
            return key
    return "name"


def pair_loss(
    loss_fn: PairLoss, sim: torch.Tensor, ids: torch.Tensor, inputs: StepInputs | None = None
) -> torch.Tensor:
    """The loss of a ``(B, B)`` score matrix whose row and column ``i`` come from the item of
    image index ``ids[i]`` (equal ids: further positives): ``loss_fn.similarity_step`` with the
    ids and whatever else of the step ``inputs`` holds (the captions a loss declares)."""
    inputs = StepInputs() if inputs is None else inputs
    return loss_fn.similarity_step(sim, replace(inputs, img_ids=ids, txt_ids=ids))


def score_stats(sim: torch.Tensor, ids: torch.Tensor) -> dict[str, float]:
    """The per-step log's ``pos_sim`` (mean score of the batch's pairs) and ``hardest_neg_sim``
    (mean hardest non-matching score, both directions), in the model's score units."""
    diagonal = torch.arange(sim.shape[1], device=sim.device)
    return similarity_stats(sim, txt_to_img=diagonal, pos_mask=ids[:, None] == ids[None, :])


def dev_metrics_from_scores(sim: torch.Tensor, txt_to_img: Any) -> dict[str, float]:
    """Model-selection metrics from a pair-scoring model's ``(N_img, N_txt)`` score matrix: the
    retrieval metrics, ``pos_sim`` and ``hardest_neg_sim``
    (:func:`~vlret.metrics.similarity_stats`), in the model's own score units (not cosines)."""
    out: dict[str, Any] = retrieval_metrics_from_similarity(sim, txt_to_img).as_dict()
    out.update(similarity_stats(sim, txt_to_img=txt_to_img))
    return out


def pair_dev_metrics(
    model: nn.Module, dataset: Any, *, batch_size: int, device: torch.device
) -> dict[str, float]:
    """Dev metrics of a pair-scoring model: every dev image and caption encoded once, every
    pair scored (:func:`vlret.eval.score_matrix`)."""
    regions, texts = encode_tokens(model, dataset, batch_size=batch_size, device=device)
    sim = score_matrix(model, regions, texts, device=device)
    return dev_metrics_from_scores(sim, torch.as_tensor(dataset.txt_to_img))


__all__ = [
    "EXTRA_NEGATIVES",
    "check_pair_scoring",
    "dev_metrics_from_scores",
    "pair_dev_metrics",
    "pair_loss",
    "score_stats",
    "scores_pairs",
]
