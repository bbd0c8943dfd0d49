"""Training augmentation: the random-resized crop against a naive crop / resize / flip written
here, the box's distribution, per-sample seeding (workers and resumes) and the config keys."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from vlret.data.transforms import RandomResizedCrop, crop_box, sample_generator
from vlret.run.config import ConfigError, config_from_dict

Image = pytest.importorskip("PIL.Image")

MEAN = (0.48145466, 0.4578275, 0.40821073)
STD = (0.26862954, 0.26130258, 0.27577711)


def picture(width: int = 37, height: int = 29, seed: int = 0):
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def naive(image, params, size, resample, mean, std) -> np.ndarray:
    """Crop the box out of the pixel array, resize it with PIL, flip it, normalise in float64."""
    arr = np.asarray(image)
    box = arr[params.top : params.top + params.height, params.left : params.left + params.width]
    out = np.asarray(Image.fromarray(box).resize((size[1], size[0]), resample=resample))
    out = out.astype(np.float64) / 255.0
    if params.flip:
        out = out[:, ::-1]
    out = (out - np.asarray(mean)) / np.asarray(std)
    return out.transpose(2, 0, 1)


@pytest.mark.parametrize("interpolation", ["bicubic", "bilinear"])
def test_output_equals_a_naive_crop_resize_flip(interpolation):
    image = picture()
    rrc = RandomResizedCrop(
        (12, 10), scale=(0.2, 1.0), interpolation=interpolation, hflip=True, mean=MEAN, std=STD
    )
    resample = getattr(Image.Resampling, interpolation.upper())
    flips = set()
    for index in range(12):
        key = (7, 3, index)
        params = rrc.params(key, *image.size)
        flips.add(params.flip)
        got = rrc(image, key=key)
        assert got.dtype == torch.float32 and got.shape == (3, 12, 10)
        want = naive(image, params, (12, 10), resample, MEAN, STD)
        # float32 normalisation of exact uint8 pixels: a few ulps of values below ~4
        np.testing.assert_allclose(got.double().numpy(), want, rtol=0, atol=4e-6)
    assert flips == {True, False}


def test_a_full_box_of_the_same_size_is_the_image_itself():
    image = picture(16, 16)
    rrc = RandomResizedCrop(16, scale=(1.0, 1.0), ratio=(1.0, 1.0))
    params = rrc.params((0, 0, 0), 16, 16)
    assert params == (0, 0, 16, 16, False)
    got = rrc(image, key=(0, 0, 0))
    want = np.asarray(image, dtype=np.float64).transpose(2, 0, 1) / 255.0
    np.testing.assert_allclose(got.double().numpy(), want, rtol=0, atol=1e-7)


def test_boxes_respect_scale_and_ratio_and_fit_the_image():
    width, height = 200, 150
    scale, ratio = (0.08, 1.0), (3 / 4, 4 / 3)
    fractions = []
    for i in range(300):
        left, top, w, h = crop_box(sample_generator((1, 0, i)), width, height, scale, ratio)
        assert 0 <= left and left + w <= width and 0 <= top and top + h <= height
        # rounding w and h to pixels moves the area and the ratio by at most one pixel a side
        assert (w - 1) * (h - 1) / (width * height) <= scale[1]
        assert (w + 1) * (h + 1) / (width * height) >= scale[0]
        assert ratio[0] * (h - 1) / (h + 1) <= w / h <= ratio[1] * (h + 1) / (h - 1) or (w, h) == (
            width,
            height,
        )
        fractions.append(w * h / (width * height))
    assert min(fractions) < 0.2 and max(fractions) > 0.8  # the whole scale range is drawn


def test_the_fallback_is_the_center_box_clamped_to_the_ratio():
    # a 100 x 10 strip cannot hold a box of ratio <= 4/3 and area >= 0.9: ten draws fail
    left, top, w, h = crop_box(sample_generator((0,)), 100, 10, (0.9, 1.0), (0.75, 4 / 3))
    assert (w, h) == (13, 10) and (left, top) == ((100 - 13) // 2, 0)


def test_the_draw_depends_on_the_key_only():
    rrc = RandomResizedCrop(8, hflip=True)
    keys = [(5, e, i) for e in range(3) for i in range(20)]
    first = [rrc.params(k, 64, 48) for k in keys]
    np.random.seed(123)  # the global generators do not enter
    torch.manual_seed(123)
    assert [rrc.params(k, 64, 48) for k in reversed(keys)] == first[::-1]
    by_epoch = [first[i * 20 : (i + 1) * 20] for i in range(3)]
    assert by_epoch[0] != by_epoch[1] != by_epoch[2]


def test_from_eval_reads_the_models_crop_mean_and_std():
    from vlret.models.clip import CLIPImageTransform

    rrc = RandomResizedCrop.from_eval(CLIPImageTransform(24, resize=32), scale=(0.9, 1.0))
    assert rrc.crop == (24, 24) and np.allclose(rrc.mean, MEAN) and np.allclose(rrc.std, STD)
    with pytest.raises(ValueError, match="has no 'crop'"):
        RandomResizedCrop.from_eval(object())


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"scale": (0.5, 0.2)}, "crop_scale"),
        ({"scale": (0.0, 1.0)}, "crop_scale"),
        ({"ratio": (2.0, 1.0)}, "crop_ratio"),
        ({"interpolation": "nearest"}, "interpolation"),
    ],
)
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RandomResizedCrop(8, **kwargs)


def base_config(**data):
    return {
        "output_dir": "run",
        "data": {"root": "x", "format": "karpathy", **data},
        "loss": {"name": "triplet"},
        "train": {"epochs": 1, "batch_size": 4},
    }


def test_config_keys_defaults_and_errors():
    data = config_from_dict(base_config()).data
    assert (data.train_transform, data.crop_scale, data.crop_ratio) == (
        "none",
        [0.08, 1.0],
        [0.75, 1.3333],
    )
    assert data.hflip is False and data.crop_interpolation == "bicubic"
    ok = config_from_dict(base_config(train_transform="random_resized_crop", crop_scale=[0.9, 1]))
    assert ok.data.crop_scale == [0.9, 1.0]
    for bad, key in [
        ({"train_transform": "rrc"}, "data.train_transform"),
        ({"crop_scale": [0.9, 1.5]}, "data.crop_scale"),
        ({"crop_ratio": [1.0]}, "data.crop_ratio"),
        ({"crop_interpolation": "lanczos"}, "data.crop_interpolation"),
        ({"format": "precomp", "train_transform": "random_resized_crop"}, "data.train_transform"),
    ]:
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            config_from_dict(base_config(**bad))


def test_ratio_log_uniform_is_symmetric():
    # log-uniform in [3/4, 4/3]: w/h > 1 as often as < 1 for boxes that fit
    above = sum(
        (lambda b: b[2] > b[3])(
            crop_box(sample_generator((9, i)), 1000, 1000, (0.1, 0.2), (0.75, 4 / 3))
        )
        for i in range(400)
    )
    assert abs(above - 200) < 4 * math.sqrt(100)
