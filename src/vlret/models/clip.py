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
normalisation by the CLIP mean and standard deviation per channel. A non-square input
(``image_size = [384, 128]``, IRRA's person-search CLIP; :mod:`vlret.models.clip_size`) is
resized to ``(height, width)`` directly, as IRRA's evaluation transform does.

Pre-training from scratch (AdaCL Table 2): :func:`build_clip` builds a named architecture
(:data:`CLIP_PRESETS`, ``"ViT-B-32"``) with random weights, with ``CLIPConfig`` overrides (a tiny
one for tests and the synthetic world). Its captions are tokenised by a local CLIP tokenizer
directory (``data.tokenizer``) or, when asked for (``model.tokenizer = "bytes"``), by
:class:`CLIPByteTokenizer`: UTF-8 bytes, no download, no vocabulary file.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from .clip_size import set_image_size
from .text import check_captions, check_local_dir, import_transformers

#: Per-channel RGB mean and std of the original CLIP preprocessing.
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
#: PIL resampling filters :class:`CLIPImageTransform` accepts.
RESAMPLES = ("bicubic", "bilinear")


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

    With ``stretch`` (the default for a non-square crop) steps 1-2 are one resize to
    ``(crop_h, crop_w)``, the aspect ratio not kept: IRRA's ``Resize((384, 128))`` for
    pedestrian pictures, where a centre crop of the shorter side would cut off heads and feet.

    Pass an instance as ``image_transform`` to :class:`vlret.data.KarpathyDataset`.

    Args:
        image_size: The crop, an int or ``(height, width)``.
        resize: Length of the shorter side after resizing; None uses the crop's longer side.
        mean: Per-channel RGB mean.
        std: Per-channel RGB standard deviation (positive).
        resample: PIL's filter for the resize, ``"bicubic"`` (CLIP, timm's ViT) or
            ``"bilinear"`` (torchvision's default, VSE++'s ResNet).
        stretch: Resize to the crop directly (``resize`` unused); None: only for a non-square
            crop.

    Raises:
        ValueError: A size is not positive, ``resize`` is smaller than the crop, ``mean`` /
            ``std`` do not hold three values, or ``resample`` is unknown.
    """

    def __init__(
        self,
        image_size: int | tuple[int, int] = 224,
        *,
        resize: int | None = None,
        mean: Sequence[float] = CLIP_MEAN,
        std: Sequence[float] = CLIP_STD,
        resample: str = "bicubic",
        stretch: bool | None = None,
    ) -> None:
        if resample not in RESAMPLES:
            raise ValueError(f"resample must be one of {RESAMPLES}, got {resample!r}")
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
        self.resample = resample
        self.stretch = self.crop[0] != self.crop[1] if stretch is None else bool(stretch)

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
        filters = getattr(pil, "Resampling", pil)
        if self.stretch:
            if (w, h) != (self.crop[1], self.crop[0]):
                resample = getattr(filters, self.resample.upper())
                image = image.resize((self.crop[1], self.crop[0]), resample=resample)
            return self._normalise(image)
        if w <= h:
            new_w, new_h = self.resize, int(self.resize * h / w)
        else:
            new_w, new_h = int(self.resize * w / h), self.resize
        if (new_w, new_h) != (w, h):
            image = image.resize((new_w, new_h), resample=getattr(filters, self.resample.upper()))
        ch, cw = self.crop
        top = int(round((new_h - ch) / 2.0))
        left = int(round((new_w - cw) / 2.0))
        return self._normalise(image.crop((left, top, left + cw, top + ch)))

    def _normalise(self, image: Any) -> torch.Tensor:
        pixels = np.asarray(image, dtype=np.float32) / 255.0
        pixels = (pixels - self.mean) / self.std
        return torch.from_numpy(np.ascontiguousarray(pixels.transpose(2, 0, 1)))

    def __repr__(self) -> str:
        extra = "" if self.resample == "bicubic" else f", resample={self.resample!r}"
        if self.stretch != (self.crop[0] != self.crop[1]):
            extra += f", stretch={self.stretch}"
        return f"CLIPImageTransform(crop={self.crop}, resize={self.resize}{extra})"


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
    path: str | Path, *, proj_dim: int | None = 768, image_size: int | Sequence[int] | None = None
) -> tuple[CLIPImageEncoder, CLIPTextEncoder, CLIPImageTransform]:
    """Image encoder, text encoder and image transform from a local CLIP directory.

    ``CLIPModel.from_pretrained(path, local_files_only=True)``, cast to float32 (fine-tuning
    half-precision weights with Adam gives NaNs; use AMP for speed instead).

    Args:
        path: The local CLIP directory (``save_pretrained`` output).
        proj_dim: Width of the added embedding layers (Unified B.1.2: 768); None keeps CLIP's
            projection output.
        image_size: ``(height, width)`` (or an int) of the input when it is not the model's
            own: the position embeddings are resampled once to the new patch grid
            (:func:`~vlret.models.clip_size.set_image_size`, IRRA's bilinear) and the
            transform resizes to it; None keeps the model's size.

    Returns:
        ``(image_encoder, text_encoder, image_transform)``.

    Raises:
        ImportError: ``transformers`` is not installed.
        FileNotFoundError: ``path`` is not a directory.
        ValueError: ``image_size`` is not positive ints that are multiples of the patch size.
    """
    transformers = import_transformers("CLIP fine-tuning")
    path = check_local_dir(path, "a CLIP model")
    clip = transformers.CLIPModel.from_pretrained(str(path), local_files_only=True).float()
    transform = CLIPImageTransform.from_pretrained(path)
    if image_size is not None:
        size = set_image_size(clip.vision_model, image_size, pretrained=True)
        mean, std = transform.mean.tolist(), transform.std.tolist()
        transform = CLIPImageTransform(size, mean=mean, std=std)
    image = CLIPImageEncoder(clip.vision_model, clip.visual_projection, proj_dim=proj_dim)
    text = CLIPTextEncoder(clip.text_model, clip.text_projection, proj_dim=proj_dim)
    return image, text, transform


#: The CLIP architectures a ``preset`` names: ``CLIPConfig`` keyword arguments. ``ViT-B-32``
#: is OpenAI's / open_clip's ViT-B/32 (vision 768 wide, 12 layers, 12 heads, patch 32, 224 px;
#: text 512 wide, 12 layers, 8 heads, 77 tokens, vocabulary 49408; 512-d joint space) with
#: plain GELU as open_clip trains it (``hidden_act="gelu"``; Hugging Face's CLIPConfig defaults
#: to OpenAI's ``quick_gelu``, which open_clip keeps only for OpenAI's own weights).
CLIP_PRESETS: dict[str, dict[str, Any]] = {
    "ViT-B-32": {
        "projection_dim": 512,
        "text_config": {
            "vocab_size": 49408,
            "hidden_size": 512,
            "intermediate_size": 2048,
            "num_hidden_layers": 12,
            "num_attention_heads": 8,
            "max_position_embeddings": 77,
            "hidden_act": "gelu",
            "bos_token_id": 49406,
            "eos_token_id": 49407,
            "pad_token_id": 1,
        },
        "vision_config": {
            "hidden_size": 768,
            "intermediate_size": 3072,
            "num_hidden_layers": 12,
            "num_attention_heads": 12,
            "image_size": 224,
            "patch_size": 32,
            "hidden_act": "gelu",
        },
    },
}
_TOWERS = ("text_config", "vision_config")


def clip_preset_config(
    preset: str, overrides: Mapping[str, Any] | None = None
) -> dict[str, dict[str, Any]]:
    """The ``CLIPConfig`` keyword arguments of ``preset`` with ``overrides`` merged in.

    ``overrides`` is a ``CLIPConfig`` table: top-level keys (``projection_dim``, ...) replace
    the preset's; ``text_config`` / ``vision_config`` are merged key by key, e.g.
    ``{"vision_config": {"hidden_size": 32, "num_hidden_layers": 2, "image_size": 32,
    "patch_size": 8}}``. Keys are
    checked against ``transformers``' configs when the model is built (:func:`build_clip`).

    Args:
        preset: A name in :data:`CLIP_PRESETS`.
        overrides: The overrides (``model.config``); None for none.

    Returns:
        A new dict (``text_config`` and ``vision_config`` always present).

    Raises:
        ValueError: An unknown preset, or ``overrides`` (or one of its towers) not a table.
    """
    if preset not in CLIP_PRESETS:
        raise ValueError(f"preset: unknown CLIP preset {preset!r}; valid: {sorted(CLIP_PRESETS)}")
    overrides = {} if overrides is None else overrides
    if not isinstance(overrides, Mapping):
        raise ValueError(f"config: expected a table of CLIPConfig overrides, got {overrides!r}")
    out = copy.deepcopy(CLIP_PRESETS[preset])
    for key, value in overrides.items():
        if key in _TOWERS:
            if not isinstance(value, Mapping):
                raise ValueError(f"config.{key}: expected a table, got {value!r}")
            out[key].update(copy.deepcopy(dict(value)))
        else:
            out[key] = copy.deepcopy(value)
    return out


def _check_config_keys(transformers: Any, kwargs: Mapping[str, Any]) -> None:
    """Refuse keys the ``transformers`` configs do not have (CLIPConfig accepts any silently)."""
    tables = (
        ("config", kwargs, transformers.CLIPConfig),
        ("config.text_config", kwargs["text_config"], transformers.CLIPTextConfig),
        ("config.vision_config", kwargs["vision_config"], transformers.CLIPVisionConfig),
    )
    for where, table, kind in tables:
        known = set(kind().to_dict()) | (set(_TOWERS) if where == "config" else set())
        unknown = sorted(set(table) - known)
        if unknown:
            raise ValueError(
                f"{where}: unknown key {unknown[0]!r} of transformers' {kind.__name__}"
            )


def build_clip(
    preset: str,
    *,
    config: Mapping[str, Any] | None = None,
    proj_dim: int | None = None,
    image_size: int | Sequence[int] | None = None,
) -> tuple[CLIPImageEncoder, CLIPTextEncoder, CLIPImageTransform]:
    """Image encoder, text encoder and transform of a randomly initialised CLIP.

    ``CLIPModel(CLIPConfig(**clip_preset_config(preset, config)))`` in float32, initialised by
    ``transformers`` from torch's global generator (seed it first); nothing is read from disk.
    The transform is CLIP's (bicubic, CLIP mean and std) at the vision tower's ``image_size``.

    Args:
        preset: A name in :data:`CLIP_PRESETS`.
        config: ``CLIPConfig`` overrides (:func:`clip_preset_config`).
        proj_dim: Width of an added embedding layer; None (pre-training) keeps CLIP's own
            projection.
        image_size: ``(height, width)`` (or an int) of the input instead of the vision
            config's square ``image_size``: random position embeddings on its patch grid
            (:func:`~vlret.models.clip_size.set_image_size`); None keeps the square.

    Returns:
        ``(image_encoder, text_encoder, image_transform)``.

    Raises:
        ImportError: ``transformers`` is not installed.
        ValueError: An unknown preset or config key, or an ``image_size`` that is not
            positive ints that are multiples of the patch size.
    """
    kwargs = clip_preset_config(preset, config)
    transformers = import_transformers("a CLIP preset")
    _check_config_keys(transformers, kwargs)
    clip = transformers.CLIPModel(transformers.CLIPConfig(**kwargs)).float()
    size: int | tuple[int, int] = int(clip.config.vision_config.image_size)
    if image_size is not None:
        size = set_image_size(clip.vision_model, image_size, pretrained=False)
    image = CLIPImageEncoder(clip.vision_model, clip.visual_projection, proj_dim=proj_dim)
    text = CLIPTextEncoder(clip.text_model, clip.text_projection, proj_dim=proj_dim)
    return image, text, CLIPImageTransform(size)


class CLIPByteTokenizer:
    """Captions as UTF-8 bytes, for a CLIP trained from scratch without a tokenizer directory.

    A caption is lower-cased with its whitespace collapsed (as CLIP's tokenizer cleans text),
    then encoded as ``[bos, byte_1, ..., byte_n, eos]``: byte ``b`` is token id ``b`` (0-255),
    ``bos`` / ``eos`` are the text config's ``bos_token_id`` / ``eos_token_id``, and a caption
    longer than ``context_length`` keeps its first ``context_length - 2`` bytes and its
    ``eos`` (CLIP pools at the end-of-text token). It is not OpenAI's BPE: a model trained on
    it needs it at evaluation (a checkpoint stores it) and its captions are about 4 times
    longer in tokens; use ``data.tokenizer`` (a local CLIP tokenizer directory) to train with
    the BPE.

    Args:
        bos_id: Start-of-text id (>= 256).
        eos_id: End-of-text id (>= 256, not ``bos_id``).
        context_length: Most ids per caption (the text tower's ``max_position_embeddings``).
        pad_id: The id written into padding (masked by ``lengths``).

    Raises:
        ValueError: An id collides with the bytes or the other, or ``context_length`` < 3.
    """

    def __init__(
        self, *, bos_id: int, eos_id: int, context_length: int = 77, pad_id: int = 0
    ) -> None:
        for name, value in (("bos_id", bos_id), ("eos_id", eos_id)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 256:
                raise ValueError(f"{name} must be an int >= 256 (0-255 are bytes), got {value!r}")
        if bos_id == eos_id:
            raise ValueError(f"bos_id and eos_id must differ, both are {bos_id}")
        if not isinstance(context_length, int) or context_length < 3:
            raise ValueError(f"context_length must be an int >= 3, got {context_length!r}")
        self.bos_id, self.eos_id = bos_id, eos_id
        self.context_length = context_length
        self.pad_id = int(pad_id)

    @classmethod
    def for_preset(cls, preset: str, config: Mapping[str, Any] | None = None) -> CLIPByteTokenizer:
        """The tokenizer of a preset's text tower (:func:`clip_preset_config`).

        Raises:
            ValueError: The text config's ``vocab_size`` does not cover the bytes and the
                ``bos`` / ``eos`` ids (the message names ``config.text_config``).
        """
        text = clip_preset_config(preset, config)["text_config"]
        bos, eos = text["bos_token_id"], text["eos_token_id"]
        vocab, length = text["vocab_size"], text["max_position_embeddings"]
        if not isinstance(vocab, int) or vocab <= max(255, bos, eos):
            raise ValueError(
                f"config.text_config: vocab_size {vocab!r} does not cover the byte tokenizer's "
                f"ids (bytes 0-255, bos_token_id {bos}, eos_token_id {eos})"
            )
        try:
            return cls(bos_id=bos, eos_id=eos, context_length=length)
        except ValueError as err:
            raise ValueError(f"config.text_config: {err}") from None

    def encode(self, text: str) -> list[int]:
        """``[bos, bytes..., eos]`` of the cleaned caption, at most ``context_length`` ids."""
        data = " ".join(text.lower().split()).encode("utf-8")
        return [self.bos_id, *data[: self.context_length - 2], self.eos_id]

    def state(self) -> dict[str, Any]:
        """What rebuilds it: ``CLIPByteTokenizer(**state)``."""
        return {
            "bos_id": self.bos_id,
            "eos_id": self.eos_id,
            "context_length": self.context_length,
            "pad_id": self.pad_id,
        }

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CLIPByteTokenizer) and self.state() == other.state()

    def __hash__(self) -> int:
        return hash(tuple(self.state().items()))

    def __repr__(self) -> str:
        return (
            f"CLIPByteTokenizer(bos_id={self.bos_id}, eos_id={self.eos_id}, "
            f"context_length={self.context_length})"
        )


__all__ = [
    "CLIP_MEAN",
    "CLIP_PRESETS",
    "CLIP_STD",
    "RESAMPLES",
    "CLIPByteTokenizer",
    "CLIPImageEncoder",
    "CLIPImageTransform",
    "CLIPTextEncoder",
    "build_clip",
    "clip_preset_config",
    "load_clip",
]
