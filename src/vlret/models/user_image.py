"""USER's image encoder: semantic-guided enhancement (SGE) of the regions, then VSE-infinity's
projection and GPO pooling (image kind ``"user"``).

Zhang et al., "Unified Semantic Enhancement with Momentum Contrast for Image-Text Retrieval"
(2024); the computation follows the authors' release (``lib/encoders.py``: ``EncoderImageAggr``
and ``SGE``) step for step, on the raw ``in_dim``-wide regions ``r_1..r_R`` of an image:

1. a global vector ``g``: the self-attention pooling of SGRAF's image side, which USER's
   ``SGE.forward`` is (local branch ``tanh(BN_R(W_l r_i))``, global branch
   ``tanh(BN_D(W_g mean_i r_i))``, both with dropout; weights ``softmax_i(w . (local_i *
   global))``; ``g = l2norm(sum_i w_i r_i)``), reused from :mod:`vlret.models.sgraf`
   (``_GlobalAttention``, its image side);
2. region attention (``SGE.region_attention``): ``a = l2norm(softmax_i(lambda g . r_i))`` (the
   L2 norm of the weight vector over the regions, plus 1e-8), ``r_i' = r_i + a_i g``;
3. ``fc(r_i') + MLP(r_i')`` (``fc``: ``in_dim -> embed_dim``; the MLP is VSE-infinity's
   two-layer one, ``Linear(in_dim, embed_dim / 2) -> BatchNorm1d -> ReLU -> Linear(.,
   embed_dim)``, its BatchNorm over every region of the batch), pooled by GPO (or ``max`` /
   ``mean``). The embedding is not normalised: the losses (and evaluation's cosine) normalise,
   as the release's final l2norm does.

The release's ``BatchNorm1d(36)`` normalises each region *position* over the batch, so the
encoder takes exactly ``num_regions`` regions per image and no padding (the release always has
36); ``lengths`` below ``num_regions`` are refused. Initialisation as released: ``fc`` and the
three SGE layers Xavier-uniform with zero bias, the MLP PyTorch's default. The release has no
region dropout.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from .attention import positive_int
from .image import POOLINGS, MaskedPooling
from .sgraf import _GlobalAttention
from .sgraf_ops import batch_norm, l2norm

#: The ``[model.image] kind`` of USER's encoder.
USER_IMAGE_KIND = "user"

#: Its valid keys and defaults (the release's: ``img_dim`` 2048, 36 regions, SGE dropout 0.4,
#: ``attention_lamda`` 1, GPO(32, 32); ``mlp_hidden`` ``None`` is ``embed_dim // 2``).
USER_IMAGE_DEFAULTS: dict[str, Any] = {
    "kind": USER_IMAGE_KIND,
    "in_dim": 2048,
    "num_regions": 36,
    "dropout": 0.4,
    "attention_lambda": 1.0,
    "mlp_hidden": None,
    "pooling": "gpo",
    "gpo_pe_dim": 32,
    "gpo_hidden": 32,
    "gpo_temperature": 0.1,
}


class RegionMLP(nn.Module):
    """VSE-infinity's two-layer MLP on every region: ``Linear -> BatchNorm1d -> ReLU ->
    Linear``, the BatchNorm's statistics over all ``N * R`` regions of the batch."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_dim, hidden)
        self.bn = nn.BatchNorm1d(hidden)
        self.fc2 = nn.Linear(hidden, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(N, R, in_dim) -> (N, R, out_dim)``."""
        rows = x.reshape(-1, x.shape[-1])
        hidden = torch.relu(batch_norm(self.fc1(rows), self.bn))
        return self.fc2(hidden).reshape(*x.shape[:-1], -1)


class UserImageEncoder(nn.Module):
    """USER's image encoder: ``(N, num_regions, in_dim)`` regions -> ``(N, embed_dim)`` (module
    doc).

    Args:
        in_dim: Width of the region features (2048 for bottom-up-attention regions).
        embed_dim: Width of the joint space.
        num_regions: Regions per image, every one valid (the SGE's ``BatchNorm1d`` channels).
        dropout: Dropout of the SGE's two branches (0.4 in the release).
        attention_lambda: ``lambda`` of the region attention (the release's
            ``attention_lamda``, 1).
        mlp_hidden: Hidden width of the MLP (``None``: ``embed_dim // 2``, the release's).
        pooling: One of :data:`~vlret.models.image.POOLINGS` (the release: ``"gpo"``).
        gpo_pe_dim: :class:`~vlret.models.image.GPO`'s ``pe_dim``.
        gpo_hidden: :class:`~vlret.models.image.GPO`'s ``hidden``.
        gpo_temperature: :class:`~vlret.models.image.GPO`'s ``temperature``.

    Raises:
        ValueError: A size that is not a positive int, ``dropout`` outside ``[0, 1)``, a
            ``attention_lambda`` that is not a finite number, or an unknown ``pooling``.
    """

    def __init__(
        self,
        *,
        in_dim: int = 2048,
        embed_dim: int = 1024,
        num_regions: int = 36,
        dropout: float = 0.4,
        attention_lambda: float = 1.0,
        mlp_hidden: int | None = None,
        pooling: str = "gpo",
        gpo_pe_dim: int = 32,
        gpo_hidden: int = 32,
        gpo_temperature: float = 0.1,
    ) -> None:
        super().__init__()
        self.in_dim = positive_int(in_dim, "in_dim")
        self.embed_dim = positive_int(embed_dim, "embed_dim")
        self.num_regions = positive_int(num_regions, "num_regions")
        hidden = embed_dim // 2 if mlp_hidden is None else mlp_hidden
        positive_int(hidden, "mlp_hidden")
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)):
            raise ValueError(f"dropout: must be a number in [0, 1), got {dropout!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout: must be a number in [0, 1), got {dropout!r}")
        if (
            isinstance(attention_lambda, bool)
            or not isinstance(attention_lambda, (int, float))
            or not math.isfinite(attention_lambda)
        ):
            raise ValueError(f"attention_lambda: must be a finite number, got {attention_lambda!r}")
        self.attention_lambda = float(attention_lambda)
        self.sge = _GlobalAttention(in_dim, float(dropout), num_regions)
        self.fc = nn.Linear(in_dim, embed_dim)
        self.mlp = RegionMLP(in_dim, hidden, embed_dim)
        self.pool = MaskedPooling(
            pooling,
            gpo_pe_dim=gpo_pe_dim,
            gpo_hidden=gpo_hidden,
            gpo_temperature=gpo_temperature,
        )
        for layer in (self.fc, self.sge.local_fc, self.sge.global_fc, self.sge.common):
            nn.init.xavier_uniform_(layer.weight)
            nn.init.zeros_(layer.bias)

    def enhance(self, regions: torch.Tensor) -> torch.Tensor:
        """Steps 1-2 of the module doc: the enhanced regions ``r_i + a_i g``, ``(N, R, in_dim)``."""
        g = self.sge(regions, None)
        attention = torch.softmax(self.attention_lambda * (regions @ g.unsqueeze(-1)), dim=1)
        return regions + l2norm(attention.transpose(1, 2)).transpose(1, 2) * g.unsqueeze(1)

    def forward(self, features: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """Embed images.

        Args:
            features: ``(N, num_regions, in_dim)`` region features.
            lengths: Optional ``(N,)`` valid regions per row; each must be ``num_regions``.

        Returns:
            The ``(N, embed_dim)`` embeddings (not normalised).

        Raises:
            ValueError: ``features`` of another shape, or padded rows (``lengths``).
        """
        if (
            not isinstance(features, torch.Tensor)
            or features.dim() != 3
            or tuple(features.shape[1:]) != (self.num_regions, self.in_dim)
        ):
            got = tuple(features.shape) if isinstance(features, torch.Tensor) else features
            raise ValueError(
                f"features must be (N, num_regions={self.num_regions}, in_dim={self.in_dim}) "
                f"region features, got {got!r:.80}"
            )
        if lengths is not None and bool((torch.as_tensor(lengths) != self.num_regions).any()):
            raise ValueError(
                f"lengths: USER's image encoder takes exactly num_regions={self.num_regions} "
                "regions per image (its BatchNorm1d normalises each region position), no padding"
            )
        regions = features.to(self.fc.weight.dtype)
        enhanced = self.enhance(regions)
        return self.pool(self.fc(enhanced) + self.mlp(enhanced))

    def extra_repr(self) -> str:
        return f"num_regions={self.num_regions}, attention_lambda={self.attention_lambda:g}"


def build_user_image_encoder(cfg: Mapping[str, Any], *, embed_dim: int) -> UserImageEncoder:
    """The encoder of a resolved ``[model.image]`` table of kind ``"user"``
    (:data:`USER_IMAGE_DEFAULTS` filled in).

    Args:
        cfg: The table, every key of :data:`USER_IMAGE_DEFAULTS`.
        embed_dim: The model's ``embed_dim``.

    Returns:
        The encoder.

    Raises:
        ValueError: An invalid value, the message naming ``image.<key>``.
    """
    if cfg.get("pooling") not in POOLINGS:
        raise ValueError(
            f"image.pooling: must be one of {list(POOLINGS)}, got {cfg.get('pooling')!r}"
        )
    try:
        return UserImageEncoder(
            embed_dim=embed_dim, **{k: v for k, v in cfg.items() if k != "kind"}
        )
    except ValueError as err:
        raise ValueError(f"image.{err}") from None


__all__ = [
    "USER_IMAGE_DEFAULTS",
    "USER_IMAGE_KIND",
    "RegionMLP",
    "UserImageEncoder",
    "build_user_image_encoder",
]
