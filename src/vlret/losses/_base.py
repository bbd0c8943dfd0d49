"""Machinery shared by the pair-similarity losses: input preparation, reductions, the module base.

Conventions (see ARCHITECTURE.md, "Core contract of a loss"):

* ``sim`` is ``(B, B)``, rows are images, columns are texts, ``sim[i, i]`` is anchor ``i``'s
  positive pair.
* ``pos_mask`` marks further true matches; they are neither negatives nor pulled. The diagonal
  is always positive.
* A loss computes per-anchor terms in both directions: the image-anchor term of row ``i`` and
  the text-anchor term of column ``i``. ``reduction="none"`` returns their sum per index ``i``,
  ``"mean"`` the mean of that ``(B,)`` vector and ``"sum"`` its sum.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from .._checks import (
    CHUNK_SIZE,
    FLAG,
    REDUCTION,
    ParamSpec,
    check_declared,
    check_embeddings,
    check_pos_mask,
    check_similarity,
    compute_dtype,
)
from ..similarity import Ids, cosine_similarity, positive_mask
from ._tiling import log1p_exp
from .step import StepInputs


def prepare(sim: torch.Tensor, pos_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate ``sim`` and ``pos_mask``; return ``sim`` in the compute dtype and the negatives.

    Half-precision inputs are computed in float32 (the gradient is cast back by autograd).
    """
    check_similarity(sim)
    positives = check_pos_mask(pos_mask, sim.shape[0], sim.device)
    return sim.to(compute_dtype(sim.dtype)), ~positives


def log1p_sum_exp(z: torch.Tensor, negatives: torch.Tensor, dim: int) -> torch.Tensor:
    """``log(1 + sum_{j in negatives} exp(z_j))`` along ``dim``, stably.

    Non-negatives are filled with the dtype's most negative finite value (never ``-inf``, whose
    arithmetic produces NaN gradients), so a row without negatives gives a graph-attached 0.
    """
    filled = z.masked_fill(~negatives, torch.finfo(z.dtype).min)
    return log1p_exp(filled.logsumexp(dim))


def reduce_per_index(
    per_index: torch.Tensor, reduction: str, batch: int | None = None
) -> torch.Tensor:
    """The one reduction of every loss.

    Args:
        per_index: The terms of each index (both directions summed).
        reduction: ``"none"`` (the terms), ``"sum"`` or ``"mean"``.
        batch: What ``"mean"`` divides by: the whole gathered batch for a shard's terms, so
            the shards' means add up to the batch mean (default: the number of terms).

    Returns:
        The reduced loss.
    """
    if reduction == "none":
        return per_index
    total = per_index.sum()
    if reduction == "sum":
        return total
    return total / (per_index.numel() if batch is None else batch)


def reduce_terms(img_terms: torch.Tensor, txt_terms: torch.Tensor, reduction: str) -> torch.Tensor:
    """Combine the image-anchor and text-anchor terms of each index and reduce."""
    return reduce_per_index(img_terms + txt_terms, reduction)


def init_args(frame: Mapping[str, Any]) -> dict[str, Any]:
    """A constructor's arguments, from ``locals()`` taken on its first line:
    ``TripletLoss.check_params(init_args(locals()))``."""
    return {k: v for k, v in frame.items() if k not in ("self", "__class__")}


@dataclass(frozen=True)
class LossCapabilities:
    """What a loss needs from the harness and what it offers, declared on its class.

    The harness (builders, config checks, the warm-up schedule, ``vlret compare``, the trainer)
    reads these through :func:`vlret.losses.loss_capabilities` instead of testing loss names.

    Attributes:
        local_shards: The tiled form (``chunk_size`` set) accepts ``shard=(start, stop)``: only
            the terms of pairs ``start:stop`` of a gathered batch (data-parallel training).
        all_negatives_warmup: :meth:`PairLoss.set_all_negatives` switches the loss between all
            negatives and the hardest (VSE-infinity's warm-up, ``train.all_negatives_epochs``).
        needs_semantics: The constructor needs ``semantic=``, a caption semantic model fitted
            on the training captions and keyed by image index (VSL).
        needs_embed_dim: The constructor needs ``embed_dim``, the model's embedding width (a
            memory queue's key width).
        owns_queue: The module holds a memory queue filled from every batch.
        momentum_keys: ``forward`` accepts ``img_keys=`` / ``txt_keys=`` from a momentum encoder.
        similarity_inputs: What :meth:`PairLoss.from_similarity` needs besides ``sim`` and
            ``pos_mask``, by keyword name, when a model that scores pairs supplies ``sim``.
        chunks_similarity: ``chunk_size`` also bounds :meth:`PairLoss.from_similarity`'s
            memory; otherwise it only selects the tiled embedding entry point.
        paper_comparison: Position in the default loss list of ``vlret compare`` (the papers'
            losses), ``None`` when the loss is not in it.
    """

    local_shards: bool = False
    all_negatives_warmup: bool = False
    needs_semantics: bool = False
    needs_embed_dim: bool = False
    owns_queue: bool = False
    momentum_keys: bool = False
    similarity_inputs: tuple[str, ...] = ()
    chunks_similarity: bool = False
    paper_comparison: int | None = None


class PairLoss(nn.Module):
    """Base of the losses on a ``(B, B)`` similarity matrix.

    ``loss(img_emb, txt_emb, img_ids=None, txt_ids=None)`` L2-normalises the embeddings (unless
    ``normalize=False``, then raw dot products are used), builds ``sim`` and, from the ids, the
    mask of further positives, and calls :meth:`from_similarity`. Passing only ``img_ids`` means
    each text carries the id of its paired image. Models that score pairs themselves (SCAN,
    SGRAF) call :meth:`from_similarity` directly.
    """

    #: The name :func:`~vlret.losses.registry.register_loss` registered the class under.
    registry_name: ClassVar[str]
    #: Short citation shown by ``vlret losses`` and the README table.
    paper: str = ""
    #: Equation(s) implemented.
    equation: str = ""
    #: The constraint of each constructor parameter this class adds (``vlret._checks``:
    #: ``Number``, ``Flag``, ``Choice``); :meth:`param_specs` merges those of the base classes.
    #: Read by the constructor and by ``registry.check_loss_params``, which checks a config's
    #: values without building the loss.
    params: ClassVar[Mapping[str, ParamSpec]] = {
        "reduction": REDUCTION,
        "normalize": FLAG,
        "chunk_size": CHUNK_SIZE,
    }

    @classmethod
    def param_specs(cls) -> dict[str, ParamSpec]:
        """Every declared parameter constraint, a subclass's overriding its bases'."""
        specs: dict[str, ParamSpec] = {}
        for klass in reversed(cls.__mro__):
            specs.update(vars(klass).get("params", {}))
        return specs

    @classmethod
    def check_params(cls, params: Mapping[str, Any]) -> None:
        """Check constructor ``params`` (names already known to be parameters) against the
        declarations, then their relations with the defaults filled in; raise
        ``vlret._checks.ParamError`` naming the parameter. Builds nothing."""
        check_declared(cls.param_specs(), params)
        signature = inspect.signature(cls.__init__).parameters.values()
        defaults = {p.name: p.default for p in signature if p.default is not p.empty}
        cls.check_param_relations({**defaults, **params})

    @classmethod
    def check_param_relations(cls, params: Mapping[str, Any]) -> None:
        """Constraints between parameters (all given, each already valid); none by default."""

    def __init__(
        self, *, reduction: str, normalize: bool = True, chunk_size: int | None = None
    ) -> None:
        super().__init__()
        check_declared(
            PairLoss.params,
            {"reduction": reduction, "normalize": normalize, "chunk_size": chunk_size},
        )
        self.reduction = reduction
        self.normalize = bool(normalize)
        #: With an int, the embedding entry point uses the family's tiled form (on the engine
        #: ``vlret.losses._tiling``, O(chunk_size x B) memory); ``from_similarity`` stays dense.
        self.chunk_size = chunk_size

    def similarity_and_mask(
        self,
        img_emb: torch.Tensor,
        txt_emb: torch.Tensor,
        img_ids: Ids | None = None,
        txt_ids: Ids | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        check_embeddings(img_emb, txt_emb)
        if self.normalize:
            sim = cosine_similarity(img_emb, txt_emb)
        else:
            sim = img_emb @ txt_emb.t()
        if img_ids is None and txt_ids is None:
            return sim, None
        if img_ids is None:
            raise ValueError("txt_ids given without img_ids; pass img_ids (and optionally txt_ids)")
        if txt_ids is None:
            txt_ids = img_ids
        batch = img_emb.shape[0]
        for name, ids in (("img_ids", img_ids), ("txt_ids", txt_ids)):
            if len(ids) != batch:
                raise ValueError(f"{name} must have one id per row ({batch}), got {len(ids)}")
        return sim, positive_mask(img_ids, txt_ids).to(sim.device)

    def forward(
        self,
        img_emb: torch.Tensor,
        txt_emb: torch.Tensor,
        img_ids: Ids | None = None,
        txt_ids: Ids | None = None,
        *,
        shard: tuple[int, int] | None = None,
    ) -> torch.Tensor:
        """The loss of a batch of embeddings.

        Args:
            img_emb: ``(B, D)`` image embeddings.
            txt_emb: ``(B, D)`` text embeddings; text ``i`` is image ``i``'s positive pair.
            img_ids: Optional ids of the images; equal ids mark further positives.
            txt_ids: Optional ids of the texts' images (default ``img_ids``).
            shard: ``(start, stop)`` with ``chunk_size`` set: only the terms of pairs
                ``start:stop`` of a gathered batch (``LossCapabilities.local_shards``).

        Returns:
            The reduced loss, or the ``(B,)`` (shard: ``(stop - start,)``) terms for
            ``reduction="none"``.

        Raises:
            ValueError: Bad shapes, ids or ``shard``.
        """
        self.check_shard(shard)
        if self.chunk_size is not None:
            return self.tiled_forward(img_emb, txt_emb, img_ids, txt_ids, shard=shard)
        sim, pos_mask = self.similarity_and_mask(img_emb, txt_emb, img_ids, txt_ids)
        return self.from_similarity(sim, pos_mask=pos_mask)

    def step_inputs(self) -> frozenset[str]:
        """The :class:`~vlret.losses.step.StepInputs` fields this module takes in
        :meth:`forward_step` besides the ids (read from its capabilities as built; a loss
        that needs more, e.g. VSL's captions, adds them)."""
        caps = self.current_capabilities()
        names: set[str] = set()
        if caps.local_shards and self.chunk_size is not None:
            names.add("shard")
        if caps.momentum_keys:
            names |= {"img_keys", "txt_keys"}
        if caps.owns_queue:
            names.add("gathered")
        return frozenset(names)

    def forward_step(
        self, img_emb: torch.Tensor, txt_emb: torch.Tensor, inputs: StepInputs
    ) -> torch.Tensor:
        """The loss of one training step: :meth:`forward` with the ids and the fields of
        ``inputs`` this loss declared in :meth:`step_inputs`.

        Raises:
            ValueError: An error of :meth:`forward`.
        """
        keywords = inputs.keywords(self.step_inputs())
        return self(img_emb, txt_emb, inputs.img_ids, inputs.txt_ids, **keywords)

    #: The capabilities of the class with its default parameters; a class whose capabilities
    #: depend on its parameters also overrides :meth:`capabilities`.
    declared: ClassVar[LossCapabilities] = LossCapabilities()

    @classmethod
    def capabilities(cls, params: Mapping[str, Any] | None = None) -> LossCapabilities:
        """The capabilities of this loss built with constructor ``params`` (defaults omitted).

        Args:
            params: Constructor parameters as configured; missing ones take their defaults.

        Returns:
            The declared :class:`LossCapabilities` (the class default ignores ``params``).
        """
        return cls.declared

    def current_capabilities(self) -> LossCapabilities:
        """The capabilities of this module as built (see :meth:`capabilities`)."""
        return type(self).declared

    @property
    def last_stats(self) -> dict[str, Any]:
        """Plain values to log after each training step (none by default)."""
        return {}

    def set_all_negatives(self, all_negatives: bool) -> None:
        """Switch between all negatives (``True``) and the hardest negative (``False``).

        VSE-infinity's warm-up (``train.all_negatives_epochs``); declared by
        ``LossCapabilities.all_negatives_warmup``. A loss configured with all negatives stays so.

        Raises:
            ValueError: The loss has no hardest-negative phase to warm up.
        """
        raise ValueError(
            f"{type(self).__name__} has no hardest-negative phase for an all-negatives warm-up"
        )

    def check_shard(self, shard: tuple[int, int] | None) -> None:
        """Raise ``ValueError`` when ``shard`` is given to a loss or a form that has none."""
        if shard is None:
            return
        if not self.current_capabilities().local_shards:
            raise ValueError(f"shard= is not supported by {type(self).__name__}")
        if self.chunk_size is None:
            raise ValueError("shard= needs the tiled form: set chunk_size")

    def tiled_arguments(
        self, img_ids: Ids | None, txt_ids: Ids | None, shard: tuple[int, int] | None
    ) -> dict[str, Any]:
        """The keyword arguments every family's tiled function takes from the module."""
        return {
            "img_ids": img_ids,
            "txt_ids": txt_ids,
            "chunk_size": self.chunk_size,
            "reduction": self.reduction,
            "normalize": self.normalize,
            "shard": shard,
        }

    def tiled_forward(
        self,
        img_emb: torch.Tensor,
        txt_emb: torch.Tensor,
        img_ids: Ids | None,
        txt_ids: Ids | None,
        shard: tuple[int, int] | None = None,
    ) -> torch.Tensor:
        """The embedding entry point with ``chunk_size`` set (the family's tiled form)."""
        raise ValueError(f"{type(self).__name__} has no tiled form; use chunk_size=None")

    def from_similarity(
        self, sim: torch.Tensor, pos_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        raise NotImplementedError


class FunctionLoss(PairLoss):
    """A module whose loss is one pure function of ``sim`` and its hyper-parameters.

    A subclass sets ``function`` (the pure function, called as ``function(sim, **hyper,
    pos_mask=..., reduction=...)``) and, in its explicit keyword-only constructor, calls
    ``self.keep(init_args(locals()))``: the arguments are checked against the declared
    constraints and each hyper-parameter becomes an attribute of the same name.
    :meth:`from_similarity` and the ``repr`` follow from them.
    """

    function: ClassVar[Callable[..., torch.Tensor]]

    def keep(self, arguments: Mapping[str, Any]) -> None:
        """Check the constructor's ``arguments``, set up the base, keep the hyper-parameters.

        Raises:
            vlret._checks.ParamError: An argument outside its declared constraint, named.
        """
        type(self).check_params(arguments)
        base = {k: arguments[k] for k in ("reduction", "normalize", "chunk_size") if k in arguments}
        PairLoss.__init__(self, **base)
        self.hyperparameters = tuple(k for k in arguments if k not in base)
        for name in self.hyperparameters:
            value = arguments[name]
            if isinstance(value, int | float) and not isinstance(value, bool):
                value = float(value)
            setattr(self, name, value)

    def from_similarity(
        self, sim: torch.Tensor, pos_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        hyper = {name: getattr(self, name) for name in self.hyperparameters}
        return self.function(sim, **hyper, pos_mask=pos_mask, reduction=self.reduction)

    def extra_repr(self) -> str:
        hyper = ", ".join(f"{name}={getattr(self, name)}" for name in self.hyperparameters)
        return f"{hyper}, reduction={self.reduction!r}"
