"""Visual Semantic Loss and the smooth rank it is built on (VSL paper Eq. 4-7).

VSL ("Image-text Retrieval via Preserving Main Semantics of Vision", Zhang et al.) asks the
ranking of each image's text similarities (a row of ``sim``) to agree with the ranking of that
image's semantic similarity to the other images of the batch, measured on their captions
(:class:`vlret.semantic.CaptionTfidf`, Eq. 3). Both matrices become smooth rank matrices
(Eq. 4) and the loss is one minus the mean min/max ratio of the two ranks (Eq. 5).

Rank orientation. Eq. (4) as printed, ``1 + sum_k Omega(m_ij - m_ik)``, counts the
entries *below* ``m_ij`` (the largest entry gets rank about ``n``); the authors' released code
and Smooth-AP (the paper's ref. [20]) count the entries *above* (the largest gets rank about
1). The two are not equivalent under Eq. (5): a min/max ratio changes far more between ranks 1
and 2 (0.5) than between ranks 127 and 128 (0.99), so whichever end is ranked 1 dominates the
loss. ``descending=True`` (the default) ranks the largest entry 1, so the loss concentrates on
the top of each ranking, which is what retrieval is scored on; ``descending=False`` is Eq. (4)
exactly as printed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn

from .._checks import (
    FLAG,
    NON_NEGATIVE,
    POSITIVE,
    Choice,
    ParamError,
    check_finite,
    check_positive,
    check_reduction,
    check_similarity,
    compute_dtype,
)
from ..similarity import Ids
from ._base import LossCapabilities, PairLoss, naming_embeddings, prepare, reduce_terms
from .deprecated import OLD_PARAMETERS
from .params import LossParams, param
from .registry import (
    available_losses,
    build_loss,
    check_loss_params,
    loss_capabilities,
    loss_parameters,
    register_loss,
)
from .vsl_rank import KERNELS, RANK_BLOCK, _rank_block, native_rank_disagreement, smooth_rank


def _semantic_matrix(c: object, name: str, like: torch.Tensor) -> torch.Tensor:
    if not isinstance(c, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(c).__name__}")
    if tuple(c.shape) != tuple(like.shape):
        raise ValueError(
            f"{name} must have shape {tuple(like.shape)} like sim (one row and column per "
            f"batch item), got {tuple(c.shape)}"
        )
    if not c.dtype.is_floating_point:
        raise ValueError(f"{name} must be floating point, got dtype {c.dtype}")
    check_finite(c, name)
    # The semantic side is a fixed target: no gradient flows into it.
    return c.detach().to(device=like.device, dtype=like.dtype)


def _rank_disagreement(
    s: torch.Tensor,
    c: torch.Tensor,
    tau: float,
    descending: bool,
    rank_block: int | None,
    kernel: str,
) -> torch.Tensor:
    """Per row ``i``: ``1 - mean_j min(sr_ij, cr_ij) / max(sr_ij, cr_ij)`` (ranks are >= 1)."""
    fused = native_rank_disagreement(s, c, tau=tau, descending=descending, kernel=kernel)
    if fused is not None:
        return fused
    with torch.no_grad():
        cr = smooth_rank(c, tau=tau, descending=descending, rank_block=rank_block, kernel=kernel)
    # Semantic ranks first: their block is freed before the similarity's is allocated.
    sr = smooth_rank(s, tau=tau, descending=descending, rank_block=rank_block, kernel=kernel)
    ratio = torch.where(sr <= cr, sr / cr, cr / sr)
    return 1.0 - ratio.mean(dim=1)


def visual_semantic_loss(
    sim: torch.Tensor,
    semantic_sim: torch.Tensor,
    *,
    tau: float = 0.001,
    descending: bool = True,
    text_semantic_sim: torch.Tensor | None = None,
    reduction: str = "mean",
    rank_block: int | None = None,
    chunk_size: int | None = None,
    kernel: str = "auto",
) -> torch.Tensor:
    """Visual semantic loss, VSL Eq. (5), optionally plus the text-side loss Eq. (7):

        L_vs = 1 - 1/n^2 * sum_{i,j} min(sr_ij, cr_ij) / max(sr_ij, cr_ij)

    with ``sr = smooth_rank(sim)`` and ``cr = smooth_rank(semantic_sim)`` row by row (Eq. 4).
    ``L_ts`` (Eq. 7) is the same comparison between the rows of ``sim.T`` (each text's image
    similarities) and ``text_semantic_sim``; the paper's ablation (Table IV) found ``L_vs``
    alone better. The loss lies in ``[0, 1)`` per side and is 0 when the rank matrices agree.
    It takes no ``pos_mask``: a second caption of the same image has the same semantic row.

    Args:
        sim: ``(B, B)`` image-text similarities.
        semantic_sim: The ``(B, B)`` image-image matrix ``C`` of Eq. (3), a constant target:
            ``C[i, j]`` is the semantic similarity between image ``i`` and the image of text
            ``j``.
        tau: The smooth rank's temperature (:func:`smooth_rank`).
        descending: Rank the largest entry 1 (:func:`smooth_rank`).
        text_semantic_sim: The ``(B, B)`` caption-caption matrix ``TC``; adds ``L_ts``.
        reduction: Per index ``i`` the term is ``1 - mean_j ratio`` of row ``i`` plus that of
            text ``i`` (when ``text_semantic_sim`` is given): ``"mean"`` is then exactly
            ``L_vs (+ L_ts)``, ``"sum"`` is ``B`` times it and ``"none"`` the ``(B,)`` terms.
        rank_block: Rows per smooth-rank block (:func:`smooth_rank`).
        chunk_size: The deprecated name of ``rank_block`` (a DeprecationWarning).
        kernel: The smooth rank's implementation, ``"auto"``, ``"native"`` or ``"torch"``
            (:func:`smooth_rank`).

    Returns:
        The loss: a scalar, or ``(B,)`` with ``reduction="none"``.

    Raises:
        ValueError: A bad ``sim``, a semantic matrix of another shape than ``sim``, not
            floating point or not finite, or a bad ``tau``, ``reduction``, ``rank_block`` or
            ``kernel``.
        RuntimeError: ``kernel="native"`` and the kernel is not available.
    """
    check_similarity(sim)
    check_positive(tau, "tau")
    check_reduction(reduction)
    rank_block = _rank_block(rank_block, chunk_size)
    s = sim.to(compute_dtype(sim.dtype))
    c = _semantic_matrix(semantic_sim, "semantic_sim", s)
    img_terms = _rank_disagreement(s, c, tau, descending, rank_block, kernel)
    if text_semantic_sim is None:
        txt_terms = torch.zeros((), dtype=s.dtype, device=s.device)
    else:
        tc = _semantic_matrix(text_semantic_sim, "text_semantic_sim", s)
        txt_terms = _rank_disagreement(s.t(), tc, tau, descending, rank_block, kernel)
    return reduce_terms(img_terms, txt_terms, reduction)


@dataclass(frozen=True, kw_only=True)
class VSLParams(LossParams):
    """Parameters of :class:`VisualSemanticLoss` (defaults: the paper's Table V, triplet base).

    ``semantic``, ``base`` and ``base_params`` are objects, checked by :meth:`check_relations`
    (``semantic`` by the constructor: a fitted ``CaptionTfidf``, built by the harness). The old
    name ``chunk_size`` of ``rank_block`` is accepted with a DeprecationWarning: VSL has no tiled
    form, and ``chunk_size`` means a tiled loss's tile height.
    """

    semantic: Any = param(
        None, None, "a fitted CaptionTfidf (built by the harness)", passed=False, config=False
    )
    base: str | nn.Module = param(
        "triplet", None, "the base loss, a registered name or a module", passed=False
    )
    base_params: dict[str, Any] | None = param(
        None, None, "the parameters of a base given by name", passed=False
    )
    alpha: float = param(1.0, NON_NEGATIVE, "the base's weight (0 skips the base)")
    beta: float = param(10.0, NON_NEGATIVE, "the VSL term's weight")
    tau: float = param(0.001, POSITIVE, "the smooth rank's temperature, in score units")
    descending: bool = param(True, FLAG, "rank the largest entry 1 (False: Eq. 4 as printed)")
    text_side: bool = param(False, FLAG, "add L_ts, Eq. 7 (needs the batch's captions)")
    rank_block: int | None = param(
        None, RANK_BLOCK, "rows per smooth-rank block (None: 4M pairwise terms)"
    )
    kernel: str = param(
        "auto", Choice(KERNELS), "the smooth rank's implementation (auto: native when it can)"
    )

    renamed = OLD_PARAMETERS["vsl"]  # chunk_size -> rank_block

    def check_relations(self) -> None:
        """Check ``base`` (a registered name other than ``"vsl"``, or a loss module) with its
        ``base_params`` (checked as that loss's) and ``reduction="none"`` on both terms or
        on neither.

        Raises:
            ParamError: Naming the parameter (``base_params.<name>`` for a base parameter).
        """
        base, base_params = self.base, self.base_params
        if isinstance(base, str):
            if base == "vsl":
                raise ParamError("base", "base must be another loss than 'vsl'")
            if base_params is not None and not isinstance(base_params, dict):
                got = type(base_params).__name__
                raise ParamError("base_params", f"base_params must be a dict, got {got}")
            try:
                check_loss_params(base, base_params or {})
            except ParamError as err:
                raise err.nested("base_params") from None
            except ValueError as err:  # an unknown loss name
                raise ParamError("base", f"base must be a registered loss name: {err}") from None
            defaults = loss_parameters(base)
            base_reduction = (base_params or {}).get("reduction", defaults.get("reduction"))
        elif isinstance(base, nn.Module) and callable(getattr(base, "from_similarity", None)):
            if base_params:
                raise ParamError(
                    "base_params", "base_params is only used when base is given by name"
                )
            base_reduction = getattr(base, "reduction", None)
        else:
            raise ParamError(
                "base",
                "base must be a registered loss name or a loss module with from_similarity(), "
                f"got {type(base).__name__}",
            )
        if (base_reduction == "none") != (self.reduction == "none"):
            raise ParamError(
                "reduction",
                "reduction='none' must be used by both terms: got reduction="
                f"{self.reduction!r} and a base with reduction={base_reduction!r}",
            )


@register_loss("vsl")
class VisualSemanticLoss(PairLoss):
    """``alpha * base + beta * VSL``, VSL Eq. (6) (and Eq. 7 with ``text_side=True``).

    The batch's ``C`` is looked up from the ids that also build the positive mask:
    ``C[i, j] = K(img_ids[i], txt_ids[j])``, the semantic similarity between row ``i``'s image
    and the image described by text ``j`` (``txt_ids`` defaults to ``img_ids``: text ``j`` of
    image ``j``). The fitted ``semantic`` is not module state (not in ``state_dict``): refit it
    on the training captions or restore it with :meth:`~vlret.semantic.CaptionTfidf.load`.

    The defaults ``alpha=1, beta=10`` (Table V) with the base's own ``"sum"`` and the VSL
    term's ``"mean"`` (Eq. 5) reproduce the paper's balance at its batch size of 128; the
    summed base grows with the batch size and Eq. (5) does not, so retune ``beta`` for other
    batch sizes or a mean-reduced base.

    The parameters are the fields of :class:`VSLParams`; more on some of them:

    * ``semantic``: may be ``None`` when every call passes ``semantic_sim`` (and, with
      ``text_side``, ``text_semantic_sim``).
    * ``base``: a registered name (built with ``base_params``) or a loss module with
      ``from_similarity(sim, pos_mask=...)``. Default: the hardest-negative triplet loss,
      margin 0.2, summed over the batch, as in the paper and its code.
    * ``tau``: an absolute gap in score units. Eq. (4) approximates a rank only while a row's
      scores spread over much more than ``n * tau``; within a few ``n * tau`` the VSL gradient
      grows like ``1 / tau``, unrelated to the base's. Choose it relative to the model's score
      spread (``docs/vsl.md``, "tau and the spread of the scores").
    * ``text_side``: Eq. (7), ``L = alpha L_base + beta (L_vs + L_ts)``; the texts' semantic
      matrix comes from the batch's ``captions`` or is passed as ``text_semantic_sim``.
    * ``reduction``: the VSL term's (the base keeps its own); ``"none"`` needs a base with
      reduction ``"none"`` too and gives ``alpha * base_i + beta * vsl_i``.
    * ``rank_block``: rows per smooth-rank block (:func:`smooth_rank`); ``chunk_size``, its old
      name, is accepted with a DeprecationWarning.
    * ``kernel``: ``"auto"`` runs the smooth rank through the fused native kernel on float32
      CPU tensors when it is available, ``"torch"`` always through PyTorch, ``"native"``
      insists on the kernel (:func:`smooth_rank`); the same numbers to float rounding.

    Raises:
        ValueError: ``semantic`` is not a fitted ``CaptionTfidf``, ``base`` is not a loss (or
            is ``"vsl"``), bad ``base_params``, only one term with reduction ``"none"``, or
            another parameter out of range (a ``ParamError`` naming it).
    """

    paper = "VSL (Zhang et al. 2023)"
    equation = "VSL Eq. (3)-(7)"
    # C is looked up from the ids
    declared = LossCapabilities(
        needs_semantics=True,
        similarity_inputs=("img_ids", "txt_ids"),
        paper_comparison=4,
    )
    Params = VSLParams
    config: VSLParams

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        c = self.config
        semantic = c.semantic
        if semantic is not None:
            from ..semantic import CaptionTfidf

            if not isinstance(semantic, CaptionTfidf):
                raise ValueError(
                    f"semantic must be a fitted CaptionTfidf, got {type(semantic).__name__}"
                )
            if not semantic.is_fitted:
                raise ValueError("semantic must be a fitted CaptionTfidf; call .fit(captions)")
        self.semantic = semantic
        # A module base is duck-typed (VSLParams.check_relations: it has from_similarity).
        self.base = (
            cast(PairLoss, c.base)
            if isinstance(c.base, nn.Module)
            else build_loss(c.base, **(c.base_params or {}))
        )

    @classmethod
    def capabilities(cls, params: Mapping[str, Any] | None = None) -> LossCapabilities:
        """The declared capabilities, with the all-negatives warm-up of the base loss.

        Args:
            params: The configured parameters (``base`` and ``base_params``; default the
                triplet base).
        """
        params = params or {}
        base = params.get("base", "triplet")
        warm = False
        if not isinstance(base, str):
            warm = loss_capabilities(base).all_negatives_warmup
        elif base != "vsl" and base in available_losses():
            base_params = params.get("base_params")
            base_params = base_params if isinstance(base_params, dict) else {}
            warm = loss_capabilities(base, base_params).all_negatives_warmup
        return dataclasses.replace(cls.declared, all_negatives_warmup=warm)

    def current_capabilities(self) -> LossCapabilities:
        """The capabilities as built: the warm-up is the built base's."""
        warm = loss_capabilities(self.base).all_negatives_warmup
        return dataclasses.replace(type(self).declared, all_negatives_warmup=warm)

    def set_all_negatives(self, all_negatives: bool) -> None:
        """Switch the base's negatives; ``L_vs`` (a ranking over all texts) is unchanged.

        Args:
            all_negatives: Sum over all negatives (``True``) or return to the configured mining.

        Raises:
            ValueError: The base has no all-negatives warm-up.
        """
        if not loss_capabilities(self.base).all_negatives_warmup:
            super().set_all_negatives(all_negatives)
        self.base.set_all_negatives(all_negatives)

    def step_inputs(self) -> frozenset[str]:
        """With ``text_side``, the batch's caption strings (Eq. 7's ``TC``)."""
        return super().step_inputs() | ({"captions"} if self.text_side else set())

    def forward(  # type: ignore[override]  # caption keywords instead of PairLoss's shard
        self,
        img_emb: torch.Tensor,
        txt_emb: torch.Tensor,
        img_ids: Ids | None = None,
        txt_ids: Ids | None = None,
        *,
        captions: list[str] | None = None,
        semantic_sim: torch.Tensor | None = None,
        text_semantic_sim: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """:meth:`from_similarity` of the embeddings' similarity, with the positive mask built
        from ``img_ids`` and ``txt_ids``; the keyword arguments are passed on to it.

        Args:
            img_emb: ``(B, D)`` image embeddings.
            txt_emb: ``(B, D)`` text embeddings, text ``i`` paired with image ``i``.

        Raises:
            ValueError: Bad embeddings or ids, or an error of :meth:`from_similarity`.
        """
        sim, pos_mask = self.similarity_and_mask(img_emb, txt_emb, img_ids, txt_ids)
        with naming_embeddings(sim, img_emb, txt_emb):
            return self.from_similarity(
                sim,
                pos_mask=pos_mask,
                img_ids=img_ids,
                txt_ids=txt_ids,
                captions=captions,
                semantic_sim=semantic_sim,
                text_semantic_sim=text_semantic_sim,
            )

    def from_similarity(  # type: ignore[override]  # its own keywords: ids, captions, matrices
        self,
        sim: torch.Tensor,
        pos_mask: torch.Tensor | None = None,
        *,
        img_ids: Ids | None = None,
        txt_ids: Ids | None = None,
        captions: list[str] | None = None,
        semantic_sim: torch.Tensor | None = None,
        text_semantic_sim: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The loss of a ``(B, B)`` similarity matrix, VSL Eq. (6) (Eq. 7 with ``text_side``).

        Args:
            sim: ``(B, B)`` image-text similarities, positives on the diagonal.
            pos_mask: ``(B, B)`` bool, further positives, for the base loss only.
            img_ids: The image id of each row; needed to look up ``C``.
            txt_ids: The id of the image of each column's text (default ``img_ids``).
            captions: The ``B`` caption strings of the columns (``text_side`` without
                ``text_semantic_sim``).
            semantic_sim: ``(B, B)`` ``C`` for this batch, instead of the lookup.
            text_semantic_sim: ``(B, B)`` ``TC`` for this batch (``text_side``).

        Returns:
            ``alpha * base + beta * VSL``: a scalar, or ``(B,)`` with ``reduction="none"``.

        Raises:
            ValueError: A bad ``sim`` or ``pos_mask``; no ``semantic`` and no
                ``semantic_sim``; ids or captions of another length than ``B``; ids unknown
                to ``semantic``.
        """
        prepare(sim, pos_mask)  # validate before the (costlier) lookups
        batch = sim.shape[0]
        if semantic_sim is None:
            semantic_sim = self._lookup_images(img_ids, txt_ids, batch, sim.device)
        if self.text_side and text_semantic_sim is None:
            text_semantic_sim = self._lookup_captions(captions, batch, sim.device)
        vsl = visual_semantic_loss(
            sim,
            semantic_sim,
            tau=self.tau,
            descending=self.descending,
            text_semantic_sim=text_semantic_sim if self.text_side else None,
            reduction=self.reduction,
            rank_block=self.rank_block,
            kernel=self.kernel,
        )
        if self.alpha == 0:
            return self.beta * vsl
        return self.alpha * self.base.from_similarity(sim, pos_mask=pos_mask) + self.beta * vsl

    def _lookup_images(
        self, img_ids: Ids | None, txt_ids: Ids | None, batch: int, device: torch.device
    ) -> torch.Tensor:
        """``C[i, j] = K(img_ids[i], txt_ids[j])``: row image vs the image of text ``j``."""
        if self.semantic is None:
            raise ValueError(
                "no semantic similarity: build the loss with semantic=<fitted CaptionTfidf> "
                "or pass semantic_sim"
            )
        if img_ids is None:
            raise ValueError("img_ids is required to look up the images' semantic similarity")
        if len(img_ids) != batch:
            raise ValueError(f"img_ids must have one id per row ({batch}), got {len(img_ids)}")
        if txt_ids is not None and len(txt_ids) != batch:
            raise ValueError(f"txt_ids must have one id per column ({batch}), got {len(txt_ids)}")
        # txt_ids=None gives the square (symmetric) C of the images in img_ids.
        return self.semantic.similarity(
            img_ids, txt_ids, device=device, names=("img_ids", "txt_ids")
        )

    def _lookup_captions(
        self, captions: list[str] | None, batch: int, device: torch.device
    ) -> torch.Tensor:
        if captions is None:
            raise ValueError("text_side=True needs the batch's captions= or text_semantic_sim")
        if self.semantic is None:
            raise ValueError(
                "no caption vectorizer: build the loss with semantic=<fitted CaptionTfidf> "
                "or pass text_semantic_sim"
            )
        if isinstance(captions, str) or len(captions) != batch:
            got = "a string" if isinstance(captions, str) else len(captions)
            raise ValueError(f"captions must hold one caption per column ({batch}), got {got}")
        return self.semantic.caption_similarity(captions, device=device)

    def extra_repr(self) -> str:
        return self.config.describe(semantic=None if self.semantic is None else "fitted")
