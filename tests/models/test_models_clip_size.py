"""CLIP at a non-square input (IRRA's 384 x 128, here 24 x 8 with patch 4): the position
embeddings resampled once against naive float64 interpolations written here, the forward at the
new size, a preset on the new grid, and the stretching transform against PIL + a loop."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from vlret.models import build_model
from vlret.models.clip import CLIP_MEAN, CLIP_STD, CLIPImageTransform, load_clip
from vlret.models.clip_size import (
    GridVisionEmbeddings,
    resize_position_embedding,
    set_image_size,
)

Image = pytest.importorskip("PIL.Image")
transformers = pytest.importorskip("transformers")

EPS32 = float(np.finfo(np.float32).eps)
A = -0.75  # PyTorch's bicubic convolution constant


def _source(dst: int, scale: float) -> float:
    return (dst + 0.5) * scale - 0.5  # align_corners=False


def _bilinear_taps(dst: int, n_in: int, n_out: int) -> list[tuple[int, float]]:
    src = max(_source(dst, n_in / n_out), 0.0)
    i0 = int(math.floor(src))
    i1 = min(i0 + 1, n_in - 1)
    lam = src - i0
    return [(i0, 1.0 - lam), (i1, lam)]


def _cubic(x: float) -> float:
    x = abs(x)
    if x <= 1:
        return ((A + 2) * x - (A + 3)) * x * x + 1
    if x < 2:
        return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A
    return 0.0


def _bicubic_taps(dst: int, n_in: int, n_out: int) -> list[tuple[int, float]]:
    src = _source(dst, n_in / n_out)
    i = int(math.floor(src))
    t = src - i
    return [(min(max(i - 1 + k, 0), n_in - 1), _cubic(t + 1 - k)) for k in range(4)]


def naive_resize(weight: torch.Tensor, old: tuple[int, int], new: tuple[int, int], mode: str):
    """Class row kept, each grid cell a separable weighted sum of old cells, in float64."""
    taps = _bilinear_taps if mode == "bilinear" else _bicubic_taps
    w = weight.double()
    grid = w[1:].reshape(old[0], old[1], -1)
    out = torch.zeros(new[0], new[1], w.shape[1], dtype=torch.float64)
    for y in range(new[0]):
        for x in range(new[1]):
            for iy, cy in taps(y, old[0], new[0]):
                for ix, cx in taps(x, old[1], new[1]):
                    out[y, x] += cy * cx * grid[iy, ix]
    return torch.cat([w[:1], out.reshape(new[0] * new[1], -1)])


def tolerance(weight: torch.Tensor) -> float:
    # float32 evaluation of <= 16 products with coefficients summing (in absolute value) to
    # < 1.6: a few dozen roundings of values below max |w|
    return 64 * EPS32 * float(weight.abs().max())


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_clip_16")
    config = transformers.CLIPConfig(
        text_config=dict(
            vocab_size=16,
            hidden_size=16,
            intermediate_size=24,
            num_hidden_layers=1,
            num_attention_heads=2,
            max_position_embeddings=12,
            bos_token_id=1,
            eos_token_id=3,
            pad_token_id=0,
        ),
        vision_config=dict(
            image_size=16,
            patch_size=4,
            hidden_size=16,
            intermediate_size=24,
            num_hidden_layers=1,
            num_attention_heads=2,
        ),
        projection_dim=12,
    )
    torch.manual_seed(0)
    model = transformers.CLIPModel(config)
    with torch.no_grad():  # O(1) embeddings, so the interpolation's errors are not masked
        model.vision_model.embeddings.position_embedding.weight.normal_()
    model.save_pretrained(str(path))
    size = {"size": {"shortest_edge": 16}, "crop_size": {"height": 16, "width": 16}}
    transformers.CLIPImageProcessor(**size).save_pretrained(str(path))  # load_clip reads it
    return path


def saved_positions(clip_dir) -> torch.Tensor:
    reference = transformers.CLIPModel.from_pretrained(str(clip_dir), local_files_only=True)
    return reference.vision_model.embeddings.position_embedding.weight.detach().clone()


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
@pytest.mark.parametrize("new", [(6, 2), (3, 5), (7, 7)])
def test_resized_embeddings_equal_a_naive_interpolation(clip_dir, mode, new):
    weight = saved_positions(clip_dir)
    got = resize_position_embedding(weight, new, mode=mode)
    assert got.shape == (1 + new[0] * new[1], 16) and got.dtype == torch.float32
    want = naive_resize(weight, (4, 4), new, mode)
    assert torch.allclose(got.double(), want, rtol=0, atol=tolerance(weight))
    assert torch.equal(got[0], weight[0])  # the class token's embedding is kept


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_a_one_to_one_interpolation_is_the_identity(clip_dir, mode):
    weight = saved_positions(clip_dir)
    same = resize_position_embedding(weight, (4, 4), mode=mode)
    assert torch.allclose(same, weight, rtol=0, atol=4 * EPS32 * float(weight.abs().max()))
    rect = resize_position_embedding(weight[:9], (2, 4), old_grid=(2, 4), mode=mode)
    assert torch.allclose(rect, weight[:9], rtol=0, atol=4 * EPS32 * float(weight.abs().max()))


def test_load_clip_at_24x8_resamples_once_as_irra(clip_dir):
    image_enc, _, transform = load_clip(clip_dir, proj_dim=None, image_size=[24, 8])
    emb = image_enc.vision_model.embeddings
    assert isinstance(emb, GridVisionEmbeddings)
    assert (emb.grid, emb.image_size, transform.crop) == ((6, 2), (24, 8), (24, 8))
    weight = saved_positions(clip_dir)
    want = naive_resize(weight, (4, 4), (6, 2), "bilinear")  # IRRA's resize_pos_embed
    got = emb.position_embedding.weight.detach().double()
    assert torch.allclose(got, want, rtol=0, atol=tolerance(weight))
    pixels = torch.stack(
        [transform(Image.new("RGB", (20 + k, 48), (40 * k, 90, 200))) for k in range(3)]
    )
    assert pixels.shape == (3, 3, 24, 8)
    out = image_enc(pixels)
    assert out.shape == (3, 12) and torch.isfinite(out).all()
    out.sum().backward()  # the resampled grid is a trained parameter
    assert emb.position_embedding.weight.grad is not None
    assert emb.position_embedding.weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match=r"16 x 16; this CLIP takes 24 x 8 \(model.image_size\)"):
        image_enc(torch.zeros(1, 3, 16, 16))


def test_bicubic_once_equals_transformers_interpolation_at_each_forward(clip_dir):
    """The other reading: HF's interpolate_pos_encoding=True resamples the 4 x 4 grid bicubically
    at every forward; resampling once with mode="bicubic" gives the same tower output."""
    reference = transformers.CLIPModel.from_pretrained(str(clip_dir), local_files_only=True)
    ours = transformers.CLIPModel.from_pretrained(str(clip_dir), local_files_only=True)
    set_image_size(ours.vision_model, (24, 8), mode="bicubic")
    pixels = torch.randn(2, 3, 24, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = reference.vision_model(pixel_values=pixels, interpolate_pos_encoding=True)
        got = ours.vision_model(pixel_values=pixels)
    # the same float32 operations in both: differences are rounding of O(1) activations
    assert torch.allclose(got.pooler_output, want.pooler_output, rtol=0, atol=1e-5)


def test_build_model_image_size_round_trips_through_the_resolved_config(clip_dir):
    model = build_model({"kind": "clip", "path": str(clip_dir), "image_size": [24, 8]})
    assert model.config["image_size"] == [24, 8] and model.image_transform.crop == (24, 8)
    again = build_model(model.config)
    again.load_state_dict(model.state_dict())  # the same keys and shapes
    square = build_model({"kind": "clip", "path": str(clip_dir), "image_size": 16})
    assert not isinstance(square.image_encoder.vision_model.embeddings, GridVisionEmbeddings)
    assert build_model({"kind": "clip", "path": str(clip_dir)}).config["image_size"] is None


TINY = {
    "projection_dim": 8,
    "vision_config": {
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "image_size": 16,
        "patch_size": 4,
    },
    "text_config": {
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "max_position_embeddings": 77,
    },
}


def test_a_preset_gets_random_embeddings_on_the_new_grid():
    torch.manual_seed(0)
    model = build_model(
        {
            "kind": "clip",
            "preset": "ViT-B-32",
            "config": TINY,
            "tokenizer": "bytes",
            "image_size": [24, 8],
        }
    )
    emb = model.image_encoder.vision_model.embeddings
    weight = emb.position_embedding.weight.detach()
    assert weight.shape == (13, 16) and model.image_transform.crop == (24, 8)
    # transformers' CLIP init: normal with std initializer_range (0.02) x factor (1)
    assert 0.01 < float(weight.std()) < 0.03
    out = model.image_encoder(torch.randn(2, 3, 24, 8))
    assert out.shape == (2, 8) and torch.isfinite(out).all()


@pytest.mark.parametrize(
    ("size", "words"),
    [
        ([24, 9], "not a multiple of the patch size 4"),
        ([24], "expected an int or [height, width]"),
        ([24, 0], "expected positive integers"),
        ("384x128", "expected an int or [height, width]"),
    ],
)
def test_bad_image_sizes_are_one_line_errors_naming_the_key(clip_dir, size, words):
    with pytest.raises(ValueError, match="image_size") as err:
        build_model({"kind": "clip", "path": str(clip_dir), "image_size": size})
    assert words in str(err.value) and "\n" not in str(err.value)


def naive_stretched(image, height: int, width: int) -> torch.Tensor:
    resized = image.resize((width, height), resample=Image.BICUBIC)
    out = torch.empty(3, height, width, dtype=torch.float64)
    for c in range(3):
        for y in range(height):
            for x in range(width):
                out[c, y, x] = (resized.getpixel((x, y))[c] / 255.0 - CLIP_MEAN[c]) / CLIP_STD[c]
    return out


@pytest.mark.parametrize("size", [(20, 48), (9, 30), (8, 24), (40, 10)])
def test_non_square_transform_resizes_to_height_by_width(size):
    rng = np.random.default_rng(sum(size))
    image = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))
    transform = CLIPImageTransform((24, 8))
    assert transform.stretch and "stretch" not in repr(transform)
    got = transform(image)
    assert got.dtype == torch.float32 and got.shape == (3, 24, 8)
    # one float32 subtraction and division of values below 1 / min(std) ~ 4
    tol = 8 * EPS32 * (1 + 1 / min(CLIP_STD))
    assert torch.allclose(got.double(), naive_stretched(image, 24, 8), rtol=0, atol=tol)


def test_square_crops_keep_the_shorter_side_resize_unless_stretch_is_asked():
    image = Image.fromarray(np.random.default_rng(3).integers(0, 256, (12, 20, 3), np.uint8))
    square = CLIPImageTransform(8)
    assert not square.stretch and repr(square) == "CLIPImageTransform(crop=(8, 8), resize=8)"
    cropped = image.resize((13, 8), resample=Image.BICUBIC).crop((2, 0, 10, 8))
    tol = 8 * EPS32 * (1 + 1 / min(CLIP_STD))
    assert torch.allclose(square(image).double(), naive_stretched(cropped, 8, 8), atol=tol)
    stretched = CLIPImageTransform(8, stretch=True)
    assert "stretch=True" in repr(stretched)
    assert torch.allclose(stretched(image).double(), naive_stretched(image, 8, 8), atol=tol)
