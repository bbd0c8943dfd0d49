"""Samples the image-caption readers skip and count: shards (:mod:`vlret.data.shards`) and CSV
pairs (:mod:`vlret.data.csv_pairs`).

A sample whose image does not decode (not an image, truncated, corrupt), is larger than
``data.max_image_pixels`` (:func:`vlret._images.open_rgb` refuses it from the header, before
decoding) or, in a shard, has no image, no caption or a broken tar member, is skipped and
counted, never raised mid-epoch:

* **Training.** Each batch carries ``skipped``, the bad samples met since the previous batch
  of its reader; the trainer adds them up over the ranks (:func:`epoch_skipped`) into the
  epoch record's ``skipped`` and the epoch line, then stops the run
  (:func:`check_bad_fraction`) when more than ``data.max_bad_fraction`` of the epoch's samples
  were bad. A shard sample is read once per epoch; a CSV row whose image is bad is replaced in
  its batch by the next good row of the file and counted once per epoch it is drawn in.
* **Validation.** A dev set (``data.dev_shards``, ``data.dev_csv``) leaves its bad samples out
  when it is read, once per run, counts them in its ``skipped`` (``dev_skipped`` in every
  epoch record and on the epoch line) and is refused when they are more than
  ``data.max_bad_fraction`` of the samples it read (:func:`check_dev_fraction`).
"""

from __future__ import annotations

from typing import Any

import torch


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
    ``skipped``): a shard stream, or a CSV read for training."""
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


__all__ = [
    "BadSample",
    "TooManyBadSamples",
    "bad_fraction_message",
    "check_bad_fraction",
    "check_dev_fraction",
    "counts_skipped",
    "epoch_fraction_message",
    "epoch_skipped",
    "over_fraction",
]
