"""Samples the image-caption readers skip and count: shards (:mod:`vlret.data.formats.shards`), CSV
pairs (:mod:`vlret.data.formats.csv`), and the Karpathy (:mod:`vlret.data.formats.karpathy`) and
person-search (:mod:`vlret.data.formats.pedes`) training splits read from image files.

A sample whose image does not decode (not an image, truncated, corrupt), is larger than
``data.max_image_pixels`` (:func:`vlret._images.open_rgb` refuses it from the header, before
decoding) or, in a shard, has no image, no caption or a broken tar member, is skipped and
counted, never raised mid-epoch:

* **Training.** Each batch carries ``skipped``, the bad samples met since the previous batch
  of its reader; the trainer adds them up over the ranks (:func:`epoch_skipped`) into the
  epoch record's ``skipped`` and the epoch line, then stops the run
  (:func:`check_bad_fraction`) when more than ``data.max_bad_fraction`` of the epoch's samples
  were bad, naming the key of the files (``data.shards``, ``data.csv``, ``data.image_root``).
  A shard sample is read once per epoch. The map-style readers (CSV, Karpathy, person search:
  :class:`SkipsBadImages`) replace an item whose image is bad, whether the model's transform
  or the training augmentation read it, by the next item of the split whose image reads, and
  count it once per epoch it is drawn in: every rank keeps its batch size and a resumed run
  replaces the same items. A split of precomputed features reads no image file and counts
  nothing.
* **Validation.** A dev set (``data.dev_shards``, ``data.dev_csv``) leaves its bad samples out
  when it is read, once per run, counts them in its ``skipped`` (``dev_skipped`` in every
  epoch record and on the epoch line) and is refused when they are more than
  ``data.max_bad_fraction`` of the samples it read (:func:`check_dev_fraction`). A Karpathy or
  person-search dev or test split, and every evaluation, stops at a bad image with the one-line
  :class:`~vlret._images.ImageReadError` naming the file.

A shard that cannot be read at all or to its end (a ``pipe:`` command that fails, an HTTP error,
a server out of reach, a file gone: :mod:`vlret.data.formats.shard_urls`) holds no bad samples:
it stops the run in one line.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from .._images import ImageReadError
from .checks import DataFormatError
from .dataset import RetrievalBatch, RetrievalDataset, RetrievalItem


class BadSample(ValueError):
    """A sample that is skipped and counted (its reason in the message)."""


class TooManyBadSamples(ValueError):
    """More than ``data.max_bad_fraction`` of a split's samples were bad."""


def over_fraction(bad: int, used: int, max_bad_fraction: float) -> bool:
    """Whether ``bad`` bad samples beside ``used`` good ones are more than the fraction."""
    return bad > 0 and bad / (bad + used) > max_bad_fraction


def bad_fraction_message(
    bad: int,
    *,
    used: int,
    key: str,
    max_bad_fraction: float,
    where: str,
    causes: str,
) -> str:
    """The line a split with too many bad samples is refused with: ``KEY: 30 bad samples
    against 100 used WHERE: more than data.max_bad_fraction = 0.01 ... (CAUSES)``."""
    samples = "bad sample" if bad == 1 else "bad samples"
    return (
        f"{key}: {bad} {samples} against {used} used {where}: more than "
        f"data.max_bad_fraction = {max_bad_fraction:g} of the samples ({causes})"
    )


def counts_skipped(source: Any) -> bool:
    """Whether the training set ``source`` skips and counts bad samples (its batches carry
    ``skipped``): a shard stream, or a :class:`SkipsBadImages` split read for training."""
    return bool(getattr(source, "counts_skipped", False))


def epoch_skipped(source: Any, count: int, *, device: Any = "cpu") -> int | None:
    """The bad samples of an epoch over every rank (``count``: this rank's; summed with an
    all-reduce under torch.distributed), or None when the training set ``source`` does not
    skip bad samples (:func:`counts_skipped`; every rank must call it)."""
    if not counts_skipped(source):
        return None
    total = torch.tensor([count], dtype=torch.long, device=device)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(total)
    return int(total.item())


def check_bad_fraction(skipped: int | None, source: Any, *, used: int | None = None) -> None:
    """Stop a run whose epoch had more than ``max_bad_fraction`` bad samples.

    Args:
        skipped: The epoch's bad samples over every rank (None: not counted, nothing to do).
        source: The training set (its ``max_bad_fraction``, ``epoch``, ``bad_key`` and
            ``bad_causes``; a shard stream also its steps and batch).
        used: The samples the epoch trained on (default: a shard stream's ``num_batches() x
            batch_size``).

    Raises:
        TooManyBadSamples: ``skipped / (skipped + used) > max_bad_fraction``.
    """
    if skipped is None or not counts_skipped(source):
        return
    if used is None:
        used = source.num_batches() * source.batch_size
    if over_fraction(skipped, used, source.max_bad_fraction):
        raise TooManyBadSamples(epoch_fraction_message(skipped, source, used=used))


def epoch_fraction_message(bad: int, source: Any, *, used: int, who: str = "") -> str:
    """:func:`bad_fraction_message` of a training epoch of ``source`` (``who``: a reader
    that stopped by itself, e.g. `` (worker 1 of rank 0 alone)``)."""
    return bad_fraction_message(
        bad,
        used=used,
        key=source.bad_key,
        max_bad_fraction=source.max_bad_fraction,
        where=f"in epoch {source.epoch}{who}",
        causes=source.bad_causes,
    )


def check_dev_fraction(
    bad: int, kept: int, *, key: str, max_bad_fraction: float, causes: str
) -> None:
    """Refuse a dev set that left out more than ``max_bad_fraction`` of the samples it read.

    Raises:
        TooManyBadSamples: ``bad / (bad + kept) > max_bad_fraction`` (naming ``key``).
    """
    if over_fraction(bad, kept, max_bad_fraction):
        raise TooManyBadSamples(
            bad_fraction_message(
                bad,
                used=kept,
                key=key,
                max_bad_fraction=max_bad_fraction,
                where="in the dev set",
                causes=causes,
            )
        )


#: What makes an image file bad, in the messages of the map-style readers.
BAD_IMAGE_CAUSES = (
    "image files that are not images, corrupt, unreadable or over data.max_image_pixels"
)


class _Replacement(RetrievalItem):
    """The item served in place of one whose image could not be read (counted by
    :meth:`SkipsBadImages.collate`)."""


class SkipsBadImages(RetrievalDataset):
    """A split read from image files that, for training, skips and counts its bad images.

    Off until :meth:`skip_bad_images` (the training split only): reading a bad image then
    raises the one-line :class:`~vlret._images.ImageReadError` naming the file. On, item
    ``index`` whose image raises it (through the model's transform or the training
    augmentation) is replaced by the next item after it, wrapping round, whose image reads, and
    :meth:`collate` counts the replaced items in the batch's ``skipped`` (module docstring).
    Missing image files are refused before training (:meth:`check_features`).

    Subclasses name the file listing the images (:attr:`bad_listing`, named when none reads)
    and say whether they read image files at all (:attr:`reads_image_files`).
    """

    bad_causes = BAD_IMAGE_CAUSES
    #: Whether bad images are skipped and counted (:meth:`skip_bad_images`).
    counts_skipped: bool = False
    #: ``data.max_bad_fraction``: the epoch's share of bad items that stops a run.
    max_bad_fraction: float = 0.01
    #: The config key of the image files, named when the run is stopped.
    bad_key: str = "data.image_root"

    @property
    def reads_image_files(self) -> bool:
        """Whether items are read from image files (not precomputed features)."""
        return True

    @property
    def bad_listing(self) -> Path:
        """The file that lists the split's images (a CSV, a JSON)."""
        raise NotImplementedError

    def skip_bad_images(self, *, key: str, max_bad_fraction: float) -> bool:
        """Skip and count bad images from now on (training); returns whether skipping is on:
        a split that reads no image file (:attr:`reads_image_files`) stays as it is.

        Args:
            key: The config key of the image files (``data.csv``, ``data.image_root``).
            max_bad_fraction: ``data.max_bad_fraction`` (:func:`check_bad_fraction`).
        """
        if not self.reads_image_files:
            return False
        self.counts_skipped, self.bad_key = True, key
        self.max_bad_fraction = max_bad_fraction
        self._bad_images: set[int] = set()  # this process's images known not to read
        return True

    def __getitem__(self, index: int) -> RetrievalItem:
        if not self.counts_skipped:
            return super().__getitem__(index)
        try:
            return self._readable(index)
        except ImageReadError:
            return self._replacement(index)

    def _readable(self, index: int) -> RetrievalItem:
        img = int(self.txt_to_img[index % len(self)])
        if img in self._bad_images:
            raise ImageReadError(str(self.image_ids[img]), "known not to read")
        try:
            return super().__getitem__(index)
        except ImageReadError:
            self._bad_images.add(img)
            raise

    def _replacement(self, index: int) -> RetrievalItem:
        """The next item after ``index`` (wrapping round) whose image reads."""
        n = len(self)
        for step in range(1, n):
            try:
                return _Replacement(*self._readable((index + step) % n))
            except ImageReadError:
                continue
        raise DataFormatError(
            self.bad_listing,
            f"none of the {self.num_images} images it lists for training can be read "
            f"({self.bad_causes}); {self.bad_key} has no usable image",
        )

    def collate(self, items: Sequence[RetrievalItem]) -> RetrievalBatch:
        """``collate_fn`` of the training DataLoader: the batch, with ``skipped`` the items
        whose image was replaced (while skipping is on)."""
        batch = super().collate(items)
        if self.counts_skipped:
            batch.skipped = sum(isinstance(it, _Replacement) for it in items)  # type: ignore[attr-defined]
        return batch


__all__ = [
    "BAD_IMAGE_CAUSES",
    "BadSample",
    "SkipsBadImages",
    "TooManyBadSamples",
    "bad_fraction_message",
    "check_bad_fraction",
    "check_dev_fraction",
    "counts_skipped",
    "epoch_fraction_message",
    "epoch_skipped",
    "over_fraction",
]
