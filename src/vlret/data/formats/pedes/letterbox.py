"""How a person-search evaluation reads its pedestrian pictures (``data.person_transform``).

Pedestrian pictures are tall (CUHK-PEDES and RSTPReid about 3:1, height to width). A model
whose input is a square (a CLIP trained on Flickr30K at 224 x 224, AdaCL Table 7's domain
generalisation) preprocesses with its shorter side to 224 and a centre crop: a 3:1 picture
keeps its middle third, the head and the feet cropped away. The choices:

* ``"letterbox"`` (:class:`Letterbox`): the whole picture resized, its aspect kept, to fit the
  model's input, centred, the rest filled with the normalisation's mean colour (0 after
  normalising); nothing is cropped or stretched. The default of a run trained on other data
  (:func:`vlret.run.eval_data.person_search_eval_data`): the square model sees a person as a
  person looks, at the scale it fits.
* ``"resize"``: IRRA's evaluation transform (:class:`~.augment.ResizeNormalize`): the picture
  resized to the model's input without a crop, the aspect not kept (a 3:1 picture squeezed
  into a square is 1.7 times as wide as it was). A model trained at IRRA's 384 x 128 reads its
  pictures so (``data.train_transform = "irra"`` implies it).
* ``"model"``: the model's own transform (the centre crop of a square CLIP).

``None`` (the default of the key) keeps the behaviour of the run's training: ``"resize"`` with
``train_transform = "irra"``, else the model's own transform.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ...._extras import require
from ...._images import DEFAULT_MAX_IMAGE_PIXELS, open_rgb
from ...pixel_batch import normalise
from ...transforms import eval_geometry
from .augment import build_irra_transforms

#: What ``data.person_transform`` takes (besides null).
PERSON_TRANSFORMS = ("letterbox", "resize", "model")


class Letterbox:
    """The whole picture fitted into ``(height, width)``, its aspect kept, centred on the mean
    colour, normalised (module docstring).

    The picture is resized by ``min(height / h, width / w)`` (each side rounded, at least 1
    pixel) with ``interpolation`` and placed at ``((height - h') // 2, (width - w') // 2)``; the
    bands around it are 0 in the normalised tensor (the mean colour).

    Args:
        size: The output ``(height, width)`` (or an int for a square).
        mean: Per-channel RGB mean.
        std: Per-channel RGB standard deviation (positive).
        interpolation: A PIL resampling filter name (``"bicubic"``: CLIP's).
        max_pixels: The pixel cap an image file is read under; None: none.

    Raises:
        ValueError: A size, mean, std or filter out of range (named).
    """

    def __init__(
        self,
        size: int | Sequence[int] = 224,
        *,
        mean: Sequence[float] = (0.0, 0.0, 0.0),
        std: Sequence[float] = (1.0, 1.0, 1.0),
        interpolation: str = "bicubic",
        max_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS,
    ) -> None:
        pair = (size, size) if isinstance(size, int) else tuple(int(s) for s in size)
        if len(pair) != 2 or min(pair) < 1:
            raise ValueError(f"size must be a positive int or (height, width), got {size!r}")
        if len(mean) != 3 or len(std) != 3 or min(std) <= 0:
            raise ValueError(f"mean and std need 3 values (std > 0), got {mean!r}, {std!r}")
        pil = require("PIL.Image", "person-search images")
        if not hasattr(pil.Resampling, str(interpolation).upper()):
            raise ValueError(f"interpolation: unknown PIL filter {interpolation!r}")
        self.crop = (int(pair[0]), int(pair[1]))
        self.mean = np.asarray(mean, dtype=np.float32)
        self.std = np.asarray(std, dtype=np.float32)
        self.interpolation = str(interpolation)
        self.max_pixels = max_pixels
        self._scale = torch.from_numpy((1.0 / (255.0 * self.std)).astype(np.float32))
        self._bias = torch.from_numpy((-self.mean / self.std).astype(np.float32))

    @classmethod
    def from_eval(cls, eval_transform: Any, **options: Any) -> Letterbox:
        """At a model's image transform's ``crop``, ``mean``, ``std`` and filter
        (``resample``, bicubic when it has none)."""
        options.setdefault("interpolation", getattr(eval_transform, "resample", "bicubic"))
        return cls(**eval_geometry(eval_transform, "the letterbox transform"), **options)

    def placement(self, width: int, height: int) -> tuple[int, int, int, int]:
        """``(top, left, h, w)`` of a ``width`` x ``height`` picture in the output."""
        out_h, out_w = self.crop
        scale = min(out_h / height, out_w / width)
        h = min(out_h, max(1, round(height * scale)))
        w = min(out_w, max(1, round(width * scale)))
        return (out_h - h) // 2, (out_w - w) // 2, h, w

    def __call__(self, image: Any) -> torch.Tensor:
        """A PIL image or image file -> the normalised float32 ``(3, height, width)``."""
        pil = require("PIL.Image", "person-search images")
        picture = open_rgb(image, max_pixels=self.max_pixels)
        top, left, h, w = self.placement(*picture.size)
        resample = getattr(pil.Resampling, self.interpolation.upper())
        pixels = np.asarray(picture.resize((w, h), resample=resample))
        chw = torch.from_numpy(np.ascontiguousarray(pixels.transpose(2, 0, 1)))
        out = torch.zeros((3, *self.crop), dtype=torch.float32)
        out[:, top : top + h, left : left + w] = normalise(chw, self._scale, self._bias)
        return out

    def __repr__(self) -> str:
        return f"Letterbox(crop={self.crop}, interpolation={self.interpolation!r})"


def person_eval_transform(data: Any, model_transform: Any) -> Any:
    """The transform a person-search split is read with: ``data.person_transform`` on the
    model's image transform ``model_transform`` (module docstring; None as trained). With
    ``data.features_dir`` (precomputed features) or no model transform, ``model_transform``.

    Raises:
        ValueError: An unknown ``data.person_transform``, or one that needs the model's
            crop, mean and std from a transform without them.
    """
    if getattr(data, "features_dir", None) is not None or model_transform is None:
        return model_transform
    choice = getattr(data, "person_transform", None)
    if choice is None:
        choice = "resize" if data.train_transform == "irra" else "model"
    if choice not in PERSON_TRANSFORMS:
        raise ValueError(
            f"data.person_transform: expected one of {', '.join(PERSON_TRANSFORMS)} or null, "
            f"got {choice!r}"
        )
    if choice == "letterbox":
        return Letterbox.from_eval(model_transform)
    if choice == "resize":
        return build_irra_transforms(model_transform)[1]  # IRRA's resize
    return model_transform


__all__ = ["PERSON_TRANSFORMS", "Letterbox", "person_eval_transform"]
