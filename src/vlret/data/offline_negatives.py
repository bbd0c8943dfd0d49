"""AOQ's offline negatives (Chen et al., ECCV 2020): the file ``vlret mine-negatives`` writes, and
the loader-side draw of one offline negative caption and image per training item.

The file is one ``.npz`` (``numpy.load(path, allow_pickle=False)`` reads it) with:

============== ======================== ==================================================
key            shape, dtype             what
============== ======================== ==================================================
``i2t``        ``(n_images, K)`` int64  each image's ``K`` highest-scoring captions, best
                                        first, its own captions excluded
``t2i``        ``(n_captions, K)`` int64 each caption's ``K`` highest-scoring images, best
                                        first, its own image excluded
``i2t_scores`` ``(n_images, K)`` f32    the scores of ``i2t``
``t2i_scores`` ``(n_captions, K)`` f32  the scores of ``t2i``
``txt_to_img`` ``(n_captions,)`` int64  the image of each caption in the mined split
``header``     0-d unicode string       JSON: ``format``, ``version``, ``checkpoint``,
                                        ``split``, ``k``, ``n_images``, ``n_captions``,
                                        ``scoring``, ``model``, ``ties``, ``fingerprint``
============== ======================== ==================================================

``fingerprint`` (:func:`split_fingerprint`) identifies the data the file was mined on: a sha256
over the split's ordered image ids, captions and clean pairing. The training set it is used
with must have the same one (:meth:`OfflineNegatives.check_data`): two splits of the same size
(another synthetic world, the test split of a folder whose splits are equal in size) give the
same sizes but not the same fingerprint. The header's ``split`` must also be the split it is
used for. A file written before the fingerprint was recorded (no ``fingerprint`` key) is
accepted on its sizes and pairs, with a warning naming it: it cannot be told from a file mined
on other data of the same size, and mining it again records the fingerprint.

Indices are positions in the split as :mod:`vlret.data` reads it (caption ``j`` is line ``j``
of ``train_caps.txt``; image ``i`` is row ``i`` of ``train_ims.npy``). Equal scores are ordered
by the lower index first, so a file is a deterministic function of the scores.

The released code (sunnychencool/AOQ ``dataAOQ.py``) draws, each time a training caption
``index`` is loaded, one ``n`` uniform in ``[0, 300)`` and takes the offline negative caption
``i2t[img][n]`` (``img`` the caption's image) and the offline negative image
``t2i[index][n // 5]`` (5 captions per image), then, for the quintuplet term, a caption of the
offline image (``n2`` uniform over its captions) and the image of the offline caption.
:meth:`OfflineNegatives.draw` is that rule; ``candidates`` is the 300 (default: the file's
``K``) and the 5 is the split's captions per image.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from .._files import atomic_write
from .dataset import RetrievalBatch, RetrievalItem
from .transforms import sample_generator

#: The ``format`` of the header, and the version of the layout above.
FORMAT = "vlret-offline-negatives"
VERSION = 1
#: The arrays of the file (besides ``header``).
ARRAYS = ("i2t", "t2i", "i2t_scores", "t2i_scores", "txt_to_img")
#: The header key of the mined data's :func:`split_fingerprint`.
FINGERPRINT = "fingerprint"


def split_fingerprint(dataset: Any) -> str:
    """``"sha256:<hex>"`` of a split's data as a mined file indexes it: its ordered image ids
    (``str`` of each), its captions and its clean pairing (``original_txt_to_img`` where a
    noise index re-paired the set, else ``txt_to_img``), each as JSON.

    Positions are all a mined file records, so two splits of the same size are told apart by
    what sits at those positions; features are not hashed (a whole split's would be read).

    Args:
        dataset: A split with ``image_ids``, ``captions`` and ``txt_to_img``.

    Returns:
        The fingerprint.
    """
    pairing = getattr(dataset, "original_txt_to_img", None)
    if pairing is None:
        pairing = dataset.txt_to_img
    digest = hashlib.sha256(b"vlret split fingerprint 1\n")
    digest.update(json.dumps([str(i) for i in dataset.image_ids]).encode("ascii"))
    digest.update(b"\n")
    digest.update(json.dumps(list(dataset.captions)).encode("ascii"))
    digest.update(b"\n")
    digest.update(json.dumps(np.asarray(pairing, dtype=np.int64).tolist()).encode("ascii"))
    return "sha256:" + digest.hexdigest()


class OfflineDraw(NamedTuple):
    """What one training caption draws (all indices into the mined split).

    Attributes:
        caption: The offline negative caption of the item's image (``i2t[img][n]``).
        image: The offline negative image of the item's caption (``t2i[index][n // cpi]``).
        image_caption: A caption of ``image`` (the quintuplet pair's caption).
        caption_image: The image of ``caption`` (the quintuplet pair's image).
    """

    caption: int
    image: int
    image_caption: int
    caption_image: int


def _fail(path: Path, message: str) -> ValueError:
    return ValueError(f"{path}: {message}")


@dataclass(frozen=True)
class OfflineNegatives:
    """A mined file's arrays (see the module docstring for their meaning) and its header."""

    i2t: np.ndarray
    t2i: np.ndarray
    i2t_scores: np.ndarray
    t2i_scores: np.ndarray
    txt_to_img: np.ndarray
    header: dict[str, Any] = field(default_factory=dict)
    #: the file it was read from (for error messages), ``None`` when built in memory
    path: Path | None = None

    @property
    def k(self) -> int:
        return int(self.i2t.shape[1])

    @property
    def num_images(self) -> int:
        return int(self.i2t.shape[0])

    @property
    def num_captions(self) -> int:
        return int(self.t2i.shape[0])

    def save(self, path: str | Path) -> Path:
        """Write the ``.npz`` atomically (a reader never sees half a file); the header gets
        ``format``, ``version``, ``k`` and the sizes."""
        header = {
            **self.header,
            "format": FORMAT,
            "version": VERSION,
            "k": self.k,
            "n_images": self.num_images,
            "n_captions": self.num_captions,
        }
        arrays = {name: getattr(self, name) for name in ARRAYS}
        text = np.array(json.dumps(header, sort_keys=True))
        return atomic_write(path, lambda fh: np.savez(fh, **arrays, header=text))

    def check(self) -> None:
        """Shapes, dtypes, index ranges and the exclusion of each item's own positives;
        ``ValueError`` naming the file and the array."""
        where = self.path if self.path is not None else Path("<offline negatives>")
        n_img, n_txt = self.i2t.shape[0] if self.i2t.ndim == 2 else -1, self.t2i.shape[0]
        for name in ARRAYS:
            a = getattr(self, name)
            want_int = name in ("i2t", "t2i", "txt_to_img")
            if want_int and a.dtype.kind not in "iu":
                raise _fail(where, f"{name}: expected integer indices, got dtype {a.dtype}")
            if not want_int and a.dtype.kind != "f":
                raise _fail(where, f"{name}: expected float scores, got dtype {a.dtype}")
        if self.i2t.ndim != 2 or self.t2i.ndim != 2 or self.i2t.shape[1] != self.t2i.shape[1]:
            raise _fail(
                where,
                f"i2t {self.i2t.shape} and t2i {self.t2i.shape}: expected (n_images, K) and "
                "(n_captions, K) with the same K",
            )
        for name, ref in (("i2t_scores", "i2t"), ("t2i_scores", "t2i")):
            if getattr(self, name).shape != getattr(self, ref).shape:
                raise _fail(
                    where, f"{name} {getattr(self, name).shape}: expected the shape of {ref}"
                )
        if self.txt_to_img.shape != (n_txt,):
            raise _fail(where, f"txt_to_img {self.txt_to_img.shape}: expected ({n_txt},)")
        for name, a, hi in (
            ("i2t", self.i2t, n_txt),
            ("t2i", self.t2i, n_img),
            ("txt_to_img", self.txt_to_img, n_img),
        ):
            if a.size and (int(a.min()) < 0 or int(a.max()) >= hi):
                raise _fail(
                    where, f"{name}: indices outside [0, {hi}) (min {a.min()}, max {a.max()})"
                )
        own = np.nonzero(self.txt_to_img[self.i2t] == np.arange(n_img)[:, None])
        if own[0].size:
            i, c = int(own[0][0]), int(self.i2t[own][0])
            raise _fail(where, f"i2t: image {i} lists its own caption {c}; not a mined file")
        own = np.nonzero(self.t2i == self.txt_to_img[:, None])
        if own[0].size:
            raise _fail(where, f"t2i: caption {int(own[0][0])} lists its own image")

    def check_split(
        self,
        *,
        num_images: int,
        num_captions: int,
        txt_to_img: Any = None,
        split: str = "train",
    ) -> None:
        """Refuse a file mined on another split: ``ValueError`` naming the file and both sizes
        (or the first caption whose image differs, or the split its header names)."""
        where = self.path if self.path is not None else Path("<offline negatives>")
        recorded = self.header.get("split")
        if recorded is not None and recorded != split:
            raise _fail(
                where,
                f"mined on the {recorded!r} split (its header); it is used for the {split!r} "
                "split: mine that split (`vlret mine-negatives --split`)",
            )
        if (self.num_images, self.num_captions) != (num_images, num_captions):
            raise _fail(
                where,
                f"mined on {self.num_images} images x {self.num_captions} captions; the {split} "
                f"split has {num_images} images x {num_captions} captions",
            )
        if txt_to_img is not None:
            given = np.asarray(txt_to_img, dtype=np.int64)
            differ = np.nonzero(given != self.txt_to_img)[0]
            if differ.size:
                j = int(differ[0])
                raise _fail(
                    where,
                    f"mined with caption {j} on image {int(self.txt_to_img[j])}; the {split} "
                    f"split pairs it with image {int(given[j])} (another caption order)",
                )

    def check_data(self, dataset: Any, *, split: str | None = None) -> None:
        """Refuse a file mined on other data than ``dataset`` (its :func:`split_fingerprint`
        differs from the header's ``fingerprint``): ``ValueError`` naming the file and the
        split (``split``, else the header's). A file without a fingerprint (written before it
        was recorded) is accepted with a ``UserWarning`` naming it."""
        where = self.path if self.path is not None else Path("<offline negatives>")
        name = split or self.header.get("split") or "training"
        recorded = self.header.get(FINGERPRINT)
        if recorded is None:
            warnings.warn(
                f"{where}: records no fingerprint of the data it was mined on (written before "
                f"vlret recorded it); accepted for the {name} split on its sizes and pairs "
                "alone, which a file mined on other data of the same size also passes: run "
                "`vlret mine-negatives` again to record it",
                UserWarning,
                stacklevel=2,
            )
            return
        actual = split_fingerprint(dataset)
        if recorded != actual:
            shown = str(recorded)[:19] if isinstance(recorded, str) else repr(recorded)[:19]
            raise _fail(
                where,
                f"mined on other data than the {name} split it is used with (fingerprint of "
                f"the image ids, captions and pairs: {shown}... in the file, {actual[:19]}... "
                "for the split); mine this split (`vlret mine-negatives`)",
            )

    def sampler(
        self, *, candidates: int | None = None, captions_per_image: int | None = None
    ) -> OfflineSampler:
        """The loader-side draw (:class:`OfflineSampler`)."""
        return OfflineSampler(self, candidates=candidates, captions_per_image=captions_per_image)

    def draw(self, index: int, rng: np.random.Generator) -> OfflineDraw:
        """:meth:`OfflineSampler.draw` with the defaults (every one of the ``K`` candidates)."""
        return self.sampler().draw(index, rng)


class OfflineSampler:
    """The released per-item draw over a mined file.

    Args:
        mined: The file's arrays.
        candidates: ``n`` is drawn uniform in ``[0, candidates)`` (the release: 300 of the
            2000 captions it mined per image); default the file's ``K``.
        captions_per_image: The divisor of ``n`` in ``t2i[index][n // captions_per_image]``
            (the release: 5); default the split's, when every image has the same number.

    Raises:
        ValueError: ``candidates`` outside ``[1, K]``, or images with different caption
            counts and no ``captions_per_image``.
    """

    def __init__(
        self,
        mined: OfflineNegatives,
        *,
        candidates: int | None = None,
        captions_per_image: int | None = None,
    ) -> None:
        k = mined.k
        where = mined.path if mined.path is not None else "<offline negatives>"
        candidates = k if candidates is None else candidates
        if (
            isinstance(candidates, bool)
            or not isinstance(candidates, int)
            or not 1 <= candidates <= k
        ):
            raise ValueError(
                f"candidates: expected an integer in [1, {k}] ({where}), got {candidates!r}"
            )
        counts = np.bincount(mined.txt_to_img, minlength=mined.num_images)
        if captions_per_image is None:
            if counts.size == 0 or counts.min() != counts.max():
                raise ValueError(
                    f"captions_per_image: {where}: images have {counts.min()} to {counts.max()} "
                    "captions; give the divisor of the draw"
                )
            captions_per_image = int(counts[0])
        if isinstance(captions_per_image, bool) or not isinstance(captions_per_image, int):
            raise ValueError(
                f"captions_per_image: expected a positive integer, got {captions_per_image!r}"
            )
        if captions_per_image < 1:
            raise ValueError(
                f"captions_per_image: expected a positive integer, got {captions_per_image!r}"
            )
        self.mined = mined
        self.candidates = candidates
        self.captions_per_image = captions_per_image
        # each image's captions, in caption order (the release's img * 5 + n2)
        order = np.argsort(mined.txt_to_img, kind="stable")
        self._first = np.concatenate([[0], np.cumsum(counts)])
        self._captions = order

    def draw(self, index: int, rng: np.random.Generator) -> OfflineDraw:
        """The offline negatives of training caption ``index``: ``n = rng.integers(candidates)``
        picks the caption ``i2t[img][n]`` and the image ``t2i[index][n // captions_per_image]``;
        then ``rng.integers(c)`` picks one of the offline image's ``c`` captions. An image
        without a caption of its own (possible under a noisy pairing) takes the release's
        ``image * captions_per_image + rng.integers(captions_per_image)``."""
        m = self.mined
        if not 0 <= index < m.num_captions:
            raise ValueError(f"index: expected a caption in [0, {m.num_captions}), got {index!r}")
        n = int(rng.integers(self.candidates))
        img = int(m.txt_to_img[index])
        caption = int(m.i2t[img, n])
        image = int(m.t2i[index, n // self.captions_per_image])
        first, stop = int(self._first[image]), int(self._first[image + 1])
        if stop > first:
            image_caption = int(self._captions[first + int(rng.integers(stop - first))])
        else:  # no caption of its own (a noisy pairing): the release's image * cpi + n2
            slot = image * self.captions_per_image + int(rng.integers(self.captions_per_image))
            image_caption = min(slot, m.num_captions - 1)
        return OfflineDraw(caption, image, image_caption, int(m.txt_to_img[caption]))


#: The last entry of a draw's seed key: keeps AOQ's draws apart from the augmentation's, whose
#: key is ``(seed, epoch, index)`` (:mod:`vlret.data.transforms`).
DRAW_STREAM = 0x414F51  # "AOQ"


def draw_generator(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The generator of training caption ``index``'s draw in ``epoch`` of a run seeded ``seed``:
    ``numpy.random.default_rng([seed, epoch, index, DRAW_STREAM])`` (each entry modulo
    ``2**64``). A function of these three alone, so the draws are the same whatever the number
    of DataLoader workers, the batch order or a resume."""
    return sample_generator((seed, epoch, index, DRAW_STREAM))


class OfflineItem(NamedTuple):
    """A training item with its offline negatives (:class:`OfflineNegativesDataset`).

    Attributes:
        item: The caption's own item (image features, caption, indices).
        offline: ``(I'_i, T'_i)``: the offline negative image and caption, as one item whose
            ``img_index`` / ``cap_index`` are theirs (not a positive pair).
        quintuplet: ``(I''_i, T''_i)``: the image of ``T'_i`` and a caption of ``I'_i``.
        draw: The four indices (:class:`OfflineDraw`).
    """

    item: RetrievalItem
    offline: RetrievalItem
    quintuplet: RetrievalItem
    draw: OfflineDraw


class OfflineNegativesDataset:
    """A training set whose items also carry their AOQ offline negatives.

    Item ``index`` is the base set's item plus, from ``sampler``'s released draw
    (:meth:`OfflineSampler.draw`) with the generator :func:`draw_generator` ``(seed, epoch,
    index)``, the items ``(I'_i, T'_i)`` and ``(I''_i, T''_i)`` (:class:`OfflineItem`);
    :meth:`collate` gives a :class:`~vlret.data.RetrievalBatch` of the items whose ``offline``
    is the ``2B`` offline rows, interleaved (row ``2i``: ``(I'_i, T'_i)``, row ``2i + 1``:
    ``(I''_i, T''_i)``). Every caption of the ``3B`` rows is padded to one width, so the two
    batches concatenate into one forward. The base set's augmentation, when set, also serves
    the offline images (keys ``(seed, epoch, index, 1)`` and ``(..., 2)``).

    Everything else (``txt_to_img``, ``captions``, ``corrupted``, :meth:`images`, ...) is the
    base set's: reading and setting an attribute reach it.

    Args:
        base: The training split (one item per caption, ``txt_to_img``).
        sampler: The draw over a mined file checked against ``base``
            (:func:`load_offline_negatives` with its sizes and ``txt_to_img``).
        seed: The run's seed (``train.seed``); ``None`` until :meth:`set_seed`.

    Raises:
        ValueError: ``sampler`` was mined on another number of captions, or on other data
            (:meth:`OfflineNegatives.check_data`: its fingerprint is not ``base``'s).
    """

    def __init__(self, base: Any, sampler: OfflineSampler, *, seed: int | None = None) -> None:
        if sampler.mined.num_captions != len(base):
            raise ValueError(
                f"offline negatives of {sampler.mined.num_captions} captions for a training "
                f"split of {len(base)}"
            )
        sampler.mined.check_data(base)
        object.__setattr__(self, "base", base)
        object.__setattr__(self, "sampler", sampler)
        object.__setattr__(self, "seed", seed)

    _OWN = ("base", "sampler", "seed")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in self._OWN:  # pickling, or not yet initialised
            raise AttributeError(name)
        return getattr(self.base, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._OWN:
            object.__setattr__(self, name, value)
        else:
            setattr(self.base, name, value)

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def set_seed(self, seed: int) -> None:
        """The run seed of the draws (the AOQ procedure sets ``train.seed`` before each epoch)."""
        object.__setattr__(self, "seed", int(seed))

    def set_epoch(self, epoch: int) -> None:
        """The epoch of the draws' (and the base set's augmentation's) keys."""
        self.base.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.base)

    def _image(self, image: int, index: int, slot: int) -> Any:
        base = self.base
        if getattr(base, "augment", None) is not None:
            key = (base.augment_seed, base.epoch, index, slot)
            return base.augment(base.image_source(image), key=key)
        return base.image(image)

    def draw(self, index: int) -> OfflineDraw:
        """Caption ``index``'s draw in the current epoch (:func:`draw_generator`)."""
        if self.seed is None:
            raise ValueError(
                "the offline negatives' draw has no seed yet (set_seed: the AOQ procedure "
                "gives it train.seed)"
            )
        return self.sampler.draw(index, draw_generator(self.seed, self.base.epoch, index))

    def __getitem__(self, index: int) -> OfflineItem:
        item = self.base[index]
        index = int(item.cap_index)
        d = self.draw(index)
        base = self.base
        offline = RetrievalItem(
            self._image(d.image, index, 1), base.caption(d.caption), d.image, d.caption
        )
        quint = RetrievalItem(
            self._image(d.caption_image, index, 2),
            base.caption(d.image_caption),
            d.caption_image,
            d.image_caption,
        )
        return OfflineItem(item, offline, quint, d)

    def collate(self, items: Sequence[OfflineItem]) -> RetrievalBatch:
        """The items' batch with its ``offline`` rows (see the class docstring)."""
        rows: list[RetrievalItem] = [it.item for it in items]
        for it in items:
            rows += [it.offline, it.quintuplet]
        full = self.base.collate(rows)  # one caption width for the 3B rows
        n = len(items)
        main, extra = _rows(full, 0, n), _rows(full, n, 3 * n)
        main.offline = extra
        if hasattr(full, "skipped"):  # the base set's replaced items (bad_samples)
            main.skipped = full.skipped  # type: ignore[attr-defined]
        return main


def _rows(batch: RetrievalBatch, start: int, stop: int) -> RetrievalBatch:
    """Rows ``start:stop`` of a collated batch (captions keep its padded width)."""

    def cut(value: Any) -> Any:
        return None if value is None else value[start:stop]

    return RetrievalBatch(
        cut(batch.features),
        cut(batch.captions),
        cut(batch.lengths),
        cut(batch.img_index),
        cut(batch.cap_index),
        cut(batch.identity),
    )


def load_offline_negatives(
    path: str | Path,
    *,
    num_images: int | None = None,
    num_captions: int | None = None,
    txt_to_img: Any = None,
    split: str = "train",
) -> OfflineNegatives:
    """Read and check a ``vlret mine-negatives`` file; with the split's sizes (and mapping),
    refuse a file mined on another split.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: Not a mined file, a missing or malformed array, or another split; the
            message names the file.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: missing; expected the .npz that `vlret mine-negatives` writes"
        )
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
    except Exception as err:  # zip, pickle or header errors: all one line
        raise _fail(path, f"not a mined-negatives .npz ({type(err).__name__}: {err})") from None
    missing = [name for name in (*ARRAYS, "header") if name not in arrays]
    if missing:
        raise _fail(path, f"missing {', '.join(missing)}; not a `vlret mine-negatives` file")
    try:
        header = json.loads(str(arrays.pop("header")))
    except ValueError:
        raise _fail(path, "header: not JSON") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise _fail(path, f"header: format is not {FORMAT!r}")
    mined = OfflineNegatives(**{n: arrays[n] for n in ARRAYS}, header=header, path=path)
    mined.check()
    if num_images is not None or num_captions is not None:
        mined.check_split(
            num_images=mined.num_images if num_images is None else num_images,
            num_captions=mined.num_captions if num_captions is None else num_captions,
            txt_to_img=txt_to_img,
            split=split,
        )
    return mined


__all__ = [
    "ARRAYS",
    "FINGERPRINT",
    "FORMAT",
    "VERSION",
    "DRAW_STREAM",
    "OfflineDraw",
    "OfflineItem",
    "OfflineNegatives",
    "OfflineNegativesDataset",
    "OfflineSampler",
    "draw_generator",
    "load_offline_negatives",
    "split_fingerprint",
]
