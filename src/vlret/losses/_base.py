"""Machinery shared by the pair-similarity losses: input preparation, reductions, the module base.

Conventions (docs/design.md, "The core contract of a loss"):

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
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import torch
from torch import nn

from .._checks import (
    ParamSpec,
    check_embeddings,
    check_finite,
    check_pos_mask,
    check_similarity,
    compute_dtype,
)
from ..similarity import Ids, cosine_similarity, positive_mask
from ._tiling import log1p_exp
from .params import LossParams
from .step import EMBEDDING_INPUTS, StepInputs


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
        paper_comparison: Position in the default loss list of ``vlret compare`` (the papers'
            losses), ``None`` when the loss is not in it.
        pairwise_sum: The loss is a sum over independent image-text pairs (a term of each
            pair's score and whether it is a positive; no softmax, no batch statistic), and
            the module has ``pair_block_terms(img_emb, txt_emb, positives)``: each image
            row's sum of terms against one block of texts (``positives(start, stop)``, the
            bool ``z = +1`` entries of rows ``start:stop``). The ring exchange
            (``train.exchange``, :mod:`vlret.train.parallel.ring`) adds these blocks up (SigLIP).
        soft_margins: The loss can train with a margin per pair (NCR's soft margins): its
            ``from_similarity`` takes ``margins=`` (Unified), or it is the hinge loss whose
            per-anchor soft-margin form NCR's procedure computes
            (:func:`vlret.train.procedures.ncr.division.soft_margin_triplet`; Triplet).
        hinge_terms: The loss is a mean of per-anchor hinge terms over hardest negatives that a
            procedure may re-weight term by term (Meta-SPN's weighted triplet loss).
        offline_negatives: The loss reads each caption's offline negatives, mined before
            training (``data.offline_negatives``; AOQ): it trains with the ``"aoq"`` procedure.
        train_identities: The loss classifies the training split's identities (its classes
            are the training identities), so it has no value on a dev split (the ID loss).
        masked_language: The loss scores a cross-modal encoder's predictions of masked caption
            tokens (IRRA's ``mlm``), which the step passes as ``mlm_logits`` / ``mlm_labels``:
            it trains with the ``"irr"`` procedure and has no value on a dev split.
    """

    local_shards: bool = False
    all_negatives_warmup: bool = False
    needs_semantics: bool = False
    needs_embed_dim: bool = False
    owns_queue: bool = False
    momentum_keys: bool = False
    similarity_inputs: tuple[str, ...] = ()
    paper_comparison: int | None = None
    pairwise_sum: bool = False
    soft_margins: bool = False
    hinge_terms: bool = False
    offline_negatives: bool = False
    train_identities: bool = False
    masked_language: bool = False


def _signature(params: type[LossParams]) -> inspect.Signature:
    """The keyword-only constructor signature of a family, generated from its declaration."""
    keyword = inspect.Parameter.KEYWORD_ONLY
    return inspect.Signature(
        [
            inspect.Parameter(f.name, keyword, default=f.default, annotation=f.type)
            for f in params.fields()
        ]
    )


@contextmanager
def naming_embeddings(
    sim: torch.Tensor, img_emb: torch.Tensor, txt_emb: torch.Tensor
) -> Iterator[None]:
    """Around the loss of a score matrix built from embeddings: a ``ValueError`` raised while
    ``sim`` holds a NaN or inf names the embedding it came from (``img_emb contains NaN ...``)
    instead of ``sim``. The embeddings are checked only on that error, so a finite batch pays
    nothing for the name (:meth:`PairLoss.similarity_and_mask` leaves them unchecked)."""
    try:
        yield
    except ValueError:
        if not bool(torch.isfinite(sim).all()):
            check_finite(img_emb, "img_emb")
            check_finite(txt_emb, "txt_emb")
        raise


class PairLoss(nn.Module):
    """Base of the losses on a ``(B, B)`` similarity matrix.

    ``loss(img_emb, txt_emb, img_ids=None, txt_ids=None)`` L2-normalises the embeddings (unless
    ``normalize=False``, then raw dot products are used), builds ``sim`` and, from the ids, the
    mask of further positives, and calls :meth:`from_similarity`. Passing only ``img_ids`` means
    each text carries the id of its paired image. Models that score pairs themselves (SCAN,
    SGRAF) call :meth:`from_similarity` directly.

    A family declares, on its class:

    * ``Params``: its parameter declaration (a :class:`~vlret.losses.params.LossParams`
      dataclass). The constructor takes exactly its fields as keywords (the class's signature
      is generated from it) and keeps the checked record as ``config``; each hyper-parameter
      handed to the functions also reads as an attribute (``loss.margin``).
    * ``dense``: the pure function of ``sim``, called by :meth:`from_similarity` as
      ``dense(sim, **arguments, pos_mask=..., reduction=...)``.
    * ``tiled`` (optional): the tiled function of the embeddings, called by the embedding entry
      point when ``chunk_size`` (the tile height) is set.

    :meth:`arguments` is what both receive: the declared fields (``config.arguments()``); a
    family whose values change during training (a learnable temperature, a warm-up) overrides it.
    """

    #: The name :func:`~vlret.losses.registry.register_loss` registered the class under.
    registry_name: ClassVar[str]
    #: Short citation shown by ``vlret losses`` and the README table.
    paper: str = ""
    #: Equation(s) implemented.
    equation: str = ""
    #: The family's parameter declaration.
    Params: ClassVar[type[LossParams]] = LossParams
    #: The pure function on a similarity matrix (a ``staticmethod``).
    dense: ClassVar[Callable[..., torch.Tensor] | None] = None
    #: The tiled function on embeddings (a ``staticmethod``), or ``None``.
    tiled: ClassVar[Callable[..., torch.Tensor] | None] = None

    #: The checked parameters, an instance of ``Params``.
    config: LossParams

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.__signature__ = _signature(cls.Params)  # type: ignore[attr-defined]

    @classmethod
    def param_specs(cls) -> dict[str, ParamSpec]:
        """Every declared parameter constraint (``Params.specs()``)."""
        return cls.Params.specs()

    @classmethod
    def check_params(cls, params: Mapping[str, Any]) -> None:
        """Check constructor ``params`` against the declaration, relations included, with the
        defaults filled in; raise ``vlret._checks.ParamError`` naming the parameter. Builds
        nothing but the parameter record."""
        cls.Params.build(params, owner=f"loss {getattr(cls, 'registry_name', cls.__name__)!r}")

    def __init__(self, **params: Any) -> None:
        super().__init__()
        owner = f"loss {getattr(type(self), 'registry_name', type(self).__name__)!r}"
        self.config = type(self).Params.build(params, owner=owner)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            # a hyper-parameter handed to the functions reads as an attribute (loss.margin); the
            # module-only ones may name the module's own parameters (SigLIP's log_scale)
            config = self.__dict__.get("config")
            if config is not None and name in type(config).passed_names():
                return getattr(config, name)
            raise

    @property
    def reduction(self) -> str:
        return self.config.reduction

    @property
    def normalize(self) -> bool:
        return self.config.normalize

    @property
    def chunk_size(self) -> int | None:
        """The tile height of the tiled form, ``None`` for the dense form (and for a family
        without a tiled form)."""
        return getattr(self.config, "chunk_size", None)

    def arguments(self) -> dict[str, Any]:
        """The hyper-parameters handed to ``dense`` and ``tiled`` now."""
        return self.config.arguments()

    def similarity_and_mask(
        self,
        img_emb: torch.Tensor,
        txt_emb: torch.Tensor,
        img_ids: Ids | None = None,
        txt_ids: Ids | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        check_embeddings(img_emb, txt_emb, finite=False)  # forward names them if sim is not
        # half-precision embeddings are scored in float32, as the tiled form scores them
        dtype = compute_dtype(torch.promote_types(img_emb.dtype, txt_emb.dtype))
        img_emb, txt_emb = img_emb.to(dtype), txt_emb.to(dtype)
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
        **inputs: Any,
    ) -> torch.Tensor:
        """The loss of a batch of embeddings.

        Args:
            img_emb: ``(B, D)`` image embeddings.
            txt_emb: ``(B, D)`` text embeddings; text ``i`` is image ``i``'s positive pair.
            img_ids: Optional ids of the images; equal ids mark further positives.
            txt_ids: Optional ids of the texts' images (default ``img_ids``).
            shard: ``(start, stop)`` with ``chunk_size`` set: only the terms of pairs
                ``start:stop`` of a gathered batch (``LossCapabilities.local_shards``).
            **inputs: Further per-batch inputs of the family's functions (Unified's
                ``margins``, ``weights``).

        Returns:
            The reduced loss, or the ``(B,)`` (shard: ``(stop - start,)``) terms for
            ``reduction="none"``.

        Raises:
            ValueError: Bad shapes, ids or ``shard``.
        """
        self.check_shard(shard)
        if self.chunk_size is not None:
            return self.tiled_forward(img_emb, txt_emb, img_ids, txt_ids, shard=shard, **inputs)
        sim, pos_mask = self.similarity_and_mask(img_emb, txt_emb, img_ids, txt_ids)
        with naming_embeddings(sim, img_emb, txt_emb):
            return self.from_similarity(sim, pos_mask=pos_mask, **inputs)

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

    def similarity_step(self, sim: torch.Tensor, inputs: StepInputs) -> torch.Tensor:
        """The loss of one training step of a model that scores pairs itself (SCAN, SGRAF):
        :meth:`from_similarity` with the positive mask of the ids, the inputs the loss names in
        ``LossCapabilities.similarity_inputs`` and the declared :meth:`step_inputs` that are
        not about embeddings (VSL's ``captions``).

        Raises:
            ValueError: A declared input the record does not hold, or an error of
                :meth:`from_similarity`.
        """
        if inputs.txt_ids is None and inputs.img_ids is not None:  # txt_ids default: img_ids
            inputs = replace(inputs, txt_ids=inputs.img_ids)
        names = set(self.current_capabilities().similarity_inputs)
        names |= self.step_inputs() - EMBEDDING_INPUTS
        missing = sorted(n for n in names if getattr(inputs, n, None) is None)
        if missing:
            raise ValueError(f"{type(self).__name__} needs {missing} of the step, which are unset")
        pos_mask = None
        if inputs.img_ids is not None and inputs.txt_ids is not None:
            pos_mask = positive_mask(inputs.img_ids, inputs.txt_ids).to(sim.device)
        return self.from_similarity(sim, pos_mask, **{n: getattr(inputs, n) for n in names})

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

    def tiled_forward(
        self,
        img_emb: torch.Tensor,
        txt_emb: torch.Tensor,
        img_ids: Ids | None,
        txt_ids: Ids | None,
        shard: tuple[int, int] | None = None,
        **inputs: Any,
    ) -> torch.Tensor:
        """The embedding entry point with ``chunk_size`` set: ``tiled(img_emb, txt_emb,
        **arguments, **inputs, ...)`` with the tile height, ids, reduction, normalisation and
        shard.

        Raises:
            ValueError: The family has no tiled form, or an input only its dense form takes.
        """
        tiled = type(self).tiled
        if tiled is None:
            raise ValueError(f"{type(self).__name__} has no tiled form; use chunk_size=None")
        accepted = inspect.signature(tiled).parameters if inputs else {}
        for name, value in list(inputs.items()):
            if name not in accepted:
                if value is not None:
                    raise ValueError(f"{name} needs the dense form; use chunk_size=None")
                del inputs[name]
        return tiled(
            img_emb,
            txt_emb,
            **self.arguments(),
            **inputs,
            img_ids=img_ids,
            txt_ids=txt_ids,
            chunk_size=self.chunk_size,
            reduction=self.reduction,
            normalize=self.normalize,
            shard=shard,
        )

    def from_similarity(
        self, sim: torch.Tensor, pos_mask: torch.Tensor | None = None, **inputs: Any
    ) -> torch.Tensor:
        """The loss of a ``(B, B)`` similarity matrix: ``dense(sim, **arguments, **inputs,
        pos_mask=pos_mask, reduction=...)``."""
        dense = type(self).dense
        if dense is None:
            raise NotImplementedError(f"{type(self).__name__} declares no dense function")
        return dense(sim, **self.arguments(), **inputs, pos_mask=pos_mask, reduction=self.reduction)

    def extra_repr(self) -> str:
        return self.config.describe()


class HardestNegativeLoss(PairLoss):
    """A loss with a ``hardest`` parameter and VSE-infinity's all-negatives warm-up: while
    :meth:`set_all_negatives` is on, the loss runs with ``hardest=False`` (declare
    ``LossCapabilities.all_negatives_warmup``); a loss configured with ``hardest=False`` stays
    so. Triplet-HN, SSP and AOQ (``train.all_negatives_epochs``, :mod:`vlret.run.warmup`)."""

    #: In the warm-up (:meth:`set_all_negatives`): the form over all negatives.
    all_negatives: bool = False

    @property
    def hardest(self) -> bool:
        """The mining in use now: the configured one, or all negatives in the warm-up."""
        return bool(getattr(self.config, "hardest", True)) and not self.all_negatives

    def set_all_negatives(self, all_negatives: bool) -> None:
        self.all_negatives = bool(all_negatives)

    def arguments(self) -> dict[str, Any]:
        return {**super().arguments(), "hardest": self.hardest}
