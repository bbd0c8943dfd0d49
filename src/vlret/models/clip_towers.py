"""CLIP's two towers as vlret trains them: each side's ``transformers`` tower and projection,
then an added embedding layer.

Unified paper B.1.2 fine-tunes CLIP ViT-L/14@336px with "an embedding layer of dimension 768
after each of the image and text encoders": here a linear layer after CLIP's own projection on
each side (``proj_dim=768``; ``None`` keeps CLIP's projection output), initialised
Xavier-uniform with a zero bias. The image side holds only CLIP's vision tower and
``visual_projection``, the text side only the text tower and ``text_projection``; CLIP's
``logit_scale`` is left out because the losses bring their own temperature, and every kept
parameter receives a gradient (DistributedDataParallel needs it). The towers come from a local
folder (:func:`vlret.models.clip.load_clip`) or a preset (:func:`vlret.models.clip.build_clip`).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .text import check_captions


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


__all__ = ["CLIPImageEncoder", "CLIPTextEncoder"]
