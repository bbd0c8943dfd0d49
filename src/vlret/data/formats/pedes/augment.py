"""IRRA's training augmentation and its evaluation resize (``data.train_transform = "irra"``).

IRRA (``datasets/build.py``, ``build_transforms(img_size=(384, 128), aug=True)``) trains on::

    Resize((384, 128)); RandomHorizontalFlip(0.5); Pad(10); RandomCrop((384, 128));
    ToTensor(); Normalize(mean, std); RandomErasing(scale=(0.02, 0.4), value=mean)

and evaluates on ``Resize((384, 128)); ToTensor(); Normalize(mean, std)``. :class:`IRRAAugment`
is that pipeline in PIL + NumPy:

1. the image resized to ``(height, width)`` (no aspect kept; PIL bilinear, torchvision's
   default for ``Resize`` on PIL images);
2. mirrored left-right with probability ``flip_prob`` (0.5);
3. padded by ``pad`` (10) black pixels on every side and cropped back to ``(height, width)`` at
   a uniform offset in ``[0, 2 * pad]`` on each axis (``RandomCrop`` of the padded image);
4. ``(pixel / 255 - mean[c]) / std[c]`` per channel, channels first;
5. with probability ``erase_prob`` (0.5, ``RandomErasing``'s default), a box of
   ``erase_scale`` (0.02 to 0.4) times the area, aspect ``h / w`` log-uniform in
   ``erase_ratio`` (0.3 to 3.3), strictly smaller than the image on both axes, at a uniform
   position, filled: ten tries, no erasing if none fits (torchvision's ``get_params``).

The fill follows IRRA's code, not its intent: ``RandomErasing(value=mean)`` runs after
``Normalize``, so the box holds the numbers ``mean`` in the normalised tensor (a light grey
of about ``mean + mean * std`` in pixels), not the mean colour. ``erase_fill = "mean_colour"``
writes the mean colour instead (0 in the normalised tensor).

The size, mean and std are the model's (:meth:`IRRAAugment.from_eval`: its image transform's
``crop``, ``mean``, ``std``): IRRA's 384 x 128 input is a model whose image size is
``[384, 128]``. Every random number of a sample comes from the generator of its key
``(run seed, epoch, caption index)`` (:func:`vlret.data.transforms.sample_generator`), as for
:class:`~vlret.data.transforms.RandomResizedCrop`: an item is the same whatever the number of
DataLoader workers, and a resumed run draws what the run it continues drew. Differences from
IRRA: those draws (torch's global generator there), and the resize, which is PIL's bilinear
without torchvision's tensor path (IRRA's images are PIL too, so the same filter).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from ...._extras import require
from ...._images import DEFAULT_MAX_IMAGE_PIXELS, open_rgb
from ...pixel_batch import normalise
from ...transforms import build_train_transform, eval_geometry, sample_generator

ERASE_FILLS = ("irra", "mean_colour")
RESAMPLES = ("bilinear", "bicubic")
#: IRRA's input size ``(height, width)``.
IRRA_SIZE = (384, 128)


class IRRAParams(NamedTuple):
    """One sample's draw: the mirror, the crop's offset in the padded image, and the erased
    box (``erase`` = ``(top, left, height, width)``, None when nothing is erased)."""

    flip: bool
    top: int
    left: int
    erase: tuple[int, int, int, int] | None


def erase_box(
    rng: np.random.Generator,
    height: int,
    width: int,
    scale: Sequence[float],
    ratio: Sequence[float],
) -> tuple[int, int, int, int] | None:
    """torchvision's ``RandomErasing.get_params``: ``(top, left, h, w)`` or None after ten
    boxes that do not fit strictly inside a ``height`` x ``width`` image."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(*log_ratio))
        h = int(round(math.sqrt(target * aspect)))
        w = int(round(math.sqrt(target / aspect)))
        if not (h < height and w < width):
            continue
        top = int(rng.integers(0, height - h + 1))
        left = int(rng.integers(0, width - w + 1))
        return top, left, h, w
    return None


def _size(size: int | Sequence[int]) -> tuple[int, int]:
    pair = (size, size) if isinstance(size, int) else tuple(int(s) for s in size)
    if len(pair) != 2 or min(pair) < 1:
        raise ValueError(f"size must be a positive int or (height, width), got {size!r}")
    return int(pair[0]), int(pair[1])


class ResizeNormalize:
    """IRRA's evaluation transform: resize to ``(height, width)``, normalise.

    Args:
        size: The output ``(height, width)`` (or an int for a square).
        mean: Per-channel RGB mean.
        std: Per-channel RGB standard deviation (positive).
        interpolation: ``"bilinear"`` (IRRA's) or ``"bicubic"``.
        max_pixels: The pixel cap an image file is read under (``data.max_image_pixels``,
            :func:`vlret._images.open_rgb`); None: none.

    Raises:
        ValueError: An argument out of its range (named in the message).
    """

    def __init__(
        self,
        size: int | Sequence[int] = IRRA_SIZE,
        *,
        mean: Sequence[float] = (0.0, 0.0, 0.0),
        std: Sequence[float] = (1.0, 1.0, 1.0),
        interpolation: str = "bilinear",
        max_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS,
    ) -> None:
        self.crop = _size(size)
        if len(mean) != 3 or len(std) != 3 or min(std) <= 0:
            raise ValueError(f"mean and std need 3 values (std > 0), got {mean!r}, {std!r}")
        if interpolation not in RESAMPLES:
            raise ValueError(f"interpolation must be one of {RESAMPLES}, got {interpolation!r}")
        self.mean = np.asarray(mean, dtype=np.float32)
        self.std = np.asarray(std, dtype=np.float32)
        self.interpolation = interpolation
        self.max_pixels = max_pixels
        self._scale = torch.from_numpy((1.0 / (255.0 * self.std)).astype(np.float32))
        self._bias = torch.from_numpy((-self.mean / self.std).astype(np.float32))

    @classmethod
    def from_eval(cls, eval_transform: Any, **options: Any) -> Any:
        """This transform at a model's image transform's ``crop``, ``mean`` and ``std``
        (``options``: the other arguments of the constructor)."""
        return cls(**eval_geometry(eval_transform, "IRRA's transforms"), **options)

    def resized(self, image: Any) -> np.ndarray:
        """The image resized to the output size, ``(H, W, 3)`` uint8."""
        pil = require("PIL.Image", "person-search images")
        resample = getattr(pil.Resampling, self.interpolation.upper())
        height, width = self.crop
        return np.asarray(
            open_rgb(image, max_pixels=self.max_pixels).resize((width, height), resample=resample)
        )

    def normalise(self, pixels: np.ndarray) -> torch.Tensor:
        """``(H, W, 3)`` uint8 -> normalised ``(3, H, W)`` float32 (the training images'
        normalisation, :func:`vlret.data.pixel_batch.normalise`)."""
        chw = torch.from_numpy(np.ascontiguousarray(pixels.transpose(2, 0, 1)))
        return normalise(chw, self._scale, self._bias)

    def __call__(self, image: Any) -> torch.Tensor:
        """A PIL image or image file -> the normalised float32 ``(3, height, width)``."""
        return self.normalise(self.resized(image))

    def __repr__(self) -> str:
        return f"ResizeNormalize(crop={self.crop}, interpolation={self.interpolation!r})"


class IRRAAugment(ResizeNormalize):
    """IRRA's training augmentation, seeded per sample (module docstring).

    Args:
        size: The output ``(height, width)`` (or an int for a square).
        mean: Per-channel RGB mean.
        std: Per-channel RGB standard deviation (positive).
        interpolation: ``"bilinear"`` (IRRA's) or ``"bicubic"``.
        flip_prob: Probability of the left-right mirror.
        pad: Black pixels padded on each side before the random crop (0: no crop).
        erase_prob: Probability of random erasing (0: never).
        erase_scale: ``(low, high)`` fractions of the area erased, ``0 < low <= high < 1``.
        erase_ratio: ``(low, high)`` bounds of the erased box's ``h / w``.
        erase_fill: ``"irra"`` (the numbers ``mean`` in the normalised tensor, IRRA's code) or
            ``"mean_colour"`` (the mean colour: 0 once normalised).
        max_pixels: The pixel cap an image file is read under (``data.max_image_pixels``).

    Raises:
        ValueError: An argument out of its range (named in the message).
    """

    def __init__(
        self,
        size: int | Sequence[int] = IRRA_SIZE,
        *,
        mean: Sequence[float] = (0.0, 0.0, 0.0),
        std: Sequence[float] = (1.0, 1.0, 1.0),
        interpolation: str = "bilinear",
        flip_prob: float = 0.5,
        pad: int = 10,
        erase_prob: float = 0.5,
        erase_scale: Sequence[float] = (0.02, 0.4),
        erase_ratio: Sequence[float] = (0.3, 3.3),
        erase_fill: str = "irra",
        max_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS,
    ) -> None:
        super().__init__(
            size, mean=mean, std=std, interpolation=interpolation, max_pixels=max_pixels
        )
        for name, p in (("flip_prob", flip_prob), ("erase_prob", erase_prob)):
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"{name} must be a probability in [0, 1], got {p!r}")
        if isinstance(pad, bool) or not isinstance(pad, int) or pad < 0:
            raise ValueError(f"pad must be an int >= 0, got {pad!r}")
        if len(erase_scale) != 2 or not 0 < erase_scale[0] <= erase_scale[1] < 1:
            raise ValueError(
                f"erase_scale must be (low, high) with 0 < low <= high < 1, got {erase_scale!r}"
            )
        if len(erase_ratio) != 2 or not 0 < erase_ratio[0] <= erase_ratio[1]:
            raise ValueError(
                f"erase_ratio must be (low, high) with 0 < low <= high, got {erase_ratio!r}"
            )
        if erase_fill not in ERASE_FILLS:
            raise ValueError(f"erase_fill must be one of {ERASE_FILLS}, got {erase_fill!r}")
        self.flip_prob = float(flip_prob)
        self.pad = pad
        self.erase_prob = float(erase_prob)
        self.erase_scale = (float(erase_scale[0]), float(erase_scale[1]))
        self.erase_ratio = (float(erase_ratio[0]), float(erase_ratio[1]))
        self.erase_fill = erase_fill
        fill = self.mean if erase_fill == "irra" else np.zeros(3, dtype=np.float32)
        self._fill = torch.from_numpy(fill.astype(np.float32))[:, None, None]

    def params(self, key: Sequence[int]) -> IRRAParams:
        """The draw of the sample ``key`` (the output size fixes every range)."""
        rng = sample_generator(key)
        height, width = self.crop
        flip = bool(rng.random() < self.flip_prob)
        top = int(rng.integers(0, 2 * self.pad + 1))
        left = int(rng.integers(0, 2 * self.pad + 1))
        erase = None
        if rng.random() < self.erase_prob:
            erase = erase_box(rng, height, width, self.erase_scale, self.erase_ratio)
        return IRRAParams(flip, top, left, erase)

    def __call__(self, image: Any, *, key: Sequence[int]) -> torch.Tensor:  # type: ignore[override]
        """Augment one image.

        Args:
            image: A PIL image or the path of an image file.
            key: The sample's seed key, e.g. ``(seed, epoch, index)``.

        Returns:
            The float32 ``(3, height, width)`` tensor.
        """
        p = self.params(key)
        pixels = self.resized(image)
        if p.flip:
            pixels = pixels[:, ::-1]
        height, width = self.crop
        # the crop of the black-padded image, written without building the padded image
        shifted = np.zeros_like(pixels)
        dy, dx = p.top - self.pad, p.left - self.pad  # source offset of the output's origin
        ys, yd = max(dy, 0), max(-dy, 0)
        xs, xd = max(dx, 0), max(-dx, 0)
        h, w = height - abs(dy), width - abs(dx)
        if h > 0 and w > 0:
            shifted[yd : yd + h, xd : xd + w] = pixels[ys : ys + h, xs : xs + w]
        chw = self.normalise(shifted)
        if p.erase is not None:
            top, left, eh, ew = p.erase
            chw[:, top : top + eh, left : left + ew] = self._fill
        return chw

    def __repr__(self) -> str:
        return (
            f"IRRAAugment(crop={self.crop}, flip_prob={self.flip_prob}, pad={self.pad}, "
            f"erase_prob={self.erase_prob}, erase_scale={self.erase_scale}, "
            f"erase_ratio={self.erase_ratio}, erase_fill={self.erase_fill!r})"
        )


def build_augment(data: Any, eval_transform: Any) -> Any:
    """The training augmentation a ``[data]`` section asks for: :class:`IRRAAugment` for
    ``train_transform = "irra"``, else :func:`vlret.data.transforms.build_train_transform`'s
    (None for ``"none"``), at the model's image transform ``eval_transform``.

    Raises:
        ValueError: Augmentation is asked for but the model has no usable image transform.
    """
    if data.train_transform == "irra":
        augment = build_irra_transforms(eval_transform)[0]
        # a section written before the key existed (or a stand-in) reads at the default cap
        augment.max_pixels = getattr(data, "max_image_pixels", DEFAULT_MAX_IMAGE_PIXELS)
        return augment
    return build_train_transform(data, eval_transform)


def build_irra_transforms(eval_transform: Any) -> tuple[IRRAAugment, ResizeNormalize]:
    """``(training augmentation, evaluation transform)`` of ``data.train_transform = "irra"``
    at the model's image transform's size, mean and std.

    Raises:
        ValueError: The model has no image transform, or one without crop, mean and std.
    """
    if eval_transform is None:
        raise ValueError(
            'data.train_transform = "irra" needs a model that reads images (one with an '
            "image_transform)"
        )
    return IRRAAugment.from_eval(eval_transform), ResizeNormalize.from_eval(eval_transform)


__all__ = [
    "ERASE_FILLS",
    "IRRA_SIZE",
    "IRRAAugment",
    "IRRAParams",
    "ResizeNormalize",
    "build_augment",
    "build_irra_transforms",
    "erase_box",
]
