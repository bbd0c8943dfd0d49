"""Noisy correspondence on a training split: the released noise-index files, their generation,
and the record of which pairs were corrupted.

The noisy-correspondence benchmarks (NCR, NeurIPS 2021, and its successors) re-pair a fraction
of the precomputed training captions with other images and publish the re-pairing as a ``.npy``
index. Two layouts are released, told apart by their length:

* ``ncr``, one entry per training caption (145,000 F30K, 566,435 COCO): entry ``k`` is the
  image caption ``k`` is paired with; clean iff it is the caption's own image
  (``k // captions_per_image`` in a precomp folder);
* ``decl``, one entry per training image (29,000 F30K): entry ``k`` is the image used in place
  of image ``k``, so all of image ``k``'s captions are paired with image ``entry[k]``; clean
  iff ``entry[k] == k``.

NCR's files move single captions (``f30k_precomp_0.2.npy``), DECL's move whole images with all
their captions (``noise_inx_0.2.npy``): the two papers' "20% noise" are different corruptions
(``docs/noisy_correspondence.md``). With one caption per image both lengths agree and
``noise_format`` (``"ncr"`` or ``"decl"``) must say which layout a file has.

:func:`generate_noise_index` draws an index the way each released loader does, from a
``numpy.random.RandomState(seed)`` and the same calls in the same order:

* ``ncr`` (``XLearning-SCU/2021-NeurIPS-NCR``, ``data.py``): shuffle the caption positions, take
  the first ``m = floor(ratio * captions)``, and shuffle the images of those ``m`` captions
  among them;
* ``decl`` (``QinYang79/DECL``, ``data.py``): shuffle the image positions, take the first
  ``m = floor(ratio * images)``, and shuffle those images among themselves.

``m`` is the floor of the ratio as written in decimal times the count (NCR and DECL compute
``int(ratio * n)`` in floating point, which agrees at every released setting but gives 28 for
0.29 x 100). The ``m`` chosen items are exactly ``floor(ratio * n)``; an item that the shuffle
returns to its own image stays clean, so the corrupted count can be a few below ``m`` (at F30K
0.2 the expected shortfall is about two captions of 29,000). The record (:func:`noise_summary`)
gives both numbers.

:func:`apply_noise_index` re-pairs a :class:`~vlret.data.dataset.RetrievalDataset` in place; the
trainer applies it to the training split only (:func:`vlret.run.builders.build_train_dataset`),
so validation, the test splits and ``vlret eval`` always see the clean pairs. A noisy training
set carries, per caption (the contract of the noise-aware procedures, e.g. NCR's clean / noisy
split):

* ``txt_to_img``: the image each caption is trained with (the noisy pairing);
* ``original_txt_to_img``: its clean image, ``(captions,)`` long;
* ``corrupted``: ``txt_to_img != original_txt_to_img``, ``(captions,)`` bool;
* ``noise``: the applied :class:`NoiseIndex` (None for a clean set).

:func:`save_noise_record` writes ``noise_index.npy`` (the applied index in its released layout,
reusable as ``data.noise_index``) and ``noise.json`` (:func:`noise_summary`) into a run folder.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .._files import atomic_write, atomic_write_text
from .checks import DataFormatError, read_npy_header
from .dataset import RetrievalDataset

#: Values of ``data.noise_format``: ``auto`` reads a file's layout from its length and
#: generates NCR's.
NOISE_FORMATS = ("auto", "ncr", "decl")
#: The run-folder files of :func:`save_noise_record`.
NOISE_INDEX_FILE = "noise_index.npy"
NOISE_SUMMARY_FILE = "noise.json"
#: Largest ``noise_seed`` (``numpy.random.RandomState`` takes seeds in ``[0, 2**32 - 1]``).
MAX_NOISE_SEED = 2**32 - 1

#: What a noise-index file is, in error messages.
_WHAT_FILE = "the data.noise_index .npy file (numpy.save of a 1-D integer array)"

_WHAT = {
    "ncr": "NCR: one image per training caption",
    "decl": "DECL: one image per training image",
}


@dataclass(frozen=True)
class NoiseIndex:
    """A noise index in its released layout (see the module docstring).

    Attributes:
        format: ``"ncr"`` (one entry per caption) or ``"decl"`` (one entry per image).
        index: The entries, int64, 1-D.
        source: The file it was read from; None for a generated index.
        ratio: The ratio it was generated with; None for a file.
        seed: The seed it was generated with; None for a file.
    """

    format: str
    index: np.ndarray
    source: str | None = None
    ratio: float | None = None
    seed: int | None = None

    def pairing(self, original: torch.Tensor) -> torch.Tensor:
        """The image each caption is paired with under this index.

        Args:
            original: The clean image of each caption, ``(captions,)`` long.

        Returns:
            ``(captions,)`` long: ``index`` itself (``ncr``) or ``index[original]`` (``decl``).
        """
        index = torch.from_numpy(np.asarray(self.index, dtype=np.int64))
        if self.format == "ncr":
            return index.clone()
        return index[original.long()]


def _checked_format(noise_format: str) -> str:
    if noise_format not in NOISE_FORMATS:
        raise ValueError(f"noise_format must be one of {NOISE_FORMATS}, got {noise_format!r}")
    return noise_format


def _layout(
    path: Path, length: int, *, num_captions: int, num_images: int, noise_format: str
) -> str:
    """``ncr`` or ``decl`` from a file's length (and ``noise_format`` where both agree)."""
    expected = f"{num_captions} ({_WHAT['ncr']}) or {num_images} ({_WHAT['decl']})"
    if noise_format != "auto":
        want = num_captions if noise_format == "ncr" else num_images
        if length != want:
            raise DataFormatError(
                path,
                f"data.noise_index has {length} entries; data.noise_format {noise_format!r} "
                f"expects {want} ({_WHAT[noise_format]}); the lengths of the training split "
                f"are {expected}",
            )
        return noise_format
    if num_captions == num_images == length:
        raise DataFormatError(
            path,
            f"data.noise_index has {length} entries, which is both the number of training "
            'captions and of images (one caption per image): set data.noise_format = "ncr" '
            '(one image per caption) or "decl" (one image per image)',
        )
    if length == num_captions:
        return "ncr"
    if length == num_images:
        return "decl"
    raise DataFormatError(path, f"data.noise_index has {length} entries; expected {expected}")


def read_noise_index(
    path: str | Path, *, num_captions: int, num_images: int, noise_format: str = "auto"
) -> NoiseIndex:
    """Read and check a released noise-index ``.npy`` for a training split of that size.

    Every file ``numpy.save`` writes is read as ``numpy.load`` reads it: format versions 1.0,
    2.0 and 3.0, either byte order (entries come back native int64), C or Fortran order. The
    header is checked (shape, dtype, the bytes that follow it, the length against the split)
    before the entries are read, so a header promising more than the file or the split holds
    allocates nothing.

    Args:
        path: The ``.npy`` file (``data.noise_index``).
        num_captions: Captions of the training split.
        num_images: Images of the training split.
        noise_format: ``auto`` (the layout from the length), ``ncr`` or ``decl``.

    Returns:
        The index, int64.

    Raises:
        FileNotFoundError: ``path`` is not a file.
        DataFormatError: Not a ``.npy`` file (a text file, or an ``.npz`` archive: named as
            one, with its members), not 1-D, not integers, fewer bytes than its header promises,
            a length that matches neither layout (both expected lengths named), or an entry
            outside ``[0, num_images)`` (its position and value named).
        ValueError: An unknown ``noise_format``.
    """
    _checked_format(noise_format)
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing; expected the data.noise_index .npy file")
    # the header first: its shape and dtype are checked against the file's size and the split
    # before numpy allocates what it promises (a forged header can claim terabytes)
    header = read_npy_header(path, _WHAT_FILE)
    if len(header.shape) != 1:
        raise DataFormatError(
            path,
            f"data.noise_index must be a 1-D array of image indices, got shape {header.shape}",
        )
    if header.dtype.kind not in "iu":
        raise DataFormatError(
            path,
            f"data.noise_index must hold integers (image indices), got dtype {header.dtype}",
        )
    if header.data_bytes < header.expected_bytes:
        raise DataFormatError(
            path,
            f"truncated or forged: its header promises {header.count} entries of "
            f"{header.dtype} ({header.expected_bytes} bytes) but {header.data_bytes} bytes "
            "follow it",
        )
    layout = _layout(
        path,
        header.count,
        num_captions=num_captions,
        num_images=num_images,
        noise_format=noise_format,
    )
    try:
        array = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise DataFormatError(path, f"not a .npy array (data.noise_index): {first}") from None
    bad = np.flatnonzero((array < 0) | (array >= num_images))
    if bad.size:
        k = int(bad[0])
        raise DataFormatError(
            path,
            f"data.noise_index entry {k} is {int(array[k])}; expected an image index in "
            f"[0, {num_images}) ({bad.size} entries out of range)",
        )
    return NoiseIndex(layout, array.astype(np.int64), source=str(path))


def noise_count(ratio: float, n: int) -> int:
    """``floor(ratio * n)`` with ``ratio`` read as the decimal it is written as (0.29 x 100 =
    29, where ``int(0.29 * 100)`` is 28).

    Args:
        ratio: The fraction, in ``[0, 1]``.
        n: The count it is a fraction of.

    Returns:
        The number of items to re-pair.
    """
    if isinstance(ratio, bool) or not 0.0 <= float(ratio) <= 1.0:
        raise ValueError(f"noise ratio must be in [0, 1], got {ratio!r}")
    return math.floor(Fraction(repr(float(ratio))) * n)


def generate_noise_index(
    original: torch.Tensor | np.ndarray,
    num_images: int,
    *,
    ratio: float,
    seed: int,
    noise_format: str = "ncr",
) -> NoiseIndex:
    """Draw a noise index the way NCR's or DECL's released loader does (module docstring).

    Deterministic given ``(original, num_images, ratio, seed, noise_format)``.

    Args:
        original: The clean image of each training caption, ``(captions,)``.
        num_images: Images of the training split.
        ratio: Fraction of the captions (``ncr``) or images (``decl``) re-drawn, in ``[0, 1]``.
        seed: The seed of ``numpy.random.RandomState``, in ``[0, 2**32 - 1]``.
        noise_format: ``ncr`` (also for ``auto``) or ``decl``.

    Returns:
        The index in that format's released layout.
    """
    layout = "ncr" if _checked_format(noise_format) == "auto" else noise_format
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_NOISE_SEED:
        raise ValueError(f"noise seed must be an int in [0, {MAX_NOISE_SEED}], got {seed!r}")
    rng = np.random.RandomState(seed)
    clean = np.asarray(original, dtype=np.int64)
    n = len(clean) if layout == "ncr" else num_images
    m = noise_count(ratio, n)
    order = np.arange(n)
    rng.shuffle(order)
    chosen = order[:m]
    index = clean.copy() if layout == "ncr" else np.arange(num_images, dtype=np.int64)
    moved = index[chosen].copy()
    rng.shuffle(moved)
    index[chosen] = moved
    return NoiseIndex(layout, index, ratio=float(ratio), seed=seed)


def configured_noise(
    dataset: RetrievalDataset,
    *,
    index: str | Path | None = None,
    noise_format: str = "auto",
    ratio: float = 0.0,
    seed: int = 0,
) -> NoiseIndex | None:
    """The noise index a run's data settings ask for on its training split ``dataset``.

    Args:
        dataset: The clean training split.
        index: ``data.noise_index``: a released file (:func:`read_noise_index`).
        noise_format: ``data.noise_format``.
        ratio: ``data.noise_ratio``: with no file, generate an index (0: clean).
        seed: ``data.noise_seed``.

    Returns:
        The index, or None for clean training.
    """
    original = torch.as_tensor(dataset.txt_to_img, dtype=torch.long)
    if index is not None:
        return read_noise_index(
            index,
            num_captions=len(original),
            num_images=dataset.num_images,
            noise_format=noise_format,
        )
    if ratio > 0:
        return generate_noise_index(
            original, dataset.num_images, ratio=ratio, seed=seed, noise_format=noise_format
        )
    return None


def apply_noise_index(dataset: RetrievalDataset, noise: NoiseIndex | None) -> RetrievalDataset:
    """Re-pair ``dataset``'s captions with ``noise`` in place and record what moved.

    Sets ``txt_to_img`` (the training pairing), ``original_txt_to_img`` (the clean one),
    ``corrupted`` (where they differ) and ``noise``; with ``noise`` None the pairing stays clean
    and ``corrupted`` is all False. Applying twice re-pairs from the original, not the noisy
    pairing.

    Args:
        dataset: A training split (one image per caption: ``txt_to_img``).
        noise: The index, or None.

    Returns:
        ``dataset``.

    Raises:
        ValueError: The index does not fit the dataset's size.
    """
    original = getattr(dataset, "original_txt_to_img", None)
    if original is None:
        original = torch.as_tensor(dataset.txt_to_img, dtype=torch.long).clone()
    pairing = original.clone()
    if noise is not None:
        want = len(original) if noise.format == "ncr" else dataset.num_images
        if len(noise.index) != want:
            raise ValueError(
                f"a {noise.format} noise index of {len(noise.index)} entries does not fit "
                f"{len(original)} captions of {dataset.num_images} images (expected {want})"
            )
        pairing = noise.pairing(original)
    dataset.original_txt_to_img = original  # type: ignore[attr-defined]
    dataset.txt_to_img = pairing
    dataset.corrupted = pairing != original  # type: ignore[attr-defined]
    dataset.noise = noise  # type: ignore[attr-defined]
    return dataset


def noise_summary(dataset: RetrievalDataset) -> dict[str, Any]:
    """The ``noise.json`` record of a dataset re-paired by :func:`apply_noise_index`.

    Keys: ``format``, ``ratio`` and ``seed`` (generated; None for a file), ``source`` (the file;
    None when generated), ``captions``, ``images``, ``selected`` (generated: the
    ``floor(ratio * n)`` captions or images re-drawn), ``corrupted_captions``,
    ``corrupted_fraction`` (of the captions) and ``corrupted_images`` (``decl``: images whose
    captions moved; ``ncr``: images with at least one caption moved away).

    Args:
        dataset: The re-paired dataset.

    Returns:
        The record (JSON-ready).
    """
    noise: NoiseIndex | None = getattr(dataset, "noise", None)
    if noise is None:
        raise ValueError("the dataset carries no noise index (apply_noise_index first)")
    corrupted: torch.Tensor = dataset.corrupted  # type: ignore[attr-defined]
    original: torch.Tensor = dataset.original_txt_to_img  # type: ignore[attr-defined]
    n = len(corrupted)
    count = int(corrupted.sum())
    selected = None
    if noise.ratio is not None:
        selected = noise_count(noise.ratio, n if noise.format == "ncr" else dataset.num_images)
    return {
        "format": noise.format,
        "ratio": noise.ratio,
        "seed": noise.seed,
        "source": noise.source,
        "captions": n,
        "images": dataset.num_images,
        "selected": selected,
        "corrupted_captions": count,
        "corrupted_fraction": count / n if n else 0.0,
        "corrupted_images": int(torch.unique(original[corrupted]).numel()),
    }


def save_noise_record(dataset: Any, folder: str | Path) -> list[Path]:
    """Write ``noise_index.npy`` and ``noise.json`` into a run folder when ``dataset`` was
    re-paired with a noise index; nothing for clean training (or a dataset without the record,
    e.g. a webdataset stream).

    Args:
        dataset: The training set.
        folder: The run folder.

    Returns:
        The files written.
    """
    noise: NoiseIndex | None = getattr(dataset, "noise", None)
    if noise is None:
        return []
    folder = Path(folder)
    index = np.asarray(noise.index, dtype=np.int64)
    text = json.dumps(noise_summary(dataset), indent=2) + "\n"
    return [
        atomic_write(folder / NOISE_INDEX_FILE, lambda fh: np.save(fh, index)),
        atomic_write_text(folder / NOISE_SUMMARY_FILE, text),
    ]


__all__ = [
    "MAX_NOISE_SEED",
    "NOISE_FORMATS",
    "NOISE_INDEX_FILE",
    "NOISE_SUMMARY_FILE",
    "NoiseIndex",
    "apply_noise_index",
    "configured_noise",
    "generate_noise_index",
    "noise_count",
    "noise_summary",
    "read_noise_index",
    "save_noise_record",
]
