"""uint8 hand-over of augmented images: the same float32 input as normalising in the worker,
a batch that collates, slices and moves as the other feature batches, and a data loader whose
workers send uint8."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from vlret.data.dataset import RetrievalBatch, RetrievalItem, collate_retrieval
from vlret.data.pixel_batch import PixelBatch, PixelSample
from vlret.data.transforms import RandomResizedCrop

Image = pytest.importorskip("PIL.Image")

MEAN = (0.48145466, 0.4578275, 0.40821073)
STD = (0.26862954, 0.26130258, 0.27577711)


def picture(seed: int, width: int = 31, height: int = 23):
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def crops(output: str) -> RandomResizedCrop:
    return RandomResizedCrop(
        (9, 7), scale=(0.3, 1.0), hflip=True, mean=MEAN, std=STD, output=output
    )


def test_uint8_output_normalises_to_the_float_output_bit_for_bit_and_to_the_float64_truth():
    to_float, to_uint8 = crops("float"), crops("uint8")
    for index in range(8):
        image, key = picture(index), (3, 1, index)
        sample = to_uint8(image, key=key)
        assert isinstance(sample, PixelSample) and sample.pixels.dtype == torch.uint8
        assert sample.pixels.shape == (3, 9, 7)
        got = sample.normalised()
        assert torch.equal(got, to_float(image, key=key))
        truth = (
            sample.pixels.double() / 255.0 - torch.tensor(MEAN, dtype=torch.float64).view(3, 1, 1)
        ) / torch.tensor(STD, dtype=torch.float64).view(3, 1, 1)
        # two float32 roundings (scale, product, sum) of values below ~2.2: a few ulps
        torch.testing.assert_close(got.double(), truth, rtol=0, atol=4 * 2.2 * 2**-23)


def test_a_batch_collates_slices_and_arrives_normalised():
    to_uint8 = crops("uint8")
    samples = [to_uint8(picture(i), key=(0, 0, i)) for i in range(5)]
    items = [RetrievalItem(s, torch.tensor([1, 2 + i]), i, i) for i, s in enumerate(samples)]
    batch = collate_retrieval(items)
    assert isinstance(batch.features, PixelBatch) and batch.features.pixels.dtype == torch.uint8
    assert len(batch.features) == 5
    moved = batch.to("cpu")
    assert moved.features.dtype == torch.float32 and moved.features.shape == (5, 3, 9, 7)
    for i, s in enumerate(samples):
        assert torch.equal(moved.features[i], s.normalised())
    first, second = batch.chunks(3)
    assert len(first.features) == 3 and len(second.features) == 2
    assert torch.equal(second.to("cpu").features, moved.features[3:])


def test_collate_refuses_mixed_sizes_and_normalisations():
    a = crops("uint8")(picture(0), key=(0, 0, 0))
    other_size = RandomResizedCrop((5, 5), mean=MEAN, std=STD, output="uint8")(
        picture(1), key=(0, 0, 1)
    )
    with pytest.raises(ValueError, match="sample 1 is"):
        PixelBatch.collate([a, other_size])
    other_norm = RandomResizedCrop((9, 7), output="uint8")(picture(1), key=(0, 0, 1))
    with pytest.raises(ValueError, match="another normalisation"):
        PixelBatch.collate([a, other_norm])
    with pytest.raises(ValueError, match="at least one"):
        PixelBatch.collate([])
    with pytest.raises(ValueError, match="output must be"):
        RandomResizedCrop(8, output="half")


class Pictures(torch.utils.data.Dataset):
    def __init__(self) -> None:
        self.augment = crops("uint8")

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> RetrievalItem:
        return RetrievalItem(self.augment(picture(i), key=(0, 0, i)), torch.tensor([1]), i, i)


def test_loader_workers_hand_over_uint8():
    loader = DataLoader(Pictures(), batch_size=3, num_workers=2, collate_fn=collate_retrieval)
    batches = list(loader)
    assert all(isinstance(b, RetrievalBatch) for b in batches)
    assert all(b.features.pixels.dtype == torch.uint8 for b in batches)
    want = crops("float")
    got = torch.cat([b.to("cpu").features for b in batches])
    for i in range(6):
        assert torch.equal(got[i], want(picture(i), key=(0, 0, i)))
