"""Web-scale image-caption shards (img2dataset / webdataset tar files), streamed.

A shard is a tar file of samples ``KEY.jpg|png|jpeg|webp``, ``KEY.txt`` (the caption) and
optionally ``KEY.json``; img2dataset names keys with 9 digits (shard id x 10^4 + index). The tar
members are read and grouped into samples by the ``webdataset`` package (the ``pixels`` extra;
a key is the file name up to its first dot, extensions lower-cased); the image is the first of
``jpg``, ``png``, ``jpeg``, ``webp`` (open_clip's choice), the caption ``txt``.

``data.shards`` is a brace pattern (``"cc3m/{00000..00331}.tar"``) or a list of paths and
patterns; relative ones start from the current folder, as every path does
(:mod:`vlret.data.paths`), not from ``data.root``. A shard may also be one of webdataset's URLs:
``pipe:COMMAND`` (``"pipe:aws s3 cp s3://bucket/cc3m/{00000..01000}.tar -"``), ``http(s)://``
or ``file:`` (:mod:`vlret.data.formats.shard_urls`: what is checked before a run, and a shard
that cannot be read stopping it in one line). No file gives the dataset's size, so
``data.train_num_samples`` sets the epoch: ``train_num_samples // train.batch_size`` global
batches (capped by ``train.max_steps_per_epoch``).

**The order of an epoch** (:class:`ShardStream`), a function of the run seed, the epoch, the
number of ranks and of DataLoader workers only:

1. the shard list is shuffled with ``(seed, epoch)`` (the same permutation on every rank);
2. rank ``r`` of ``R`` takes shards ``r, r + R, ...``, then its worker ``w`` of ``W`` takes
   every ``W``-th of those (webdataset's ``split_by_node`` then ``split_by_worker``, with the
   rank passed explicitly); fewer shards than ``R x W`` readers is refused unless
   ``data.resampled``, which instead draws each worker's shards with replacement from the
   whole list with ``(seed, epoch, rank, worker)``;
3. the samples pass through a shuffle buffer of ``data.shuffle_buffer`` samples (webdataset's
   ``shuffle``, filled completely before the first draw) seeded with ``(seed, epoch, rank,
   worker)``;
4. worker ``w`` serves the global batches ``w, w + W, ...``, in the DataLoader's round-robin
   order. A worker whose shards run out reads them again (a new pass, reshuffled with the
   pass number; the buffer drains at each pass's end), so every rank runs the epoch's steps.

Sample ``j`` of global batch ``b`` on rank ``r`` gets the id ``b x batch_size + r x
local_batch + j`` (its ``img_index`` and ``cap_index``: unique within the epoch, so each sample
is the positive of its own caption only) and, with augmentation, the key ``(seed, epoch,
id)`` (:mod:`vlret.data.transforms`).

**Exact resume.** A run resumed at batch ``k`` of an epoch rebuilds the same stream and skips
its first ``k`` batches: read and decoded (a bad sample is found the same way, and not counted
again), neither augmented nor handed over; so it trains on exactly the uninterrupted run's
samples, order and crops, re-reading the epoch's first ``k`` batches (same ranks and workers).

**Bad samples** (:mod:`vlret.data.bad_samples`, shared with the CSV reader). A corrupt image,
an image over ``data.max_image_pixels`` (refused from its header, before decoding), a missing or
empty caption, a sample without an image or a broken tar member (webdataset's handler for the
tar reading) is skipped and counted, never raised and never slept on (webdataset's own
``warn_and_continue`` sleeps 0.5 s per error). Each batch carries ``skipped``: the bad samples
its worker met since its previous batch; the trainer adds them up (over ranks) into the epoch
record's ``skipped`` and stops the run when more than ``data.max_bad_fraction`` of the epoch's
samples were bad. A worker stops by itself (one line, through the trainer) once its own count
proves the fraction exceeded, or when a whole pass over its shards held no sample at all, so a
broken data set never stalls the loop. The dev set (``data.dev_shards``) counts the samples it
leaves out in ``skipped`` (``dev_skipped`` in the epoch record and line) and is refused past
``data.max_bad_fraction`` (:class:`ShardDevSet`).

**Patterns.** ``data.shards`` (and ``data.dev_shards``) is webdataset's (and open_clip's
``--train-data``) syntax: brace ranges and alternatives (``{00000..00331}``, ``{a,b}``), several
patterns joined with ``::``. A comma outside braces is no list separator (a TOML list is): a
missing file whose name holds one is reported so, and so are unbalanced braces, a folder and
anything else that is not a tar file, each naming the key.
"""

from __future__ import annotations

import io
import itertools
import random
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from ..._extras import require
from ..._images import DEFAULT_MAX_IMAGE_PIXELS, ImageReadError, open_rgb
from ..bad_samples import BadSample, check_dev_fraction, epoch_fraction_message
from ..checks import DataFormatError
from ..dataset import RetrievalBatch, RetrievalDataset, collate_retrieval
from ..paths import relative_path_hint
from .shard_urls import (
    ShardReadError,
    check_url,
    expand_pattern,
    is_url,
    not_a_shard,
    read_shards,
    shown_url,
)

#: The image members a sample is read from, in order of preference (open_clip's).
IMAGE_EXTENSIONS = ("jpg", "png", "jpeg", "webp")


class ShardError(ValueError):
    """Shards that cannot feed a run: too many bad or no readable samples, too few shards."""


class ShardFailure:
    """What a worker hands over instead of a batch when the run must stop (an exception would
    reach the trainer wrapped in a traceback); :class:`ShardLoader` raises it in one line."""

    def __init__(self, message: str) -> None:
        self.message = message


class _Skipped:
    """A batch of a resumed epoch that was trained before the checkpoint."""


_SKIPPED = _Skipped()


def _wds(what: str = "reading webdataset shards") -> Any:
    return require("webdataset", what)


def expand_shards(
    spec: str | Sequence[str],
    *,
    root: str | Path = ".",
    key: str = "data.shards",
    data_root: str | Path | None = None,
) -> list[str]:
    """The shards of a brace pattern or a list of paths / patterns, in the given order.

    Args:
        spec: ``"cc3m/{00000..00331}.tar"``, several such patterns joined with ``::``
            (open_clip's ``--train-data``), or a list of them; a pattern may be a URL
            (``pipe:``, ``http(s)://``, ``file:``; :mod:`vlret.data.formats.shard_urls`).
        root: The folder relative paths start from: the current folder, as for every config
            key (:mod:`vlret.data.paths`); a caller of the library may give another.
        key: The config key named in errors.
        data_root: The config's ``data.root``: a missing shard found under it is reported
            with the fix (:func:`vlret.data.paths.relative_path_hint`), never read from there.

    Returns:
        The files as strings (a ``file:`` URL as its path), the other URLs as written.

    Raises:
        ValueError: The spec is empty, a pattern's braces are unbalanced, a ``${NAME}``'s
            variable is not set, or a URL's scheme or form is refused (checked without running
            a command or sending a request: :func:`~vlret.data.formats.shard_urls.check_url`).
        FileNotFoundError: A listed shard is missing, a folder or not a regular file (naming
            it, its pattern and, for a name holding a comma, how to list several).
    """
    specs = [spec] if isinstance(spec, str) else list(spec)
    out: list[str] = []
    for pattern in specs:
        for name in expand_pattern(pattern, key=key):
            if is_url(name):
                local = check_url(name, key=key, pattern=pattern)
                if local is None:
                    out.append(name)
                    continue
                name = local
            path = Path(name) if Path(name).is_absolute() else Path(root) / name
            if not path.is_file():
                hint = relative_path_hint(path, data_root=data_root, pattern=pattern)
                raise FileNotFoundError(not_a_shard(path, name, pattern, key) + hint)
            out.append(str(path))
    if not out:
        raise ValueError(f"{key}: {spec!r} names no shard")
    return out


def decode_sample(
    sample: dict[str, Any], *, max_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS
) -> tuple[Any, str]:
    """The RGB PIL image (:func:`vlret._images.open_rgb`) and the caption of a webdataset
    sample.

    Args:
        sample: webdataset's dict of the sample's members (``__key__``, ``__url__``, ...).
        max_pixels: The pixel cap (``data.max_image_pixels``), checked before decoding.

    Raises:
        BadSample: No image member, an image that does not decode or is over the cap, no or
            an empty caption.
    """
    ext = next((e for e in IMAGE_EXTENSIONS if e in sample), None)
    key = sample.get("__key__")
    if ext is None:
        raise BadSample(f"sample {key}: no image ({'/'.join(IMAGE_EXTENSIONS)})")
    text = sample.get("txt")
    try:
        caption = text.decode("utf-8").strip() if isinstance(text, bytes) else ""
    except UnicodeDecodeError:
        raise BadSample(f"sample {key}: caption is not UTF-8") from None
    if not caption:
        raise BadSample(f"sample {key}: {'empty' if text is not None else 'no'} caption")
    shard = Path(str(sample.get("__url__", "shard"))).name
    try:
        image = open_rgb(sample[ext], max_pixels=max_pixels, name=f"{shard} member {key}.{ext}")
    except ImageReadError as err:
        raise BadSample(str(err)) from None
    return image, caption


class _Counter:
    """The webdataset exception handler of one worker: counts and continues."""

    def __init__(self) -> None:
        self.bad = self.good = self.raw = 0
        self.raw_before = self.good_before = 0  # at the start of the current pass

    def __call__(self, exn: BaseException) -> bool:
        self.bad += 1
        return True


class ShardStream(IterableDataset):
    """One rank's training batches from shards (the module docstring gives the order).

    Also what the trainer asks its sampler for: :meth:`set_epoch` and :meth:`num_batches`;
    its batches carry ``skipped`` (:mod:`vlret.data.bad_samples`).

    Args:
        shards: The shards, files and URLs (:func:`expand_shards`).
        num_samples: ``data.train_num_samples``.
        batch_size: The global batch.
        seed: The run seed.
        rank: This process's rank.
        world_size: The number of ranks.
        num_workers: DataLoader workers per rank (0: read in the main process).
        shuffle_buffer: Samples in the shuffle buffer (0 or 1: no shuffling within shards).
        resampled: Draw shards with replacement.
        max_bad_fraction: The fraction of bad samples that stops a run.
        max_batches: Cap on the batches of an epoch.
        max_image_pixels: The pixel cap (``data.max_image_pixels``; None: none): a larger
            image is a bad sample.
        image_transform: Maps a PIL image to the model's input (the evaluation transform).
        augment: Training augmentation used instead (``augment(image, key=...)``).
        encoder: Turns captions into token ids (None: texts).

    Raises:
        ShardError: Fewer shards than readers (without ``resampled``), or fewer samples
            than one batch.
        ValueError: A batch that does not divide over the ranks.
    """

    #: Its batches carry ``skipped``; the key and the causes a bad-fraction stop names.
    counts_skipped = True
    bad_key = "data.shards"
    bad_causes = "corrupt or oversized images, empty captions or broken tar members"

    def __init__(
        self,
        shards: Sequence[str],
        *,
        num_samples: int,
        batch_size: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        num_workers: int = 0,
        shuffle_buffer: int = 1000,
        resampled: bool = False,
        max_bad_fraction: float = 0.01,
        max_batches: int | None = None,
        image_transform: Any = None,
        augment: Any = None,
        encoder: Any = None,
        max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS,
    ) -> None:
        if batch_size % world_size:
            raise ValueError(
                f"train.batch_size ({batch_size}) must be a multiple of the number of ranks "
                f"({world_size}); it is the global batch"
            )
        readers = world_size * max(num_workers, 1)
        if not resampled and len(shards) < readers:
            raise ShardError(
                f"data.shards: {len(shards)} shards for {world_size} ranks x "
                f"{max(num_workers, 1)} workers = {readers} readers; each reader needs a shard "
                "of its own (fewer data.num_workers, or data.resampled = true)"
            )
        steps = num_samples // batch_size
        if steps < 1:
            raise ShardError(
                f"data.train_num_samples = {num_samples} is less than one batch of {batch_size}"
            )
        self.shards = list(shards)
        self.num_samples = num_samples
        self.batch_size, self.seed = batch_size, seed
        self.rank, self.world_size, self.num_workers = rank, world_size, num_workers
        self.local_batch = batch_size // world_size
        self.shuffle_buffer, self.resampled = shuffle_buffer, resampled
        self.max_bad_fraction, self.max_image_pixels = max_bad_fraction, max_image_pixels
        self.steps = steps if max_batches is None else min(steps, max_batches)
        self.image_transform, self.augment, self.encoder = image_transform, augment, encoder
        self.epoch = 0
        self.start_batch = 0
        self.captions: list[str] = []  # no caption list: streamed (losses that need one refuse)

    @property
    def num_images(self) -> int:  # the nominal size: ``train_num_samples``
        return self.num_samples

    num_captions = num_images

    def set_epoch(self, epoch: int, *, start_batch: int = 0) -> None:
        """The epoch to stream next, from its batch ``start_batch`` (a resumed run)."""
        self.epoch, self.start_batch = int(epoch), int(start_batch)

    def num_batches(self) -> int:
        """Global batches (steps) per epoch."""
        return self.steps

    def __len__(self) -> int:
        return max(0, self.steps - self.start_batch)

    @property
    def pad_id(self) -> int:
        """The encoder's padding id (0 without an encoder)."""
        return 0 if self.encoder is None else int(self.encoder.pad_id)

    def check_features(self, *, in_dim: int | None = None, chunk_bytes: int = 0) -> None:
        """Nothing to check before training: a streamed sample is checked when it is read."""

    def loader(self, dataset: Any = None, *, num_workers: int, seed: int) -> ShardLoader:
        """This epoch's batches through a DataLoader with ``num_workers`` workers (its own
        generator, so making it draws nothing from the global torch RNG); ``dataset`` is
        this stream (the sampler's signature)."""
        return ShardLoader(self, num_workers=num_workers, seed=seed)

    def __bool__(self) -> bool:  # a stream is there even when no batch is left
        return True

    # -- the stream ------------------------------------------------------------------------

    def _shard_passes(self, worker: int, workers: int) -> Iterator[list[str]]:
        tag = f"{self.seed}/{self.epoch}"
        for p in itertools.count():
            if self.resampled:
                rng = random.Random(f"{tag}/{self.rank}/{worker}/resample/{p}")
                yield [rng.choice(self.shards) for _ in range(len(self.shards))]
                continue
            order = list(self.shards)
            random.Random(f"{tag}/shards/{p}").shuffle(order)
            mine = list(itertools.islice(order, self.rank, None, self.world_size))
            yield list(itertools.islice(mine, worker, None, workers))

    def _passes(self, worker: int, workers: int, counter: _Counter) -> Iterator[Iterator[Any]]:
        """The raw samples of each pass over this worker's shards, each pass shuffled in the
        buffer and drained at its end (an epoch that reads one pass reads every sample once)."""
        shuffle = _wds().filters._shuffle
        for p, urls in enumerate(self._shard_passes(worker, workers)):
            raw = read_shards(urls, handler=counter, key=self.bad_key)
            if self.shuffle_buffer > 1:
                rng = random.Random(f"{self.seed}/{self.epoch}/{self.rank}/{worker}/buffer/{p}")
                raw = iter(shuffle(raw, self.shuffle_buffer, self.shuffle_buffer, rng=rng))
            yield raw
            if counter.good == counter.good_before:  # another pass would loop for ever
                read = counter.raw - counter.raw_before
                raise ShardError(
                    f"data.shards: worker {worker} of rank {self.rank} read "
                    f"{'no sample' if not read else f'{read} samples, none usable,'} from its "
                    f"{len(urls)} shards ({shown_url(urls[0])}, ...)"
                )
            counter.raw_before, counter.good_before = counter.raw, counter.good

    def _samples(self, worker: int, workers: int, counter: _Counter) -> Iterator[Any]:
        for raw in self._passes(worker, workers, counter):
            for sample in raw:
                counter.raw += 1
                try:
                    image, caption = decode_sample(sample, max_pixels=self.max_image_pixels)
                except BadSample:
                    counter.bad += 1
                    continue
                counter.good += 1
                yield image, caption, sample.get("__key__")

    def _limit(self) -> float:
        """A worker's bad count that proves the epoch's fraction exceeded."""
        f = self.max_bad_fraction
        total = self.steps * self.batch_size
        return total * f / (1.0 - f) if f < 1.0 else 10.0 * total

    def __iter__(self) -> Iterator[RetrievalBatch | ShardFailure | _Skipped]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        counter = _Counter()
        reported = 0
        try:
            samples = self._samples(worker, workers, counter)
            for b in range(worker, self.steps, workers):
                items: list[tuple[Any, str, Any]] = []
                while len(items) < self.local_batch:
                    if counter.bad > self._limit():
                        used = self.steps * self.batch_size
                        who = f" (worker {worker} of rank {self.rank} alone)"
                        line = epoch_fraction_message(counter.bad, self, used=used, who=who)
                        yield ShardFailure(line)
                        return
                    items.append(next(samples))
                if b < self.start_batch:  # read, not handed over (its bad samples are in
                    reported = counter.bad  # the checkpoint's count); the marker keeps the
                    yield _SKIPPED  # DataLoader's round robin over the workers in step
                    continue
                batch = self._collate(b, items)
                batch.skipped = counter.bad - reported  # type: ignore[attr-defined]
                reported = counter.bad
                yield batch
        except (ShardError, ShardReadError) as err:  # a URL's command or server failed
            yield ShardFailure(str(err))

    def _collate(self, b: int, items: list[tuple[Any, str, Any]]) -> RetrievalBatch:
        first = b * self.batch_size + self.rank * self.local_batch
        rows = []
        for j, (image, caption, _) in enumerate(items):
            sid = first + j
            if self.augment is not None:
                feats = self.augment(image, key=(self.seed, self.epoch, sid))
            elif self.image_transform is not None:
                feats = self.image_transform(image)
            else:
                feats = image
            cap: Any = caption
            if self.encoder is not None:
                cap = torch.tensor(self.encoder.encode(caption), dtype=torch.long)
            rows.append((feats, cap, sid, sid))
        batch = collate_retrieval(rows, pad_id=self.pad_id)  # type: ignore[arg-type]
        batch.keys = [key for _, _, key in items]  # type: ignore[attr-defined]
        return batch


class ShardLoader:
    """The batches of a DataLoader over a :class:`ShardStream` (with a length, for progress
    bars); a worker's :class:`ShardFailure` is raised as a one-line :class:`ShardError`."""

    def __init__(self, stream: ShardStream, *, num_workers: int, seed: int) -> None:
        self.stream = stream
        self.loader = DataLoader(
            stream,
            batch_size=None,
            num_workers=num_workers,
            generator=torch.Generator().manual_seed(seed),
        )

    def __len__(self) -> int:
        return len(self.stream)

    def __iter__(self) -> Iterator[RetrievalBatch]:
        for batch in self.loader:
            if isinstance(batch, _Skipped):
                continue
            if isinstance(batch, ShardFailure):
                raise ShardError(batch.message)
            yield batch


class ShardDevSet(RetrievalDataset):
    """A small dev retrieval set from shards, one caption per image, read whole in shard
    order (no shuffling); bad samples are left out and counted in ``skipped`` (the epoch
    record's ``dev_skipped``), and more than ``max_bad_fraction`` of them is refused.

    Args:
        shards: The shards, files and URLs (:func:`expand_shards`).
        image_transform: Maps a PIL image to the model's input (None: PIL images).
        encoder: Turns captions into token ids.
        max_images: Keep the first ones only.
        max_bad_fraction: ``data.max_bad_fraction``: the share of the samples read that may
            be bad.
        max_image_pixels: The pixel cap (``data.max_image_pixels``; None: none).

    Raises:
        ShardError: A shard could not be read to its end (a URL's command or server failed).
        DataFormatError: No readable sample (a ShardError when the first shard is a URL).
        TooManyBadSamples: More than ``max_bad_fraction`` of the samples read were bad.
    """

    #: The key a bad-fraction refusal names.
    bad_key = "data.dev_shards"

    def __init__(
        self,
        shards: Sequence[str],
        *,
        image_transform: Any = None,
        encoder: Any = None,
        max_images: int | None = None,
        max_bad_fraction: float = 0.01,
        max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS,
    ) -> None:
        counter = _Counter()
        self._images: list[bytes] = []
        self.captions, self.image_ids = [], []
        try:
            for sample in read_shards(shards, handler=counter, key=self.bad_key):
                if max_images is not None and len(self.image_ids) >= max_images:
                    break
                try:
                    image, caption = decode_sample(sample, max_pixels=max_image_pixels)
                except BadSample:
                    counter.bad += 1
                    continue
                buf = io.BytesIO()
                image.save(buf, format="PNG")  # decoded once here; lossless
                self._images.append(buf.getvalue())
                self.captions.append(caption)
                self.image_ids.append(sample.get("__key__"))
        except ShardReadError as err:
            raise ShardError(str(err)) from None
        if not self.image_ids:
            if is_url(shards[0]):  # no path: DataFormatError would normalise its '//'
                raise ShardError(f"{shown_url(shards[0])}: data.dev_shards hold no readable sample")
            raise DataFormatError(shards[0], "data.dev_shards hold no readable sample")
        self.skipped = counter.bad
        check_dev_fraction(
            self.skipped,
            len(self.image_ids),
            key=self.bad_key,
            max_bad_fraction=max_bad_fraction,
            causes=ShardStream.bad_causes,
        )
        self.txt_to_img = torch.arange(len(self.image_ids))
        self.image_transform, self.encoder = image_transform, encoder

    def image_source(self, index: int) -> Any:
        # read the way decode_sample read it when the set was built (it passed the cap then)
        return open_rgb(self._images[index], max_pixels=None, name=f"dev image {index}")

    def image(self, index: int) -> Any:
        image = self.image_source(index)
        return self.image_transform(image) if self.image_transform is not None else image


def build_shard_source(
    data: Any,
    *,
    batch_size: int,
    seed: int,
    rank: int = 0,
    world_size: int = 1,
    max_batches: int | None = None,
    image_transform: Any = None,
    augment: Any = None,
    encoder: Any = None,
) -> ShardStream:
    """The :class:`ShardStream` of a ``[data]`` section with ``format = "webdataset"``."""
    return ShardStream(
        expand_shards(data.shards, data_root=data.root),
        num_samples=data.train_num_samples,
        batch_size=batch_size,
        seed=seed,
        rank=rank,
        world_size=world_size,
        num_workers=data.num_workers,
        shuffle_buffer=data.shuffle_buffer,
        resampled=data.resampled,
        max_bad_fraction=data.max_bad_fraction,
        max_batches=max_batches,
        image_transform=image_transform,
        augment=augment,
        encoder=encoder,
        max_image_pixels=data.max_image_pixels,
    )


def build_shard_dev_set(
    data: Any, *, image_transform: Any = None, encoder: Any = None, max_images: int | None = None
) -> ShardDevSet:
    """The dev set ``data.dev_shards`` of a ``[data]`` section."""
    shards = expand_shards(data.dev_shards, key="data.dev_shards", data_root=data.root)
    return ShardDevSet(
        shards,
        image_transform=image_transform,
        encoder=encoder,
        max_images=max_images,
        max_bad_fraction=data.max_bad_fraction,
        max_image_pixels=data.max_image_pixels,
    )


__all__ = [
    "IMAGE_EXTENSIONS",
    "ShardDevSet",
    "ShardError",
    "ShardFailure",
    "ShardStream",
    "build_shard_dev_set",
    "build_shard_source",
    "decode_sample",
    "expand_shards",
    "ShardLoader",
]
