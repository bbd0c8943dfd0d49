"""The zero-shot tests' toys: a two-tower model over 4 x 4 pictures, a character tokenizer and
a ClassificationSet-like set (tests/test_zeroshot.py, tests/test_progress.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn


class CharTokenizer:
    pad_id = 0

    def encode(self, text):
        return [1, *(2 + ord(ch) % 37 for ch in text)]


def to_pixels(image):
    return torch.from_numpy(np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0).permute(
        2, 0, 1
    )


class Toy(nn.Module):
    """Text: the sum of its tokens' embeddings; image: a linear map of its pixels."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.words = nn.Embedding(40, 6)
        self.pixels = nn.Linear(3 * 4 * 4, 6)
        self.image_transform = to_pixels

    def encode_texts(self, ids, lengths):
        mask = torch.arange(ids.shape[1])[None, :] < lengths[:, None]
        return (self.words(ids) * mask[..., None]).sum(1)

    def encode_images(self, pixels):
        return self.pixels(pixels.flatten(1))


@dataclass(frozen=True)
class ToySet:
    """A ClassificationSet-like object: name, split, classnames, labels, image(i)."""

    name: str
    split: str
    classnames: list[str]
    labels: list[int]
    images: list = field(repr=False)
    root: Path = Path(".")

    def __len__(self):
        return len(self.labels)

    def image(self, i):
        return self.images[i]

    def describe(self, i):
        return f"image {i}"
