"""Collaborative Experts (Liu, Albanie, Nagrani, Zisserman, "Use What You Have: Video
Retrieval Using Representations From Collaborative Experts", BMVC 2019).

Video side, per expert ``e`` (:class:`CEVideoEncoder`):

1. temporal aggregation of a temporal expert: masked NetVLAD for the experts named in
   ``vlad_clusters`` (CE aggregates its variable-length experts, audio, speech and OCR, with
   NetVLAD: 16, 32 and 32 clusters in the released MSR-VTT config), the masked mean over the
   real frames otherwise (CE's ``avg`` for appearance, scene, motion, face); a pooled expert is
   used as given;
2. projection to the shared size ``D`` and L2 normalisation (the released code's
   ``ReduceDim``), ``p_e``;
3. collaborative gating (Sec. 3.2, Eq. 2-3): a pairwise MLP ``g([p_e, p_j])`` (two layers,
   ReLU) for each OTHER expert ``j`` the video has, reduced over ``j`` (``cg_reduce``: the
   released code's mean over the present pairs, or the paper's sum), a second MLP ``h``
   (two layers, ReLU) and a sigmoid give the gate ``T_e``; ``p_e * T_e``. Only present
   experts ``j`` contribute (``torch.where`` on the pair masks, never a multiplication);
4. a gated embedding unit per expert (linear, context gating, L2 normalisation).

Text side (:class:`CETextEncoder`): word embeddings (``nn.Embedding(vocab_size, word_dim)``),
masked NetVLAD over the words (``text_clusters``, 32 in the released MSR-VTT config), one
gated embedding unit per expert and a linear layer giving the mixture logits (softmax over
the experts the video has, :func:`~vlret.models.video_experts.common.mixture_scores`).

Hyper-parameters followed (released ``configs/msrvtt/train-full-ce.json``): shared size 512
(``embed_dim``), text NetVLAD 32 clusters, audio 16 / speech 32 / OCR 32 clusters, max-margin
ranking loss with margin 0.2 (``[loss] name = "triplet"``, ``hardest = false``).

Deviations: (a) no BatchNorm (the references put one in context gating, NetVLAD and the
gating MLPs); batch statistics mix the videos of a batch, and absent experts with them; (b) CE
fuses the collaborative gate into its video unit (``x * sigmoid(BN(W x) + BN(h))``); here the
gate and the gated embedding unit are applied one after the other, as the paper describes;
(c) word embeddings are learned from scratch (CE reads pretrained word2vec / GPT features;
initialise ``text_encoder.embed`` from vectors of your own to match).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from ..attention import positive_int
from ..image import lengths_to_mask
from .common import (
    ExpertInputs,
    GatedEmbeddingUnit,
    MultiExpertModel,
    NetVLAD,
    check_experts,
    l2norm,
    masked_mean,
)

CG_REDUCTIONS = ("mean", "sum")


class CollaborativeGating(nn.Module):
    """``T_e = sigmoid(h(reduce_{j present, j != e} g([p_e, p_j])))`` for every expert ``e``.

    Args:
        dim: Size ``D`` of the projected experts.
        reduce: ``"mean"`` (released code) or ``"sum"`` (paper Eq. 2) over the present ``j``.

    Raises:
        ValueError: ``reduce`` is unknown.
    """

    def __init__(self, dim: int, *, reduce: str = "mean") -> None:
        super().__init__()
        if reduce not in CG_REDUCTIONS:
            raise ValueError(f"cg_reduce: must be one of {list(CG_REDUCTIONS)}, got {reduce!r}")
        self.reduce = reduce
        self.dim = dim
        self.g1 = nn.Linear(2 * dim, dim)
        self.g2 = nn.Linear(dim, dim)
        self.h1 = nn.Linear(dim, dim)
        self.h2 = nn.Linear(dim, dim)

    def forward(self, p: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
        """The gates.

        Args:
            p: ``(N, E, D)`` projected experts (finite; zero where absent).
            present: ``(N, E)`` bool.

        Returns:
            ``(N, E, D)`` gates in (0, 1).
        """
        w = self.g1.weight
        left = F.linear(p, w[:, : self.dim], self.g1.bias)  # (N, E, D): the expert e
        right = F.linear(p, w[:, self.dim :])  # (N, E, D): its partner j
        pair = self.g2(F.relu(left.unsqueeze(2) + right.unsqueeze(1)))  # (N, E_e, E_j, D)
        n_exp = p.shape[1]
        other = ~torch.eye(n_exp, dtype=torch.bool, device=p.device)
        keep = present.unsqueeze(2) & present.unsqueeze(1) & other  # (N, E, E)
        total = torch.where(keep.unsqueeze(-1), pair, 0.0).sum(dim=2)
        if self.reduce == "mean":
            total = total / keep.sum(dim=2, keepdim=True).clamp(min=1).to(p.dtype)
        return torch.sigmoid(self.h2(F.relu(self.h1(total))))


class CEVideoEncoder(nn.Module):
    """CE's video side: ``ExpertInputs`` -> ``(N, E, D)`` L2-normalised expert embeddings.

    Args:
        experts: ``name -> input dim``, in the model's order.
        embed_dim: Shared size ``D``.
        vlad_clusters: ``name -> clusters`` of the temporal experts aggregated with NetVLAD
            (others are mean-pooled over their real frames).
        collaborative: Apply collaborative gating (False: projection + gated embedding unit
            only, MoEE-style; the CE paper's ablation).
        cg_reduce: :class:`CollaborativeGating`'s reduction.

    Raises:
        ValueError: An invalid size, or ``vlad_clusters`` names an expert the model lacks.
    """

    def __init__(
        self,
        experts: Mapping[str, int],
        *,
        embed_dim: int = 512,
        vlad_clusters: Mapping[str, int] | None = None,
        collaborative: bool = True,
        cg_reduce: str = "mean",
    ) -> None:
        super().__init__()
        self.in_dim = check_experts(experts)
        self.embed_dim = positive_int(embed_dim, "embed_dim")
        clusters = dict(vlad_clusters or {})
        unknown = sorted(set(clusters) - set(self.in_dim))
        if unknown:
            raise ValueError(
                f"vlad_clusters.{unknown[0]}: not one of the model's experts {list(self.in_dim)}"
            )
        self.vlad = nn.ModuleDict(
            {
                n: NetVLAD(self.in_dim[n], positive_int(k, f"vlad_clusters.{n}"))
                for n, k in clusters.items()
            }
        )
        dims = [
            cast(NetVLAD, self.vlad[n]).out_dim if n in self.vlad else d
            for n, d in self.in_dim.items()
        ]
        self.project = nn.ModuleList(nn.Linear(d, embed_dim) for d in dims)
        if not isinstance(collaborative, bool):
            raise ValueError(f"collaborative: must be true or false, got {collaborative!r}")
        self.gating = CollaborativeGating(embed_dim, reduce=cg_reduce) if collaborative else None
        self.geu = nn.ModuleList(GatedEmbeddingUnit(embed_dim, embed_dim) for _ in dims)

    def forward(self, inputs: ExpertInputs) -> torch.Tensor:
        pooled = []
        for name, x, mask in zip(self.in_dim, inputs.features, inputs.masks, strict=True):
            pooled.append(self.vlad[name](x, mask) if name in self.vlad else masked_mean(x, mask))
        p = torch.stack([l2norm(fc(x)) for fc, x in zip(self.project, pooled, strict=True)], 1)
        present = inputs.present
        p = torch.where(present.unsqueeze(-1), p, 0.0)
        if self.gating is not None:
            p = p * self.gating(p, present)
        return torch.stack([geu(p[:, i]) for i, geu in enumerate(self.geu)], dim=1)


class CETextEncoder(nn.Module):
    """CE's text side: ids -> word embeddings -> masked NetVLAD -> one gated embedding unit per
    expert, and linear mixture logits.

    Args:
        vocab_size: Number of word ids.
        num_experts: ``E``.
        embed_dim: ``D``.
        word_dim: Word embedding size.
        clusters: NetVLAD clusters over the words.

    Raises:
        ValueError: A size is not a positive int.
    """

    def __init__(
        self,
        vocab_size: int,
        *,
        num_experts: int,
        embed_dim: int = 512,
        word_dim: int = 300,
        clusters: int = 32,
    ) -> None:
        super().__init__()
        self.vocab_size = positive_int(vocab_size, "text.vocab_size")
        self.embed = nn.Embedding(vocab_size, positive_int(word_dim, "text.word_dim"))
        nn.init.uniform_(self.embed.weight, -0.1, 0.1)
        self.vlad = NetVLAD(word_dim, positive_int(clusters, "text.clusters"))
        n_exp = positive_int(num_experts, "num_experts")
        self.geu = nn.ModuleList(
            GatedEmbeddingUnit(self.vlad.out_dim, embed_dim) for _ in range(n_exp)
        )
        self.mixture = nn.Linear(self.vlad.out_dim, n_exp)

    def forward(
        self, captions: torch.Tensor, lengths: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(N, L)`` ids -> (``(N, E, D)`` L2-normalised embeddings, ``(N, E)`` logits).

        Raises:
            ValueError: An id lies outside the vocabulary.
        """
        if captions.numel() and (int(captions.max()) >= self.vocab_size or int(captions.min()) < 0):
            raise ValueError(
                f"captions hold ids in {int(captions.min())}..{int(captions.max())}; "
                f"expected 0..{self.vocab_size - 1} (vocab_size {self.vocab_size})"
            )
        mask = lengths_to_mask(lengths, captions.shape[1])
        text = self.vlad(self.embed(captions.masked_fill(~mask, 0)), mask)
        return torch.stack([geu(text) for geu in self.geu], dim=1), self.mixture(text)


class CollaborativeExperts(MultiExpertModel):
    """CE (Liu et al., BMVC 2019): :class:`CEVideoEncoder` + :class:`CETextEncoder`, scored by
    the renormalised mixture of per-expert cosines (module docstring).

    Args:
        experts: ``name -> input dim``, in the model's order.
        vocab_size: Number of word ids.
        embed_dim: Shared size ``D``.
        vlad_clusters: Temporal experts aggregated with NetVLAD, ``name -> clusters``.
        collaborative: Apply collaborative gating.
        cg_reduce: ``"mean"`` or ``"sum"`` over the present partner experts.
        word_dim: Word embedding size.
        text_clusters: NetVLAD clusters over the words.
        config: The resolved config the model was built from.

    Raises:
        ValueError: An invalid setting (the message names it).
    """

    def __init__(
        self,
        experts: Mapping[str, int],
        *,
        vocab_size: int,
        embed_dim: int = 512,
        vlad_clusters: Mapping[str, int] | None = None,
        collaborative: bool = True,
        cg_reduce: str = "mean",
        word_dim: int = 300,
        text_clusters: int = 32,
        config: Mapping[str, object] | None = None,
    ) -> None:
        video = CEVideoEncoder(
            experts,
            embed_dim=embed_dim,
            vlad_clusters=vlad_clusters,
            collaborative=collaborative,
            cg_reduce=cg_reduce,
        )
        text = CETextEncoder(
            vocab_size,
            num_experts=len(video.in_dim),
            embed_dim=embed_dim,
            word_dim=word_dim,
            clusters=text_clusters,
        )
        super().__init__(video, text, embed_dim=embed_dim, config=config)


__all__ = [
    "CG_REDUCTIONS",
    "CETextEncoder",
    "CEVideoEncoder",
    "CollaborativeExperts",
    "CollaborativeGating",
]
