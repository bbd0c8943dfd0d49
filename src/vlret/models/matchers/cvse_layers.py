"""CVSE's layers (Wang et al., ECCV 2020): the single-modal self-attentions that give the
instance-level vectors, the concept graph convolution and the consensus-level embeddings.

Each follows the authors' release (``BruceW91/CVSE``, ``model_CVSE.py`` and
``util/C_GCN.py``); every module's own parameter names map to the release's through its
``reference_names()`` (:meth:`vlret.models.matchers.cvse.CVSE.reference_names`).
The release's ``l2norm`` adds 1e-12 to the norm (:func:`l2norm`, ``util/utils.py``).
The BatchNorms run through :func:`vlret.models.sgraf_ops.batch_norm` (the statistics computed
from the input, the running buffers updated without autograd), so the backward never holds a
running buffer that a later call, or the ``pair_bank`` procedure restoring the buffers after
scoring its bank, updates in place.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..sgraf_ops import batch_norm

#: The release's ``util/utils.py`` ``l2norm`` eps.
CVSE_NORM_EPS = 1e-12
#: The concept GCN's LeakyReLU slope (``C_GCN``).
GCN_SLOPE = 0.2


def l2norm(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """The release's ``l2norm``: ``x / (||x|| + 1e-12)`` along ``dim``."""
    return x / (x.square().sum(dim=dim, keepdim=True).sqrt() + CVSE_NORM_EPS)


def gen_adj(a: torch.Tensor) -> torch.Tensor:
    """The release's ``gen_adj``: ``D A^T D`` with ``D = diag(rowsum(A)^-1/2)``."""
    d = a.sum(dim=1).pow(-0.5)
    return (a * d[None, :]).t() * d[None, :]


class VisualSelfAttention(nn.Module):
    """``V_single_modal_atten``: regions pooled by attention guided by their mean.

    ``W_v = dropout(tanh(bn1(fc1(v))))`` with ``bn1`` a BatchNorm over the ``num_regions``
    region POSITIONS (the release's ``BatchNorm1d(36)`` on ``(B, 36, D)``: each position
    normalised over the batch and the features), ``W_m = dropout(tanh(bn2(fc2(mean_r v))))``,
    weights ``softmax_r(fc3(W_v * W_m))`` (no temperature), and the instance vector
    ``l2norm(sum_r w_r v_r)`` of the input regions ``v``. The release's unused ``fc2_2`` and
    ``fc4`` are left out.

    Args:
        dim: Feature size ``D``.
        num_regions: Regions per image (the BatchNorm's channels).
        dropout: Dropout in training.
    """

    def __init__(self, dim: int, num_regions: int, dropout: float) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, 1)
        self.bn1, self.bn2 = nn.BatchNorm1d(num_regions), nn.BatchNorm1d(dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, regions: torch.Tensor) -> torch.Tensor:
        """``(N, R, D)`` normalised regions -> ``(N, D)`` instance vectors."""
        w_v = self.dropout(torch.tanh(batch_norm(self.fc1(regions), self.bn1)))
        w_m = self.dropout(torch.tanh(batch_norm(self.fc2(regions.mean(dim=1)), self.bn2)))
        logits = self.fc3(w_v * w_m.unsqueeze(1)).squeeze(-1)
        weights = torch.softmax(logits, dim=1)
        return l2norm(torch.bmm(weights.unsqueeze(1), regions).squeeze(1))

    @staticmethod
    def reference_names() -> dict[str, str]:
        """Own parameter / buffer name -> the release's (``V_self_atten_enhance``)."""
        names = {f"fc{k}.{p}": f"fc{k}.{p}" for k in (1, 2, 3) for p in ("weight", "bias")}
        for own, ref in (("bn1", "embedding_1.1"), ("bn2", "embedding_2.1")):
            for p in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked"):
                names[f"{own}.{p}"] = f"{ref}.{p}"
        return names


class TextSelfAttention(nn.Module):
    """``T_single_modal_atten``: words pooled by attention guided by their normalised mean.

    ``W_u = dropout(tanh(fc1(u)))``, ``W_m = dropout(tanh(fc2(l2norm(sum_t u_t))))``, weights
    ``softmax_t(fc3(W_u * W_m))`` over the caption's real words, and ``l2norm(sum_t w_t u_t)``
    (no BatchNorm on this side, as in the release).

    The release's softmax runs over every padded position of the batch, unmasked; a padded
    word is a zero vector, so it adds nothing to the weighted sum and only scales the real
    words' weights by a common factor, which the final ``l2norm`` removes: the masked softmax
    here gives the same vector up to the norm's 1e-12 eps. Likewise the release's
    ``l2norm(mean over padded positions)`` is ``l2norm`` of the sum over real words.

    Args:
        dim: Feature size ``D``.
        dropout: Dropout in training.
    """

    def __init__(self, dim: int, dropout: float) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, 1)
        self.dropout = nn.Dropout(dropout)

    def forward(self, words: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``(N, L, D)`` word features (zero at padding), ``(N, L)`` real-word mask ->
        ``(N, D)`` instance vectors."""
        w_u = self.dropout(torch.tanh(self.fc1(words)))
        w_m = self.dropout(torch.tanh(self.fc2(l2norm(words.sum(dim=1)))))
        logits = self.fc3(w_u * w_m.unsqueeze(1)).squeeze(-1)
        logits = logits.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(logits, dim=1)
        return l2norm(torch.bmm(weights.unsqueeze(1), words).squeeze(1))

    @staticmethod
    def reference_names() -> dict[str, str]:
        """Own parameter name -> the release's (``T_self_atten_enhance``)."""
        return {f"fc{k}.{p}": f"fc{k}.{p}" for k in (1, 2, 3) for p in ("weight", "bias")}


class ConceptGCN(nn.Module):
    """``C_GCN`` in ``whole_graph`` mode: two graph convolutions over the concept graph.

    ``Â = gen_adj(adj_all)`` (:func:`gen_adj`, no gradient), ``x = Â (inp W1)``, LeakyReLU
    0.2, ``x = Â (x W2)``, each row ``l2norm``-ed: a ``(C, D)`` table that does not depend on
    the batch. ``adj_all`` is the processed adjacency
    (:func:`~vlret.models.matchers.cvse_concepts.gen_a_concept`), a buffer (the release keeps
    it as a never-updated ``nn.Parameter``). ``inp`` is the ``(C, in_dim)`` concept word
    vectors: a fixed buffer or, ``learned``, a parameter (the release's are GloVe-840B
    vectors, not available offline). Weights uniform in ``±1/sqrt(out)`` (the release's
    ``GraphConvolution.reset_parameters``), no bias.

    Args:
        adjacency: ``(C, C)`` processed adjacency.
        vectors: ``(C, in_dim)`` concept word vectors.
        hidden: Size of the first layer.
        out_dim: Size ``D`` of the table.
        learned: Train the vectors.
    """

    adj_all: torch.Tensor
    vectors: torch.Tensor

    def __init__(
        self,
        adjacency: torch.Tensor,
        vectors: torch.Tensor,
        hidden: int,
        out_dim: int,
        *,
        learned: bool = False,
    ) -> None:
        super().__init__()
        self.register_buffer("adj_all", adjacency.float().clone())
        if learned:
            self.vectors = nn.Parameter(vectors.float().clone())
        else:
            self.register_buffer("vectors", vectors.float().clone())
        in_dim = vectors.shape[1]
        self.gc1 = nn.Parameter(torch.empty(in_dim, hidden))
        self.gc2 = nn.Parameter(torch.empty(hidden, out_dim))
        for weight in (self.gc1, self.gc2):
            bound = 1.0 / math.sqrt(weight.shape[1])
            nn.init.uniform_(weight, -bound, bound)

    def forward(self) -> torch.Tensor:
        """The ``(C, D)`` concept table."""
        adj = gen_adj(self.adj_all).detach()
        # a buffer is copied: the product keeps its operand for the backward, and the
        # pair_bank procedure restores every buffer in place after scoring its bank
        vectors = self.vectors if self.vectors.requires_grad else self.vectors.clone()
        x = adj @ (vectors @ self.gc1)
        x = F.leaky_relu(x, GCN_SLOPE)
        return l2norm(adj @ (x @ self.gc2))

    @staticmethod
    def reference_names() -> dict[str, str]:
        """Own name -> the release's (``C_GCN``); ``vectors`` is not in its checkpoint."""
        return {"adj_all": "adj_all", "gc1": "gc1.weight", "gc2": "gc2.weight"}


class ConsensusLevel(nn.Module):
    """``Consensus_level_feature_learning``: an instance vector's distribution over the
    concepts and its consensus vector.

    ``E_c = tanh(bn1(fc1(table)))`` (the BatchNorm's batch axis is the ``C`` concepts),
    ``E_x = tanh(bn2(fc2(x)))``, ``w = softmax_c(temperature * fc3(E_c * E_x))`` (written as a
    product: ``fc3(E_c * E_x) = E_x (E_c * w3)^T + b3``); the text side mixes in its concept
    labels ``y``: ``w = ratio * softmax(temperature * y) + (1 - ratio) * w``; the consensus
    vector is ``l2norm(sum_c w_c l2norm(table_c))``. No dropout (the release has none here).

    Args:
        dim: Feature size ``D``.
        temperature: The softmax's factor (the release's ``smooth_coef`` 10).
        label_ratio: The labels' share ``beta`` (text side; 0 on the image side).
    """

    def __init__(self, dim: int, temperature: float, label_ratio: float = 0.0) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, 1)
        self.bn1, self.bn2 = nn.BatchNorm1d(dim), nn.BatchNorm1d(dim)
        self.temperature = temperature
        self.label_ratio = label_ratio

    def forward(
        self, x: torch.Tensor, table: torch.Tensor, labels: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(consensus (N, D), weights (N, C))`` of instance vectors ``x`` ``(N, D)``."""
        e_c = torch.tanh(batch_norm(self.fc1(table), self.bn1))
        e_x = torch.tanh(batch_norm(self.fc2(x), self.bn2))
        logits = e_x @ (e_c * self.fc3.weight).t() + self.fc3.bias
        weights = torch.softmax(self.temperature * logits, dim=1)
        if labels is not None:
            prior = torch.softmax(self.temperature * labels, dim=1)
            weights = self.label_ratio * prior + (1.0 - self.label_ratio) * weights
        return l2norm(weights @ l2norm(table)), weights

    @staticmethod
    def reference_names() -> dict[str, str]:
        """Own name -> the release's (``V_`` / ``T_consensus_level_embedding``)."""
        return VisualSelfAttention.reference_names()


__all__ = [
    "CVSE_NORM_EPS",
    "GCN_SLOPE",
    "ConceptGCN",
    "ConsensusLevel",
    "TextSelfAttention",
    "VisualSelfAttention",
    "gen_adj",
    "l2norm",
]
