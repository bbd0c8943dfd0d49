"""Conformance of :func:`vlret._images.open_rgb` to the images PIL writes (issue 39 item 11).

Every file here is written by ``PIL.Image.save`` (PNG; TIFF for the modes PNG cannot hold;
JPEG for CMYK, YCbCr and EXIF orientation) from a NumPy array, read back by ``open_rgb``, and
compared with a NumPy computation from the array written (the readings the module docstring of
``vlret._images`` documents), and for the 8-bit modes with transformers' own ``convert_to_rgb``.

Tolerances: 0 where the reading is integer arithmetic; one level where PIL converts in fixed
point (CMYK, YCbCr: their float64 formulas are rounded once, so the integer result lies within
one level); JPEG's tolerance is in its test.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from vlret._images import open_rgb

Image = pytest.importorskip("PIL.Image")

SIZE = (24, 16)  # width, height: not square, so a rotation cannot pass for another
RNG_SEED = 39


def rng() -> np.random.Generator:
    return np.random.default_rng(RNG_SEED)


def grey3(grey: np.ndarray) -> np.ndarray:
    return np.repeat(grey[..., None], 3, axis=2)


def over_white(colour: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """Colour composited over white in float64, rounded half up: the documented reading."""
    c = colour.astype(np.float64)
    a = alpha.astype(np.float64)[..., None] if colour.ndim == 3 else alpha.astype(np.float64)
    return np.floor((c * a + 255.0 * (255.0 - a)) / 255.0 + 0.5)


def saved(tmp_path: Path, image: Any, fmt: str, **options: Any) -> Path:
    path = tmp_path / f"image.{fmt.lower()}"
    image.save(path, fmt, **options)
    return path


def read(path: Path) -> np.ndarray:
    out = open_rgb(path)
    assert out.mode == "RGB" and out.size == SIZE
    return np.asarray(out).astype(np.float64)


def test_mode_1_png(tmp_path: Path) -> None:
    bits = rng().random((SIZE[1], SIZE[0])) < 0.5
    image = Image.fromarray(bits)
    assert image.mode == "1"
    np.testing.assert_array_equal(read(saved(tmp_path, image, "PNG")), grey3(bits * 255.0))


def test_mode_L_png(tmp_path: Path) -> None:
    grey = rng().integers(0, 256, (SIZE[1], SIZE[0]), dtype=np.uint8)
    np.testing.assert_array_equal(read(saved(tmp_path, Image.fromarray(grey), "PNG")), grey3(grey))


def test_mode_LA_png_over_white(tmp_path: Path) -> None:
    pixels = rng().integers(0, 256, (SIZE[1], SIZE[0], 2), dtype=np.uint8)
    image = Image.fromarray(pixels)
    assert image.mode == "LA"
    expected = grey3(over_white(pixels[..., 0], pixels[..., 1]))
    np.testing.assert_allclose(read(saved(tmp_path, image, "PNG")), expected, atol=1)


def palette_image(mode: str = "P") -> tuple[Any, np.ndarray, np.ndarray]:
    r = rng()
    index = r.integers(0, 16, (SIZE[1], SIZE[0]), dtype=np.uint8)
    palette = r.integers(0, 256, (256, 3), dtype=np.uint8)
    image = Image.fromarray(index)
    image.putpalette(palette.flatten().tolist())
    assert image.mode == "P"
    return image, index, palette


def test_mode_P_png(tmp_path: Path) -> None:
    image, index, palette = palette_image()
    np.testing.assert_array_equal(read(saved(tmp_path, image, "PNG")), palette[index])


def test_mode_P_with_transparency_png_over_white(tmp_path: Path) -> None:
    image, index, palette = palette_image()
    alphas = rng().integers(0, 256, 256, dtype=np.uint8)
    path = saved(tmp_path, image, "PNG", transparency=alphas.tobytes())
    expected = over_white(palette[index], alphas[index])
    np.testing.assert_allclose(read(path), expected, atol=1)


def test_mode_PA_tiff_over_white(tmp_path: Path) -> None:
    r = rng()
    index = r.integers(0, 16, (SIZE[1], SIZE[0]), dtype=np.uint8)
    alpha = r.integers(0, 256, (SIZE[1], SIZE[0]), dtype=np.uint8)
    palette = r.integers(0, 256, (256, 3), dtype=np.uint8)
    image = Image.frombytes("PA", SIZE, np.stack([index, alpha], -1).tobytes())
    image.putpalette(palette.flatten().tolist())
    expected = over_white(palette[index], alpha)
    np.testing.assert_allclose(read(saved(tmp_path, image, "TIFF")), expected, atol=1)


def test_mode_RGB_png_exact(tmp_path: Path) -> None:
    rgb = rng().integers(0, 256, (SIZE[1], SIZE[0], 3), dtype=np.uint8)
    np.testing.assert_array_equal(read(saved(tmp_path, Image.fromarray(rgb), "PNG")), rgb)


def test_mode_RGB_with_transparent_colour_png(tmp_path: Path) -> None:
    """A PNG tRNS colour key: pixels of that colour are transparent, read as white."""
    rgb = rng().integers(0, 4, (SIZE[1], SIZE[0], 3), dtype=np.uint8) * 60
    key = (60, 0, 120)
    path = saved(tmp_path, Image.fromarray(rgb), "PNG", transparency=key)
    expected = rgb.astype(np.float64)
    expected[(rgb == key).all(axis=2)] = 255
    assert (rgb == key).all(axis=2).any()
    np.testing.assert_array_equal(read(path), expected)


def test_mode_RGBA_png_over_white(tmp_path: Path) -> None:
    rgba = rng().integers(0, 256, (SIZE[1], SIZE[0], 4), dtype=np.uint8)
    expected = over_white(rgba[..., :3], rgba[..., 3])
    np.testing.assert_allclose(
        read(saved(tmp_path, Image.fromarray(rgba), "PNG")), expected, atol=1
    )


def cmyk_to_rgb(cmyk: np.ndarray) -> np.ndarray:
    c = cmyk.astype(np.float64) / 255.0
    return 255.0 * (1.0 - c[..., :3]) * (1.0 - c[..., 3:])


def test_mode_CMYK_tiff(tmp_path: Path) -> None:
    cmyk = rng().integers(0, 256, (SIZE[1], SIZE[0], 4), dtype=np.uint8)
    image = Image.frombytes("CMYK", SIZE, cmyk.tobytes())
    np.testing.assert_allclose(read(saved(tmp_path, image, "TIFF")), cmyk_to_rgb(cmyk), atol=1)


def ycbcr_to_rgb(ycc: np.ndarray) -> np.ndarray:
    y, cb, cr = (ycc[..., i].astype(np.float64) for i in range(3))
    rgb = np.stack(
        [
            y + 1.402 * (cr - 128),
            y - 0.344136 * (cb - 128) - 0.714136 * (cr - 128),
            y + 1.772 * (cb - 128),
        ],
        axis=-1,
    )
    return np.clip(rgb, 0, 255)


def test_mode_YCbCr_tiff(tmp_path: Path) -> None:
    ycc = rng().integers(0, 256, (SIZE[1], SIZE[0], 3), dtype=np.uint8)
    image = Image.frombytes("YCbCr", SIZE, ycc.tobytes())
    np.testing.assert_allclose(read(saved(tmp_path, image, "TIFF")), ycbcr_to_rgb(ycc), atol=1)


def flat_blocks(channels: int) -> np.ndarray:
    """An image of constant 8 x 8 blocks aligned to JPEG's grid: at quality 100 with no
    chroma subsampling each block keeps only its DC term, quantised by 1."""
    blocks = rng().integers(0, 256, (SIZE[1] // 8, SIZE[0] // 8, channels), dtype=np.uint8)
    return np.repeat(np.repeat(blocks, 8, axis=0), 8, axis=1)


# JPEG of flat blocks: the DC term rounded (half a level), the colour transform to and from
# the stored YCbCr rounded each way (half a level each, scaled by at most 1.772 on the way back)
JPEG_ATOL = 0.5 + 0.5 + 1.772 * 0.5 + 0.5


def test_mode_CMYK_jpeg(tmp_path: Path) -> None:
    cmyk = flat_blocks(4)
    image = Image.frombytes("CMYK", SIZE, cmyk.tobytes())
    path = saved(tmp_path, image, "JPEG", quality=100, subsampling=0)
    # CMYK JPEGs store the four channels without a colour transform: each block's DC term
    # rounded (half a level in c and in k, each moving red by at most as much), then PIL's
    # fixed-point CMYK formula (half a level)
    np.testing.assert_allclose(read(path), cmyk_to_rgb(cmyk), atol=0.5 + 0.5 + 0.5)


def test_mode_YCbCr_jpeg(tmp_path: Path) -> None:
    ycc = flat_blocks(3)
    image = Image.frombytes("YCbCr", SIZE, ycc.tobytes())
    path = saved(tmp_path, image, "JPEG", quality=100, subsampling=0)
    np.testing.assert_allclose(read(path), ycbcr_to_rgb(ycc), atol=JPEG_ATOL)


def sixteen_bit_values() -> np.ndarray:
    """Every boundary a reading could get wrong (0, 128, 129, 256, 257 x k +- 128, 65535)
    and random values, in the image's shape."""
    edges = np.array([0, 1, 128, 129, 255, 256, 257, 385, 386, 32767, 32768, 65407, 65535])
    values = rng().integers(0, 65536, SIZE[0] * SIZE[1])
    values[: edges.size] = edges
    return values.reshape(SIZE[1], SIZE[0])


def sixteen_to_eight(values: np.ndarray) -> np.ndarray:
    return np.clip(np.floor(values.astype(np.float64) / 257.0 + 0.5), 0, 255)


def test_mode_I16_png_is_not_clipped_to_white(tmp_path: Path) -> None:
    values = sixteen_bit_values().astype(np.uint16)
    image = Image.fromarray(values)
    assert image.mode == "I;16"
    path = saved(tmp_path, image, "PNG")
    with Image.open(path) as written:  # a 16-bit PNG, as a 16-bit scanner or camera writes
        assert written.mode == "I;16"
    got = read(path)
    np.testing.assert_array_equal(got, grey3(sixteen_to_eight(values)))
    assert got.mean() < 250  # convert("RGB") read this as (nearly) all white


def test_mode_I16B_tiff(tmp_path: Path) -> None:
    values = sixteen_bit_values().astype(">u2")
    image = Image.fromarray(values)
    assert image.mode == "I;16B"
    np.testing.assert_array_equal(
        read(saved(tmp_path, image, "TIFF")), grey3(sixteen_to_eight(values))
    )


def test_mode_I_tiff_read_as_16_bit_and_clipped(tmp_path: Path) -> None:
    values = sixteen_bit_values().astype(np.int32)
    values[0, :3] = [-5, 70000, 2**31 - 1]  # outside 16 bits: clipped to black and white
    image = Image.fromarray(values)
    assert image.mode == "I"
    np.testing.assert_array_equal(
        read(saved(tmp_path, image, "TIFF")), grey3(sixteen_to_eight(values))
    )


def test_mode_F_tiff_read_as_fractions(tmp_path: Path) -> None:
    values = rng().uniform(-0.2, 1.2, (SIZE[1], SIZE[0])).astype(np.float32)
    values[0, :3] = [np.nan, np.inf, -np.inf]
    image = Image.fromarray(values)
    assert image.mode == "F"
    clean = np.nan_to_num(values.astype(np.float64), nan=0.0, posinf=1.0, neginf=0.0)
    expected = np.clip(np.floor(255.0 * clean + 0.5), 0, 255)
    np.testing.assert_array_equal(read(saved(tmp_path, image, "TIFF")), grey3(expected))


def oriented(pixels: np.ndarray, orientation: int) -> np.ndarray:
    """The upright view of stored pixels under an EXIF orientation (EXIF 2.32, tag 0x0112):
    1 as stored, 2 mirrored, 3 turned half way, 4 flipped, 5 transposed, 6 turned a quarter
    clockwise, 7 transposed across the other diagonal, 8 turned a quarter anticlockwise."""
    return {
        1: lambda a: a,
        2: lambda a: a[:, ::-1],
        3: lambda a: a[::-1, ::-1],
        4: lambda a: a[::-1],
        5: lambda a: a.transpose(1, 0, 2),
        6: lambda a: np.rot90(a, k=-1),
        7: lambda a: a[::-1, ::-1].transpose(1, 0, 2),
        8: lambda a: np.rot90(a, k=1),
    }[orientation](pixels)


def with_orientation(orientation: int) -> Any:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return exif


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_png(tmp_path: Path, orientation: int) -> None:
    rgb = rng().integers(0, 256, (SIZE[1], SIZE[0], 3), dtype=np.uint8)
    path = saved(tmp_path, Image.fromarray(rgb), "PNG", exif=with_orientation(orientation))
    got = np.asarray(open_rgb(path))
    np.testing.assert_array_equal(got, oriented(rgb, orientation))


@pytest.mark.parametrize("orientation", [3, 6, 8])
def test_exif_orientation_jpeg(tmp_path: Path, orientation: int) -> None:
    rgb = flat_blocks(3)
    path = saved(
        tmp_path,
        Image.fromarray(rgb),
        "JPEG",
        quality=100,
        subsampling=0,
        exif=with_orientation(orientation),
    )
    got = np.asarray(open_rgb(path)).astype(np.float64)
    np.testing.assert_allclose(got, oriented(rgb, orientation), atol=JPEG_ATOL)


EIGHT_BIT_MODES = ["1", "L", "LA", "P", "P+tRNS", "RGBA", "CMYK"]


@pytest.mark.parametrize("mode", EIGHT_BIT_MODES)
def test_eight_bit_modes_match_transformers_convert_to_rgb(tmp_path: Path, mode: str) -> None:
    """Where transformers reads a mode right (8-bit ones), open_rgb gives its exact pixels."""
    image_transforms = pytest.importorskip("transformers.image_transforms")
    r = rng()
    if mode in ("P", "P+tRNS"):
        image, _, _ = palette_image()
        options = {"transparency": r.integers(0, 256, 256, dtype=np.uint8).tobytes()}
        path = saved(tmp_path, image, "PNG", **(options if mode == "P+tRNS" else {}))
    elif mode == "CMYK":
        data = r.integers(0, 256, (SIZE[1], SIZE[0], 4), dtype=np.uint8).tobytes()
        path = saved(tmp_path, Image.frombytes("CMYK", SIZE, data), "TIFF")
    else:
        bands = len(mode)
        pixels = r.integers(0, 256, (SIZE[1], SIZE[0], bands), dtype=np.uint8)
        data = np.packbits(pixels > 127) if mode == "1" else pixels  # "1": rows of bits
        image = Image.frombytes(mode, SIZE, data.tobytes())
        path = saved(tmp_path, image, "PNG")
    with Image.open(path) as written:
        theirs = image_transforms.convert_to_rgb(written, return_numpy=True)
    np.testing.assert_array_equal(np.asarray(open_rgb(path)), theirs)
