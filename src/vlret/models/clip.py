"""CLIP fine-tuning: a local ``CLIPModel`` with added embedding layers, and CLIP preprocessing.

The model is a ``transformers`` ``CLIPModel`` read from a local directory; the image
preprocessing uses PIL and numpy only (no torchvision).

Unified paper B.1.2 fine-tunes CLIP ViT-L/14@336px with "an embedding layer of dimension 768
after each of the image and text encoders": here a linear layer after CLIP's own projection on
each side (``proj_dim=768``; ``None`` keeps CLIP's projection output). The image side holds
only CLIP's vision tower and ``visual_projection``, the text side only the text tower and
``text_projection``; CLIP's ``logit_scale`` is left out because the losses bring their own
temperature, and every kept parameter receives a gradient (DistributedDataParallel needs it).

Preprocessing follows the original CLIP pipeline: bicubic resize of the shorter side to the
model's image size, a center crop to ``image_size x image_size``, scaling to ``[0, 1]`` and
normalisation by the CLIP mean and standard deviation per channel.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from .text import check_captions, check_local_dir, import_transformers

#: Per-channel RGB mean and std of the original CLIP preprocessing.
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def _import_pil() -> Any:
    try:
        from PIL import Image
    except ImportError:
        raise ImportError(
            "CLIP image preprocessing needs the optional package pillow: pip install vlret[hf]"
        ) from None
    return Image


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not a readable JSON file ({err})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: top level is {type(data).__name__}; expected an object")
    return data


def _size_pair(value: Any, where: str) -> tuple[int, int]:
    """``(height, width)`` from an int or a ``{"height", "width"}`` / ``{"shortest_edge"}``."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value, value
    if isinstance(value, dict):
        if "height" in value and "width" in value:
            return int(value["height"]), int(value["width"])
        if "shortest_edge" in value:
            return int(value["shortest_edge"]), int(value["shortest_edge"])
    raise ValueError(f"{where}: cannot read an image size from {value!r}")


class CLIPImageTransform:
    """PIL image (or image path) -> float32 tensor ``(3, crop_h, crop_w)`` for CLIP.

    1. convert to RGB and resize (bicubic) so the shorter side is ``resize`` pixels (the longer
       side becomes ``int(resize * long / short)``), as CLIP's preprocessing does;
    2. center crop, offsets ``round((H - crop_h) / 2)`` and ``round((W - crop_w) / 2)``;
    3. ``(pixel / 255 - mean[c]) / std[c]`` per channel, channels first.

    Pass an instance as ``image_transform`` to :class:`vlret.data.KarpathyDataset`.

    Args:
        image_size: The crop, an int or ``(height, width)``.
        resize: Length of the shorter side after resizing; None uses the crop's longer side.
        mean: Per-channel RGB mean.
        std: Per-channel RGB standard deviation (positive).

    Raises:
        ValueError: A size is not positive, ``resize`` is smaller than the crop, or ``mean`` /
            ``std`` do not hold three values.
    """

    def __init__(
        self,
        image_size: int | tuple[int, int] = 224,
        *,
        resize: int | None = None,
        mean: Sequence[float] = CLIP_MEAN,
        std: Sequence[float] = CLIP_STD,
    ) -> None:
        crop = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
        if len(crop) != 2 or min(crop) < 1:
            raise ValueError(f"image_size must be a positive int or (h, w), got {image_size!r}")
        resize = max(crop) if resize is None else int(resize)
        if resize < max(crop):
            raise ValueError(f"resize ({resize}) must be at least the crop size {crop}")
        if len(mean) != 3 or len(std) != 3 or min(std) <= 0:
            raise ValueError(f"mean and std need 3 values (std > 0), got {mean!r}, {std!r}")
        self.crop = (int(crop[0]), int(crop[1]))
        self.resize = resize
        self.mean = np.asarray(mean, dtype=np.float32)
        self.std = np.asarray(std, dtype=np.float32)

    @classmethod
    def from_pretrained(cls, path: str | Path) -> CLIPImageTransform:
        """The transform of a local CLIP directory (needs no ``transformers``).

        Reads ``preprocessor_config.json`` when present (``size``, ``crop_size``,
        ``image_mean``, ``image_std``), else the vision config's ``image_size`` in
        ``config.json`` with the CLIP mean and std.

        Args:
            path: The local CLIP directory.

        Returns:
            The configured transform.

        Raises:
            FileNotFoundError: ``path`` is not a directory, or holds neither file.
            ValueError: A JSON file is unreadable or holds no usable image size.
        """
        path = check_local_dir(path, "a CLIP model")
        pre = path / "preprocessor_config.json"
        if pre.is_file():
            cfg = _read_json(pre)
            crop = _size_pair(cfg.get("crop_size", cfg.get("size", 224)), str(pre))
            resize = cfg.get("size")
            shorter = _size_pair(resize, str(pre))[0] if resize is not None else max(crop)
            return cls(
                crop,
                resize=max(shorter, max(crop)),
                mean=cfg.get("image_mean", CLIP_MEAN),
                std=cfg.get("image_std", CLIP_STD),
            )
        config = path / "config.json"
        if not config.is_file():
            raise FileNotFoundError(f"{config}: missing; expected a CLIP config.json")
        vision = _read_json(config).get("vision_config") or {}
        return cls(int(vision.get("image_size", 224)))

    def __call__(self, image: Any) -> torch.Tensor:
        """Preprocess one image.

        Args:
            image: A PIL image, or the path of an image file.

        Returns:
            The normalised float32 ``(3, crop_h, crop_w)`` tensor.

        Raises:
            ValueError: ``image`` is neither a PIL image nor a path.
            ImportError: pillow is not installed.
        """
        pil = _import_pil()
        if isinstance(image, (str, Path)):
            with pil.open(image) as opened:
                image = opened.convert("RGB")
        elif isinstance(image, pil.Image):
            image = image.convert("RGB")
        else:
            raise ValueError(f"image must be a PIL image or a path, got {type(image).__name__}")
        w, h = image.size
        if w <= h:
            new_w, new_h = self.resize, int(self.resize * h / w)
        else:
            new_w, new_h = int(self.resize * w / h), self.resize
        if (new_w, new_h) != (w, h):
            image = image.resize((new_w, new_h), resample=getattr(pil, "Resampling", pil).BICUBIC)
        ch, cw = self.crop
        top = int(round((new_h - ch) / 2.0))
        left = int(round((new_w - cw) / 2.0))
        image = image.crop((left, top, left + cw, top + ch))
        pixels = np.asarray(image, dtype=np.float32) / 255.0
        pixels = (pixels - self.mean) / self.std
        return torch.from_numpy(np.ascontiguousarray(pixels.transpose(2, 0, 1)))

    def __repr__(self) -> str:
        return f"CLIPImageTransform(crop={self.crop}, resize={self.resize})"


def _added_layer(in_dim: int, proj_dim: int | None) -> nn.Module:
    if proj_dim is None:
        return nn.Identity()
    if not isinstance(proj_dim, int) or isinstance(proj_dim, bool) or proj_dim < 1:
        raise ValueError(f"proj_dim must be a positive int or None, got {proj_dim!r}")
    layer = nn.Linear(in_dim, proj_dim)
    r = math.sqrt(6.0) / math.sqrt(in_dim + proj_dim)
    nn.init.uniform_(layer.weight, -r, r)
    nn.init.zeros_(layer.bias)
    return layer


class CLIPImageEncoder(nn.Module):
    """``pixel_values (N, 3, S, S)`` -> CLIP image embedding -> added layer ``(N, proj_dim)``.

    Args:
        vision_model: CLIP's vision tower.
        visual_projection: CLIP's ``visual_projection`` (a linear layer).
        proj_dim: Width of the added layer; None keeps CLIP's projection output.

    Raises:
        ValueError: ``proj_dim`` is neither None nor a positive int.
    """

    def __init__(
        self, vision_model: nn.Module, visual_projection: nn.Linear, *, proj_dim: int | None
    ) -> None:
        super().__init__()
        self.vision_model = vision_model
        self.visual_projection = visual_projection
        self.embed_proj = _added_layer(visual_projection.out_features, proj_dim)
        self.embed_dim = proj_dim if proj_dim is not None else visual_projection.out_features

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Embed preprocessed images.

        Args:
            pixel_values: ``(N, 3, H, W)`` output of :class:`CLIPImageTransform`.

        Returns:
            The ``(N, embed_dim)`` image embeddings.

        Raises:
            ValueError: ``pixel_values`` is not a 4-D tensor.
        """
        if not isinstance(pixel_values, torch.Tensor) or pixel_values.dim() != 4:
            got = tuple(pixel_values.shape) if isinstance(pixel_values, torch.Tensor) else None
            raise ValueError(
                f"pixel_values must be a (N, 3, H, W) tensor (CLIPImageTransform output), "
                f"got {got or type(pixel_values).__name__}"
            )
        pooled = self.vision_model(pixel_values=pixel_values, return_dict=True).pooler_output
        return self.embed_proj(self.visual_projection(pooled))


class CLIPTextEncoder(nn.Module):
    """``(B, L)`` token ids + lengths -> CLIP text embedding -> added layer ``(B, proj_dim)``.

    The attention mask comes from ``lengths``; CLIP pools at the end-of-text token, which the
    tokenizer places before any padding. The arguments are those of :class:`CLIPImageEncoder`
    for the text side: CLIP's text tower ``text_model`` and its ``text_projection``.
    """

    def __init__(
        self, text_model: nn.Module, text_projection: nn.Linear, *, proj_dim: int | None
    ) -> None:
        super().__init__()
        self.text_model = text_model
        self.text_projection = text_projection
        self.embed_proj = _added_layer(text_projection.out_features, proj_dim)
        self.embed_dim = proj_dim if proj_dim is not None else text_projection.out_features

    def forward(self, captions: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """Embed a padded batch of CLIP token ids.

        Args:
            captions: ``(B, L)`` token ids of CLIP's tokenizer.
            lengths: ``(B,)`` valid tokens per caption; None means all ``L``.

        Returns:
            The ``(B, embed_dim)`` caption embeddings.

        Raises:
            ValueError: The batch is malformed (:func:`~vlret.models.text.check_captions`).
        """
        captions, lengths = check_captions(captions, lengths)
        positions = torch.arange(captions.size(1), device=captions.device)
        mask = (positions.unsqueeze(0) < lengths.to(captions.device).unsqueeze(1)).long()
        pooled = self.text_model(
            input_ids=captions, attention_mask=mask, return_dict=True
        ).pooler_output
        return self.embed_proj(self.text_projection(pooled))


def load_clip(
    path: str | Path, *, proj_dim: int | None = 768
) -> tuple[CLIPImageEncoder, CLIPTextEncoder, CLIPImageTransform]:
    """Image encoder, text encoder and image transform from a local CLIP directory.

    ``CLIPModel.from_pretrained(path, local_files_only=True)``, cast to float32 (fine-tuning
    half-precision weights with Adam gives NaNs; use AMP for speed instead).

    Args:
        path: The local CLIP directory (``save_pretrained`` output).
        proj_dim: Width of the added embedding layers (Unified B.1.2: 768); None keeps CLIP's
            projection output.

    Returns:
        ``(image_encoder, text_encoder, image_transform)``.

    Raises:
        ImportError: ``transformers`` is not installed.
        FileNotFoundError: ``path`` is not a directory.
    """
    transformers = import_transformers("CLIP fine-tuning")
    path = check_local_dir(path, "a CLIP model")
    clip = transformers.CLIPModel.from_pretrained(str(path), local_files_only=True).float()
    image = CLIPImageEncoder(clip.vision_model, clip.visual_projection, proj_dim=proj_dim)
    text = CLIPTextEncoder(clip.text_model, clip.text_projection, proj_dim=proj_dim)
    return image, text, CLIPImageTransform.from_pretrained(path)


__all__ = [
    "CLIP_MEAN",
    "CLIP_STD",
    "CLIPImageEncoder",
    "CLIPImageTransform",
    "CLIPTextEncoder",
    "load_clip",
]
