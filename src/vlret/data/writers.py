"""Writers of the real on-disk formats, and tiny generated data sets built with them.

The ``write_*`` functions write exactly what they are given (the readers do the validation, so
tests can also write malformed data with them). The ``make_tiny_*`` functions generate small
consistent data sets (random features, captions from a small grammar) for tests and the
synthetic benchmark.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .formats.karpathy_json import KarpathyImage, KarpathySentence
from .formats.msrvtt import (
    DATA_JSON,
    FEATURE_IDS,
    FEATURES_NPY,
    JSFUSION_CSV,
    JSFUSION_HEADER,
    TRAIN_9K_CSV,
)

# ------------------------------------------------------------------------------ precomputed


def write_precomp(
    root: str | Path,
    split: str,
    features: np.ndarray,
    captions: Sequence[str],
    *,
    ids: Sequence[int] | None = None,
) -> dict[str, Path]:
    """Write one split of a precomputed-feature folder.

    Args:
        root: The folder (created if missing).
        split: The split name, the files' prefix.
        features: The image features, saved as given.
        captions: One caption per line of ``{split}_caps.txt``.
        ids: If given, written one per line to ``{split}_ids.txt``: one id per caption or one
            per image, whichever is passed.

    Returns:
        The paths written, under ``"ims"``, ``"caps"`` and (with ``ids``) ``"ids"``.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    paths = {"ims": root / f"{split}_ims.npy", "caps": root / f"{split}_caps.txt"}
    np.save(paths["ims"], np.asarray(features))
    _write_lines(paths["caps"], captions)
    if ids is not None:
        paths["ids"] = root / f"{split}_ids.txt"
        _write_lines(paths["ids"], [str(int(i)) for i in ids])
    return paths


def _write_lines(path: Path, lines: Sequence[str]) -> None:
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")


_COLOURS = ("red", "blue", "green", "yellow", "white", "black")
_THINGS = ("dog", "cat", "man", "woman", "car", "bird", "table", "ball")
_PLACES = ("on a beach", "in a park", "near a table", "on the street", "in a kitchen")
_VERBS = ("sitting", "standing", "running", "playing", "looking")


def tiny_captions(n: int, rng: np.random.Generator) -> list[str]:
    """Captions from a small grammar, in the precomputed style.

    Args:
        n: How many.
        rng: The random generator they are drawn from.

    Returns:
        ``n`` captions in original case with a space before punctuation
        (``"A red dog sitting on a beach ."``).
    """
    out = []
    for _ in range(n):
        colour, thing = rng.choice(_COLOURS), rng.choice(_THINGS)
        verb, place = rng.choice(_VERBS), rng.choice(_PLACES)
        extra = f" , next to a {rng.choice(_COLOURS)} ball" if rng.random() < 0.3 else ""
        out.append(f"A {colour} {thing} {verb} {place}{extra} .")
    return out


def make_tiny_precomp(
    root: str | Path,
    *,
    sizes: Mapping[str, int] | None = None,
    feature_shape: tuple[int, ...] = (4, 16),
    captions_per_image: int = 5,
    seed: int = 0,
) -> dict[str, dict[str, Path]]:
    """Write a small precomputed folder with the real layouts of ``{split}_ids.txt``.

    Train ids are one per image (as in COCO/F30K train), the other splits' one per caption (as
    in COCO testall and F30K test/dev); ids are distinct across splits like Karpathy
    ``imgid``/``cocoid``.

    Args:
        root: The folder (created if missing).
        sizes: Split -> number of images (default train 6, dev 2, test 2, testall 4).
        feature_shape: One image's features: ``(regions, D)`` (real: ``(36, 2048)``) or
            ``(D,)``.
        captions_per_image: Captions per image.
        seed: Seed of the features and captions.

    Returns:
        Each split's paths (:func:`write_precomp`).
    """
    sizes = dict(sizes or {"train": 6, "dev": 2, "test": 2, "testall": 4})
    rng = np.random.default_rng(seed)
    out = {}
    next_id = 100
    for split, n in sizes.items():
        feats = rng.standard_normal((n, *feature_shape)).astype(np.float32)
        caps = tiny_captions(n * captions_per_image, rng)
        image_ids = list(range(next_id, next_id + n))
        next_id += n
        ids = (
            image_ids
            if split == "train"
            else [i for i in image_ids for _ in range(captions_per_image)]
        )
        out[split] = write_precomp(root, split, feats, caps, ids=ids)
    return out


# ------------------------------------------------------------------------------ Karpathy


def karpathy_tokens(raw: str) -> list[str]:
    """Karpathy-style ``tokens`` of a raw caption: lower-cased words without punctuation.

    Args:
        raw: The caption.

    Returns:
        Its runs of ASCII letters and digits, lower-cased.
    """
    return re.findall(r"[a-z0-9]+", raw.lower())


def karpathy_entry(image: KarpathyImage) -> dict:
    """The JSON object of one image of a Karpathy split file.

    Args:
        image: The image with its sentences.

    Returns:
        The entry, with the fields of the real files in their order (``filepath`` and
        ``cocoid`` only when set).
    """
    entry: dict = {}
    if image.filepath is not None:
        entry["filepath"] = image.filepath
    entry["sentids"] = list(image.sentids)
    entry["filename"] = image.filename
    entry["imgid"] = image.imgid
    entry["split"] = image.split
    entry["sentences"] = [
        {"tokens": list(s.tokens), "raw": s.raw, "imgid": image.imgid, "sentid": s.sentid}
        for s in image.sentences
    ]
    if image.cocoid is not None:
        entry["cocoid"] = image.cocoid
    return entry


def write_karpathy_json(path: str | Path, images: Sequence[KarpathyImage], *, dataset: str) -> Path:
    """Write a Karpathy split file like the real ``dataset_*.json``.

    Args:
        path: The JSON file (parent folders created).
        images: The images, in file order.
        dataset: The ``"dataset"`` field (``"coco"``, ``"flickr30k"``).

    Returns:
        ``path``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"images": [karpathy_entry(im) for im in images], "dataset": dataset}
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def make_tiny_karpathy(
    path: str | Path,
    *,
    dataset: str = "coco",
    splits: Mapping[str, int] | None = None,
    captions_per_image: int = 5,
    extra_captions: Mapping[int, int] | None = None,
    image_root: str | Path | None = None,
    seed: int = 0,
) -> list[KarpathyImage]:
    """Write a small Karpathy JSON and, with ``image_root``, tiny JPEG files.

    COCO entries get ``filepath`` (val2014 for restval/val/test, train2014 for train) and
    ``cocoid``; other datasets' entries neither.

    Args:
        path: The JSON file.
        dataset: ``"coco"`` or a Flickr name.
        splits: Karpathy split -> image count (default train 3, restval 2, val 2, test 2),
            written in that order.
        captions_per_image: Captions per image.
        extra_captions: More captions for some images (imgid -> how many more), like the COCO
            images with 6 or 7.
        image_root: If given, a random JPEG is written at each image's path under it.
        seed: Seed of the captions and pixels.

    Returns:
        The images written.

    Raises:
        ImportError: ``image_root`` without Pillow.
    """
    splits = dict(splits or {"train": 3, "restval": 2, "val": 2, "test": 2})
    extra = dict(extra_captions or {})
    rng = np.random.default_rng(seed)
    is_coco = dataset == "coco"
    images: list[KarpathyImage] = []
    sentid = 0
    for split, n in splits.items():
        for _ in range(n):
            imgid = len(images)
            count = captions_per_image + extra.get(imgid, 0)
            raws = [c.replace(" .", ".").replace(" ,", ",") for c in tiny_captions(count, rng)]
            sents = tuple(
                KarpathySentence(sentid + k, raw, tuple(karpathy_tokens(raw)))
                for k, raw in enumerate(raws)
            )
            sentid += count
            if is_coco:
                cocoid = 400000 + 7 * imgid
                folder = "train2014" if split == "train" else "val2014"
                filename, filepath = f"COCO_{folder}_{cocoid:012d}.jpg", folder
            else:
                cocoid, filepath, filename = None, None, f"{1000092795 + imgid}.jpg"
            images.append(
                KarpathyImage(
                    imgid=imgid,
                    filename=filename,
                    split=split,
                    sentids=tuple(s.sentid for s in sents),
                    sentences=sents,
                    filepath=filepath,
                    cocoid=cocoid,
                )
            )
    write_karpathy_json(path, images, dataset=dataset)
    if image_root is not None:
        write_tiny_images(image_root, images, seed=seed)
    return images


def write_tiny_images(
    image_root: str | Path, images: Sequence[KarpathyImage], *, size: int = 8, seed: int = 0
) -> None:
    """Write a small random JPEG at each image's path (Pillow is imported only here).

    Args:
        image_root: The folder the images' paths are relative to.
        images: The images.
        size: The side of each square image, in pixels.
        seed: Seed of the pixels.

    Raises:
        ImportError: Pillow is not installed.
    """
    try:
        from PIL import Image
    except ImportError:
        raise ImportError("write_tiny_images needs Pillow (pip install pillow)") from None
    rng = np.random.default_rng(seed)
    for im in images:
        path = im.path(image_root)
        path.parent.mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(path, format="JPEG")


# ------------------------------------------------------------------------------ MSR-VTT


def write_msrvtt_json(
    path: str | Path,
    videos: Sequence[tuple[str, str]],
    captions: Mapping[str, Sequence[str]],
) -> Path:
    """Write ``MSRVTT_data.json``.

    Sentences are written video by video with consecutive ``sen_id``; the videos carry the real
    files' other fields (``category``, ``url``, ``"start time"``, ``"end time"``, ``id``).

    Args:
        path: The JSON file (parent folders created).
        videos: The ``(video_id, split)`` of each video, in file order.
        captions: Each video's captions (a video may have none).

    Returns:
        ``path``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    vids = []
    for k, (vid, split) in enumerate(videos):
        vids.append(
            {
                "category": k % 20,
                "url": f"https://www.youtube.com/watch?v=tiny{k:05d}",
                "video_id": vid,
                "start time": 10.0 + k,
                "end time": 20.0 + k,
                "split": split,
                "id": k,
            }
        )
    sentences: list[dict[str, Any]] = []
    for vid, _ in videos:
        for caption in captions.get(vid, ()):
            sentences.append({"caption": caption, "video_id": vid, "sen_id": len(sentences)})
    data = {"info": {"contributor": "vlret tiny writer"}, "videos": vids, "sentences": sentences}
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def write_msrvtt_train_csv(path: str | Path, video_ids: Sequence[str]) -> Path:
    """Write ``MSRVTT_train.9k.csv``: a ``video_id`` header and one id per row.

    Args:
        path: The CSV file.
        video_ids: The training videos.

    Returns:
        ``path``.
    """
    path = Path(path)
    _write_lines(path, ["video_id", *video_ids])
    return path


def write_jsfusion_csv(path: str | Path, pairs: Sequence[tuple[str, str]]) -> Path:
    """Write ``MSRVTT_JSFUSION_test.csv``: rows ``ret{k},msr{n},video{n},sentence``.

    Args:
        path: The CSV file.
        pairs: The ``(video_id, sentence)`` test pairs (``video_id`` of the form
            ``video{n}``).

    Returns:
        ``path``.
    """
    path = Path(path)
    with path.open("w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(JSFUSION_HEADER)
        for k, (vid, sentence) in enumerate(pairs):
            writer.writerow([f"ret{k}", "msr" + vid.removeprefix("video"), vid, sentence])
    return path


def write_video_features(
    features_dir: str | Path, video_ids: Sequence[str], features: np.ndarray
) -> dict[str, Path]:
    """Write ``video_feats.npy`` and ``video_ids.txt`` (:mod:`vlret.data.formats.msrvtt`'s layout).

    Args:
        features_dir: The folder (created if missing).
        video_ids: The video of each row.
        features: ``(N_videos, T, D)`` or ``(N_videos, D)``; row ``k`` is ``video_ids[k]``.

    Returns:
        The paths written, under ``"features"`` and ``"ids"``.
    """
    root = Path(features_dir)
    root.mkdir(parents=True, exist_ok=True)
    paths = {"features": root / FEATURES_NPY, "ids": root / FEATURE_IDS}
    np.save(paths["features"], np.asarray(features))
    _write_lines(paths["ids"], video_ids)
    return paths


def make_tiny_msrvtt(
    root: str | Path,
    *,
    sizes: Mapping[str, int] | None = None,
    captions_per_video: int = 20,
    n_test_1ka: int = 2,
    feature_shape: tuple[int, ...] = (3, 8),
    seed: int = 0,
) -> dict[str, list[str]]:
    """Write a small MSR-VTT root: data JSON, 9k train CSV, JSFUSION CSV and video features.

    As in the real 1k-A split, the last ``n_test_1ka`` test videos form the JSFUSION test (one
    of their captions each) and every other video is in the 9k train CSV. Features cover all
    videos, written in reverse order so that rows differ from the JSON order.

    Args:
        root: The data root.
        sizes: JSON split -> videos (default train 4, validate 2, test 3; real 6513 / 497 /
            2990).
        captions_per_video: Captions per video.
        n_test_1ka: How many test videos form the 1k-A test.
        feature_shape: One video's features: ``(T, D)`` frames or ``(D,)``.
        seed: Seed of the captions and features.

    Returns:
        The video ids of each JSON split, plus ``"1k-A train"`` and ``"1k-A test"``.
    """
    sizes = dict(sizes or {"train": 4, "validate": 2, "test": 3})
    rng = np.random.default_rng(seed)
    split_of = [split for split, n in sizes.items() for _ in range(n)]
    videos = [(f"video{k}", split) for k, split in enumerate(split_of)]
    captions = {
        vid: [
            c.replace(" ,", "").replace(" .", "").lower()
            for c in tiny_captions(captions_per_video, rng)
        ]
        for vid, _ in videos
    }
    root = Path(root)
    write_msrvtt_json(root / DATA_JSON, videos, captions)
    test = [v for v, s in videos if s == "test"]
    test_1ka = test[len(test) - n_test_1ka :] if n_test_1ka else []
    train_1ka = [v for v, _ in videos if v not in set(test_1ka)]
    write_msrvtt_train_csv(root / TRAIN_9K_CSV, train_1ka)
    write_jsfusion_csv(root / JSFUSION_CSV, [(v, captions[v][0]) for v in test_1ka])
    all_ids = [v for v, _ in videos][::-1]
    feats = rng.standard_normal((len(all_ids), *feature_shape)).astype(np.float32)
    write_video_features(root, all_ids, feats)
    out = {split: [v for v, s in videos if s == split] for split in sizes}
    out["1k-A train"], out["1k-A test"] = train_1ka, test_1ka
    return out


__all__ = [
    "karpathy_entry",
    "karpathy_tokens",
    "make_tiny_karpathy",
    "make_tiny_msrvtt",
    "make_tiny_precomp",
    "tiny_captions",
    "write_jsfusion_csv",
    "write_karpathy_json",
    "write_msrvtt_json",
    "write_msrvtt_train_csv",
    "write_precomp",
    "write_tiny_images",
    "write_video_features",
]
