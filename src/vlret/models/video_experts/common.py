"""Building blocks shared by the multi-expert video models (CE, MMT) and their base class.

* :class:`ContextGating`, :class:`GatedEmbeddingUnit`: Miech et al., "Learning a Text-Video
  Embedding from Incomplete and Heterogeneous Data" (MoEE, 2018), Eq. 1-2: ``y = x * sigmoid(W
  x + b)``; a gated embedding unit is a linear layer, context gating and L2 normalisation.
* :class:`NetVLAD`: Arandjelovic et al. (CVPR 2016) aggregation of a variable-length set of
  local features (words, frames), masked so that padding never contributes.
* :func:`mixture_weights`, :func:`mixture_scores`: the text-weighted sum over experts of CE
  (Liu et al., BMVC 2019, Eq. 4) and MMT (Gabeur et al., ECCV 2020, Eq. 6),
  ``s(v, t) = sum_e w_e(t | v) <v_e, t_e>`` with ``w(t | v)`` the softmax of the caption's
  mixture logits over the experts the video has.
* :class:`MultiExpertModel`: the pair-scoring model interface (a
  :class:`~vlret.models.PairScorer`) both models share; see its docstring for the encoded layouts.

An absent expert's features may hold anything (zeros, NaN, inf): every use of them goes
through ``torch.where`` on the presence mask (never a multiplication by zero), so they never
reach a present expert's embedding, a score or a gradient.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast, runtime_checkable

import torch
from torch import nn

from ..attention import NORM_EPS, positive_int
from ..pair_scorer import PairScoringModel
from ..text import check_captions


@runtime_checkable
class ExpertBatch(Protocol):
    """What the models read of a batch of videos' experts: :class:`vlret.data.ExpertBatch`
    (models and data are sibling layers, so the models name its shape, not its class).

    Attributes:
        names: The experts, in the batch's order.
        features: ``name -> (B, D_e)`` or ``(B, T_e, D_e)``.
        present: ``(B, E)`` bool.
        frames: ``(B, E)`` long, real frames per expert.
    """

    names: tuple[str, ...]
    features: dict[str, torch.Tensor]
    present: torch.Tensor
    frames: torch.Tensor


def l2norm(x: torch.Tensor) -> torch.Tensor:
    """``x / (||x|| + 1e-8)`` over the last dimension (the references' ``l2norm``), with the
    norm's gradient at a zero vector taken as 0 (``vector_norm``), so an empty NetVLAD
    descriptor or an all-zero row gives a zero vector and finite gradients."""
    return x / (torch.linalg.vector_norm(x, dim=-1, keepdim=True) + NORM_EPS)


def dropout_rate(value: Any, name: str) -> float:
    """``value`` as a dropout rate in ``[0, 1)``, else ``ValueError("name: ...")``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ValueError(f"{name}: must be a dropout rate in [0, 1), got {value!r}")
    return float(value)


def check_experts(experts: Any, name: str = "experts") -> dict[str, int]:
    """Validate an ordered ``expert name -> input dim`` mapping.

    Args:
        experts: The mapping (its order is the model's expert order).
        name: The config key, named in errors.

    Returns:
        A plain ``dict`` copy.

    Raises:
        ValueError: Not a non-empty mapping of names to positive ints.
    """
    if not isinstance(experts, Mapping) or not experts:
        raise ValueError(
            f"{name}: must be a non-empty table of expert name -> input dim, e.g. "
            f"{{appearance = 2048, audio = 128}}, got {experts!r}"
        )
    out = {}
    for key, dim in experts.items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"{name}: expert names must be non-empty strings, got {key!r}")
        out[key] = positive_int(dim, f"{name}.{key}")
    return out


class ContextGating(nn.Module):
    """``x * sigmoid(W x + b)`` (MoEE Eq. 2; CE's and MMT's ``ContextGating``).

    The references add a BatchNorm1d before the sigmoid; it is left out here because its
    batch statistics would mix videos (and absent experts) of a batch.

    Args:
        dim: Feature size.
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.fc = nn.Linear(positive_int(dim, "dim"), dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.fc(x))


class GatedEmbeddingUnit(nn.Module):
    """Linear -> :class:`ContextGating` -> L2 normalisation (MoEE Eq. 1-2).

    Args:
        in_dim: Input size.
        out_dim: Output size.
    """

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.fc = nn.Linear(positive_int(in_dim, "in_dim"), positive_int(out_dim, "out_dim"))
        self.cg = ContextGating(out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return l2norm(self.cg(self.fc(x)))


class NetVLAD(nn.Module):
    """Masked NetVLAD: ``(N, T, D)`` local features -> ``(N, K * D)``.

    Soft assignment ``a_tk = softmax_k(w_k . x_t + b_k)``; residuals
    ``V_k = sum_t m_t a_tk (x_t - c_k)`` over the real items ``m_t``; each ``V_k``
    L2-normalised (intra-normalisation), then the flattened vector (Arandjelovic et al. 2016,
    Eq. 1-4; CE's ``NetVLAD``, which adds a BatchNorm on the assignment logits: left out here,
    as in :class:`ContextGating`). A row without real items gives the zero vector.

    Args:
        dim: Size ``D`` of a local feature.
        clusters: Number ``K`` of clusters.
    """

    def __init__(self, dim: int, clusters: int) -> None:
        super().__init__()
        self.dim = positive_int(dim, "dim")
        self.clusters = positive_int(clusters, "clusters")
        self.assign = nn.Linear(dim, clusters)
        self.centroids = nn.Parameter(torch.randn(clusters, dim) / dim**0.5)
        nn.init.normal_(self.assign.weight, std=1 / dim**0.5)
        nn.init.zeros_(self.assign.bias)

    @property
    def out_dim(self) -> int:
        """``K * D``."""
        return self.clusters * self.dim

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Aggregate.

        Args:
            x: ``(N, T, D)`` local features (anything at padding, NaN included).
            mask: ``(N, T)`` bool, True at real items.

        Returns:
            The ``(N, K * D)`` L2-normalised descriptors.
        """
        m = mask.unsqueeze(-1)
        x = torch.where(m, x, torch.zeros((), dtype=x.dtype, device=x.device))
        a = torch.where(m, torch.softmax(self.assign(x), dim=-1), 0.0)  # (N, T, K)
        vlad = a.transpose(1, 2) @ x - a.sum(dim=1).unsqueeze(-1) * self.centroids  # (N, K, D)
        return l2norm(l2norm(vlad).flatten(1))


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``(N, T, D)`` -> ``(N, D)``: the mean over the real items (zero where there are none)."""
    m = mask.unsqueeze(-1)
    total = torch.where(m, x, torch.zeros((), dtype=x.dtype, device=x.device)).sum(dim=1)
    return total / mask.sum(dim=1, keepdim=True).clamp(min=1).to(x.dtype)


def masked_max(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``(N, T, D)`` -> ``(N, D)``: the maximum over the real items (zero where there are none)."""
    m = mask.unsqueeze(-1)
    low = torch.finfo(x.dtype).min
    top = torch.where(m, x, torch.full((), low, dtype=x.dtype, device=x.device)).amax(dim=1)
    return torch.where(mask.any(dim=1, keepdim=True), top, 0.0)


def mixture_weights(present: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """The mixture weights ``w_e(t | v)``: softmax of each caption's logits over the experts
    each video has (CE Eq. 4; renormalised over the present experts).

    Args:
        present: ``(n_v, E)`` bool, the experts each video has.
        logits: ``(n_t, E)`` mixture logits of each caption.

    Returns:
        ``(n_v, n_t, E)`` weights: 0 on absent experts, summing to 1 over the present ones (all
        0 for a video without experts).
    """
    present = present.bool()
    z = logits.unsqueeze(0).expand(present.shape[0], -1, -1)
    keep = present.unsqueeze(1).expand_as(z)
    z = torch.where(keep, z, torch.finfo(z.dtype).min)
    w = torch.softmax(z, dim=-1)
    return torch.where(keep, w, 0.0)


def mixture_scores(videos: torch.Tensor, texts: torch.Tensor) -> torch.Tensor:
    """``s(v, t) = sum_e w_e(t | v) <v_e, t_e>`` for every video x caption pair.

    Two matmuls: with ``u = exp(logit - max logit)`` per caption (``max`` over all its
    experts), the numerator is ``[v_1 .. v_E] @ [u_1 t_1 .. u_E t_E]^T`` over the flattened
    expert embeddings (absent experts zeroed by ``torch.where``) and the denominator
    ``present @ u^T``; their ratio is the renormalised softmax mixture. A video without any
    expert (denominator 0) scores 0.

    Args:
        videos: ``(n_v, E, D + 1)``: per-expert embeddings in ``[..., :D]``, presence (1.0 / 0.0)
            in channel ``D``.
        texts: ``(n_t, E, D + 1)``: per-expert embeddings in ``[..., :D]``, the raw mixture
            logits in channel ``D``.

    Returns:
        The ``(n_v, n_t)`` scores.

    Raises:
        ValueError: The shapes disagree.
    """
    if videos.dim() != 3 or texts.dim() != 3 or videos.shape[1:] != texts.shape[1:]:
        raise ValueError(
            "videos (n_v, E, D + 1) and texts (n_t, E, D + 1) must agree on E and D, got "
            f"{tuple(videos.shape)} and {tuple(texts.shape)}"
        )
    dtype = torch.promote_types(videos.dtype, texts.dtype)
    videos, texts = videos.to(dtype), texts.to(dtype)
    present = videos[..., -1] > 0
    v = torch.where(present.unsqueeze(-1), videos[..., :-1], 0.0)
    logits = texts[..., -1]
    u = torch.exp(logits - logits.amax(dim=1, keepdim=True))  # (n_t, E), max term 1
    t = texts[..., :-1] * u.unsqueeze(-1)
    num = v.flatten(1) @ t.flatten(1).t()
    den = present.to(dtype) @ u.t()
    return torch.where(den > 0, num / torch.where(den > 0, den, 1.0), 0.0)


@dataclass
class ExpertInputs:
    """A batch's experts in a model's order, padding and absent experts zeroed.

    Attributes:
        features: Per expert ``(N, T_e, D_e)`` (a pooled expert has ``T_e = 1``), zero at
            padding frames and wherever the expert is absent.
        masks: Per expert ``(N, T_e)`` bool, the real frames (all False where absent).
        present: ``(N, E)`` bool.
        temporal: Per expert, whether the data gave frames (``(N, T, D)``) or one vector.
    """

    features: list[torch.Tensor]
    masks: list[torch.Tensor]
    present: torch.Tensor
    temporal: list[bool]


def gather_experts(
    batch: ExpertBatch, in_dims: Mapping[str, int], *, device: torch.device, dtype: torch.dtype
) -> ExpertInputs:
    """Pick a model's experts out of an :class:`~vlret.data.ExpertBatch`, by name.

    Args:
        batch: The batch (any expert order; extra experts are ignored).
        in_dims: The model's ``expert -> input dim``, in its order.
        device: Where the model's parameters are.
        dtype: The model's float type.

    Returns:
        The :class:`ExpertInputs`.

    Raises:
        ValueError: ``batch`` is not an ExpertBatch, lacks one of the model's experts, or an
            expert's feature size differs from the model's.
    """
    if not isinstance(batch, ExpertBatch):
        raise ValueError(
            "features must be a vlret.data.ExpertBatch (multi-expert video features), got "
            f"{type(batch).__name__}; build the data set with data.experts"
        )
    missing = [n for n in in_dims if n not in batch.names]
    if missing:
        raise ValueError(
            f"experts: the model's expert {missing[0]!r} is not in the batch (it has "
            f"{list(batch.names)}); the data's experts must include every model expert"
        )
    feats, masks, temporal, present = [], [], [], []
    all_present = batch.present.to(device=device, dtype=torch.bool)
    for name, dim in in_dims.items():
        col = batch.names.index(name)
        x = batch.features[name].to(device=device, dtype=dtype)
        if x.dim() not in (2, 3) or x.shape[-1] != dim:
            raise ValueError(
                f"experts.{name}: the batch's features have shape {tuple(x.shape)}; the model "
                f"expects (N, {dim}) or (N, T, {dim})"
            )
        p = all_present[:, col]
        if x.dim() == 2:
            x, mask = x.unsqueeze(1), p.unsqueeze(1)
        else:
            steps = torch.arange(x.shape[1], device=device)
            count = batch.frames[:, col].to(device)
            mask = (steps[None, :] < count[:, None]) & p[:, None]
        feats.append(
            torch.where(mask.unsqueeze(-1), x, torch.zeros((), dtype=dtype, device=device))
        )
        masks.append(mask)
        temporal.append(batch.features[name].dim() == 3)
        present.append(p)
    return ExpertInputs(feats, masks, torch.stack(present, dim=1), temporal)


class MultiExpertModel(PairScoringModel):
    """A video encoder over named experts and a caption encoder with one embedding per expert,
    scored by the renormalised mixture (:func:`mixture_scores`); base of
    :class:`~vlret.models.video_experts.CollaborativeExperts` and
    :class:`~vlret.models.video_experts.MultiModalTransformer`.

    It is a pair scorer (:class:`~vlret.models.PairScorer`, like
    :class:`~vlret.models.cross_model.CrossAttentionModel`; ``forward`` is
    :class:`~vlret.models.pair_scorer.PairScoringModel`'s): :meth:`encode_images` gives
    ``(N, E, D + 1)`` per-expert video embeddings (L2-normalised, zero where absent) with the
    presence flag in channel ``D``; :meth:`encode_texts` gives ``(N, E, D + 1)`` per-expert
    caption embeddings with each expert's raw mixture logit in channel ``D``; the pair-scoring
    evaluation stores a caption's ``E`` rows as its "words" (:meth:`token_lengths`).

    Subclasses set ``image_encoder`` (``forward(ExpertInputs) -> (N, E, D)``, attribute
    ``in_dim``: ``expert -> input dim``) and ``text_encoder`` (``forward(captions, lengths) ->
    (embeddings (N, E, D), logits (N, E))``).

    Args:
        image_encoder: The video encoder.
        text_encoder: The caption encoder.
        embed_dim: ``D``.
        config: The resolved config the model was built from (kept as ``model.config``).
    """

    config_sections = ("kind", "experts", "text")

    def __init__(
        self,
        image_encoder: nn.Module,
        text_encoder: nn.Module,
        *,
        embed_dim: int,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(image_encoder, text_encoder, config=config)
        self.embed_dim = positive_int(embed_dim, "embed_dim")

    @property
    def experts(self) -> tuple[str, ...]:
        """The model's experts, in its order."""
        return tuple(self._in_dim)

    @property
    def _in_dim(self) -> dict[str, int]:
        """The video encoder's ``expert -> input dim`` (its attribute ``in_dim``)."""
        return cast("dict[str, int]", self.image_encoder.in_dim)

    def _param(self) -> torch.Tensor:
        return next(self.parameters())

    def encode_images(self, batch: ExpertBatch, lengths: Any = None) -> torch.Tensor:
        """Encode videos: ``ExpertBatch`` -> ``(N, E, D + 1)``.

        Args:
            batch: The videos' experts (moved to the model's device here).
            lengths: Ignored (the pair-scoring evaluation's signature).

        Returns:
            Per expert, in the model's order: the L2-normalised embedding in ``[..., :D]`` (zero
            where the video lacks the expert) and 1.0 / 0.0 presence in channel ``D``.

        Raises:
            ValueError: ``batch`` is not an ExpertBatch or lacks a model expert.
        """
        p = self._param()
        inputs = gather_experts(batch, self._in_dim, device=p.device, dtype=p.dtype)
        emb = self.image_encoder(inputs)
        present = inputs.present.unsqueeze(-1)
        emb = torch.where(present, emb, 0.0)
        return torch.cat([emb, present.to(emb.dtype)], dim=-1)

    def encode_texts(self, captions: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Encode captions: ``(N, L)`` ids -> ``(N, E, D + 1)``, each expert's L2-normalised
        embedding in ``[..., :D]`` and its raw mixture logit in channel ``D``.

        Raises:
            ValueError: The caption batch is malformed.
        """
        captions, lengths = check_captions(captions, lengths)
        device = self._param().device
        emb, logits = self.text_encoder(captions.to(device), lengths.to(device))
        return torch.cat([emb, logits.unsqueeze(-1).to(emb.dtype)], dim=-1)

    def token_lengths(self, lengths: torch.Tensor) -> torch.Tensor:
        """The rows :meth:`encode_texts` gives per caption: ``E`` each."""
        return torch.full_like(torch.as_tensor(lengths), len(self.experts))

    def mixture_weights(self, videos: torch.Tensor, texts: torch.Tensor) -> torch.Tensor:
        """``(n_v, n_t, E)`` mixture weights of encoded videos and captions
        (:func:`mixture_weights`), for inspection."""
        return mixture_weights(videos[..., -1] > 0, texts[..., -1])

    def score(
        self,
        videos: torch.Tensor,
        texts: torch.Tensor,
        lengths: torch.Tensor | Sequence[int] | None = None,
        *,
        max_elements: int | None = None,
    ) -> torch.Tensor:
        """Score encoded videos against encoded captions (:func:`mixture_scores`).

        Args:
            videos: ``(n_v, E, D + 1)`` from :meth:`encode_images`.
            texts: ``(n_t, E, D + 1)`` from :meth:`encode_texts`.
            lengths: ``(n_t,)`` rows per caption; must all be ``E`` when given.
            max_elements: Ignored (memory is ``O(n_v n_t + (n_v + n_t) E D)``).

        Returns:
            The ``(n_v, n_t)`` scores.

        Raises:
            ValueError: A shape disagrees with the model's experts and ``embed_dim``.
        """
        want = (len(self.experts), self.embed_dim + 1)
        for name, x in (("videos", videos), ("texts", texts)):
            if not isinstance(x, torch.Tensor) or x.dim() != 3 or tuple(x.shape[1:]) != want:
                got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
                raise ValueError(f"{name}: expected (n, {want[0]}, {want[1]}), got {got}")
        if lengths is not None and bool((torch.as_tensor(lengths) != want[0]).any()):
            raise ValueError(f"lengths: every caption has {want[0]} expert rows")
        return mixture_scores(videos, texts)


__all__ = [
    "ContextGating",
    "ExpertInputs",
    "GatedEmbeddingUnit",
    "MultiExpertModel",
    "NetVLAD",
    "check_experts",
    "gather_experts",
    "l2norm",
    "masked_max",
    "masked_mean",
    "mixture_scores",
    "mixture_weights",
]
