"""Per-video multi-expert features on disk: the layout, its writer, reader and converter.

The multi-expert video models (CE, Liu et al., BMVC 2019; MMT, Gabeur et al., ECCV 2020) read
several feature streams per video ("experts": appearance, motion, audio, ...), any of which may
be missing for a video. Layout of a folder ``DIR`` (the MSR-VTT data root or its
``features_dir``)::

    DIR/experts.json        {"format": "vlret-experts", "version": 1, "experts": [
                              {"name": "appearance", "kind": "pooled", "dim": 2048},
                              {"name": "audio", "kind": "temporal", "dim": 128,
                               "max_frames": 30}]}          (list order = expert order)
    DIR/video_ids.txt       one video id per line = row order, shared by every expert
    DIR/<name>.npy          float32 (N, D) pooled | (N, T, D) temporal, T = max_frames
                            (zeros where the video lacks the expert, and on padding frames)
    DIR/<name>.present.npy  bool (N,)
    DIR/<name>.frames.npy   int64 (N,), real frames per video (temporal experts only; 0 where
                            absent, 1 .. max_frames where present)

Names match ``[A-Za-z0-9_-]+``. The feature arrays are memory-mapped (:class:`ExpertFeatures`),
opened again in each DataLoader worker. :func:`write_expert_features` writes the layout from
arrays in memory, :func:`convert_experts` from the pickles the CE and MMT authors released.
The module also reads the single-stream frame layout of :mod:`vlret.data.formats.msrvtt`
(:class:`VideoFeatures`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ...._files import check_output_dir
from ...checks import (
    SCAN_CHUNK_BYTES,
    DataFormatError,
    NonFinite,
    _read_rows,
    find_non_finite,
    load_feature_array,
    read_lines,
    require_file,
)
from ...dataset import LazyFeatures
from ...expert_batch import ExpertSample
from .layout import (
    EXPERT_IDS,
    EXPERTS_JSON,
    KINDS,
    NAME_PATTERN,
    ExpertSpec,
    expert_paths,
    positive_int,
    read_expert_specs,
    write_expert_features,
)
from .pickles import API_FLAGS, read_released_experts

#: The single-stream frame layout of :mod:`vlret.data.formats.msrvtt` (``experts=None``).
FEATURES_NPY = "video_feats.npy"
FEATURE_IDS = "video_ids.txt"


@dataclass(frozen=True)
class ExpertNonFinite:
    """The first NaN or inf among a present expert's real frames.

    Attributes:
        expert: The expert.
        path: Its feature file.
        found: The value (``index`` is ``(frame, dimension)`` or ``(dimension,)``).
    """

    expert: str
    path: Path
    found: NonFinite


class ExpertFeatures:
    """A multi-expert feature folder (the module docstring's layout), memory-mapped.

    Args:
        folder: The folder.
        experts: The experts to read, in this order; default every expert, in file order.
        mmap: Memory-map the feature arrays (rows are read on access; DataLoader workers open
            the maps again instead of receiving copies).

    Raises:
        ValueError: ``experts`` is not a list of distinct names.
        FileNotFoundError: A file is missing.
        DataFormatError: A malformed file (named, with its line or row), or an expert the
            folder does not have (the known ones are listed).
    """

    def __init__(
        self, folder: str | Path, *, experts: Sequence[str] | None = None, mmap: bool = True
    ) -> None:
        self.dir = Path(folder)
        self.json_path = self.dir / EXPERTS_JSON
        known = read_expert_specs(self.json_path)
        by_name = {s.name: s for s in known}
        if experts is None:
            chosen = known
        else:
            if isinstance(experts, str) or not all(isinstance(e, str) for e in experts):
                raise ValueError(f"experts must be a list of names, got {experts!r}")
            if len(set(experts)) != len(experts) or not experts:
                raise ValueError(f"experts must be distinct names, at least one: {experts!r}")
            missing = [e for e in experts if e not in by_name]
            if missing:
                raise DataFormatError(
                    self.json_path, f"has no expert {missing[0]!r}; it has {list(by_name)}"
                )
            chosen = [by_name[e] for e in experts]
        self.ids_path = self.dir / EXPERT_IDS
        self.video_ids, self.row = _read_ids(self.ids_path)
        n = len(self.video_ids)
        self.specs: tuple[ExpertSpec, ...] = tuple(chosen)
        self.names: tuple[str, ...] = tuple(s.name for s in chosen)
        self.paths = {s.name: expert_paths(self.dir, s.name)["features"] for s in chosen}
        self._features: dict[str, LazyFeatures] = {}
        present, frames = [], []
        for spec in chosen:
            array, p, f = _open_expert(self.dir, spec, n, mmap=mmap)
            self._features[spec.name] = LazyFeatures(self.paths[spec.name], mmap=mmap, array=array)
            present.append(p)
            frames.append(f)
        self.present = np.stack(present, axis=1)  # (N, E)
        self.frames = np.stack(frames, axis=1)  # (N, E); 1 for a present pooled expert

    def __len__(self) -> int:
        return len(self.video_ids)

    def rows_for(self, video_ids: Sequence[str]) -> list[int]:
        """The row of each of ``video_ids``, in their order (see :func:`_rows_for`)."""
        return _rows_for(self.row, video_ids, self.ids_path)

    def sample(self, row: int) -> ExpertSample:
        """The experts of row ``row`` (features of absent experts as stored: zeros)."""
        return ExpertSample(
            names=self.names,
            features={n: self._features[n].row(row) for n in self.names},
            present=torch.from_numpy(self.present[row].copy()),
            frames=torch.from_numpy(self.frames[row].copy()),
        )

    __getitem__ = sample

    def check_dims(self, in_dims: Mapping[str, int]) -> None:
        """Check that the model's experts are read and have its input sizes.

        Args:
            in_dims: Expert -> the size the model expects (``[model] experts``); experts read
                but not named here are not checked.

        Raises:
            ValueError: ``in_dims`` is not a mapping of names to positive ints.
            DataFormatError: An expert that is not read, or of another size (the expert and
                its file are named).
        """
        if not isinstance(in_dims, Mapping) or not all(
            isinstance(k, str) and positive_int(v) for k, v in in_dims.items()
        ):
            raise ValueError(f"in_dim must map expert names to positive ints, got {in_dims!r}")
        for name, want in in_dims.items():
            if name not in self.names:
                raise DataFormatError(
                    self.json_path,
                    f"the model's expert {name!r} is not among the experts read "
                    f"{list(self.names)}; add it to data.experts or remove it from model.experts",
                )
            spec = self.specs[self.names.index(name)]
            if spec.dim != want:
                raise DataFormatError(
                    self.paths[name],
                    f"expert {name} has features of size {spec.dim}, but the model expects "
                    f"model.experts.{name} = {want}; set it to {spec.dim} or use features of "
                    f"size {want}",
                )

    def find_non_finite(
        self, rows: Sequence[int] | np.ndarray, *, chunk_bytes: int = SCAN_CHUNK_BYTES
    ) -> ExpertNonFinite | None:
        """The first NaN or inf among ``rows`` (expert by expert, rows in file order), reading
        only present experts and their real frames.

        Args:
            rows: The rows to scan.
            chunk_bytes: Feature bytes read at once.
        """
        rows = np.unique(np.asarray(rows, dtype=np.int64))
        for e, spec in enumerate(self.specs):
            mine = rows[self.present[rows, e]]
            if not len(mine):
                continue
            frames = self.frames[:, e] if spec.temporal else None
            array = self._features[spec.name].array
            found = _scan(array, mine, frames, chunk_bytes)
            if found is not None:
                return ExpertNonFinite(spec.name, self.paths[spec.name], found)
        return None

    def check(
        self,
        rows: Sequence[int],
        *,
        in_dim: Mapping[str, int] | None = None,
        describe: Callable[[int], str] | None = None,
        chunk_bytes: int = SCAN_CHUNK_BYTES,
    ) -> None:
        """:meth:`check_dims`, then :meth:`find_non_finite` as an error.

        Args:
            rows: The rows to scan.
            in_dim: Expert -> model input size; None skips the size check.
            describe: Names the video of a row in the message (default its id and row).
            chunk_bytes: Feature bytes read at once.

        Raises:
            ValueError: A bad ``in_dim``.
            DataFormatError: As :meth:`check_dims`, or a non-finite value (the video, the
                expert, the frame and the dimension are named).
        """
        if in_dim is not None:
            self.check_dims(in_dim)
        bad = self.find_non_finite(rows, chunk_bytes=chunk_bytes)
        if bad is not None:
            row = bad.found.row
            what = describe(row) if describe else f"{self.video_ids[row]} (row {row})"
            message = bad.found.describe(f"{what}, expert {bad.expert}", "frame")
            raise DataFormatError(bad.path, message, row=row)


def _rows_for(row: Mapping[str, int], video_ids: Sequence[str], ids_path: Path) -> list[int]:
    """``row[v]`` for each of ``video_ids``, in their order.

    Raises:
        DataFormatError: Some videos have no row (the first few are named, with ``ids_path``).
    """
    missing = [v for v in video_ids if v not in row]
    if missing:
        raise DataFormatError(
            ids_path,
            f"has no features for {len(missing)} videos (first {missing[:3]}); expected a "
            "row for every video of the split",
        )
    return [row[v] for v in video_ids]


def _read_ids(path: Path) -> tuple[list[str], dict[str, int]]:
    ids = [v.strip() for v in read_lines(path, "one video id per line, one per feature row")]
    row: dict[str, int] = {}
    for number, vid in enumerate(ids, start=1):
        if not vid:
            raise DataFormatError(path, "empty video id", line=number)
        if vid in row:
            raise DataFormatError(
                path, f"video id {vid!r} repeats line {row[vid] + 1}", line=number
            )
        row[vid] = number - 1
    if not ids:
        raise DataFormatError(path, "is empty; expected one video id per line")
    return ids, row


def _open_expert(
    folder: Path, spec: ExpertSpec, n: int, *, mmap: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """An expert's checked ``(features, present, frames)``; frames of a pooled expert are
    ``present`` as 0/1."""
    paths = expert_paths(folder, spec.name)
    array = load_feature_array(paths["features"], mmap=mmap)
    want = f"experts.json declares {spec.kind} expert {spec.name} of dim {spec.dim}" + (
        f" and max_frames {spec.max_frames}" if spec.temporal else ""
    )
    if array.shape[1:] != spec.shape:
        raise DataFormatError(
            paths["features"],
            f"has shape {array.shape}, but {want}; expected (N, {', '.join(map(str, spec.shape))})",
        )
    if array.shape[0] != n:
        raise DataFormatError(
            paths["features"], f"has {array.shape[0]} rows for the {n} ids of {EXPERT_IDS}"
        )
    present = _small_array(paths["present"], "bool", n)
    if not spec.temporal:
        return array, present, present.astype(np.int64)
    frames = _small_array(paths["frames"], "int", n).astype(np.int64)
    assert spec.max_frames is not None  # a temporal expert's
    bad = (frames < 0) | (frames > spec.max_frames) | (present != (frames > 0))
    if bad.any():
        r = int(bad.argmax())
        raise DataFormatError(
            paths["frames"],
            f"{frames[r]} frames for video {r} (present: {bool(present[r])}); expected 1 .. "
            f"max_frames = {spec.max_frames} of {EXPERTS_JSON} where present, 0 where absent",
            row=r,
        )
    return array, present, frames


def _small_array(path: Path, kind: str, n: int) -> np.ndarray:
    """A ``(n,)`` bool or integer array, read whole."""
    what = f"a {kind} .npy array of shape ({n},)"
    require_file(path, what)
    try:
        arr = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as err:
        raise DataFormatError(path, f"not a readable .npy array ({err}); expected {what}") from None
    ok = arr.dtype == np.bool_ if kind == "bool" else np.issubdtype(arr.dtype, np.integer)
    if not isinstance(arr, np.ndarray) or not ok or arr.shape != (n,):
        raise DataFormatError(
            path, f"has dtype {arr.dtype} and shape {arr.shape}; expected {what} (one per id)"
        )
    return arr


def _scan(
    array: np.ndarray, rows: np.ndarray, frames: np.ndarray | None, chunk_bytes: int
) -> NonFinite | None:
    """The first non-finite value of ``rows`` (ascending), ignoring padding frames."""
    step = max(1, chunk_bytes // max(1, array[0].nbytes))
    for start in range(0, len(rows), step):
        numbers = rows[start : start + step]
        chunk = _read_rows(array, numbers)
        bad = ~np.isfinite(chunk)
        real = np.ones_like(bad)
        if frames is not None:
            steps = np.arange(chunk.shape[1])[None, :, None]
            real = np.broadcast_to(steps < frames[numbers][:, None, None], bad.shape)
            bad &= real
        flat = bad.reshape(len(chunk), -1)
        if not flat.any():
            continue
        r = int(flat.any(axis=1).argmax())
        index = tuple(int(i) for i in np.unravel_index(int(flat[r].argmax()), chunk.shape[1:]))
        return NonFinite(
            row=int(numbers[r]),
            index=index,
            value=float(chunk[r][index]),
            count=int(flat[r].sum()),
            row_size=int(real[r].sum()),
        )
    return None


# ------------------------------------------------------------------------------ frames


class VideoFeatures:
    """``video_feats.npy`` and ``video_ids.txt`` (the module docstring's layout).

    Args:
        features_dir: The folder holding the two files.
        mmap: Memory-map the array (rows are read on access).

    Raises:
        FileNotFoundError: A file is missing.
        DataFormatError: An unreadable or non-float array, an empty or repeated id, or not one
            id per row.
    """

    def __init__(self, features_dir: str | Path, *, mmap: bool = True) -> None:
        self.dir = Path(features_dir)
        npy = self.dir / FEATURES_NPY
        ids_path = self.dir / FEATURE_IDS
        array = load_feature_array(npy, mmap=mmap)
        ids = read_lines(ids_path, f"one video id per line, one per row of {FEATURES_NPY}")
        row: dict[str, int] = {}
        for number, vid in enumerate(ids, start=1):
            vid = vid.strip()
            if not vid:
                raise DataFormatError(ids_path, "empty video id", line=number)
            if vid in row:
                raise DataFormatError(
                    ids_path, f"video id {vid!r} repeats line {row[vid] + 1}", line=number
                )
            row[vid] = number - 1
        if len(ids) != array.shape[0]:
            raise DataFormatError(
                ids_path,
                f"has {len(ids)} ids for {array.shape[0]} rows in {FEATURES_NPY}; expected one "
                "id per row",
            )
        self.ids_path = ids_path
        self.path = npy
        self.row = row
        self.shape = tuple(array.shape)
        self.feature_shape = self.shape[1:]
        self._features = LazyFeatures(npy, mmap=mmap, array=array)

    def rows_for(self, video_ids: Sequence[str]) -> list[int]:
        """The array row of each of ``video_ids``, in their order (see :func:`_rows_for`)."""
        return _rows_for(self.row, video_ids, self.ids_path)

    def __getitem__(self, row: int) -> torch.Tensor:
        """The float32 features of array row ``row``: ``(T, D)`` frames or ``(D,)``."""
        return self._features.row(row)

    def find_non_finite(self, rows: Sequence[int], *, chunk_bytes: int = SCAN_CHUNK_BYTES):
        """The first of ``rows`` (in file order) holding NaN or inf, or ``None``.

        Args:
            rows: The array rows to scan.
            chunk_bytes: Feature bytes read at once (:func:`vlret.data.checks.find_non_finite`).
        """
        return find_non_finite(self._features.array, rows=np.unique(rows), chunk_bytes=chunk_bytes)


def convert_experts(
    src: str | Path,
    out: str | Path,
    *,
    experts: Sequence[str] | Mapping[str, str] | None = None,
    max_frames: Mapping[str, int] | None = None,
    overwrite: bool = False,
    flags: Mapping[str, str] | None = None,
) -> Path:
    """Convert the expert features the CE and MMT authors released to this module's layout.

    The released files are pickled dicts of numpy arrays, read with a restricted unpickler
    (:class:`vlret.data.formats.experts.pickles.RestrictedUnpickler`: numpy arrays, numpy scalars
    and
    builtin containers only; any other ``module.name`` is refused before it is imported). Two
    forms:

    (a) ``src`` is a folder of per-expert pickles ``{video_id: array}``, one file per expert,
        the expert named by the file stem (or by ``experts={name: relative path}``). This is
        how both releases store features: CE (albanie/collaborative-experts) one file per
        expert and aggregation, e.g. ``aggregated_<feature>_<fps>fps_.../<model>-avg.pickle``
        (``(D,)`` per video; ``-raw`` files hold ``(T, D)`` frames), and the older MSR-VTT
        files such as ``Audio_MSRVTT_new.pickle`` or ``I3D_MSRVTT_new.pickle``; MMT
        (gabeur/mmt, its challenge features) one file per expert and aggregation, ``fixed_seg``
        with ``(T, D)`` segments and ``avg`` / ``max`` with ``(1, D)`` (converted to pooled
        ``(D,)``). Text-feature and caption pickles in the same folders are not video experts:
        select the experts with ``experts``.
    (b) ``src`` is one pickle ``{video_id: {expert: array}}``, the per-video organisation
        (MMT's ECCV 2020 features are stored per video, ``features.<expert>`` in one HDF5
        file each; dumped to one pickle of dicts they convert in this form).

    An entry is *missing* (the video lacks the expert: ``present`` False) when its key is
    absent, or it is ``None``, a NaN number (CE's marker, ``float("nan")``), an empty array,
    or an array of NaN only (MMT tests the first value for NaN). An array that is only partly
    NaN / inf is an error. ``(D,)`` entries make a pooled expert, ``(T, D)`` a temporal one
    (``(1, D)`` throughout: pooled). Rows follow the videos' first appearance, expert by
    expert. Every expert is held in memory until written (the released MSR-VTT files take a
    few GB).

    Args:
        src: The folder (a) or the pickle (b).
        out: The output folder (:func:`write_expert_features`).
        experts: None: every expert found; a list of names; or a mapping expert name -> file
            path relative to ``src`` (a) / key of the per-video dicts (b).
        max_frames: Temporal expert -> the most frames kept per video.
        overwrite: Replace an existing ``out/experts.json``.
        flags: How errors name the arguments to change (keys of
            :data:`vlret.data.formats.experts.pickles.API_FLAGS`: ``experts``, ``experts_paths``,
            ``overwrite``, ``out``); ``vlret convert-experts`` passes its options.

    Returns:
        ``out``.

    Raises:
        OutputPathError: ``out`` is a file or cannot be written (checked before reading).
        FileExistsError: ``out`` holds ``experts.json`` and not ``overwrite``.
        FileNotFoundError: ``src`` or a named file is missing.
        DataFormatError: A refused or malformed pickle (the file, and where it applies the
            video, expert and refused ``module.name``, are named).
        ValueError: Bad ``experts`` or ``max_frames``.
    """
    names = {**API_FLAGS, **(flags or {})}
    out = check_output_dir(out, names["out"])
    if (out / EXPERTS_JSON).exists() and not overwrite:
        raise FileExistsError(
            f"{out / EXPERTS_JSON}: exists; pass {names['overwrite']} to replace it"
        )
    video_ids, entries = read_released_experts(src, experts=experts, flags=flags)
    return write_expert_features(
        out, video_ids, entries, max_frames=max_frames, overwrite=overwrite
    )


__all__ = [
    "EXPERTS_JSON",
    "EXPERT_IDS",
    "FEATURES_NPY",
    "FEATURE_IDS",
    "KINDS",
    "NAME_PATTERN",
    "ExpertFeatures",
    "ExpertNonFinite",
    "ExpertSpec",
    "VideoFeatures",
    "convert_experts",
    "expert_paths",
    "read_expert_specs",
    "write_expert_features",
]
