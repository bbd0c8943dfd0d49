"""VSE-infinity's grid image encoder: a ResNeXt's feature map as a set of features, FC, GPO.

The image kind ``resnext-wsl`` (``model.image = { kind = "resnext-wsl", path = FILE }``): the
ResNeXt-101 32x8d WSL backbone of VSE-infinity's grid setting (Chen et al., CVPR 2021; GOAL
Tables 5-6), built in plain torch (:class:`~vlret.models.resnext.ResNeXt`) from a local state
dict (``path``, required: nothing is downloaded). A ``(N, 3, S, S)`` image gives the
``(N, 2048, S/32, S/32)`` map of ``layer4`` (16 x 16 at VSE-infinity's 512 x 512), read as
``(S/32)^2`` grid features in row-major order, each projected by one linear layer
(Xavier-uniform, as the VSE lineage) to the joint space and pooled by GPO (``pooling``; or max,
mean). VSE-infinity's grid encoder has no MLP branch (its ``EncoderImageAggr`` adds the MLP for
region features only).

In training mode ``size_augment`` drops grid features as VSE-infinity's size augmentation
does (:func:`size_augment_mask`); evaluation uses all of them. The backbone's BatchNorms stay in
eval mode for the whole run (``frozen_bn``, as VSE-infinity's feature extractor overrides
``train``).

Evaluation preprocessing (``transform``): VSE-infinity's, the image resized to ``S x S``
without keeping its aspect ratio (bilinear), ImageNet mean and std.

Parameter names: ``image_encoder.backbone`` (``.conv1``, ``.bn1``, ``.layer1`` .. ``.layer4``),
``image_encoder.fc`` and ``image_encoder.pool`` (``optim.lr_multipliers``, ``train.freeze``,
``train.lock``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .backbones import IMAGENET_MEAN, IMAGENET_STD
from .clip import CLIPImageTransform
from .image import MaskedPooling
from .resnext import RESNEXT101_32X8D, ResNeXt, load_resnext_weights

#: The image kind of VSE-infinity's WSL grid backbone.
GRID_KIND = "resnext-wsl"
#: VSE-infinity's size augmentation: an image keeps every grid feature with probability 0.2;
#: otherwise, with ``u ~ U(0.2, 1)``, each grid feature is dropped with probability ``0.2 u``.
SIZE_AUGMENT_KEEP_ALL, SIZE_AUGMENT_RATE = 0.2, 0.2


def size_augment_mask(
    count: int, width: int, *, generator: torch.Generator | None = None, device: Any = None
) -> torch.Tensor:
    """The grid features each image keeps under VSE-infinity's size augmentation.

    Per image ``u ~ U(0, 1)``: ``u <= 0.2`` keeps all ``width`` features; otherwise feature ``j``
    is kept when ``v_j > 0.2 u`` with ``v_j ~ U(0, 1)`` (so about 4-20% are dropped, 9.6% on
    average over all images). A row that would lose every feature keeps its largest ``v_j``.

    Args:
        count: Images ``N``.
        width: Grid features per image ``K``.
        generator: Random generator (torch's global one when None).
        device: Device of the mask.

    Returns:
        A ``(N, K)`` bool mask, True at kept features.
    """
    u = torch.rand(count, 1, generator=generator, device=device)
    v = torch.rand(count, width, generator=generator, device=device)
    keep = (v > SIZE_AUGMENT_RATE * u) | (u <= SIZE_AUGMENT_KEEP_ALL)
    empty = ~keep.any(dim=1)
    if bool(empty.any()):
        keep[empty, v[empty].argmax(dim=1)] = True
    return keep


class GridImageEncoder(nn.Module):
    """``pixel_values (N, 3, S, S)`` -> ResNeXt grid -> FC per grid feature -> pooling.

    Args:
        backbone: A :class:`~vlret.models.resnext.ResNeXt` (its ``layer4`` map
            ``(N, out_channels, H', W')``).
        embed_dim: Width of the joint space.
        pooling: ``"gpo"`` (VSE-infinity), ``"max"`` or ``"mean"``.
        size_augment: Drop grid features in training mode (:func:`size_augment_mask`).
        transform: The evaluation preprocessing, kept as ``transform``.
        gpo_pe_dim: GPO's ``pe_dim``.
        gpo_hidden: GPO's ``hidden``.
        gpo_temperature: GPO's ``temperature``.

    Raises:
        ValueError: ``embed_dim`` is not a positive int, or an unknown pooling.
    """

    def __init__(
        self,
        backbone: ResNeXt,
        *,
        embed_dim: int,
        pooling: str = "gpo",
        size_augment: bool = True,
        transform: CLIPImageTransform | None = None,
        gpo_pe_dim: int = 32,
        gpo_hidden: int = 32,
        gpo_temperature: float = 0.1,
    ) -> None:
        super().__init__()
        if not isinstance(embed_dim, int) or isinstance(embed_dim, bool) or embed_dim < 1:
            raise ValueError(f"embed_dim must be a positive int, got {embed_dim!r}")
        self.backbone = backbone
        self.feature_dim = int(backbone.out_channels)
        self.embed_dim = embed_dim
        self.size_augment = bool(size_augment)
        self.transform = transform
        self.fc = nn.Linear(self.feature_dim, embed_dim)
        self.pool = MaskedPooling(
            pooling, gpo_pe_dim=gpo_pe_dim, gpo_hidden=gpo_hidden, gpo_temperature=gpo_temperature
        )
        r = math.sqrt(6.0) / math.sqrt(self.feature_dim + embed_dim)
        nn.init.uniform_(self.fc.weight, -r, r)
        nn.init.zeros_(self.fc.bias)

    def grid_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """The ``(N, H' * W', feature_dim)`` grid features, row-major (before the FC)."""
        pixel_values = pixel_values.to(self.fc.weight.dtype)
        grid = self.backbone(pixel_values)
        return grid.flatten(2).transpose(1, 2)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Embed preprocessed images.

        Args:
            pixel_values: ``(N, 3, S, S)`` output of ``transform``.

        Returns:
            The ``(N, embed_dim)`` embeddings (not normalised).
        """
        features = self.grid_features(pixel_values)
        mask = None
        if self.training and self.size_augment:
            mask = size_augment_mask(*features.shape[:2], device=features.device)
        return self.pool(self.fc(features), mask)

    def extra_repr(self) -> str:
        return (
            f"feature_dim={self.feature_dim}, embed_dim={self.embed_dim}, "
            f"size_augment={self.size_augment}"
        )


def grid_transform(image_size: int) -> CLIPImageTransform:
    """VSE-infinity's evaluation preprocessing: resize to ``image_size`` square (aspect ratio
    not kept, bilinear), ImageNet mean and std.

    Raises:
        ValueError: ``image_size`` is not a positive int.
    """
    if not isinstance(image_size, int) or isinstance(image_size, bool) or image_size < 1:
        raise ValueError(f"image_size: expected a positive int, got {image_size!r}")
    return CLIPImageTransform(
        image_size,
        resize=(image_size, image_size),
        mean=IMAGENET_MEAN,
        std=IMAGENET_STD,
        resample="bilinear",
    )


def build_grid_encoder(
    *,
    path: str | Path,
    embed_dim: int,
    config: Mapping[str, Any] | None = None,
    image_size: int = 512,
    pooling: str = "gpo",
    size_augment: bool = True,
    gpo_pe_dim: int = 32,
    gpo_hidden: int = 32,
    gpo_temperature: float = 0.1,
) -> GridImageEncoder:
    """The ``resnext-wsl`` image encoder, its backbone read from the local state dict ``path``.

    Args:
        path: The ResNeXt state dict (torchvision / WSL-Images layout,
            :func:`~vlret.models.resnext.load_resnext_weights`).
        embed_dim: Width of the joint space.
        config: Overrides of the architecture (:data:`~vlret.models.resnext.RESNEXT101_32X8D`'s
            keys ``layers``, ``groups``, ``width_per_group``; e.g. a small model).
        image_size: The square input side (VSE-infinity: 512).
        pooling: ``"gpo"``, ``"max"`` or ``"mean"``.
        size_augment: VSE-infinity's grid dropping in training mode.
        gpo_pe_dim: GPO's ``pe_dim``.
        gpo_hidden: GPO's ``hidden``.
        gpo_temperature: GPO's ``temperature``.

    Raises:
        ValueError: An unknown ``config`` key, a bad size, or a state dict that does not fit
            (``image.path: FILE: ...``, naming the key of the state dict).
        FileNotFoundError: ``path`` does not exist.
    """
    overrides = {} if config is None else config
    if not isinstance(overrides, Mapping):
        raise ValueError(f"config: expected a table of ResNeXt keys, got {config!r}")
    unknown = sorted(set(overrides) - set(RESNEXT101_32X8D))
    if unknown:
        raise ValueError(
            f"config: unknown key {unknown[0]!r} of a ResNeXt; valid: {sorted(RESNEXT101_32X8D)}"
        )
    transform = grid_transform(image_size)
    backbone = ResNeXt(**{**RESNEXT101_32X8D, **dict(overrides)})
    try:
        load_resnext_weights(backbone, path)
    except ValueError as err:  # the key first, as the other model errors name theirs
        raise ValueError(f"image.path: {err}") from None
    return GridImageEncoder(
        backbone,
        embed_dim=embed_dim,
        pooling=pooling,
        size_augment=size_augment,
        transform=transform,
        gpo_pe_dim=gpo_pe_dim,
        gpo_hidden=gpo_hidden,
        gpo_temperature=gpo_temperature,
    )


__all__ = [
    "GRID_KIND",
    "GridImageEncoder",
    "build_grid_encoder",
    "grid_transform",
    "size_augment_mask",
]
