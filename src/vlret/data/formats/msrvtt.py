"""MSR-VTT annotations (full split and 1k-A) with precomputed per-video frame features.

Annotation files, in the data root:

* ``MSRVTT_data.json``: ``videos[]`` (``video_id`` such as ``"video0"``, ``split`` in
  ``train``/``validate``/``test``, plus ``category``, ``url``, ``"start time"``, ``"end time"``,
  ``id``) and ``sentences[]`` (``caption``, ``video_id``, ``sen_id``), 20 sentences per video.
* ``MSRVTT_train.9k.csv``: a ``video_id`` column, the 9000 1k-A training videos.
* ``MSRVTT_JSFUSION_test.csv``: header ``key,vid_key,video_id,sentence``, the 1000 1k-A test
  pairs (one caption per video), e.g. ``ret0,msr9770,video9770,a person is connecting ...``.

Protocols: ``full`` (train 6513 / dev = ``validate`` 497 / test 2990 videos, 20 captions each;
video->text ranks the best of a video's captions, which is what ``txt_to_img`` gives
:func:`vlret.metrics.retrieval_metrics`) and ``1k-A`` (train: the 9k videos with all their
captions from the JSON; test: the 1000 JSFUSION pairs, a square problem).

Feature layout (ours; the raw features come in many extractor-specific forms), in
``features_dir`` (the data root by default):

* ``video_feats.npy``: float32 ``(N_videos, T, D)`` frame features (``T`` frames sampled or
  padded to a fixed count when extracting) or ``(N_videos, D)`` pooled vectors, memory-mapped;
* ``video_ids.txt``: the video id of each row, one per line, in row order.

One array for all videos is memory-mappable and opens once, where 10,000 small files would
each need an open per read; :func:`vlret.data.writers.write_video_features` writes it. With
``experts``, the folder holds per-video multi-expert features instead
(:mod:`vlret.data.formats.experts.features`).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch

from ..checks import (
    SCAN_CHUNK_BYTES,
    DataFormatError,
    check_feature_size,
    read_json,
    read_lines,
    require_file,
)
from ..dataset import CaptionEncoder, RetrievalDataset, first_images
from ..vocab import DEFAULT_MIN_COUNT, Vocabulary, build_vocab
from .experts.features import FEATURE_IDS, FEATURES_NPY, ExpertFeatures, VideoFeatures
from .karpathy_json import EntryError, JsonPath, locate_json_line
from .registry import DataFormat, OpenRequest, register_format

DATA_JSON = "MSRVTT_data.json"
TRAIN_9K_CSV = "MSRVTT_train.9k.csv"
JSFUSION_CSV = "MSRVTT_JSFUSION_test.csv"
JSFUSION_HEADER = ("key", "vid_key", "video_id", "sentence")
JSON_SPLITS = ("train", "validate", "test")
PROTOCOLS = ("full", "1k-A")
#: Videos per split in the real data (pass as ``expected_videos`` to check a download).
FULL_SPLIT_SIZES = {"train": 6513, "dev": 497, "test": 2990}
ONE_K_A_SIZES = {"train": 9000, "test": 1000}
CAPTIONS_PER_VIDEO = 20

_FULL_SPLITS = {"train": "train", "dev": "validate", "val": "validate", "test": "test"}
_JSON_LAYOUT = (
    '{"videos": [{"video_id", "split"}], "sentences": [{"caption", "video_id", "sen_id"}]}'
)
_EXPECTED_JSON = "expected " + _JSON_LAYOUT


@dataclass(frozen=True)
class MSRVTTAnnotations:
    """``MSRVTT_data.json`` as :func:`read_msrvtt_json` parses it.

    Attributes:
        path: The file read.
        video_ids: The video ids in file order.
        splits: The JSON split of each video: ``"train"``, ``"validate"`` or ``"test"``.
        captions: Each video's captions, in ``sen_id`` order.
    """

    path: Path
    video_ids: tuple[str, ...]
    splits: dict[str, str]
    captions: dict[str, list[str]]

    def split_videos(self, split: str) -> list[str]:
        """The ids of the videos of JSON split ``split`` (``train``/``validate``/``test``)."""
        return [v for v in self.video_ids if self.splits[v] == split]


def _entry_field(entry: Any, key: str, kind: type, where: str, at: JsonPath) -> Any:
    """``entry[key]`` of type ``kind``; an :class:`~vlret.data.formats.karpathy.EntryError` at
    the entry (not an object, missing key) or at the value (wrong type) otherwise."""
    if not isinstance(entry, dict):
        raise EntryError(at, f"{where} is {type(entry).__name__}; {_EXPECTED_JSON}")
    value = entry.get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
        value_at = (*at, key) if key in entry else at
        raise EntryError(value_at, f"{where}: {key!r} is {value!r:.60}; {_EXPECTED_JSON}")
    return value


def read_msrvtt_json(path: str | Path) -> MSRVTTAnnotations:
    """Parse and validate ``MSRVTT_data.json``.

    Args:
        path: The annotation file.

    Returns:
        The videos in file order with their splits, and their captions in ``sen_id`` order.

    Raises:
        FileNotFoundError: The file is missing.
        DataFormatError: Not JSON of the module's layout, or a malformed entry. The message
            names the file, the entry (``videos[1] (video1): split 'val'``) and, where the
            entry can be found, its line (:func:`vlret.data.formats.karpathy.locate_json_line`).
    """
    path = Path(path)
    data = read_json(path, "the MSR-VTT annotations " + _JSON_LAYOUT)
    if not isinstance(data, dict) or not all(
        isinstance(data.get(k), list) for k in ("videos", "sentences")
    ):
        raise DataFormatError(
            path, f"top level lacks the 'videos' and 'sentences' lists; {_EXPECTED_JSON}"
        )
    try:
        return _parse_annotations(path, data)
    except EntryError as err:
        raise err.located(path) from None


def _parse_annotations(path: Path, data: dict) -> MSRVTTAnnotations:
    video_ids: list[str] = []
    splits: dict[str, str] = {}
    for k, entry in enumerate(data["videos"]):
        at = ("videos", k)
        vid = _entry_field(entry, "video_id", str, f"videos[{k}]", at)
        split = _entry_field(entry, "split", str, f"videos[{k}] ({vid})", at)
        if split not in JSON_SPLITS:
            raise EntryError(
                (*at, "split"),
                f"videos[{k}] ({vid}): split {split!r}; expected one of {JSON_SPLITS}",
            )
        if vid in splits:
            raise EntryError(
                (*at, "video_id"),
                f"videos[{k}]: video_id {vid!r} appears twice "
                f"(first at videos[{video_ids.index(vid)}])",
            )
        video_ids.append(vid)
        splits[vid] = split
    by_video: dict[str, list[tuple[int, str]]] = {v: [] for v in video_ids}
    for k, entry in enumerate(data["sentences"]):
        where = f"sentences[{k}]"
        at = ("sentences", k)
        caption = _entry_field(entry, "caption", str, where, at)
        vid = _entry_field(entry, "video_id", str, where, at)
        sen_id = _entry_field(entry, "sen_id", int, where, at)
        if vid not in by_video:
            raise EntryError((*at, "video_id"), f"{where}: video_id {vid!r} is not in 'videos'")
        by_video[vid].append((sen_id, caption))
    captions = {
        v: [c for _, c in sorted(items, key=lambda t: t[0])] for v, items in by_video.items()
    }
    return MSRVTTAnnotations(path, tuple(video_ids), splits, captions)


def _csv_rows(path: Path, what: str) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """Header and ``(line number, fields)`` rows of a UTF-8 CSV (a BOM is tolerated; blank
    lines at the end are ignored, one before the last row is an error)."""
    text = "\n".join(read_lines(path, what))
    reader = csv.reader(io.StringIO(text), strict=True)
    rows: list[tuple[int, list[str]]] = []
    header: list[str] | None = None
    try:
        for fields in reader:
            if not fields:
                raise DataFormatError(path, f"empty line; expected {what}", line=reader.line_num)
            if header is None:
                header = [f.strip() for f in fields]
            else:
                rows.append((reader.line_num, fields))
    except csv.Error as err:
        raise DataFormatError(
            path, f"bad CSV ({err}); expected {what}", line=reader.line_num
        ) from None
    if header is None:
        raise DataFormatError(path, f"is empty; expected {what}", line=1)
    return header, rows


def read_train_csv(path: str | Path) -> list[str]:
    """Read the 1k-A training videos.

    Args:
        path: ``MSRVTT_train.9k.csv`` (or the ``.7k`` list).

    Returns:
        The ``video_id`` column, in file order.

    Raises:
        FileNotFoundError: The file is missing.
        DataFormatError: Malformed CSV, no ``video_id`` column, or an empty or repeated id.
    """
    return [vid for _, vid in _train_csv_lines(Path(path))]


def _train_csv_lines(path: Path) -> list[tuple[int, str]]:
    """``(line number, video_id)`` of each row of a training CSV."""
    what = "a CSV with a 'video_id' column"
    header, rows = _csv_rows(path, what)
    if "video_id" not in header:
        raise DataFormatError(path, f"header {header} has no 'video_id'; expected {what}", line=1)
    col = header.index("video_id")
    out: list[tuple[int, str]] = []
    seen: set[str] = set()
    for line, fields in rows:
        if len(fields) != len(header):
            raise DataFormatError(
                path, f"{len(fields)} fields; expected {len(header)} like the header", line=line
            )
        vid = fields[col].strip()
        if not vid:
            raise DataFormatError(path, "empty video_id", line=line)
        if vid in seen:
            raise DataFormatError(path, f"video_id {vid!r} repeated", line=line)
        seen.add(vid)
        out.append((line, vid))
    return out


def _first_listed(
    path: Path, lines: list[tuple[int, str]], bad: set[str], what: str, expected: str
) -> DataFormatError:
    """A ``DataFormatError`` at the first CSV row whose video is in ``bad``; ``what`` may use
    ``{n}``, the number of such rows."""
    hits = [(line, vid) for line, vid in lines if vid in bad]
    line, vid = hits[0]
    return DataFormatError(
        path,
        f"lists {what.format(n=len(hits))} (first {vid!r}, on this line); expected {expected}",
        line=line,
    )


def read_jsfusion_csv(path: str | Path) -> list[tuple[str, str]]:
    """Read the 1k-A test pairs.

    Args:
        path: ``MSRVTT_JSFUSION_test.csv``.

    Returns:
        The ``(video_id, sentence)`` of each row, in file order.

    Raises:
        FileNotFoundError: The file is missing.
        DataFormatError: Malformed CSV, another header than ``key,vid_key,video_id,sentence``,
            or an empty ``video_id`` or sentence.
    """
    path = Path(path)
    what = "the header key,vid_key,video_id,sentence and one test pair per row"
    header, rows = _csv_rows(path, what)
    if tuple(header) != JSFUSION_HEADER:
        raise DataFormatError(path, f"header {','.join(header)}; expected {what}", line=1)
    out = []
    for line, fields in rows:
        if len(fields) != len(JSFUSION_HEADER):
            raise DataFormatError(path, f"{len(fields)} fields; expected 4 ({what})", line=line)
        vid, sentence = fields[2].strip(), fields[3].strip()
        if not vid or not sentence:
            raise DataFormatError(path, "empty video_id or sentence", line=line)
        out.append((vid, sentence))
    return out


def normalise_protocol(protocol: str) -> str:
    """``"full"`` or ``"1k-A"`` from any case and ``-``/``_`` spelling (``"msrvtt_1ka"``).

    Raises:
        ValueError: Another protocol.
    """
    key = str(protocol).lower().replace("-", "").replace("_", "")
    names = {"full": "full", "1ka": "1k-A", "msrvttfull": "full", "msrvtt1ka": "1k-A"}
    if key not in names:
        raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}")
    return names[key]


class MSRVTTDataset(RetrievalDataset):
    """One split of MSR-VTT under the ``full`` or ``1k-A`` protocol, with frame features or,
    with ``experts``, multi-expert features (``image`` gives an
    :class:`~vlret.data.expert_batch.ExpertSample`).

    Args:
        root: The data root holding the annotation files.
        split: ``"train"``, ``"dev"`` (the JSON's ``validate``; full only) or ``"test"``.
        protocol: ``"full"`` or ``"1k-A"`` (any :func:`normalise_protocol` spelling).
        encoder: Turns a caption into token ids; ``None`` keeps the strings.
        features_dir: The folder of the feature files (default ``root``).
        captions_per_video: Each video keeps its first captions by ``sen_id`` and must have
            that many; ``None`` keeps all. The 1k-A test has the CSV's one caption per video.
        train_csv: The 1k-A training list, in ``root``.
        expected_videos: The number of videos the split must have (e.g.
            ``FULL_SPLIT_SIZES["test"]``); ``None`` checks nothing.
        mmap: Memory-map the features.
        experts: None: the frame layout (``video_feats.npy``); ``"all"`` or a list of names:
            the :class:`~vlret.data.formats.experts.features.ExpertFeatures` of the feature folder.

    Raises:
        ValueError: An unknown protocol or split, or a bad ``captions_per_video``.
        FileNotFoundError: An annotation or feature file is missing.
        DataFormatError: A malformed file, too few captions, an unknown training video, a
            split of another size than ``expected_videos``, or a video without features.
    """

    def __init__(
        self,
        root: str | Path,
        split: str,
        *,
        protocol: str = "full",
        encoder: CaptionEncoder | None = None,
        features_dir: str | Path | None = None,
        captions_per_video: int | None = CAPTIONS_PER_VIDEO,
        train_csv: str = TRAIN_9K_CSV,
        expected_videos: int | None = None,
        mmap: bool = True,
        experts: str | Sequence[str] | None = None,
    ) -> None:
        self.root = Path(root)
        self.protocol = normalise_protocol(protocol)
        self.split = split
        self.encoder = encoder
        if captions_per_video is not None and (
            not isinstance(captions_per_video, int) or captions_per_video < 1
        ):
            raise ValueError(
                f"captions_per_video must be a positive int or None, got {captions_per_video!r}"
            )
        if self.protocol == "1k-A" and split == "test":
            pairs = read_jsfusion_csv(self.root / JSFUSION_CSV)
            video_ids, captions, txt_to_img = _group_pairs(pairs)
            source: Path = self.root / JSFUSION_CSV
        else:
            ann = read_msrvtt_json(self.root / DATA_JSON)
            if self.protocol == "full":
                if split not in _FULL_SPLITS:
                    raise ValueError(f"split must be one of {tuple(_FULL_SPLITS)}, got {split!r}")
                video_ids = ann.split_videos(_FULL_SPLITS[split])
            elif split == "train":
                csv_path = self.root / train_csv
                lines = _train_csv_lines(csv_path)
                video_ids = [v for _, v in lines]
                unknown = {v for v in video_ids if v not in ann.splits}
                if unknown:
                    raise _first_listed(
                        csv_path,
                        lines,
                        unknown,
                        "{n} videos absent from " + DATA_JSON,
                        "ids of its 'videos'",
                    )
            else:
                raise ValueError(f"1k-A has the splits 'train' and 'test', got {split!r}")
            captions, txt_to_img = _video_captions(ann, video_ids, captions_per_video)
            source = ann.path
        if expected_videos is not None and len(video_ids) != expected_videos:
            raise DataFormatError(
                source,
                f"gives {len(video_ids)} videos for {self.protocol} {split}; expected "
                f"{expected_videos}",
            )
        if not video_ids:
            raise DataFormatError(source, f"has no videos for {self.protocol} {split}")
        folder = features_dir if features_dir is not None else self.root
        if experts is None:
            self.features: VideoFeatures | ExpertFeatures = VideoFeatures(folder, mmap=mmap)
        else:
            chosen = None if experts == "all" else experts
            self.features = ExpertFeatures(folder, experts=chosen, mmap=mmap)
        self._rows = self.features.rows_for(video_ids)
        self.image_ids = list(video_ids)
        self.captions = captions
        self.txt_to_img = torch.tensor(txt_to_img, dtype=torch.long)

    @property
    def video_ids(self) -> list[str]:
        """The split's video ids in dataset order (``image_ids``)."""
        return self.image_ids

    def image(self, index: int) -> Any:
        """Float32 features of the split's video ``index``: ``(T, D)`` frames or ``(D,)``, or
        its :class:`~vlret.data.expert_batch.ExpertSample`."""
        return self.features[self._rows[index]]

    def check_features(
        self, *, in_dim: int | Mapping[str, int] | None = None, chunk_bytes: int = SCAN_CHUNK_BYTES
    ) -> None:
        """Check the feature size, then scan the rows of this split's videos for NaN or inf
        (in file order; rows of other splits are not read).

        Args:
            in_dim: The feature size the model reads (expert -> size for expert features);
                ``None`` skips the size check.
            chunk_bytes: Feature bytes read at once.

        Raises:
            ValueError: An ``in_dim`` of the wrong kind for the features.
            DataFormatError: Another last dimension than ``in_dim``, or a non-finite value (the
                video, its position in the split, the expert and the frame are named).
        """
        feats = self.features
        rows = self._rows[: self.num_images]  # builders may keep only the first videos

        def what(row: int) -> str:
            index = rows.index(row)
            return (
                f"{self.image_ids[index]} (video {index} of the {self.protocol} {self.split} split)"
            )

        if in_dim is not None and isinstance(feats, ExpertFeatures) != isinstance(in_dim, Mapping):
            raise ValueError(f"in_dim {in_dim!r} does not fit {type(feats).__name__}")
        # in_dim's kind matches the features' (checked above)
        if isinstance(feats, ExpertFeatures):
            expert_dims = cast("Mapping[str, int] | None", in_dim)
            feats.check(rows, in_dim=expert_dims, describe=what, chunk_bytes=chunk_bytes)
            return
        check_feature_size(feats.path, feats.shape, cast("int | None", in_dim))
        bad = feats.find_non_finite(rows, chunk_bytes=chunk_bytes)
        if bad is not None:
            raise DataFormatError(feats.path, bad.describe(what(bad.row), "frame"), row=bad.row)


def _video_captions(
    ann: MSRVTTAnnotations, video_ids: Sequence[str], per_video: int | None
) -> tuple[list[str], list[int]]:
    captions: list[str] = []
    txt_to_img: list[int] = []
    for i, vid in enumerate(video_ids):
        caps = ann.captions[vid]
        if per_video is not None:
            if len(caps) < per_video:
                raise DataFormatError(
                    ann.path,
                    f"video {vid} has {len(caps)} sentences; expected {per_video}",
                    line=_video_line(ann, vid),
                )
            caps = caps[:per_video]
        elif not caps:
            raise DataFormatError(
                ann.path,
                f"video {vid} has no sentences; expected at least one",
                line=_video_line(ann, vid),
            )
        captions.extend(caps)
        txt_to_img.extend([i] * len(caps))
    return captions, txt_to_img


def _video_line(ann: MSRVTTAnnotations, vid: str) -> int | None:
    """Line of the video's ``video_id`` in the JSON (for an error message)."""
    return locate_json_line(ann.path, ("videos", ann.video_ids.index(vid), "video_id"))


def _group_pairs(pairs: Sequence[tuple[str, str]]) -> tuple[list[str], list[str], list[int]]:
    """Videos in first-appearance order and each caption's video index."""
    index: dict[str, int] = {}
    captions, txt_to_img = [], []
    for vid, sentence in pairs:
        txt_to_img.append(index.setdefault(vid, len(index)))
        captions.append(sentence)
    return list(index), captions, txt_to_img


def msrvtt_vocab_captions(root: str | Path, *, protocol: str = "full") -> list[str]:
    """The captions a vocabulary is built from, never a test caption.

    Args:
        root: The data root.
        protocol: ``"full"``: the train and validate videos; ``"1k-A"``: the 9k videos.

    Returns:
        Their captions, video by video.

    Raises:
        ValueError: An unknown protocol.
        FileNotFoundError: An annotation file is missing.
        DataFormatError: A malformed file, or a 1k-A training list with a JSFUSION test video.
    """
    root = Path(root)
    protocol = normalise_protocol(protocol)
    ann = read_msrvtt_json(root / DATA_JSON)
    if protocol == "full":
        videos = ann.split_videos("train") + ann.split_videos("validate")
    else:
        lines = _train_csv_lines(root / TRAIN_9K_CSV)
        videos = [v for _, v in lines]
        held_out = {
            v for v, _ in read_jsfusion_csv(require_file(root / JSFUSION_CSV, "the 1k-A test CSV"))
        }
        leaked = held_out.intersection(videos)
        if leaked:
            raise _first_listed(
                root / TRAIN_9K_CSV,
                lines,
                leaked,
                "1k-A test videos ({n}) of " + JSFUSION_CSV,
                "training videos only",
            )
    return [c for v in videos for c in ann.captions.get(v, [])]


def build_msrvtt_vocab(
    root: str | Path, *, protocol: str = "full", min_count: int = DEFAULT_MIN_COUNT
) -> Vocabulary:
    """A vocabulary from the protocol's training (and validation) captions.

    Args:
        root: The data root.
        protocol: ``"full"`` or ``"1k-A"`` (:func:`msrvtt_vocab_captions`).
        min_count: Keep the words seen at least this many times.

    Raises:
        ValueError: An unknown protocol or a bad ``min_count``.
        DataFormatError: As :func:`msrvtt_vocab_captions`.
    """
    return build_vocab(msrvtt_vocab_captions(root, protocol=protocol), min_count=min_count)


def _open(data: Any, split: str, request: OpenRequest) -> RetrievalDataset:
    dataset = MSRVTTDataset(
        request.root,
        split,
        protocol=request.protocol or data.protocol,
        encoder=request.encoder,
        features_dir=data.features_dir,
        captions_per_video=data.captions_per_video,
        experts=data.experts,
    )
    return first_images(dataset, request.max_images)


def _vocabulary(data: Any) -> Vocabulary:
    return build_msrvtt_vocab(data.root, protocol=data.protocol, min_count=data.min_count)


#: MSR-VTT with per-video frame features, full or 1k-A (``data.format = "msrvtt"``).
MSRVTT = register_format(
    DataFormat(
        name="msrvtt",
        summary="MSR-VTT (full or 1k-A) with per-video frame or multi-expert features",
        reader=__name__,
        open=_open,
        splits=tuple(_FULL_SPLITS),
        inputs="features",
        caption_count_key="captions_per_video",
        visual="video",
        experts=True,
        reads_root=True,
        vocabulary=_vocabulary,
    )
)


__all__ = [
    "FEATURES_NPY",
    "FEATURE_IDS",
    "FULL_SPLIT_SIZES",
    "MSRVTT",
    "ONE_K_A_SIZES",
    "PROTOCOLS",
    "MSRVTTAnnotations",
    "MSRVTTDataset",
    "VideoFeatures",
    "build_msrvtt_vocab",
    "msrvtt_vocab_captions",
    "read_jsfusion_csv",
    "read_msrvtt_json",
    "read_train_csv",
]
