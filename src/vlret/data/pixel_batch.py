"""Augmented images handed over as uint8 and normalised on the device.

A training image leaves a DataLoader worker as its ``(3, H, W)`` uint8 pixels with the
normalisation that turns them into the model's input (:class:`PixelSample`), and a batch of them
travels as one uint8 tensor (:class:`PixelBatch`): a quarter of the bytes of float32 through the
workers' shared memory, the collation and the host-to-device copy. :meth:`PixelBatch.normalised`
makes the float32 input where the batch is, which :meth:`vlret.data.RetrievalBatch.to` does after
moving it, so models receive exactly the tensor an in-worker normalisation gives: ``x * scale +
bias`` in float32 with ``scale = 1 / (255 std)``, ``bias = -mean / std`` per channel, two roundings
in the same order wherever it runs (``benchmarks/bench_pixels.py`` part 1 measures the gain).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch


def normalise(pixels: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``pixels * scale + bias`` in float32, per channel (``pixels``: ``(..., 3, H, W)`` uint8;
    ``scale``, ``bias``: ``(3,)``); a multiply then an add, never fused, so every device rounds
    the same two operations."""
    shape = (3, 1, 1)
    out = pixels.to(torch.float32)
    out.mul_(scale.to(out.device).view(shape))
    return out.add_(bias.to(out.device).view(shape))


class PixelSample(NamedTuple):
    """One augmented image: ``pixels`` ``(3, H, W)`` uint8 and its normalisation ``(3,)``."""

    pixels: torch.Tensor
    scale: torch.Tensor
    bias: torch.Tensor

    def normalised(self) -> torch.Tensor:
        """The model's float32 ``(3, H, W)`` input."""
        return normalise(self.pixels, self.scale, self.bias)


@dataclass
class PixelBatch:
    """A batch of :class:`PixelSample` s: ``pixels`` ``(B, 3, H, W)`` uint8 and the shared
    ``scale`` / ``bias`` ``(3,)``."""

    pixels: torch.Tensor
    scale: torch.Tensor
    bias: torch.Tensor

    @classmethod
    def collate(cls, samples: Sequence[PixelSample]) -> PixelBatch:
        """Stack samples that share one normalisation and one size.

        Raises:
            ValueError: No samples, or samples with different sizes or normalisations.
        """
        if not samples:
            raise ValueError("PixelBatch.collate needs at least one sample")
        first = samples[0]
        for i, s in enumerate(samples[1:], start=1):
            if s.pixels.shape != first.pixels.shape:
                raise ValueError(
                    f"sample {i} is {tuple(s.pixels.shape)}, sample 0 {tuple(first.pixels.shape)}"
                )
            if not (torch.equal(s.scale, first.scale) and torch.equal(s.bias, first.bias)):
                raise ValueError(f"sample {i} has another normalisation than sample 0")
        return cls(torch.stack([s.pixels for s in samples]), first.scale, first.bias)

    def __len__(self) -> int:
        return int(self.pixels.shape[0])

    def __getitem__(self, index: slice | torch.Tensor) -> PixelBatch:
        """The images at ``index`` (a slice or an index tensor), as a batch."""
        return PixelBatch(self.pixels[index], self.scale, self.bias)

    def to(self, device: torch.device | str, *, non_blocking: bool = False) -> PixelBatch:
        """A copy on ``device``, still uint8."""
        return PixelBatch(
            self.pixels.to(device, non_blocking=non_blocking),
            self.scale.to(device, non_blocking=non_blocking),
            self.bias.to(device, non_blocking=non_blocking),
        )

    def pin_memory(self) -> PixelBatch:
        """A copy in pinned memory (what a ``DataLoader(pin_memory=True)`` asks of a batch)."""
        return PixelBatch(self.pixels.pin_memory(), self.scale, self.bias)

    def normalised(self) -> torch.Tensor:
        """The model's float32 ``(B, 3, H, W)`` input, computed where the pixels are."""
        return normalise(self.pixels, self.scale, self.bias)
