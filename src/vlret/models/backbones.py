"""Image backbones trained from pixels: a ResNet or a ViT from ``transformers``, then an FC.

VSE++ with a CNN or ViT backbone (GOAL Tables 3-4): ResNet-152 (``transformers.ResNetModel``,
its pooled 2048-d output) or ViT-B/16 (``transformers.ViTModel``, the CLS token of the last
layer after the final layer norm, 768-d; no pooler), then one linear layer (Xavier-uniform, as
the VSE lineage's FC image encoders) into the joint space.

A backbone comes from a local directory (``path``: ``save_pretrained`` output, read with
``local_files_only=True``; nothing is ever downloaded) or is built with random weights from a
named architecture (``preset``, :data:`BACKBONE_PRESETS`), in both cases with optional config
overrides (``config``, keys of ``transformers``' ``ResNetConfig`` / ``ViTConfig``; with a
``path`` they replace the directory's values, which must not change a weight's shape).

Its parameters are ``backbone.*`` and the FC's ``fc.*``; inside a
:class:`~vlret.models.RetrievalModel` they are ``image_encoder.backbone`` and
``image_encoder.fc`` (``train.freeze = ["image_encoder.backbone"]`` is VSE++'s step 1,
``optim.lr_multipliers = {"image_encoder.backbone" = 0.01}`` a slower backbone).

Evaluation preprocessing (``encoder.transform``, a :class:`~vlret.models.clip.CLIPImageTransform`):
VSE++'s, resize the shorter side to ``round(S * 256 / 224)`` and center crop ``S`` (256 and
224 at ``S = 224``), ImageNet mean and std; bilinear for the ResNet (torchvision's default)
and bicubic for the ViT (timm's ViT default). ``S`` is ``image_size`` when given, else the
ViT config's ``image_size``, else 224 for the ResNet (whose config has no size). A directory's
saved image processor replaces the mean and std by its ``image_mean`` / ``image_std`` (weights
trained with another normalisation, e.g. Google's ViT at 0.5, are fed as trained), read from
either of ``transformers``' layouts: ``processor_config.json``'s ``image_processor``
(transformers 5) or ``preprocessor_config.json``
(:func:`~vlret.models.clip_folder.find_image_processor`).
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .clip import CLIPImageTransform
from .clip_folder import find_image_processor, read_channels
from .text import check_local_dir, import_transformers

#: Per-channel RGB mean and std of ImageNet (torchvision's, VSE++'s).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

#: The backbone kinds and, per kind, its named architectures (config keyword arguments).
#: ``resnet-152``: He et al.'s ResNet-152 v1.5 (stride in the 3x3, as torchvision's and
#: ``microsoft/resnet-152``); 58,143,808 parameters without the classifier. ``vit-b-16``:
#: ``google/vit-base-patch16-224`` (768 wide, 12 layers, 12 heads, patch 16, 224 px, layer-norm
#: eps 1e-12 as Google's weights; timm's uses 1e-6); 85,798,656 parameters without pooler and
#: head.
BACKBONE_PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "resnet": {
        "resnet-152": {
            "depths": [3, 8, 36, 3],
            "hidden_sizes": [256, 512, 1024, 2048],
            "embedding_size": 64,
            "layer_type": "bottleneck",
            "hidden_act": "relu",
        }
    },
    "vit": {
        "vit-b-16": {
            "hidden_size": 768,
            "num_hidden_layers": 12,
            "num_attention_heads": 12,
            "intermediate_size": 3072,
            "hidden_act": "gelu",
            "image_size": 224,
            "patch_size": 16,
            "qkv_bias": True,
            "layer_norm_eps": 1e-12,
        }
    },
}
BACKBONE_KINDS = tuple(BACKBONE_PRESETS)
_CLASSES = {"resnet": ("ResNetConfig", "ResNetModel"), "vit": ("ViTConfig", "ViTModel")}


def backbone_config(
    kind: str,
    *,
    path: str | Path | None = None,
    preset: str | None = None,
    config: Mapping[str, Any] | None = None,
) -> Any:
    """The ``transformers`` config of a backbone: the directory's ``config.json`` or the
    preset's, with ``config`` overrides; unknown keys are refused (the configs accept any).

    Args:
        kind: ``"resnet"`` or ``"vit"``.
        path: A local directory (exclusive with ``preset``).
        preset: A name in ``BACKBONE_PRESETS[kind]``.
        config: Overrides, keys of ``ResNetConfig`` / ``ViTConfig``.

    Raises:
        ValueError: An unknown kind, preset or key, or not exactly one of ``path`` / ``preset``.
        FileNotFoundError: ``path`` is not a directory or holds no ``config.json``.
        ImportError: ``transformers`` is not installed.
    """
    if kind not in BACKBONE_PRESETS:
        raise ValueError(f"kind: unknown backbone {kind!r}; valid: {list(BACKBONE_KINDS)}")
    if (path is None) == (preset is None):
        raise ValueError(
            f"path: a {kind} backbone takes exactly one of path (a local directory) or preset "
            f"(random weights: {sorted(BACKBONE_PRESETS[kind])}), got "
            f"{'both' if path is not None else 'neither'}"
        )
    if preset is not None and preset not in BACKBONE_PRESETS[kind]:
        raise ValueError(
            f"preset: unknown {kind} preset {preset!r}; valid: {sorted(BACKBONE_PRESETS[kind])}"
        )
    overrides = {} if config is None else config
    if not isinstance(overrides, Mapping):
        raise ValueError(f"config: expected a table of {_CLASSES[kind][0]} keys, got {config!r}")
    transformers = import_transformers(f"a {kind} backbone")
    config_class = getattr(transformers, _CLASSES[kind][0])
    known = set(config_class().to_dict())
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"config: unknown key {unknown[0]!r} of transformers' {_CLASSES[kind][0]}")
    if path is None:
        return config_class(**{**copy.deepcopy(BACKBONE_PRESETS[kind][str(preset)]), **overrides})
    folder = _model_dir(kind, path)
    return config_class.from_pretrained(str(folder), local_files_only=True, **overrides)


def _model_dir(kind: str, path: str | Path) -> Path:
    """``path`` if it holds a ``config.json`` of this kind's ``model_type``; else one line."""
    folder = check_local_dir(path, f"a {kind} model")
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(
            f"{config_file}: missing; expected the save_pretrained output of a transformers "
            f"{_CLASSES[kind][1]}"
        )
    try:
        model_type = json.loads(config_file.read_text(encoding="utf-8")).get("model_type")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as err:
        raise ValueError(f"{config_file}: not a readable JSON config ({err})") from None
    if model_type != kind:
        raise ValueError(
            f"{config_file}: model_type is {model_type!r}; expected {kind!r} (a transformers "
            f"{_CLASSES[kind][1]})"
        )
    return folder


def backbone_transform(
    kind: str, config: Any, *, path: str | Path | None = None, image_size: int | None = None
) -> CLIPImageTransform:
    """The evaluation preprocessing of a backbone (module docstring).

    Args:
        kind: ``"resnet"`` or ``"vit"``.
        config: Its ``transformers`` config.
        path: Its local directory, whose saved image processor gives the mean and std.
        image_size: The crop ``S``; None: the ViT config's ``image_size``, 224 for a ResNet.

    Raises:
        ValueError: ``image_size`` is not a positive int, or a preprocessor file is unreadable.
    """
    if image_size is None:
        image_size = int(getattr(config, "image_size", 224)) if kind == "vit" else 224
    if not isinstance(image_size, int) or isinstance(image_size, bool) or image_size < 1:
        raise ValueError(f"image_size: expected a positive int, got {image_size!r}")
    mean, std = IMAGENET_MEAN, IMAGENET_STD
    found = find_image_processor(path) if path is not None else None
    if found is not None:  # either transformers layout (vlret.models.clip_folder)
        stats, where = found
        if "image_mean" in stats:
            mean = read_channels(stats["image_mean"], where, "image_mean")
        if "image_std" in stats:
            std = read_channels(stats["image_std"], where, "image_std")
    return CLIPImageTransform(
        image_size,
        resize=int(round(image_size * 256 / 224)),
        mean=mean,
        std=std,
        resample="bilinear" if kind == "resnet" else "bicubic",
    )


class BackboneImageEncoder(nn.Module):
    """``pixel_values (N, 3, S, S)`` -> backbone feature -> FC -> ``(N, embed_dim)``.

    Args:
        backbone: A ``transformers`` ``ResNetModel`` or ``ViTModel`` (no pooling layer).
        kind: ``"resnet"`` (pooled output) or ``"vit"`` (CLS token of the last hidden state).
        feature_dim: Width of the backbone feature (2048 for ResNet-152, 768 for ViT-B/16).
        embed_dim: Width of the joint space.
        transform: The evaluation preprocessing, kept as ``transform``.

    Raises:
        ValueError: An unknown kind, or a width that is not a positive int.
    """

    def __init__(
        self,
        backbone: nn.Module,
        *,
        kind: str,
        feature_dim: int,
        embed_dim: int,
        transform: CLIPImageTransform | None = None,
    ) -> None:
        super().__init__()
        if kind not in BACKBONE_KINDS:
            raise ValueError(f"kind: unknown backbone {kind!r}; valid: {list(BACKBONE_KINDS)}")
        for name, value in (("feature_dim", feature_dim), ("embed_dim", embed_dim)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self.kind = kind
        self.backbone = backbone
        self.feature_dim = feature_dim
        self.embed_dim = embed_dim
        self.transform = transform
        self.fc = nn.Linear(feature_dim, embed_dim)
        r = math.sqrt(6.0) / math.sqrt(feature_dim + embed_dim)
        nn.init.uniform_(self.fc.weight, -r, r)
        nn.init.zeros_(self.fc.bias)

    def features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """The ``(N, feature_dim)`` backbone features (before the FC).

        Raises:
            ValueError: ``pixel_values`` is not a 4-D tensor.
        """
        if not isinstance(pixel_values, torch.Tensor) or pixel_values.dim() != 4:
            got = tuple(pixel_values.shape) if isinstance(pixel_values, torch.Tensor) else None
            raise ValueError(
                f"pixel_values must be a (N, 3, H, W) tensor (the model's transform output), "
                f"got {got or type(pixel_values).__name__}"
            )
        pixel_values = pixel_values.to(self.fc.weight.dtype)
        out = self.backbone(pixel_values=pixel_values, return_dict=True)
        if self.kind == "resnet":
            return out.pooler_output.flatten(1)
        return out.last_hidden_state[:, 0]

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Embed preprocessed images.

        Args:
            pixel_values: ``(N, 3, S, S)`` output of ``transform``.

        Returns:
            The ``(N, embed_dim)`` embeddings (not normalised).
        """
        return self.fc(self.features(pixel_values))

    def extra_repr(self) -> str:
        return f"kind={self.kind!r}, feature_dim={self.feature_dim}, embed_dim={self.embed_dim}"


def build_backbone_encoder(
    kind: str,
    *,
    embed_dim: int,
    path: str | Path | None = None,
    preset: str | None = None,
    config: Mapping[str, Any] | None = None,
    image_size: int | None = None,
) -> BackboneImageEncoder:
    """A :class:`BackboneImageEncoder` from a local directory or a preset (random weights,
    from torch's global generator: seed it first).

    Args:
        kind: ``"resnet"`` or ``"vit"``.
        embed_dim: Width of the joint space.
        path: A local directory (``save_pretrained`` output; exclusive with ``preset``).
        preset: A name in ``BACKBONE_PRESETS[kind]``.
        config: Config overrides (:func:`backbone_config`).
        image_size: The evaluation crop (:func:`backbone_transform`).

    Raises:
        ValueError: A bad kind, preset, key, size or directory content.
        FileNotFoundError: ``path`` is not a directory or holds no ``config.json``.
        ImportError: ``transformers`` is not installed.
    """
    cfg = backbone_config(kind, path=path, preset=preset, config=config)
    transformers = import_transformers(f"a {kind} backbone")
    model_class = getattr(transformers, _CLASSES[kind][1])
    extra = {"add_pooling_layer": False} if kind == "vit" else {}
    if path is None:
        backbone = model_class(cfg, **extra)
    else:
        backbone = model_class.from_pretrained(
            str(path), config=cfg, local_files_only=True, **extra
        )
    backbone = backbone.float()
    feature_dim = int(cfg.hidden_sizes[-1] if kind == "resnet" else cfg.hidden_size)
    transform = backbone_transform(kind, cfg, path=path, image_size=image_size)
    return BackboneImageEncoder(
        backbone, kind=kind, feature_dim=feature_dim, embed_dim=embed_dim, transform=transform
    )


__all__ = [
    "BACKBONE_KINDS",
    "BACKBONE_PRESETS",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "BackboneImageEncoder",
    "backbone_config",
    "backbone_transform",
    "build_backbone_encoder",
]
