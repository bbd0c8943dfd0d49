"""CLIP fine-tuning: a local ``CLIPModel`` read with its own preprocessing, and CLIP
preprocessing.

:func:`load_clip` reads a ``transformers`` ``CLIPModel`` from a local directory and returns its
towers with vlret's added embedding layers (:mod:`vlret.models.clip_towers`; Unified paper
B.1.2) and the image transform of the processor saved beside it, in either of ``transformers``'
layouts (:mod:`vlret.models.clip_folder`: ``processor_config.json`` from transformers 5,
``preprocessor_config.json`` from transformers 4). A folder without either is refused unless
``default_preprocessing = "openai-clip"`` names OpenAI's pipeline. The image preprocessing uses
PIL and numpy only (no torchvision).

OpenAI's CLIP pipeline (:class:`CLIPImageTransform`'s defaults): bicubic resize of the shorter
side to the model's image size, a center crop to ``image_size x image_size``, scaling to
``[0, 1]`` and normalisation by the CLIP mean and standard deviation per channel. A processor
file's steps are applied as ``transformers`` applies them (its sizes, filter, rescale factor,
mean and std, crop offsets rounded down). A non-square input (``image_size = [384, 128]``,
IRRA's person-search CLIP; :mod:`vlret.models.clip_size`) is resized to ``(height, width)``
directly, as IRRA's evaluation transform does.

Pre-training from scratch (AdaCL Table 2): :func:`build_clip` builds a named architecture
(:data:`CLIP_PRESETS`, ``"ViT-B-32"``) with random weights, with ``CLIPConfig`` overrides (a tiny
one for tests and the synthetic world). Its captions are tokenised by a local CLIP tokenizer
directory (``data.tokenizer``) or, when asked for (``model.tokenizer = "bytes"``), by
:class:`CLIPByteTokenizer`: UTF-8 bytes, no download, no vocabulary file.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .._images import DEFAULT_MAX_IMAGE_PIXELS, open_rgb
from .clip_folder import ImagePreprocessing, load_clip_model, read_preprocessing, vision_image_size
from .clip_size import set_image_size
from .clip_towers import CLIPImageEncoder, CLIPTextEncoder
from .text import check_local_dir, import_transformers

#: Per-channel RGB mean and std of the original CLIP preprocessing.
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
#: PIL resampling filters :class:`CLIPImageTransform` accepts (every filter a Hugging Face image
#: processor's ``resample`` may name).
RESAMPLES = ("bicubic", "bilinear", "nearest", "lanczos", "box", "hamming")
#: How the centre crop's offset is rounded: torchvision's (OpenAI's CLIP) or transformers'.
CROP_OFFSETS = ("round", "floor")


def _import_pil() -> Any:
    try:
        from PIL import Image
    except ImportError:
        raise ImportError(
            "CLIP image preprocessing needs the optional package pillow: pip install vlret[hf]"
        ) from None
    return Image


class CLIPImageTransform:
    """PIL image (or image path) -> float32 tensor ``(3, crop_h, crop_w)`` for CLIP.

    1. convert to RGB and resize (bicubic) so the shorter side is ``resize`` pixels (the longer
       side becomes ``int(resize * long / short)``), as CLIP's preprocessing does;
    2. center crop, offsets ``round((H - crop_h) / 2)`` and ``round((W - crop_w) / 2)``
       (torchvision's, OpenAI's CLIP) or, with ``crop_offsets="floor"``, ``(H - crop_h) // 2``
       (``transformers``' image processors);
    3. ``(pixel * rescale_factor - mean[c]) / std[c]`` per channel (computed in float64),
       channels first.

    With ``stretch`` (the default for a non-square crop) steps 1-2 are one resize to
    ``(crop_h, crop_w)``, the aspect ratio not kept: IRRA's ``Resize((384, 128))`` for
    pedestrian pictures, where a centre crop of the shorter side would cut off heads and feet.
    ``resize = (height, width)`` resizes to that exact size before the crop, as a Hugging Face
    image processor's ``size = {"height", "width"}`` does; ``do_resize`` / ``do_center_crop``
    false skip a step as the processor's keys of that name do, and then an image whose result
    is not ``image_size`` is refused (it would not fit the vision tower).

    Pass an instance as ``image_transform`` to :class:`vlret.data.KarpathyDataset`.

    Args:
        image_size: The crop (the output size), an int or ``(height, width)``.
        resize: Length of the shorter side after resizing, or an exact ``(height, width)``;
            None uses the crop's longer side.
        mean: Per-channel RGB mean.
        std: Per-channel RGB standard deviation (positive).
        resample: PIL's filter for the resize (:data:`RESAMPLES`): ``"bicubic"`` (CLIP, timm's
            ViT), ``"bilinear"`` (torchvision's default, VSE++'s ResNet), ...
        stretch: Resize to the crop directly (``resize`` unused); None: only for a non-square
            crop and no exact ``resize``.
        do_resize: Resize at all (False: the image's own size goes to the crop).
        do_center_crop: Crop at all (False: the resize must give ``image_size``).
        crop_offsets: ``"round"`` or ``"floor"`` (step 2).
        rescale_factor: What a 0-255 pixel value is multiplied by (``1/255``: to ``[0, 1]``).
        max_pixels: The largest ``width * height`` read (``data.max_image_pixels``); None: no
            cap. Images are read by :func:`vlret._images.open_rgb` (every PIL mode to RGB,
            EXIF orientation applied, the cap checked before decoding).

    Raises:
        ValueError: A size is not positive, ``resize`` is smaller than the crop, ``mean`` /
            ``std`` do not hold three values, ``resample`` or ``crop_offsets`` is unknown, or
            the steps asked for do not give one output size.
    """

    def __init__(
        self,
        image_size: int | tuple[int, int] = 224,
        *,
        resize: int | tuple[int, int] | None = None,
        mean: Sequence[float] = CLIP_MEAN,
        std: Sequence[float] = CLIP_STD,
        resample: str = "bicubic",
        stretch: bool | None = None,
        do_resize: bool = True,
        do_center_crop: bool = True,
        crop_offsets: str = "round",
        rescale_factor: float = 1 / 255,
        max_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS,
    ) -> None:
        if resample not in RESAMPLES:
            raise ValueError(f"resample must be one of {RESAMPLES}, got {resample!r}")
        if crop_offsets not in CROP_OFFSETS:
            raise ValueError(f"crop_offsets must be one of {CROP_OFFSETS}, got {crop_offsets!r}")
        if not rescale_factor > 0:
            raise ValueError(f"rescale_factor must be positive, got {rescale_factor!r}")
        crop = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
        if len(crop) != 2 or min(crop) < 1:
            raise ValueError(f"image_size must be a positive int or (h, w), got {image_size!r}")
        if len(mean) != 3 or len(std) != 3 or min(std) <= 0:
            raise ValueError(f"mean and std need 3 values (std > 0), got {mean!r}, {std!r}")
        self.crop = (int(crop[0]), int(crop[1]))
        exact = None
        shorter = max(self.crop)
        if isinstance(resize, (tuple, list)):
            exact = (int(resize[0]), int(resize[1]))
        elif resize is not None:
            shorter = int(resize)
        default_stretch = self.crop[0] != self.crop[1] and exact is None
        self.stretch = default_stretch if stretch is None else bool(stretch)
        if shorter < max(self.crop):
            raise ValueError(f"resize ({resize}) must be at least the crop size {self.crop}")
        #: the resized (height, width), or the shorter side; neither: no resize
        self._exact = exact if exact is not None or not self.stretch else self.crop
        self._shorter = shorter if self._exact is None else None
        if self._exact is not None and not all(
            r >= c for r, c in zip(self._exact, self.crop, strict=True)
        ):
            raise ValueError(f"resize {resize!r} is smaller than the crop {self.crop}")
        if do_resize and not do_center_crop and self._exact != self.crop:
            raise ValueError(f"without a center crop, resize must be the size {self.crop}")
        if not do_resize:
            self._exact = self._shorter = None
        self.resize = exact if exact is not None else shorter
        self.do_resize, self.do_center_crop = bool(do_resize), bool(do_center_crop)
        self.crop_offsets = crop_offsets
        self.rescale_factor = float(rescale_factor)
        self.max_pixels = max_pixels
        self.mean = np.asarray(mean, dtype=np.float32)
        self.std = np.asarray(std, dtype=np.float32)
        self.resample = resample

    @classmethod
    def from_preprocessing(cls, steps: ImagePreprocessing) -> CLIPImageTransform:
        """The transform that applies a Hugging Face image processor's steps as ``transformers``
        does (:func:`vlret.models.clip_folder.parse_image_processor`): the transform's own
        default mean and std where the processor leaves ``CLIPImageProcessor``'s (OpenAI's),
        and ``transformers``' floor for the crop offsets."""
        size = steps.output_size
        if size is None:
            raise ValueError(f"{steps.source}: the steps do not give one image size")
        return cls(
            size,
            resize=steps.resize,
            mean=CLIP_MEAN if steps.mean is None else steps.mean,
            std=CLIP_STD if steps.std is None else steps.std,
            resample=steps.resample,
            stretch=False,
            do_resize=steps.resize is not None,
            do_center_crop=steps.crop is not None,
            crop_offsets="floor",
            rescale_factor=steps.rescale_factor,
        )

    @classmethod
    def from_pretrained(
        cls, path: str | Path, *, default_preprocessing: str | None = None
    ) -> CLIPImageTransform:
        """The transform of a local CLIP directory (needs no ``transformers``).

        Reads the image processor ``transformers`` saved there, in either layout:
        ``processor_config.json``'s ``image_processor`` (transformers 5) or
        ``preprocessor_config.json`` (transformers 4; :mod:`vlret.models.clip_folder`).
        A folder with neither is refused unless ``default_preprocessing = "openai-clip"``:
        OpenAI's CLIP pipeline at the vision config's ``image_size`` in ``config.json``.

        Args:
            path: The local CLIP directory.
            default_preprocessing: None, or ``"openai-clip"`` (used only without a file).

        Returns:
            The configured transform.

        Raises:
            FileNotFoundError: ``path`` is not a directory, or holds no processor file (and
                no defaults were named) or, with the defaults, no ``config.json``.
            ValueError: A JSON file is unreadable or holds keys vlret cannot apply as
                ``transformers`` would; the message names the file and the key.
        """
        path = check_local_dir(path, "a CLIP model")
        steps = read_preprocessing(path, default_preprocessing=default_preprocessing)
        if steps is None:  # the caller opted into OpenAI CLIP's pipeline
            return cls(vision_image_size(path))
        return cls.from_preprocessing(steps)

    def __call__(self, image: Any) -> torch.Tensor:
        """Preprocess one image.

        Args:
            image: A PIL image, or the path of an image file.

        Returns:
            The normalised float32 ``(3, crop_h, crop_w)`` tensor.

        Raises:
            ValueError: ``image`` is neither a PIL image nor a path, or (with a step skipped)
                it is too small for the crop or does not come out at ``image_size``.
            ImageReadError: The file is missing or not a readable image
                (:class:`vlret._images.ImageTooLarge`: over ``max_pixels``); one line naming it.
            ImportError: pillow is not installed.
        """
        pil = _import_pil()
        if not isinstance(image, (str, Path, pil.Image)):
            raise ValueError(f"image must be a PIL image or a path, got {type(image).__name__}")
        image = open_rgb(image, max_pixels=self.max_pixels)
        w, h = image.size
        if self._exact is not None:
            new_h, new_w = self._exact
        elif self._shorter is not None and w <= h:
            new_w, new_h = self._shorter, int(self._shorter * h / w)
        elif self._shorter is not None:
            new_w, new_h = int(self._shorter * w / h), self._shorter
        else:
            new_w, new_h = w, h
        if (new_w, new_h) != (w, h):
            filters = getattr(pil, "Resampling", pil)
            image = image.resize((new_w, new_h), resample=getattr(filters, self.resample.upper()))
        ch, cw = self.crop
        if self.do_center_crop and (new_h < ch or new_w < cw):
            raise ValueError(f"image: {new_w} x {new_h} (width x height) is smaller than the crop")
        if self.do_center_crop and (new_h, new_w) != self.crop:
            if self.crop_offsets == "floor":
                top, left = (new_h - ch) // 2, (new_w - cw) // 2
            else:
                top, left = int(round((new_h - ch) / 2.0)), int(round((new_w - cw) / 2.0))
            image = image.crop((left, top, left + cw, top + ch))
        if image.size != (cw, ch):
            raise ValueError(
                f"image: {image.size[0]} x {image.size[1]} (width x height) after preprocessing; "
                f"this CLIP takes {cw} x {ch}"
            )
        return self._normalise(image)

    def _normalise(self, image: Any) -> torch.Tensor:
        pixels = np.asarray(image, dtype=np.float64) * self.rescale_factor
        pixels = (pixels - self.mean.astype(np.float64)) / self.std.astype(np.float64)
        return torch.from_numpy(np.ascontiguousarray(pixels.transpose(2, 0, 1), dtype=np.float32))

    def __repr__(self) -> str:
        extra = "" if self.resample == "bicubic" else f", resample={self.resample!r}"
        if self.stretch != (self.crop[0] != self.crop[1]):
            extra += f", stretch={self.stretch}"
        for name, default in (("do_resize", True), ("do_center_crop", True)):
            if getattr(self, name) != default:
                extra += f", {name}={getattr(self, name)}"
        if self.crop_offsets != "round":
            extra += f", crop_offsets={self.crop_offsets!r}"
        return f"CLIPImageTransform(crop={self.crop}, resize={self.resize}{extra})"


def load_clip(
    path: str | Path,
    *,
    proj_dim: int | None = 768,
    image_size: int | Sequence[int] | None = None,
    default_preprocessing: str | None = None,
) -> tuple[CLIPImageEncoder, CLIPTextEncoder, CLIPImageTransform]:
    """Image encoder, text encoder and image transform from a local CLIP directory.

    ``CLIPModel.from_pretrained(path, local_files_only=True)``, cast to float32 (fine-tuning
    half-precision weights with Adam gives NaNs; use AMP for speed instead), with each failure
    one line (:func:`~vlret.models.clip_folder.load_clip_model`); the transform is the
    folder's image processor (:meth:`CLIPImageTransform.from_pretrained`), read first so that a
    folder without one is refused before the weights are loaded.

    Args:
        path: The local CLIP directory (``save_pretrained`` output).
        proj_dim: Width of the added embedding layers (Unified B.1.2: 768); None keeps CLIP's
            projection output.
        image_size: ``(height, width)`` (or an int) of the input when it is not the model's
            own: the position embeddings are resampled once to the new patch grid
            (:func:`~vlret.models.clip_size.set_image_size`, IRRA's bilinear) and the
            transform resizes to it (keeping the processor's mean, std, filter and rescale
            factor); None keeps the model's size.
        default_preprocessing: ``"openai-clip"`` to use OpenAI CLIP's preprocessing when the
            folder holds no processor file; None refuses such a folder.

    Returns:
        ``(image_encoder, text_encoder, image_transform)``.

    Raises:
        ImportError: ``transformers`` is not installed.
        FileNotFoundError: ``path`` is not a directory, or holds no weights, or no processor
            file (and no ``default_preprocessing``).
        ValueError: ``image_size`` is not positive ints that are multiples of the patch size,
            the processor's output size is not the vision config's ``image_size``, or the
            folder's files cannot be read (the message names the file).
    """
    import_transformers("CLIP fine-tuning")  # a missing extra is named before any file
    path = check_local_dir(path, "a CLIP model")
    transform = CLIPImageTransform.from_pretrained(
        path, default_preprocessing=default_preprocessing
    )
    clip = load_clip_model(path)
    own = int(clip.config.vision_config.image_size)
    if image_size is not None:
        size = set_image_size(clip.vision_model, image_size, pretrained=True)
        transform = CLIPImageTransform(
            size,
            mean=transform.mean.tolist(),
            std=transform.std.tolist(),
            resample=transform.resample,
            crop_offsets=transform.crop_offsets,
            rescale_factor=transform.rescale_factor,
            max_pixels=transform.max_pixels,
        )
    elif transform.crop != (own, own):
        raise ValueError(
            f"{path}: its image processor gives {transform.crop[0]} x {transform.crop[1]} images "
            f"but config.json's vision_config image_size is {own} (set image_size to resample "
            "the position embeddings)"
        )
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
