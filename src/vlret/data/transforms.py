"""Training augmentation for image files and shards: random-resized crop, optional flip.

:class:`RandomResizedCrop` turns a PIL image (or an image file) into the model's input tensor
``(3, crop_h, crop_w)``, as the model's evaluation transform does
(:class:`vlret.models.clip.CLIPImageTransform`: ``.crop``, ``.mean``, ``.std``), but from a
random region of the picture:

1. a box of ``scale`` times the image's area (uniform) and aspect ratio ``w / h`` drawn
   log-uniformly from ``ratio``, at a uniform position; ten tries, then the largest center
   box whose ratio lies in ``ratio`` (torchvision's ``RandomResizedCrop.get_params``, the
   reading open_clip and VSE++ use);
2. the box cropped, then resized to the crop size (``bicubic`` or ``bilinear``, PIL);
3. with ``hflip``, mirrored left-right with probability 1/2;
4. ``(pixel / 255 - mean[c]) / std[c]`` per channel, channels first.

Every random number of one sample comes from a generator seeded by a key of integers,
``(run seed, epoch, sample index)`` (:func:`sample_generator`), never from a global or a
per-worker generator: an item is the same whatever the number of DataLoader workers, and a
resumed run draws the same crops as the run it continues.

The two published settings (``[data]`` of a run config, :func:`build_train_transform`):

- VSE++ (GOAL Tables 3-4): ``crop_scale = [0.08, 1.0]``, ``hflip = true`` (torchvision's
  defaults, which VSE++'s ``data.py`` uses);
- open_clip (AdaCL Table 2): ``crop_scale = [0.9, 1.0]``, ``hflip = false``, bicubic.

Both keep ``crop_ratio = [0.75, 1.3333]`` (3/4 to 4/3).

Every image is read through :func:`vlret._images.open_rgb` (the modes and EXIF orientation
read the documented way) under ``data.max_image_pixels``, checked from the file's header
before decoding: :class:`CappedTransform` puts a model's evaluation transform behind the same
cap where a reader hands it image files.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from .._extras import require
from .._images import DEFAULT_MAX_IMAGE_PIXELS, open_rgb
from .pixel_batch import PixelSample

#: "irra": IRRA's person-search augmentation (vlret.data.formats.pedes.augment)
TRAIN_TRANSFORMS = ("none", "random_resized_crop", "irra")
INTERPOLATIONS = ("bicubic", "bilinear")


def sample_generator(key: Sequence[int]) -> np.random.Generator:
    """The generator of one sample's random numbers, from a key such as ``(seed, epoch,
    index)`` (negative parts are taken modulo 2**64, as NumPy's seed sequences need)."""
    return np.random.default_rng([int(k) % 2**64 for k in key])


class CropParams(NamedTuple):
    """One sample's draw: the box (``left``, ``top``, ``width``, ``height`` in pixels of the
    source image) and whether the crop is mirrored."""

    left: int
    top: int
    width: int
    height: int
    flip: bool


def crop_box(
    rng: np.random.Generator,
    width: int,
    height: int,
    scale: Sequence[float],
    ratio: Sequence[float],
) -> tuple[int, int, int, int]:
    """A random-resized-crop box ``(left, top, w, h)`` of a ``width`` x ``height`` image.

    Args:
        rng: The sample's generator (:func:`sample_generator`).
        width: The image's width.
        height: The image's height.
        scale: ``(low, high)`` fractions of the image's area.
        ratio: ``(low, high)`` bounds of the box's ``w / h``.

    Returns:
        The box; after ten failed draws, the center box of the image clamped to ``ratio``.
    """
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(*log_ratio))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            return left, top, w, h
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        w, h = int(round(height * max(ratio))), height
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, w, h


class CappedTransform:
    """A model's image transform (e.g. :class:`vlret.models.clip.CLIPImageTransform`) whose
    input is first read by :func:`vlret._images.open_rgb` under a pixel cap: an image file
    over ``data.max_image_pixels`` is refused from its header before decoding, one that does
    not decode is one line naming it, whatever the transform does with files itself.

    Reads as the transform it wraps (``crop``, ``mean``, ``std`` ...), so code asking a
    dataset's transform for its geometry finds the model's.

    Args:
        transform: The transform, called with the RGB PIL image.
        max_pixels: The cap (``data.max_image_pixels``); None: no cap.
    """

    def __init__(self, transform: Any, *, max_pixels: int | None) -> None:
        self.transform = transform
        self.max_pixels = max_pixels

    def __call__(self, image: Any) -> Any:
        return self.transform(open_rgb(image, max_pixels=self.max_pixels))

    def __getattr__(self, name: str) -> Any:
        # only reached for names the wrapper lacks; "transform" itself is absent while
        # unpickling (DataLoader workers), where forwarding it would recurse
        if name == "transform" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.transform, name)

    def __repr__(self) -> str:
        return f"CappedTransform({self.transform!r}, max_pixels={self.max_pixels})"


def capped(transform: Any, max_pixels: int | None) -> Any:
    """``transform`` behind the pixel cap (:class:`CappedTransform`); None stays None, and a
    transform already capped gets this cap. The transform then receives decoded images, which
    :func:`vlret._images.open_rgb` does not hold to a cap again, so a cap of its own (a
    ``max_pixels`` attribute, as :class:`vlret.models.clip.CLIPImageTransform` has) never
    overrides the run's."""
    if transform is None:
        return None
    if isinstance(transform, CappedTransform):
        transform = transform.transform
    return CappedTransform(transform, max_pixels=max_pixels)


def eval_geometry(eval_transform: Any, needs: str) -> dict[str, Any]:
    """The ``crop`` (size), ``mean`` and ``std`` of a model's evaluation transform, what a
    training transform built on it takes (``from_eval``); ``needs`` names that transform in
    the error when one is missing."""
    for name in ("crop", "mean", "std"):
        if not hasattr(eval_transform, name):
            raise ValueError(
                f"the model's image transform {eval_transform!r} has no {name!r}; {needs} "
                "needs crop, mean and std"
            )
    return {
        "size": eval_transform.crop,
        "mean": [float(m) for m in eval_transform.mean],
        "std": [float(s) for s in eval_transform.std],
    }


class RandomResizedCrop:
    """A random-resized crop, an optional flip and the model's normalisation (module
    docstring), seeded per sample.

    Args:
        size: The output ``(height, width)`` (or an int for a square).
        scale: ``(low, high)`` fractions of the image's area, ``0 < low <= high <= 1``.
        ratio: ``(low, high)`` bounds of the box's aspect ratio, ``0 < low <= high``.
        interpolation: ``"bicubic"`` or ``"bilinear"``.
        hflip: Mirror left-right with probability 1/2.
        mean: Per-channel RGB mean.
        std: Per-channel RGB standard deviation (positive).
        output: ``"float"``: the normalised float32 tensor; ``"uint8"``: a
            :class:`~vlret.data.pixel_batch.PixelSample` (the pixels and their normalisation,
            applied on the device when the batch gets there: the same float32 values, a quarter
            of the bytes through the data loader). Training pipelines use ``"uint8"``
            (:func:`build_train_transform`).
        max_pixels: The pixel cap of the images read (``data.max_image_pixels``; None: no
            cap): a larger one is refused from its header before decoding.

    Raises:
        ValueError: An argument out of its range (named in the message).
    """

    def __init__(
        self,
        size: int | Sequence[int],
        *,
        scale: Sequence[float] = (0.08, 1.0),
        ratio: Sequence[float] = (3 / 4, 4 / 3),
        interpolation: str = "bicubic",
        hflip: bool = False,
        mean: Sequence[float] = (0.0, 0.0, 0.0),
        std: Sequence[float] = (1.0, 1.0, 1.0),
        output: str = "float",
        max_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS,
    ) -> None:
        crop = (size, size) if isinstance(size, int) else tuple(int(s) for s in size)
        if len(crop) != 2 or min(crop) < 1:
            raise ValueError(f"size must be a positive int or (height, width), got {size!r}")
        problem = range_problem(scale, ratio)
        if problem:
            raise ValueError(problem)
        if interpolation not in INTERPOLATIONS:
            raise ValueError(
                f"interpolation must be one of {INTERPOLATIONS}, got {interpolation!r}"
            )
        if len(mean) != 3 or len(std) != 3 or min(std) <= 0:
            raise ValueError(f"mean and std need 3 values (std > 0), got {mean!r}, {std!r}")
        if output not in ("float", "uint8"):
            raise ValueError(f"output must be 'float' or 'uint8', got {output!r}")
        self.output = output
        self.max_pixels = max_pixels
        self.crop = (int(crop[0]), int(crop[1]))
        self.scale = (float(scale[0]), float(scale[1]))
        self.ratio = (float(ratio[0]), float(ratio[1]))
        self.interpolation = interpolation
        self.hflip = bool(hflip)
        self.mean = np.asarray(mean, dtype=np.float32)
        self.std = np.asarray(std, dtype=np.float32)
        # (x / 255 - mean) / std as a multiply and an add per channel (pixel_batch.normalise)
        self._scale = torch.from_numpy((1.0 / (255.0 * self.std)).astype(np.float32))
        self._bias = torch.from_numpy((-self.mean / self.std).astype(np.float32))

    @classmethod
    def from_eval(cls, eval_transform: Any, **options: Any) -> RandomResizedCrop:
        """The training transform matching a model's evaluation transform: its ``crop``,
        ``mean`` and ``std`` (``options``: the other arguments of the constructor)."""
        return cls(**eval_geometry(eval_transform, "a random-resized crop"), **options)

    def params(self, key: Sequence[int], width: int, height: int) -> CropParams:
        """The box and flip of the sample ``key`` on a ``width`` x ``height`` image."""
        rng = sample_generator(key)
        left, top, w, h = crop_box(rng, width, height, self.scale, self.ratio)
        flip = bool(self.hflip and rng.random() < 0.5)
        return CropParams(left, top, w, h, flip)

    def __call__(self, image: Any, *, key: Sequence[int]) -> torch.Tensor | PixelSample:
        """Augment one image.

        Args:
            image: A PIL image or the path of an image file.
            key: The sample's seed key, e.g. ``(seed, epoch, index)``.

        Returns:
            The normalised float32 ``(3, crop_h, crop_w)`` tensor, or with ``output="uint8"``
            its :class:`~vlret.data.pixel_batch.PixelSample`.
        """
        pil = require("PIL.Image", "training augmentation of images")
        image = open_rgb(image, max_pixels=self.max_pixels)
        p = self.params(key, *image.size)
        resample = getattr(pil.Resampling, self.interpolation.upper())
        ch, cw = self.crop
        region = image.crop((p.left, p.top, p.left + p.width, p.top + p.height))
        out = region.resize((cw, ch), resample=resample)
        pixels = np.asarray(out)  # (H, W, 3) uint8
        if p.flip:
            pixels = pixels[:, ::-1]
        chw = torch.from_numpy(np.ascontiguousarray(pixels.transpose(2, 0, 1)))
        sample = PixelSample(chw, self._scale, self._bias)
        return sample if self.output == "uint8" else sample.normalised()

    def __repr__(self) -> str:
        return (
            f"RandomResizedCrop(crop={self.crop}, scale={self.scale}, ratio={self.ratio}, "
            f"interpolation={self.interpolation!r}, hflip={self.hflip})"
        )


def range_problem(scale: Sequence[float], ratio: Sequence[float]) -> str | None:
    """What is wrong with a ``crop_scale`` / ``crop_ratio`` pair, or None."""
    if len(scale) != 2 or not 0 < scale[0] <= scale[1] <= 1:
        return f"crop_scale must be [low, high] with 0 < low <= high <= 1, got {list(scale)!r}"
    if len(ratio) != 2 or not 0 < ratio[0] <= ratio[1]:
        return f"crop_ratio must be [low, high] with 0 < low <= high, got {list(ratio)!r}"
    return None


def build_train_transform(data: Any, eval_transform: Any) -> RandomResizedCrop | None:
    """The training transform a ``[data]`` section asks for (``train_transform``,
    ``crop_scale``, ``crop_ratio``, ``crop_interpolation``, ``hflip``), built on the model's
    evaluation transform; None for ``train_transform = "none"``.

    Raises:
        ValueError: Augmentation is asked for but the model has no image transform.
    """
    if data.train_transform == "none":
        return None
    if eval_transform is None:
        raise ValueError(
            f"data.train_transform = {data.train_transform!r} needs a model that reads "
            "images (one with an image_transform)"
        )
    return RandomResizedCrop.from_eval(
        eval_transform,
        scale=data.crop_scale,
        ratio=data.crop_ratio,
        interpolation=data.crop_interpolation,
        hflip=data.hflip,
        output="uint8",
        # a section written before the key existed (or a stand-in) reads at the default cap
        max_pixels=getattr(data, "max_image_pixels", DEFAULT_MAX_IMAGE_PIXELS),
    )


__all__ = [
    "INTERPOLATIONS",
    "TRAIN_TRANSFORMS",
    "CappedTransform",
    "CropParams",
    "RandomResizedCrop",
    "build_train_transform",
    "capped",
    "crop_box",
    "range_problem",
    "sample_generator",
]
