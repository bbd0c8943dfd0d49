"""CLIP at a non-square input: the vision tower's position embeddings on a ``(h, w)`` patch grid.

Text-based person search trains CLIP ViT-B/16 on 384 x 128 (height x width) pedestrian images
(IRRA): the pretrained 224 x 224 model's 14 x 14 grid of patch position embeddings is
interpolated once, when the model is built, to the 24 x 8 grid of the new input, and training
updates the interpolated embeddings (IRRA's ``model/clip_model.py``: ``load_param`` calls
``resize_pos_embed``). :func:`set_image_size` does that to a ``transformers`` CLIP vision tower:
the class token's embedding is kept, the grid's are resampled by
:func:`resize_position_embedding`, and the tower's embeddings module becomes a
:class:`GridVisionEmbeddings` that takes exactly ``(h, w)`` images.

Readings and choices:

* **Once, not at every forward.** ``transformers`` offers ``interpolate_pos_encoding=True``,
  which keeps the 14 x 14 parameters and resamples them at each forward (bicubic). IRRA
  resamples once and fine-tunes the 24 x 8 result, so the parameters trained are the grid's
  own; that is what is done here (``GridVisionEmbeddings`` still accepts
  ``interpolate_pos_encoding=True`` for another input size, resampling its own grid).
* **Filter.** IRRA's ``resize_pos_embed`` calls ``F.interpolate(..., mode='bilinear')``
  (``align_corners=False``), so ``mode="bilinear"`` is the default; ``mode="bicubic"`` is
  ``transformers``' ``interpolate_pos_encoding`` filter (also ``align_corners=False``).
* **Random weights.** For a preset (no pretrained grid) the new grid's embeddings are drawn as
  ``transformers`` initialises CLIP's: normal with standard deviation
  ``initializer_range * initializer_factor`` of the vision config.
* **Stride.** IRRA's ``stride_size`` equals the patch size in its released runs (16); the
  patch convolution is kept as is, so ``h`` and ``w`` must be multiples of the patch size.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

#: Resampling filters of :func:`resize_position_embedding` (``F.interpolate`` modes).
POS_MODES = ("bilinear", "bicubic")


def image_size_pair(value: Any, where: str = "image_size") -> tuple[int, int]:
    """``(height, width)`` from a positive int (a square) or a pair of positive ints.

    Raises:
        ValueError: Anything else, naming ``where`` and the value.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        pair: Sequence[Any] = (value, value)
    elif isinstance(value, (list, tuple)) and len(value) == 2:
        pair = value
    else:
        raise ValueError(f"{where}: expected an int or [height, width], got {value!r}")
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in pair):
        raise ValueError(f"{where}: expected positive integers [height, width], got {value!r}")
    return int(pair[0]), int(pair[1])


def resize_position_embedding(
    weight: torch.Tensor,
    grid: tuple[int, int],
    *,
    old_grid: tuple[int, int] | None = None,
    mode: str = "bilinear",
) -> torch.Tensor:
    """Position embeddings ``(1 + gh * gw, D)`` resampled to the patch grid ``grid``.

    Row 0 (the class token's) is kept; rows ``1..`` are the old grid in row-major order
    (``transformers``' and OpenAI's layout), resampled as a ``D``-channel image by
    ``F.interpolate(size=grid, mode=mode, align_corners=False)`` (IRRA's
    ``resize_pos_embed`` with ``mode="bilinear"``). The same grid gives the same values.

    Args:
        weight: The ``(1 + gh * gw, D)`` embeddings.
        grid: The new ``(rows, columns)`` of patches.
        old_grid: The old ``(rows, columns)``; None: a square ``sqrt(len(weight) - 1)``.
        mode: ``"bilinear"`` (IRRA) or ``"bicubic"`` (``transformers``).

    Returns:
        The ``(1 + grid[0] * grid[1], D)`` embeddings, in ``weight``'s dtype.

    Raises:
        ValueError: ``weight`` is not 2-D, its rows do not match ``old_grid`` (or a square),
            a grid is not two positive ints, or ``mode`` is unknown.
    """
    if mode not in POS_MODES:
        raise ValueError(f"mode must be one of {POS_MODES}, got {mode!r}")
    if weight.dim() != 2 or weight.shape[0] < 2:
        raise ValueError(f"weight must be (1 + patches, D), got {tuple(weight.shape)}")
    new_h, new_w = image_size_pair(tuple(grid), "grid")
    patches = weight.shape[0] - 1
    if old_grid is None:
        side = math.isqrt(patches)
        if side * side != patches:
            raise ValueError(
                f"weight holds {patches} patch embeddings, not a square grid; give old_grid"
            )
        old_grid = (side, side)
    old_h, old_w = image_size_pair(tuple(old_grid), "old_grid")
    if old_h * old_w != patches:
        raise ValueError(f"old_grid {old_grid} has {old_h * old_w} cells; weight has {patches}")
    dim = weight.shape[1]
    cells = weight[1:].reshape(1, old_h, old_w, dim).permute(0, 3, 1, 2)
    resized = F.interpolate(cells, size=(new_h, new_w), mode=mode, align_corners=False)
    resized = resized.permute(0, 2, 3, 1).reshape(new_h * new_w, dim)
    return torch.cat([weight[:1], resized.to(weight.dtype)], dim=0)


class GridVisionEmbeddings(nn.Module):
    """CLIP's vision embeddings (class token, patch convolution, position embeddings) on a
    ``(rows, columns)`` patch grid, for ``(rows * patch, columns * patch)`` images.

    A drop-in for ``transformers``' ``CLIPVisionEmbeddings`` with the same parameter names
    (``class_embedding``, ``patch_embedding.weight``, ``position_embedding.weight``), so
    checkpoints keep their keys.

    Args:
        class_embedding: The class token's ``(D,)`` embedding (the tower's own parameter).
        patch_embedding: The patch convolution (kernel and stride ``patch``).
        position_embedding: ``(1 + rows * columns, D)`` embeddings.
        grid: ``(rows, columns)``.

    Raises:
        ValueError: ``position_embedding`` does not have ``1 + rows * columns`` rows.
    """

    def __init__(
        self,
        class_embedding: nn.Parameter,
        patch_embedding: nn.Conv2d,
        position_embedding: torch.Tensor,
        grid: tuple[int, int],
    ) -> None:
        super().__init__()
        rows, cols = image_size_pair(tuple(grid), "grid")
        if position_embedding.shape[0] != 1 + rows * cols:
            raise ValueError(
                f"position_embedding has {position_embedding.shape[0]} rows; a {rows} x {cols} "
                f"grid needs {1 + rows * cols}"
            )
        self.class_embedding = class_embedding
        self.patch_embedding = patch_embedding
        self.embed_dim = int(position_embedding.shape[1])
        ks = patch_embedding.kernel_size
        self.patch_size = int(ks[0] if isinstance(ks, tuple) else ks)
        self.grid = (rows, cols)
        self.image_size = (rows * self.patch_size, cols * self.patch_size)
        self.num_patches = rows * cols
        self.num_positions = self.num_patches + 1
        self.position_embedding = nn.Embedding(self.num_positions, self.embed_dim)
        with torch.no_grad():
            self.position_embedding.weight.copy_(position_embedding)
        self.register_buffer(
            "position_ids", torch.arange(self.num_positions).expand((1, -1)), persistent=False
        )

    def forward(
        self, pixel_values: torch.Tensor, interpolate_pos_encoding: bool = False
    ) -> torch.Tensor:
        """``(N, 1 + patches, D)`` token embeddings of ``(N, 3, H, W)`` images.

        Raises:
            ValueError: ``(H, W)`` is not :attr:`image_size` and ``interpolate_pos_encoding``
                is false.
        """
        batch, _, height, width = pixel_values.shape
        if (height, width) != self.image_size and not interpolate_pos_encoding:
            raise ValueError(
                f"pixel_values: images are {height} x {width}; this CLIP takes "
                f"{self.image_size[0]} x {self.image_size[1]} (model.image_size)"
            )
        dtype = self.patch_embedding.weight.dtype
        patches = self.patch_embedding(pixel_values.to(dtype=dtype)).flatten(2).transpose(1, 2)
        cls = self.class_embedding.expand(batch, 1, -1)
        tokens = torch.cat([cls, patches], dim=1)
        if (height, width) == self.image_size:
            return tokens + self.position_embedding(self.position_ids)
        grid = (height // self.patch_size, width // self.patch_size)
        pos = resize_position_embedding(
            self.position_embedding.weight, grid, old_grid=self.grid, mode="bicubic"
        )
        return tokens + pos.unsqueeze(0)


def set_image_size(
    vision_model: nn.Module,
    image_size: int | Sequence[int],
    *,
    pretrained: bool = True,
    mode: str = "bilinear",
) -> tuple[int, int]:
    """Make a ``transformers`` CLIP vision tower take ``image_size`` images (in place).

    ``vision_model.embeddings`` is replaced by a :class:`GridVisionEmbeddings` on the grid
    ``(h // patch, w // patch)``: with ``pretrained``, its position embeddings are the tower's
    resampled by :func:`resize_position_embedding` (``mode``); otherwise freshly drawn as
    ``transformers`` initialises them (module docstring). The tower's own size and square
    input give the tower unchanged (nothing is replaced).

    Args:
        vision_model: CLIP's vision tower (``CLIPModel.vision_model``).
        image_size: ``(height, width)`` of the input, or an int for a square.
        pretrained: Resample the existing embeddings (True) or draw new ones.
        mode: The resampling filter, ``"bilinear"`` (IRRA) or ``"bicubic"``.

    Returns:
        The ``(height, width)`` the tower now takes.

    Raises:
        ValueError: ``image_size`` is not positive ints, or not a multiple of the patch size.
    """
    height, width = image_size_pair(
        list(image_size) if not isinstance(image_size, int) else image_size
    )
    if mode not in POS_MODES:
        raise ValueError(f"mode must be one of {POS_MODES}, got {mode!r}")
    emb: Any = vision_model.embeddings
    patch = int(emb.patch_size)
    if height % patch or width % patch:
        raise ValueError(
            f"image_size: {height} x {width} is not a multiple of the patch size {patch} "
            "on both sides"
        )
    old = emb.image_size
    old_size = tuple(old) if isinstance(old, (tuple, list)) else (int(old), int(old))
    if (height, width) == old_size:
        return height, width
    old_grid = (old_size[0] // patch, old_size[1] // patch)
    grid = (height // patch, width // patch)
    weight = emb.position_embedding.weight.detach()
    if pretrained:
        new = resize_position_embedding(weight, grid, old_grid=old_grid, mode=mode)
    else:
        config = getattr(emb, "config", None)
        std = float(getattr(config, "initializer_range", 0.02)) * float(
            getattr(config, "initializer_factor", 1.0)
        )
        new = torch.empty(1 + grid[0] * grid[1], weight.shape[1], dtype=weight.dtype)
        nn.init.normal_(new, std=std)
    vision_model.embeddings = GridVisionEmbeddings(
        emb.class_embedding, emb.patch_embedding, new.to(weight.device), grid
    )
    return height, width


__all__ = [
    "POS_MODES",
    "GridVisionEmbeddings",
    "image_size_pair",
    "resize_position_embedding",
    "set_image_size",
]
