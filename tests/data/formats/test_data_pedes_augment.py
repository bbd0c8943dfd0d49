"""IRRA's augmentation (``data.train_transform = "irra"``): resize to 384 x 128, flip, pad-10
random crop, random erasing, seeded per sample; checked against a float64 pipeline written out
here from the drawn parameters, and its draws' ranges and rates."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("PIL")

from PIL import Image  # noqa: E402

from vlret.data.formats.pedes.augment import (  # noqa: E402
    IRRAAugment,
    ResizeNormalize,
    build_augment,
    erase_box,
)
from vlret.data.transforms import RandomResizedCrop, sample_generator  # noqa: E402

MEAN = (0.48145466, 0.4578275, 0.40821073)  # IRRA's (CLIP's)
STD = (0.26862954, 0.26130258, 0.27577711)


@pytest.fixture(scope="module")
def picture():
    rng = np.random.default_rng(3)
    return Image.fromarray(rng.integers(0, 256, (90, 40, 3), dtype=np.uint8))


def reference(picture, aug: IRRAAugment, key) -> np.ndarray:
    """torchvision's Resize, RandomHorizontalFlip, Pad(10), RandomCrop, ToTensor, Normalize,
    RandomErasing(value=mean) in float64, from the sample's drawn parameters."""
    p = aug.params(key)
    h, w = aug.crop
    x = np.asarray(picture.convert("RGB").resize((w, h), Image.Resampling.BILINEAR), np.float64)
    if p.flip:
        x = x[:, ::-1]
    x = np.pad(x, ((aug.pad, aug.pad), (aug.pad, aug.pad), (0, 0)))  # black
    x = x[p.top : p.top + h, p.left : p.left + w]
    x = (x / 255.0 - np.array(MEAN)) / np.array(STD)
    x = x.transpose(2, 0, 1).copy()
    if p.erase is not None:
        t, left, eh, ew = p.erase
        x[:, t : t + eh, left : left + ew] = np.array(MEAN)[:, None, None]
    return x


def test_output_matches_the_pipeline_written_out_and_is_384_by_128(picture):
    aug = IRRAAugment(mean=MEAN, std=STD)
    flips, erased = set(), set()
    for index in range(12):
        key = (0, 1, index)
        got = aug(picture, key=key)
        assert got.shape == (3, 384, 128) and got.dtype == torch.float32
        # float32 normalisation of values within |x| <= 3.8: rounding below 1e-6
        np.testing.assert_allclose(got.numpy(), reference(picture, aug, key), atol=2e-6, rtol=0)
        p = aug.params(key)
        flips.add(p.flip)
        erased.add(p.erase is not None)
    assert flips == {True, False} and erased == {True, False}  # every branch compared


def test_the_same_key_gives_the_same_sample_and_keys_differ(picture, tmp_path):
    aug = IRRAAugment((48, 16), mean=MEAN, std=STD)
    path = tmp_path / "p.jpg"
    picture.save(path)
    a = aug(path, key=(5, 2, 7))
    assert torch.equal(a, aug(path, key=(5, 2, 7)))
    assert torch.equal(a, IRRAAugment((48, 16), mean=MEAN, std=STD)(path, key=(5, 2, 7)))
    others = [aug(path, key=k) for k in [(5, 2, 8), (5, 3, 7), (6, 2, 7)]]
    assert all(not torch.equal(a, o) for o in others)
    assert aug.params((5, 2, 7)) == aug.params((5, 2, 7))


def test_draws_follow_irras_ranges_and_rates():
    aug = IRRAAugment((384, 128))
    draws = [aug.params((0, 0, i)) for i in range(2000)]
    assert 0.45 < np.mean([d.flip for d in draws]) < 0.55
    tops = {d.top for d in draws}
    assert tops == set(range(21)) and {d.left for d in draws} == set(range(21))
    boxes = [d.erase for d in draws if d.erase is not None]
    assert 0.45 < len(boxes) / len(draws) < 0.55  # p = 0.5; a box nearly always fits
    for top, left, h, w in boxes:
        assert 0 < h < 384 and 0 < w < 128 and top + h <= 384 and left + w <= 128
        # the area before rounding is 2% to 40%; rounding h and w moves it by < h + w + 1
        assert 0.02 * 384 * 128 - h - w - 1 <= h * w <= 0.4 * 384 * 128 + h + w + 1
        assert 0.3 * 0.9 < h / w < 3.3 * 1.1


def test_erase_box_gives_up_after_ten_boxes_that_do_not_fit():
    assert erase_box(sample_generator([1]), 2, 2, (0.9, 0.99), (1.0, 1.0)) is None
    box = erase_box(sample_generator([1]), 100, 100, (0.1, 0.1), (1.0, 1.0))
    assert box is not None and box[2:] == (32, 32)  # sqrt(1000) rounded


def test_mean_colour_fill_and_no_erasing(picture):
    key = next((0, 0, i) for i in range(100) if IRRAAugment().params((0, 0, i)).erase)
    aug = IRRAAugment(mean=MEAN, std=STD, erase_fill="mean_colour")
    top, left, h, w = aug.params(key).erase
    assert torch.all(aug(picture, key=key)[:, top : top + h, left : left + w] == 0)
    plain = IRRAAugment(mean=MEAN, std=STD, flip_prob=0, pad=0, erase_prob=0)
    resize = ResizeNormalize(mean=MEAN, std=STD)
    assert torch.equal(plain(picture, key=key), resize(picture))  # IRRA's evaluation view


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"flip_prob": 1.5}, r"flip_prob must be a probability"),
        ({"pad": -1}, r"pad must be an int >= 0"),
        ({"erase_scale": (0.5, 1.0)}, r"erase_scale must be \(low, high\)"),
        ({"erase_ratio": (2.0, 1.0)}, r"erase_ratio must be"),
        ({"erase_fill": "grey"}, r"erase_fill must be one of"),
        ({"size": (0, 4)}, r"size must be a positive int"),
        ({"interpolation": "nearest"}, r"interpolation must be one of"),
    ],
)
def test_bad_arguments_are_named(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        IRRAAugment(**kwargs)


def test_build_augment_picks_irra_at_the_models_size():
    from types import SimpleNamespace

    from vlret.models.clip import CLIPImageTransform

    model = CLIPImageTransform((48, 16))
    data = SimpleNamespace(train_transform="irra")
    aug = build_augment(data, model)
    assert isinstance(aug, IRRAAugment) and aug.crop == (48, 16)
    np.testing.assert_array_equal(aug.mean, model.mean)
    with pytest.raises(ValueError, match=r'train_transform = "irra" needs a model that reads'):
        build_augment(data, None)
    rrc = SimpleNamespace(
        train_transform="random_resized_crop",
        crop_scale=[0.9, 1.0],
        crop_ratio=[0.75, 1.33],
        crop_interpolation="bicubic",
        hflip=False,
    )
    assert isinstance(build_augment(rrc, model), RandomResizedCrop)
    assert build_augment(SimpleNamespace(train_transform="none"), model) is None
