"""``vlret export --format hf``: a vlret CLIP as a ``transformers`` CLIP folder.

The folder holds what ``CLIPModel.save_pretrained`` and ``CLIPProcessor.save_pretrained``
write (``config.json``, ``model.safetensors``, ``processor_config.json`` and the tokenizer's
files), so ``CLIPModel.from_pretrained(DIR)`` and ``CLIPProcessor.from_pretrained(DIR)`` load
it, and vlret reads it back as a local CLIP (``model.path = DIR``, ``vlret eval --model-dir``).

**Weights.** vlret's CLIP *is* ``transformers``' towers and projections (:mod:`.parts`), so the
state dict is copied key for key (``vision_model.*``, ``text_model.*``,
``visual_projection.weight``, ``text_projection.weight``) into a ``CLIPModel`` of the same
config; a square input other than the preset's becomes the vision config's ``image_size``.
``logit_scale`` is the one parameter vlret does not keep (its losses bring their own
temperature): it is the caller's (the checkpoint's learned or fixed temperature,
``log(1 / temperature)``), else ``CLIPConfig``'s initial value.

**Embeddings.** ``get_image_features(**inputs).pooler_output`` and
``get_text_features(**inputs).pooler_output`` are vlret's image and text embeddings *before*
L2 normalisation: the outputs of the model's ``image_encoder`` and ``text_encoder``
(``RetrievalModel.encode_images`` / ``encode_texts`` with ``model.normalize`` false; with it
true, normalise the features). vlret scores them by ``model.scoring``: cosine (normalise both,
as ``CLIPModel``'s logits do) or dot (rank by the unnormalised features' dot products).

**Image preprocessing.** The processor's image steps are the model's
:class:`~vlret.models.clip.CLIPImageTransform`: ``size`` (the shorter side, or an exact
``height`` / ``width``), ``crop_size``, ``resample``, ``rescale_factor``, ``image_mean`` and
``image_std`` (the float32 values vlret uses). One step differs: ``transformers`` places the
centre crop at ``floor((H - h) / 2)``, vlret's preset CLIPs (like OpenAI's and open_clip's
torchvision pipeline) at ``round((H - h) / 2)``, so where the resized longer side exceeds the
crop by 3, 7, 11, ... pixels the two crops are one pixel apart (square images and even
differences are equal). A CLIP loaded from a folder already uses ``transformers``' floor. Load
the processor with ``backend="pil"`` where torchvision is installed: ``transformers`` 5 would
otherwise resize with torchvision's bicubic filter, not PIL's, which vlret uses.

**Tokenizer.** A CLIP trained on a local Hugging Face tokenizer ships that tokenizer, with
``model_max_length`` set to the length vlret truncates to (the text tower's
``max_position_embeddings`` at most); call the processor with ``truncation=True``. vlret's
byte tokenizer ships as a ``tokenizer.json`` (:mod:`.byte_tokenizer`) giving the same ids.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from ..._extras import require
from ..clip import CLIPByteTokenizer
from ..clip_folder import PIL_FILTERS
from .byte_tokenizer import byte_tokenizer_for_transformers
from .folder import write_export_dir
from .parts import CLIPParts, ExportRefused, clip_parts

#: ``CLIPConfig``'s ``logit_scale_init_value`` (``log(1 / 0.07)``, rounded as it stores it).
DEFAULT_LOGIT_SCALE = 2.6592


def hf_tokenizer(encoder: Any) -> Any:
    """The ``transformers`` tokenizer that gives ``encoder``'s ids.

    Args:
        encoder: The checkpoint's caption encoder: a
            :class:`~vlret.models.clip.CLIPByteTokenizer`, or a wrapped Hugging Face
            tokenizer (``.tokenizer`` and ``.max_length``, :class:`vlret.data.vocab.HFTokenizer`).

    Returns:
        A tokenizer whose ``save_pretrained`` output ``AutoTokenizer`` loads, truncating (with
        ``truncation=True``) where vlret truncates.

    Raises:
        ExportRefused: ``encoder`` is neither (a word vocabulary has no CLIP text tower).
    """
    if isinstance(encoder, CLIPByteTokenizer):
        return byte_tokenizer_for_transformers(encoder)
    tokenizer = getattr(encoder, "tokenizer", None)
    if tokenizer is None or not hasattr(tokenizer, "save_pretrained"):
        raise ExportRefused(
            f"the caption encoder {type(encoder).__name__} is neither vlret's byte tokenizer nor "
            "a Hugging Face tokenizer"
        )
    max_length = getattr(encoder, "max_length", None)
    if max_length is not None:
        tokenizer.model_max_length = int(max_length)
    return tokenizer


def image_processor_kwargs(transform: Any) -> dict[str, Any]:
    """``CLIPImageProcessor`` keyword arguments of a
    :class:`~vlret.models.clip.CLIPImageTransform` (module docstring; its crop offsets are
    ``transformers``' floor whatever the transform's)."""
    resample = {name: number for number, name in PIL_FILTERS.items()}[transform.resample]
    crop_h, crop_w = transform.crop
    size: dict[str, int]
    if transform.stretch:
        size = {"height": crop_h, "width": crop_w}
    elif isinstance(transform.resize, tuple):
        size = {"height": transform.resize[0], "width": transform.resize[1]}
    else:
        size = {"shortest_edge": int(transform.resize)}
    return {
        "do_resize": transform.do_resize,
        "size": size,
        "resample": resample,
        "do_center_crop": transform.do_center_crop,
        "crop_size": {"height": crop_h, "width": crop_w},
        "do_rescale": True,
        "rescale_factor": transform.rescale_factor,
        "do_normalize": True,
        "image_mean": [float(v) for v in transform.mean.tolist()],
        "image_std": [float(v) for v in transform.std.tolist()],
        "do_convert_rgb": True,
    }


def crop_offsets_note(transform: Any) -> str | None:
    """The one-line note on the crop offsets where the transform rounds (module docstring)."""
    if getattr(transform, "crop_offsets", "floor") != "round" or not transform.do_center_crop:
        return None
    return (
        "crop offsets: transformers crops at floor((H - h) / 2), this model at "
        "round((H - h) / 2); images whose resized longer side exceeds the crop by 3, 7, 11, ... "
        "pixels are cropped one pixel apart"
    )


def hf_state_dict(parts: CLIPParts, logit_scale: float) -> dict[str, torch.Tensor]:
    """``CLIPModel``'s state dict of the parts, tensors copied to contiguous float32."""
    state: dict[str, torch.Tensor] = {}
    for prefix, module in (
        ("vision_model.", parts.vision_model),
        ("text_model.", parts.text_model),
        ("visual_projection.", parts.visual_projection),
        ("text_projection.", parts.text_projection),
    ):
        for key, value in module.state_dict().items():
            state[prefix + key] = value.detach().to("cpu", torch.float32).contiguous().clone()
    state["logit_scale"] = torch.tensor(float(logit_scale))
    return state


def build_hf_clip(parts: CLIPParts, *, logit_scale: float | None = None) -> Any:
    """The ``transformers.CLIPModel`` holding the parts' weights, in float32.

    Raises:
        MissingExtra: ``transformers`` is not installed.
        ExportRefused: The weights do not fill the ``CLIPModel`` of their config (a key
            missing or left over, named).
    """
    transformers = require("transformers", "vlret export --format hf")
    scale = DEFAULT_LOGIT_SCALE if logit_scale is None else float(logit_scale)
    config = transformers.CLIPConfig(
        text_config=parts.text_config,
        vision_config=parts.vision_config,
        projection_dim=parts.projection_dim,
        logit_scale_init_value=scale,
    )
    clip = transformers.CLIPModel(config).float()
    missing, unexpected = clip.load_state_dict(hf_state_dict(parts, scale), strict=False)
    if missing or unexpected:
        which = f"missing {missing[0]}" if missing else f"unexpected {unexpected[0]}"
        raise ExportRefused(f"the weights do not fill transformers' CLIPModel ({which})")
    return clip.eval()


def export_hf(
    model: Any,
    *,
    encoder: Any,
    out: str | Path,
    logit_scale: float | None = None,
    overwrite: bool = False,
) -> list[str]:
    """Write ``model`` as a ``transformers`` CLIP folder (module docstring).

    Args:
        model: A vlret CLIP (:func:`~vlret.models.build_model`, e.g. rebuilt from a checkpoint).
        encoder: Its caption encoder (:func:`hf_tokenizer`).
        out: The folder to write (refused if it exists, unless ``overwrite``).
        logit_scale: ``log(1 / temperature)`` for ``CLIPModel.logit_scale``; None:
            ``CLIPConfig``'s initial value.
        overwrite: Replace an existing export folder.

    Returns:
        Notes for the user: where the export differs from vlret (the crop offsets) and how
        to reproduce its scores.

    Raises:
        ExportRefused: What ``CLIPModel`` cannot hold (:func:`~.parts.clip_parts`), or a
            caption encoder with no ``transformers`` tokenizer.
        OutputPathError: ``out`` is refused (:func:`~.folder.check_export_dir`).
        MissingExtra: ``transformers`` is not installed.
    """
    parts = clip_parts(model)
    tokenizer = hf_tokenizer(encoder)
    if logit_scale is not None and not math.isfinite(logit_scale):
        raise ValueError(f"logit_scale must be finite, got {logit_scale!r}")
    transformers = require("transformers", "vlret export --format hf")
    clip = build_hf_clip(parts, logit_scale=logit_scale)
    image_processor = transformers.CLIPImageProcessorPil(
        **image_processor_kwargs(parts.image_transform)
    )
    processor = transformers.CLIPProcessor(image_processor=image_processor, tokenizer=tokenizer)

    def fill(folder: Path) -> None:
        bars = transformers.utils.logging
        shown = bars.is_progress_bar_enabled()
        bars.disable_progress_bar()  # one shard of a known size: its bar says nothing
        try:
            clip.save_pretrained(str(folder))
            processor.save_pretrained(str(folder))
        finally:
            if shown:
                bars.enable_progress_bar()

    write_export_dir(out, fill, overwrite=overwrite)
    notes = [crop_offsets_note(parts.image_transform)]
    if parts.scoring == "dot":
        notes.append(
            "model.scoring is dot: rank by the dot products of get_*_features, not by "
            "CLIPModel's logits (cosine)"
        )
    return [note for note in notes if note]


__all__ = [
    "DEFAULT_LOGIT_SCALE",
    "build_hf_clip",
    "crop_offsets_note",
    "export_hf",
    "hf_state_dict",
    "hf_tokenizer",
    "image_processor_kwargs",
]
