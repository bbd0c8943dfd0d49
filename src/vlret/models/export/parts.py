"""What an export reads of a vlret CLIP, and what no export can carry.

:func:`clip_parts` takes a :class:`~vlret.models.retrieval.RetrievalModel` built with
``model.kind = "clip"`` apart into ``transformers``' CLIP pieces (the vision and text towers,
their projections, the image transform) and refuses, in one line naming the difference, what
neither ``transformers``' ``CLIPModel`` nor open_clip's ``CLIP`` has:

* another model kind (precomputed features, GRU or BERT text, pair scorers, video experts):
  only ``model.kind = "clip"`` has CLIP's towers;
* an added embedding layer (``model.proj_dim``, Unified paper B.1.2): a linear layer with a
  bias after CLIP's projection, where both libraries end at a bias-free projection matrix;
* a non-square input (``model.image_size = [384, 128]``, IRRA's person search): both
  libraries' configs hold one square ``image_size`` (a square size other than the preset's is
  exported as the config's ``image_size`` with the resampled position embeddings).

The caption encoder is checked by each format (:mod:`.hf`, :mod:`.open_clip`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

#: The model kinds an export takes.
EXPORTABLE_KINDS = ("clip",)


class ExportRefused(ValueError):
    """The model cannot be expressed in the target format; the message names the difference."""


@dataclass(frozen=True)
class CLIPParts:
    """A vlret CLIP as ``transformers``' pieces.

    Attributes:
        vision_model: ``CLIPModel.vision_model`` (its embeddings possibly a
            :class:`~vlret.models.clip_size.GridVisionEmbeddings` of the same parameter names).
        text_model: ``CLIPModel.text_model``.
        visual_projection: The bias-free ``(projection_dim, vision hidden)`` linear layer.
        text_projection: The bias-free ``(projection_dim, text hidden)`` linear layer.
        vision_config: The vision tower's config as a dict, ``image_size`` set to the input.
        text_config: The text tower's config as a dict.
        image_transform: The model's :class:`~vlret.models.clip.CLIPImageTransform`.
        normalize: ``model.normalize`` (vlret L2-normalises its embeddings).
        scoring: ``model.scoring`` (``cosine`` or ``dot``).
    """

    vision_model: nn.Module
    text_model: nn.Module
    visual_projection: nn.Linear
    text_projection: nn.Linear
    vision_config: dict[str, Any]
    text_config: dict[str, Any]
    image_transform: Any
    normalize: bool
    scoring: str

    @property
    def projection_dim(self) -> int:
        """Width of the joint space."""
        return int(self.visual_projection.out_features)

    @property
    def image_size(self) -> int:
        """The square input side."""
        return int(self.vision_config["image_size"])


def _kind(model: Any) -> str:
    config = getattr(model, "config", None)
    kind = config.get("kind") if isinstance(config, dict) else None
    return str(kind) if kind is not None else type(model).__name__


def clip_parts(model: Any) -> CLIPParts:
    """The pieces of a vlret CLIP (module docstring), or a refusal naming why not.

    Args:
        model: A model :func:`~vlret.models.build_model` built (a trained one rebuilt from its
            checkpoint).

    Returns:
        Its :class:`CLIPParts`.

    Raises:
        ExportRefused: Not a CLIP, an added embedding layer, or a non-square input.
    """
    from ..clip import CLIPImageTransform
    from ..clip_towers import CLIPImageEncoder, CLIPTextEncoder

    kind = _kind(model)
    image = getattr(model, "image_encoder", None)
    text = getattr(model, "text_encoder", None)
    if (
        kind not in EXPORTABLE_KINDS
        or not isinstance(image, CLIPImageEncoder)
        or not isinstance(text, CLIPTextEncoder)
    ):
        raise ExportRefused(
            f'model.kind is {kind!r}; only CLIP models (model.kind = "clip", from a preset or '
            "a local CLIP folder) can be exported"
        )
    if not isinstance(image.embed_proj, nn.Identity) or not isinstance(
        text.embed_proj, nn.Identity
    ):
        width = getattr(image.embed_proj, "out_features", "?")
        raise ExportRefused(
            f"model.proj_dim = {width} adds an embedding layer with a bias after CLIP's "
            "projection, which CLIP's architecture (a bias-free projection) cannot hold"
        )
    size = getattr(image.vision_model.embeddings, "image_size", None)
    pair = tuple(size) if isinstance(size, (tuple, list)) else (size, size)
    if pair[0] != pair[1]:
        raise ExportRefused(
            f"model.image_size = [{pair[0]}, {pair[1]}] is not square; CLIP's configs hold one "
            "image_size for both sides"
        )
    transform = getattr(model, "image_transform", None)
    if not isinstance(transform, CLIPImageTransform) or transform.crop != pair:
        raise ExportRefused(
            f"the model's image transform ({transform!r}) does not give its {pair[0]} x "
            f"{pair[1]} input"
        )
    towers: tuple[Any, Any] = (image.vision_model, text.text_model)  # transformers' models
    vision_config = towers[0].config.to_dict()
    vision_config["image_size"] = int(pair[0])
    return CLIPParts(
        vision_model=image.vision_model,
        text_model=text.text_model,
        visual_projection=image.visual_projection,
        text_projection=text.text_projection,
        vision_config=vision_config,
        text_config=towers[1].config.to_dict(),
        image_transform=transform,
        normalize=bool(getattr(model, "normalize", False)),
        scoring=str(getattr(model, "scoring", "cosine")),
    )


__all__ = ["EXPORTABLE_KINDS", "CLIPParts", "ExportRefused", "clip_parts"]
