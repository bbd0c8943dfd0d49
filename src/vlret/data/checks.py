"""File reading and feature validation shared by every on-disk format of :mod:`vlret.data`.

Errors name the file and, where one applies, the line of a text file or the row of a feature
array (:class:`DataFormatError`), so that a bad data folder is fixed without a debugger.
"""

from __future__ import annotations

import codecs
import json
import math
import os
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


class DataFormatError(ValueError):
    """A data file that exists but does not hold what its format requires.

    The location also appears in the message: ``"{path}, line {line}: {message}"``,
    ``"{path}, row {row}: ..."``.

    Args:
        path: The file.
        message: What is wrong and what was expected.
        line: The 1-based line of a text file, where it applies.
        row: The 0-based row of a feature array, where it applies.
    """

    def __init__(
        self, path: str | Path, message: str, *, line: int | None = None, row: int | None = None
    ) -> None:
        self.path = Path(path)
        self.line = line
        self.row = row
        where = str(self.path)
        if line is not None:
            where += f", line {line}"
        if row is not None:
            where += f", row {row}"
        super().__init__(f"{where}: {message}")


def require_file(path: Path, what: str) -> Path:
    """Check that a required file exists.

    Args:
        path: The file.
        what: What it should hold, named in the error message.

    Returns:
        ``path``.

    Raises:
        FileNotFoundError: ``path`` is not a file.
    """
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing; expected {what}")
    return path


def read_lines(path: Path, what: str) -> list[str]:
    """The lines of a UTF-8 text file without line endings or a leading byte order mark.

    Blank lines at the end of the file (an editor's final newline, or a few more) add no line;
    a blank line before the last entry is kept, for the caller to refuse with its number.

    Args:
        path: The file.
        what: What it should hold, named in error messages.

    Returns:
        The lines.

    Raises:
        FileNotFoundError: The file is missing.
        DataFormatError: A line is not UTF-8.
    """
    data = require_file(path, what).read_bytes().removeprefix(codecs.BOM_UTF8)
    lines = data.split(b"\n")
    while lines and not lines[-1].strip():
        lines.pop()
    out = []
    for number, raw in enumerate(lines, start=1):
        try:
            out.append(raw.decode("utf-8").rstrip("\r"))
        except UnicodeDecodeError as err:
            raise DataFormatError(
                path, f"not UTF-8 text ({err.reason}); expected {what}", line=number
            ) from None
    return out


def load_feature_array(path: Path, *, mmap: bool = True) -> np.ndarray:
    """Open a float ``(N, D)`` or ``(N, R, D)`` feature array.

    Args:
        path: The ``.npy`` file.
        mmap: Memory-map it (a large training split is never read whole).

    Returns:
        The array (a ``np.memmap`` with ``mmap``).

    Raises:
        FileNotFoundError: The file is missing.
        DataFormatError: Not a readable ``.npy`` array, fewer bytes than its header promises
            (checked before numpy allocates them), an empty or wrongly ranked shape, or a
            non-float dtype.
    """
    require_file(path, "a float32 .npy array of shape (N, D) or (N, regions, D)")
    try:
        header: NpyHeader | None = read_npy_header(path, "float32 features")
    except DataFormatError:
        header = None  # not a .npy file: numpy.load's own message below says what it is
    if header is not None and header.data_bytes < header.expected_bytes:
        # read whole (mmap=False), numpy would first allocate what the header promises
        raise DataFormatError(
            path,
            f"truncated or forged: its header promises shape {header.shape} of {header.dtype} "
            f"({header.expected_bytes} bytes) but {header.data_bytes} bytes follow it; "
            "expected float32 features",
        )
    try:
        arr = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except (ValueError, OSError, EOFError) as err:
        raise DataFormatError(
            path, f"not a readable .npy array ({err}); expected float32 features"
        ) from None
    if not isinstance(arr, np.ndarray):
        raise DataFormatError(path, "holds an .npz archive; expected a single .npy array")
    if arr.ndim not in (2, 3) or 0 in arr.shape:
        expected = "(N, D) vectors or (N, regions, D) features, each size >= 1"
        raise DataFormatError(path, f"has shape {arr.shape}; expected {expected}")
    if not np.issubdtype(arr.dtype, np.floating):
        raise DataFormatError(path, f"has dtype {arr.dtype}; expected float32 features")
    return arr


#: Feature bytes read at once by :func:`find_non_finite` (plus a boolean mask a quarter as big).
SCAN_CHUNK_BYTES = 4 << 20
#: The model config key that must match the last feature dimension.
IN_DIM_KEY = "model.image.in_dim"


def check_in_dim(in_dim: int | None) -> None:
    """Check the model's feature size argument.

    Raises:
        ValueError: ``in_dim`` is neither None nor a positive int.
    """
    if in_dim is not None and (
        not isinstance(in_dim, int) or isinstance(in_dim, bool) or in_dim < 1
    ):
        raise ValueError(f"in_dim must be a positive int or None, got {in_dim!r}")


def check_feature_size(path: Path, shape: tuple[int, ...], in_dim: int | None) -> None:
    """Check that features have the model's size (the config key :data:`IN_DIM_KEY`).

    Args:
        path: The feature file, named in the error.
        shape: The feature array's shape.
        in_dim: The model's feature size; None accepts any.

    Raises:
        ValueError: ``in_dim`` is neither None nor a positive int.
        DataFormatError: The last dimension of ``shape`` is not ``in_dim``.
    """
    check_in_dim(in_dim)
    if in_dim is not None and shape[-1] != in_dim:
        raise DataFormatError(
            path,
            f"has shape {tuple(shape)}: features of size {shape[-1]}, but the model expects "
            f"{IN_DIM_KEY} = {in_dim}; set {IN_DIM_KEY} = {shape[-1]} or use features of "
            f"size {in_dim}",
        )


@dataclass(frozen=True)
class NonFinite:
    """The first non-finite value found in a feature array.

    Attributes:
        row: The row holding it.
        index: Its index inside the row, ``(region, dimension)`` or ``(dimension,)``.
        value: The value (NaN, inf or -inf).
        count: How many of the row's values are not finite.
        row_size: How many values the row holds.
    """

    row: int
    index: tuple[int, ...]
    value: float
    count: int
    row_size: int

    def describe(self, what: str, axis: str) -> str:
        """A message such as ``"{what}, {axis} 2, dimension 5: NaN (3 of its 64 values ...)"``.

        Args:
            what: The row's name, e.g. ``"image 7"``.
            axis: The name of the row's first axis for 3-D features, e.g. ``"region"``.

        Returns:
            The message.
        """
        names = (axis, "dimension")[-len(self.index) :]
        where = ", ".join(f"{name} {i}" for name, i in zip(names, self.index, strict=True))
        found = "NaN" if np.isnan(self.value) else ("inf" if self.value > 0 else "-inf")
        return (
            f"{what}, {where}: {found} ({self.count} of its {self.row_size} values are not "
            "finite); expected finite features (a corrupt or partly written file?)"
        )


def find_non_finite(
    array: np.ndarray,
    *,
    rows: np.ndarray | None = None,
    stop: int | None = None,
    chunk_bytes: int = SCAN_CHUNK_BYTES,
) -> NonFinite | None:
    """Find the first row holding NaN or inf.

    Reads about ``chunk_bytes`` of rows at a time: a memory-mapped array is streamed with file
    reads, so neither the heap nor the mapped pages grow with it.

    Args:
        array: The feature array.
        rows: Ascending row indices to scan; default rows ``0 .. stop``.
        stop: End of the default row range; default every row.
        chunk_bytes: Bytes of rows read at once.

    Returns:
        The first bad value, or None when every scanned row is finite.
    """
    if rows is None:
        rows = np.arange(len(array) if stop is None else min(stop, len(array)))
    step = max(1, chunk_bytes // max(1, array[0].nbytes))
    for start in range(0, len(rows), step):
        numbers = rows[start : start + step]
        chunk = _read_rows(array, numbers)
        if np.isfinite(chunk).all():
            continue
        bad = ~np.isfinite(chunk.reshape(len(chunk), -1))
        r = int(bad.any(axis=1).argmax())
        index = tuple(int(i) for i in np.unravel_index(int(bad[r].argmax()), chunk.shape[1:]))
        return NonFinite(
            row=int(numbers[r]),
            index=index,
            value=float(chunk[r][index]),
            count=int(bad[r].sum()),
            row_size=bad.shape[1],
        )
    return None


def _read_rows(array: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``array[rows]`` (ascending), one read per run of consecutive rows; a C-ordered
    ``np.memmap`` is read from its file instead of through the mapping."""
    runs = np.split(rows, np.flatnonzero(np.diff(rows) != 1) + 1)
    parts = []
    for run in runs:
        start, n = int(run[0]), len(run)
        if isinstance(array, np.memmap) and array.filename and array.flags.c_contiguous:
            offset = array.offset + start * array[0].nbytes
            flat = np.fromfile(array.filename, array.dtype, n * array[0].size, offset=offset)
            parts.append(flat.reshape(n, *array.shape[1:]))
        else:
            parts.append(array[start : start + n])
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def read_json(path: Path, what: str) -> Any:
    """Parse a JSON file.

    Args:
        path: The file.
        what: What it should hold, named in error messages.

    Returns:
        The parsed value.

    Raises:
        FileNotFoundError: The file is missing.
        DataFormatError: Not UTF-8, a syntax error (with its line), a value Python cannot
            hold (an integer of more than 4300 digits), or nesting deeper than the parser's
            recursion limit.
    """
    require_file(path, what)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise DataFormatError(path, f"not UTF-8 ({err.reason}); expected {what}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise DataFormatError(
            path, f"invalid JSON ({err.msg}, column {err.colno}); expected {what}", line=err.lineno
        ) from None
    except ValueError as err:  # e.g. an integer past Python's 4300-digit conversion limit
        raise DataFormatError(path, f"not readable as JSON ({err}); expected {what}") from None
    except RecursionError:  # Python's parser recurses once per level of [ or {
        raise DataFormatError(
            path,
            "JSON nested deeper than Python's parser can read (recursion limit "
            f"{sys.getrecursionlimit()}); expected {what}",
        ) from None


#: The first bytes of every ``.npy`` file (``numpy.lib.format.MAGIC_PREFIX``) and of a zip
#: archive (an ``.npz``: ``numpy.savez`` writes a zip of ``.npy`` members).
NPY_MAGIC = b"\x93NUMPY"
ZIP_MAGIC = b"PK\x03\x04"


@dataclass(frozen=True)
class NpyHeader:
    """What the header of a ``.npy`` file says, read before any of its data.

    Attributes:
        version: The format version, ``(1, 0)``, ``(2, 0)`` or ``(3, 0)``.
        shape: The array's shape.
        fortran_order: Whether the data is stored column-major.
        dtype: The element type (its byte order as stored, e.g. ``>i8``).
        data_bytes: The bytes that follow the header in the file.
    """

    version: tuple[int, int]
    shape: tuple[int, ...]
    fortran_order: bool
    dtype: np.dtype
    data_bytes: int

    @property
    def count(self) -> int:
        """The number of elements the header promises."""
        return math.prod(self.shape)

    @property
    def expected_bytes(self) -> int:
        """The data bytes the header promises (``count * itemsize``)."""
        return self.count * self.dtype.itemsize


def _not_npy(path: Path, start: bytes, what: str) -> DataFormatError:
    """The one line for a file that does not begin with :data:`NPY_MAGIC`."""
    if start.startswith(ZIP_MAGIC):
        try:
            with zipfile.ZipFile(path) as archive:
                names = [n.removesuffix(".npy") for n in archive.namelist()]
        except (OSError, zipfile.BadZipFile, ValueError):
            names = []
        listed = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
        holding = f" holding {listed}" if names else ""
        return DataFormatError(
            path,
            f"is an .npz archive (numpy.savez){holding}, not a .npy file; expected {what}",
        )
    return DataFormatError(
        path,
        f"not a .npy file: it begins with {start[:16]!r}, not numpy's {NPY_MAGIC!r} (a text "
        f"file?); expected {what}",
    )


def read_npy_header(path: Path, what: str) -> NpyHeader:
    """Read the header of a ``.npy`` file without reading (or allocating) its data.

    A forged or truncated header can promise terabytes; checking :class:`NpyHeader` (its shape,
    dtype and :attr:`~NpyHeader.data_bytes`) first keeps ``numpy.load`` from allocating them.
    Uses numpy's own readers (``numpy.lib.format.read_magic``, ``read_array_header_1_0`` /
    ``read_array_header_2_0``).

    Args:
        path: The file.
        what: What it should hold, named in error messages.

    Returns:
        The header.

    Raises:
        FileNotFoundError: The file is missing.
        DataFormatError: Not a ``.npy`` file (an ``.npz`` archive is named as one, with its
            members), an unknown format version or an unreadable header.
    """
    require_file(path, what)
    fmt = np.lib.format
    try:
        with path.open("rb") as fh:
            start = fh.read(len(NPY_MAGIC) + 10)
            if not start.startswith(NPY_MAGIC):
                raise _not_npy(path, start, what)
            fh.seek(0)
            version = fmt.read_magic(fh)
            if version == (1, 0):
                shape, fortran_order, dtype = fmt.read_array_header_1_0(fh)
            elif version in ((2, 0), (3, 0)):
                # 3.0 is 2.0 with a UTF-8 header, which only non-Latin-1 field names of a
                # structured dtype need (refused by the callers' dtype checks anyway)
                shape, fortran_order, dtype = fmt.read_array_header_2_0(fh)
            else:
                raise DataFormatError(
                    path,
                    f".npy format version {version[0]}.{version[1]}, which numpy does not "
                    f"write (1.0, 2.0 or 3.0); expected {what}",
                )
            data_bytes = os.fstat(fh.fileno()).st_size - fh.tell()
    except DataFormatError:
        raise
    except OSError as err:
        raise DataFormatError(path, f"cannot be read ({err.strerror}); expected {what}") from None
    except ValueError as err:  # numpy's header errors: one line of them
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise DataFormatError(
            path, f"not a readable .npy header ({first}); expected {what}"
        ) from None
    major, minor = version
    return NpyHeader((major, minor), tuple(shape), bool(fortran_order), dtype, data_bytes)


__all__ = [
    "IN_DIM_KEY",
    "NPY_MAGIC",
    "SCAN_CHUNK_BYTES",
    "ZIP_MAGIC",
    "DataFormatError",
    "NonFinite",
    "NpyHeader",
    "check_feature_size",
    "check_in_dim",
    "find_non_finite",
    "load_feature_array",
    "read_json",
    "read_lines",
    "read_npy_header",
    "require_file",
]
