"""Fault cases of issue 39 on images: the pixel cap checked before decoding (item 3), images
that do not decode or are over the cap as one line naming the file in every reader (item 12),
class folders that nest their images a level deeper (item 14)."""

from __future__ import annotations

import io
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from vlret._images import (
    DEFAULT_MAX_IMAGE_PIXELS,
    ImageReadError,
    ImageTooLarge,
    open_rgb,
)

Image = pytest.importorskip("PIL.Image")
ImageFile = pytest.importorskip("PIL.ImageFile")

BIG_SIDE = 6000  # 36 M pixels: over the default cap, a PNG of a few tens of KB when all black
SMALL_CAP = 10_000


@pytest.fixture(scope="module")
def big_png(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real 6000 x 6000 all-black PNG written by PIL: tiny on disk, 36 MB decoded."""
    path = tmp_path_factory.mktemp("big") / "big.png"
    Image.new("L", (BIG_SIDE, BIG_SIDE)).save(path)
    assert path.stat().st_size < 200_000
    return path


@pytest.fixture
def no_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any pixel decoding fails the test: the cap must be met from the header alone."""

    def load(self: object) -> None:
        raise AssertionError("an image over the cap was decoded")

    monkeypatch.setattr(ImageFile.ImageFile, "load", load)


def test_default_cap_is_the_config_default() -> None:
    from vlret.train.config import DataConfig

    assert DataConfig().max_image_pixels == DEFAULT_MAX_IMAGE_PIXELS


def test_cap_refuses_from_the_header(big_png: Path, no_decoding: None) -> None:
    start = time.perf_counter()
    with pytest.raises(ImageTooLarge) as caught:
        open_rgb(big_png)  # the default cap (25 M) is below 36 M
    assert time.perf_counter() - start < 1.0
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{big_png}: 6000 x 6000")
    assert "data.max_image_pixels" in message


@pytest.mark.parametrize("kind", ["bytes", "file", "pil"])
def test_cap_applies_to_every_source(big_png: Path, no_decoding: None, kind: str) -> None:
    data = big_png.read_bytes()
    source = {
        "bytes": lambda: data,
        "file": lambda: io.BytesIO(data),
        "pil": lambda: Image.open(io.BytesIO(data)),  # lazy: header parsed, nothing decoded
    }[kind]()
    with pytest.raises(ImageTooLarge, match="^member 7.png: 6000 x 6000"):
        open_rgb(source, name="member 7.png")


def test_image_under_a_cap_above_pils_limit_reads_without_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """max_pixels is the limit that applies: PIL's own (here made tiny) neither warns nor
    refuses, and is left as it was."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
    buffer = io.BytesIO()
    Image.new("RGB", (40, 30), (1, 2, 3)).save(buffer, "PNG")  # 1200 > 2 x PIL's 100
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        image = open_rgb(buffer.getvalue(), max_pixels=1200)
    assert image.size == (40, 30) and image.getpixel((0, 0)) == (1, 2, 3)
    assert Image.MAX_IMAGE_PIXELS == 100
    with pytest.raises(ImageTooLarge):
        open_rgb(buffer.getvalue(), max_pixels=1199)


def test_no_cap_reads_a_large_image(big_png: Path) -> None:
    assert open_rgb(big_png, max_pixels=None).size == (BIG_SIDE, BIG_SIDE)


def png_bytes(size: tuple[int, int] = (8, 8)) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.full((size[1], size[0], 3), 7, dtype=np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"this is a caption, not an image", "not an image PIL can read"),
        (png_bytes((64, 64))[:80], "does not decode"),  # truncated in its pixel data
        (b"", "not an image PIL can read"),
    ],
)
def test_bad_files_are_one_line_naming_the_file(
    tmp_path: Path, content: bytes, problem: str
) -> None:
    path = tmp_path / "photo.jpg"
    path.write_bytes(content)
    with pytest.raises(ImageReadError) as caught:
        open_rgb(path)
    assert str(caught.value).startswith(f"{path}: {problem}")
    assert "\n" not in str(caught.value)


def test_missing_file_folder_and_fifo_are_named(tmp_path: Path) -> None:
    with pytest.raises(ImageReadError, match="missing.png: no such file"):
        open_rgb(tmp_path / "missing.png")
    with pytest.raises(ImageReadError, match="is a folder"):
        open_rgb(tmp_path)
    fifo = tmp_path / "pipe.png"
    os = pytest.importorskip("os")
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs on this platform")
    os.mkfifo(fifo)
    with pytest.raises(ImageReadError, match="pipe.png: not a regular file"):
        open_rgb(fifo)  # PIL would block on it, waiting for a writer


def test_eps_is_never_handed_to_ghostscript(tmp_path: Path) -> None:
    path = tmp_path / "figure.eps"
    path.write_bytes(b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nshowpage\n")
    with pytest.raises(ImageReadError, match="not an image PIL can read"):
        open_rgb(path)


def test_result_is_loaded_and_holds_no_file(tmp_path: Path) -> None:
    path = tmp_path / "a.png"
    path.write_bytes(png_bytes())
    image = open_rgb(path)
    path.unlink()  # the pixels are in memory
    assert image.mode == "RGB" and image.getpixel((3, 3)) == (7, 7, 7)
