"""The one image reader: every image vlret decodes (Karpathy folders, CSV rows, shards, image
folders, classification sets, person search, report thumbnails, captioning) goes through
:func:`open_rgb`, which checks a pixel cap from the file's header before decoding anything and
returns 8-bit RGB pixels read the same documented way whatever mode the file was written in.

**The pixel cap.** ``width * height`` is read from the header (``PIL.Image.open`` parses only
the header) and compared with ``max_pixels`` before a single pixel is decoded: a 10000 x 10000
PNG of 290 KB would otherwise take 300 MB of memory and seconds of CPU per read. The default,
:data:`DEFAULT_MAX_IMAGE_PIXELS` (25 M pixels, a 6000 x 4000 photograph fits), is the default of
the run config's ``data.max_image_pixels`` and well below PIL's own decompression-bomb limit
(``PIL.Image.MAX_IMAGE_PIXELS``, 89 M, a warning; twice that, an error). PIL's own check is
lifted while the header is parsed (under a lock, restored right after), so the cap asked for is
the one that applies: no ``DecompressionBombWarning`` for an image under it, and ``max_pixels``
above PIL's limit (or None, no cap) is honoured too. Ghostscript is never run: EPS files are not
read (PIL hands them to the ``gs`` program, a known route for malicious files).

**Orientation.** An EXIF ``Orientation`` tag (JPEG, PNG ``eXIf``, TIFF, WebP) is applied
(``PIL.ImageOps.exif_transpose``): a phone's portrait photograph stored sideways is read upright,
as viewers and browsers show it.

**Modes** (:func:`to_rgb`; ``v`` is a stored value, ``a`` an alpha in 0..255):

- ``RGB``: as stored. ``RGBX`` drops its padding band.
- ``1``: a set bit is 255, a clear one 0, in all three channels. ``L``: grey, ``(v, v, v)``.
- ``P`` (palette): the palette's colour.
- Alpha (``LA``, ``PA``, ``RGBA``, ``La``, ``RGBa``) and transparency (``P``, ``L``, ``RGB`` and
  16-bit grey with a ``transparency`` entry, e.g. a PNG ``tRNS`` chunk): composited over white,
  ``round((c * a + 255 * (255 - a)) / 255)`` per channel (PIL's ``alpha_composite`` in fixed
  point, within one level), as transformers' ``image_transforms.convert_to_rgb`` does: a
  transparent logo reads as the logo on white, not on black or on whatever colour the invisible
  pixels happen to hold.
- 16-bit grey (``I;16``, ``I;16B``, ``I;16L``; a 16-bit PNG or TIFF) and 32-bit integer ``I``
  (how older Pillow releases, and TIFF, hold 16-bit grey): ``round(v / 257)`` clipped to
  0..255, so 0 -> 0 and 65535 -> 255. The previous ``convert("RGB")`` clipped every value above
  255 to white: a 16-bit photograph became a white page.
- 32-bit float ``F``: read as intensity fractions, the convention of float images in the
  scientific Python stack (scikit-image's ``img_as_float``, torchvision's float tensors):
  ``round(255 * v)`` clipped to 0..255 (NaN and -inf -> 0, +inf -> 255). PIL's own
  ``convert`` clips the values themselves to 0..255, which would read a 0..1 image as black.
- ``CMYK``: ``255 * (1 - c/255) * (1 - k/255)`` for red (``m``, ``y`` for green and blue), the
  usual device-independent formula (PIL's, within one level); Adobe's inverted CMYK JPEGs are
  inverted back by PIL while reading.
- ``YCbCr``: JPEG's full-range (JFIF) formulas ``R = Y + 1.402 (Cr - 128)``,
  ``G = Y - 0.344136 (Cb - 128) - 0.714136 (Cr - 128)``, ``B = Y + 1.772 (Cb - 128)``,
  rounded and clipped (PIL's, within one level).
- 16-bit RGB(A) PNGs: PIL keeps each sample's high byte (``v >> 8``, within one level of
  ``v / 257``); multi-frame images (GIF, TIFF): the first frame.
- Any other mode PIL converts to RGB (``HSV``) is converted by PIL; one it cannot is an
  :class:`ImageReadError`.

Errors are one line, ``"<name>: <what is wrong>"``: :class:`ImageTooLarge` for an image over
the cap, :class:`ImageReadError` (a ``ValueError``) for a missing file, something that is not an
image, or truncated or corrupt data. Callers in training turn them into a skipped-and-counted
sample where their reader skips bad samples; elsewhere the line reaches the command line as is.
"""

from __future__ import annotations

import contextlib
import io
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ._extras import require

if TYPE_CHECKING:
    from PIL.Image import Image

__all__ = [
    "DEFAULT_MAX_IMAGE_PIXELS",
    "ImageReadError",
    "ImageTooLarge",
    "open_rgb",
    "to_rgb",
]

#: The pixel cap (``width * height``) of :func:`open_rgb`, the default of ``data.max_image_pixels``
DEFAULT_MAX_IMAGE_PIXELS: int = 25_000_000

#: PIL formats never read: EPS is rendered by running Ghostscript on the file
_REFUSED_FORMATS = frozenset({"EPS"})

#: The modes read as 16-bit grey (module docstring)
_SIXTEEN_BIT = ("I;16", "I;16B", "I;16L", "I;16N", "I")

_PIL_LIMIT_LOCK = threading.Lock()

_WHAT = "reading images"


class ImageReadError(ValueError):
    """An image that cannot be read: ``"<name>: <what is wrong>"`` (one line).

    Built from one argument, that is the whole message; a DataLoader worker's report (torch
    rebuilds a worker's error as ``type(error)("Caught ... in DataLoader worker process 0.
    Original Traceback ...")``) is cut back to the error's own line, so a bad image met in a
    worker still ends the command in one line naming the file.
    """

    def __init__(self, name: str, problem: str | None = None) -> None:
        if problem is None:
            name, _, problem = _own_line(name, type(self).__name__).partition(": ")
        self.name = name
        self.problem = problem
        super().__init__(f"{name}: {problem}" if problem else name)

    def __reduce__(self) -> tuple[Any, ...]:
        # pickled whole (multiprocessing): the constructors take parts
        return (_rebuild, (type(self), self.args, self.__dict__))


def _own_line(message: str, kind: str) -> str:
    """The ``<kind>: <message>`` line a traceback ends with, less its prefix; a one-line
    message as it is."""
    lines = message.strip().splitlines()
    for line in reversed(lines):
        head, sep, rest = line.partition(": ")
        if sep and head.rsplit(".", 1)[-1] == kind:
            return rest
    return message


def _rebuild(
    cls: type[ImageReadError], args: tuple[Any, ...], state: dict[str, Any]
) -> ImageReadError:
    err = cls.__new__(cls)
    ValueError.__init__(err, *args)
    err.__dict__.update(state)
    return err


class ImageTooLarge(ImageReadError):
    """An image over the pixel cap, found from its header before any decoding (one argument:
    the whole message, as for :class:`ImageReadError`)."""

    def __init__(
        self,
        name: str,
        *,
        width: int | None = None,
        height: int | None = None,
        max_pixels: int | None = None,
    ) -> None:
        self.width, self.height, self.max_pixels = width, height, max_pixels
        if width is None or height is None or max_pixels is None:
            super().__init__(name)
            return
        super().__init__(
            name,
            f"{width} x {height} = {width * height} pixels, over the cap of {max_pixels} "
            "(data.max_image_pixels); refused before decoding",
        )


def _pil() -> Any:
    return require("PIL.Image", _WHAT)


@contextlib.contextmanager
def _pil_limit_lifted(pil: Any, lift: bool = True) -> Iterator[None]:
    """PIL's decompression-bomb check off (``lift``) while a header is parsed, or an image
    allowed past PIL's limit is decoded: our cap replaces it."""
    if not lift:
        yield
        return
    with _PIL_LIMIT_LOCK:
        previous = pil.MAX_IMAGE_PIXELS
        pil.MAX_IMAGE_PIXELS = None
        try:
            yield
        finally:
            pil.MAX_IMAGE_PIXELS = previous


def _formats(pil: Any) -> list[str]:
    """Every format PIL reads, EPS excluded (all plugins registered first)."""
    pil.init()
    return [f for f in pil.ID if f not in _REFUSED_FORMATS]


def _default_name(source: Any) -> str:
    if isinstance(source, (str, Path)):
        return str(source)
    name = getattr(source, "filename", None) or getattr(source, "name", None)
    return name if isinstance(name, str) and name else "image"


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


def _check_cap(name: str, size: tuple[int, int], max_pixels: int | None) -> None:
    width, height = int(size[0]), int(size[1])
    if max_pixels is not None and width * height > max_pixels:
        raise ImageTooLarge(name, width=width, height=height, max_pixels=max_pixels)


def _check_path(path: Path, name: str) -> None:
    """A missing file, a folder or a device is named before PIL opens it (a FIFO would block)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise ImageReadError(name, "no such file") from None
    except OSError as err:
        raise ImageReadError(name, err.strerror or _first_line(err)) from None
    if stat.S_ISDIR(mode):
        raise ImageReadError(name, "is a folder, not an image file")
    if not stat.S_ISREG(mode):
        raise ImageReadError(name, "not a regular file")


def _decode(stream: Any, name: str, max_pixels: int | None) -> Image:
    """Parse the header of ``stream``, check the cap, then decode (the first frame)."""
    pil = _pil()
    formats = _formats(pil)
    try:
        with _pil_limit_lifted(pil):
            image = pil.open(stream, formats=formats)
    except pil.UnidentifiedImageError:
        raise ImageReadError(name, "not an image PIL can read") from None
    except (MemoryError, KeyboardInterrupt):
        raise
    except Exception as err:  # PIL raises OSError, SyntaxError, struct.error, ... on bad headers
        raise ImageReadError(name, f"not a readable image ({_first_line(err)})") from None
    _check_cap(name, image.size, max_pixels)
    limit = pil.MAX_IMAGE_PIXELS
    # PIL checks again while decoding some formats (TIFF tiles, GIF frames): lifted only when
    # the cap lets through more than PIL would, since the lock then serialises decoding
    beyond_pil = limit is not None and (max_pixels is None or max_pixels > limit)
    try:
        with _pil_limit_lifted(pil, beyond_pil):
            image.load()
    except (MemoryError, KeyboardInterrupt):
        raise
    except Exception as err:  # truncated or corrupt data
        raise ImageReadError(name, f"does not decode ({_first_line(err)})") from None
    return image


def _upright(image: Image) -> Image:
    """The image with its EXIF orientation applied (itself when it has none)."""
    try:
        orientation = image.getexif().get(0x0112, 1)
    except Exception:  # unreadable EXIF: nothing to apply
        return image
    if orientation not in (2, 3, 4, 5, 6, 7, 8):
        return image
    ops = require("PIL.ImageOps", _WHAT)
    return ops.exif_transpose(image)


def _has_transparency(image: Image) -> bool:
    return (
        "A" in image.getbands()
        or "a" in image.getbands()
        or (image.info.get("transparency") is not None)
    )


def _from_grey(grey: np.ndarray) -> Image:
    pil = _pil()
    return pil.fromarray(np.ascontiguousarray(np.repeat(grey[..., None], 3, axis=2)))


def to_rgb(image: Image) -> Image:
    """An RGB image (8 bits per channel) of the same pixels, converted the way the module
    docstring documents for ``image.mode`` (16-bit and 32-bit integer grey, float, alpha and
    transparency over white, palette, CMYK, YCbCr, ...). The image itself when it is already
    RGB without transparency.

    Raises:
        ValueError: A mode PIL cannot convert to RGB (named in the message).
    """
    pil = _pil()
    mode = image.mode
    if mode == "RGB" and image.info.get("transparency") is None:
        return image
    if mode in _SIXTEEN_BIT:
        values = np.asarray(image).astype(np.int64)
        # round(v / 257) with integers: floor((2 v + 257) / 514)
        grey = np.clip((2 * values + 257) // 514, 0, 255).astype(np.uint8)
        key = image.info.get("transparency")
        if isinstance(key, int):  # a tRNS grey level: that value is transparent, so white
            grey[values == key] = 255
        return _from_grey(grey)
    if mode == "F":
        values = np.nan_to_num(np.asarray(image, dtype=np.float64), nan=0.0, posinf=1.0, neginf=0.0)
        return _from_grey(np.clip(np.floor(values * 255.0 + 0.5), 0, 255).astype(np.uint8))
    if _has_transparency(image):
        rgba = image.convert("RGBA")
        white = pil.new("RGBA", image.size, (255, 255, 255, 255))
        return pil.alpha_composite(white, rgba).convert("RGB")
    try:
        return image.convert("RGB")
    except ValueError as err:
        raise ValueError(f"image mode {mode!r} has no RGB reading ({err})") from None


def open_rgb(
    source: str | Path | bytes | bytearray | memoryview | Any,
    *,
    max_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS,
    name: str | None = None,
) -> Image:
    """Read an image as fully loaded 8-bit RGB, upright, refusing one over the pixel cap
    before decoding it (module docstring).

    Args:
        source: A path, the bytes of an image file, a binary file object (read from its
            current position, not closed), or a PIL image (never modified; one opened but not
            decoded yet has its size checked against the cap before it is loaded, one already
            decoded is only converted: its pixels are in memory, and a reader that decoded it
            under a cap of its own, such as the run's ``data.max_image_pixels``, decides).
        max_pixels: The largest ``width * height`` read; None: no cap.
        name: What to call the image in errors, e.g. ``"shard 00003.tar member 000042.jpg"``
            (default: the path, a file object's or PIL image's file name, else ``"image"``).

    Returns:
        A loaded ``RGB`` PIL image holding no open file.

    Raises:
        ImageTooLarge: ``width * height > max_pixels``, from the header.
        ImageReadError: A missing file, a folder or device, not an image, truncated or
            corrupt data, a mode with no RGB reading.
    """
    label = name if name is not None else _default_name(source)
    pil = _pil()
    if isinstance(source, pil.Image):
        if getattr(source, "tile", None):  # opened lazily, not decoded yet: the cap applies
            _check_cap(label, source.size, max_pixels)
        try:
            source.load()
        except Exception as err:  # a lazily opened image whose data is bad
            raise ImageReadError(label, f"does not decode ({_first_line(err)})") from None
        image = source
    elif isinstance(source, (str, Path)):
        path = Path(source)
        _check_path(path, label)
        try:
            with open(path, "rb") as stream:
                image = _decode(stream, label, max_pixels)
        except OSError as err:  # unreadable (permissions) between the check and the read
            raise ImageReadError(label, err.strerror or _first_line(err)) from None
    elif isinstance(source, (bytes, bytearray, memoryview)):
        image = _decode(io.BytesIO(bytes(source)), label, max_pixels)
    elif hasattr(source, "read"):
        image = _decode(source, label, max_pixels)
    else:
        raise TypeError(
            "source must be a path, bytes, a binary file object or a PIL image, got "
            f"{type(source).__name__}"
        )
    try:
        return to_rgb(_upright(image))
    except ValueError as err:
        raise ImageReadError(label, str(err)) from None
