"""The multi-expert feature layout of :mod:`vlret.data.formats.experts.features`: its
``experts.json`` entries (:class:`ExpertSpec`), file names, and the writer
:func:`write_expert_features`.


Import these from :mod:`vlret.data.formats.experts.features`, which documents the layout and
reads it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np

from ...checks import DataFormatError, read_json
from ..karpathy_json import locate_json_line

EXPERTS_JSON = "experts.json"
EXPERT_IDS = "video_ids.txt"
FORMAT = "vlret-experts"
VERSION = 1
KINDS = ("pooled", "temporal")
NAME_PATTERN = re.compile(r"[A-Za-z0-9_-]+")
LAYOUT = (
    '{"format": "vlret-experts", "version": 1, "experts": [{"name", "kind": "pooled" | '
    '"temporal", "dim", "max_frames" (temporal only)}]}'
)


@dataclass(frozen=True)
class ExpertSpec:
    """One expert of a feature folder (an entry of ``experts.json``).

    Attributes:
        name: The expert's name (``[A-Za-z0-9_-]+``).
        kind: ``"pooled"`` (one ``(D,)`` vector per video) or ``"temporal"`` (``(T, D)``).
        dim: The feature size ``D``.
        max_frames: ``T``, the frames stored per video (temporal experts only).

    Raises:
        ValueError: A bad name, kind, dim or max_frames.
    """

    name: str
    kind: str
    dim: int
    max_frames: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not NAME_PATTERN.fullmatch(self.name):
            raise ValueError(f"expert name must match [A-Za-z0-9_-]+, got {self.name!r}")
        if self.kind not in KINDS:
            raise ValueError(f"expert {self.name}: kind must be one of {KINDS}, got {self.kind!r}")
        if not positive_int(self.dim):
            raise ValueError(f"expert {self.name}: dim must be a positive int, got {self.dim!r}")
        if self.temporal != positive_int(self.max_frames):
            want = "a positive int" if self.temporal else "None"
            raise ValueError(
                f"expert {self.name}: max_frames must be {want} for a {self.kind} expert, got "
                f"{self.max_frames!r}"
            )

    @property
    def temporal(self) -> bool:
        """Whether the expert has frames."""
        return self.kind == "temporal"

    @property
    def shape(self) -> tuple[int, ...]:
        """One video's feature shape: ``(dim,)`` or ``(max_frames, dim)``."""
        if self.temporal:  # then max_frames is an int (checked on construction)
            return (cast(int, self.max_frames), self.dim)
        return (self.dim,)

    def to_json(self) -> dict:
        """The ``experts.json`` entry."""
        entry: dict = {"name": self.name, "kind": self.kind, "dim": self.dim}
        if self.temporal:
            entry["max_frames"] = self.max_frames
        return entry


def positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def expert_paths(folder: str | Path, name: str) -> dict[str, Path]:
    """The files of expert ``name`` in ``folder``: ``"features"``, ``"present"``, ``"frames"``."""
    folder = Path(folder)
    return {
        "features": folder / f"{name}.npy",
        "present": folder / f"{name}.present.npy",
        "frames": folder / f"{name}.frames.npy",
    }


# ------------------------------------------------------------------------------ writer


def write_expert_features(
    out_dir: str | Path,
    video_ids: Sequence[str],
    experts: Mapping[str, Sequence[np.ndarray | None]],
    *,
    max_frames: Mapping[str, int] | None = None,
    overwrite: bool = False,
) -> Path:
    """Write a multi-expert feature folder (the module docstring's layout).

    Each expert's kind comes from its present entries: ``(D,)`` arrays make a pooled expert,
    ``(T, D)`` arrays a temporal one (``T`` may vary per video: padded with zeros to the
    longest, or truncated to ``max_frames[name]``). The files are written to a temporary folder
    inside ``out_dir`` and moved into place, ``experts.json`` last, so a crash never leaves an
    ``experts.json`` describing half-written arrays.

    Args:
        out_dir: The folder (created if missing).
        video_ids: The video of each row, unique, without whitespace.
        experts: Expert name -> one entry per video, in ``video_ids`` order: ``None`` where
            the video lacks the expert, else a float array. Mapping order = expert order.
        max_frames: Temporal expert name -> the most frames kept per video.
        overwrite: Replace an existing folder's ``experts.json`` (and the files of its
            experts).

    Returns:
        ``out_dir``.

    Raises:
        ValueError: Bad ids, an unknown or pooled ``max_frames`` name, entries of another
            length than ``video_ids``, an expert absent for every video, or entries of one
            expert disagreeing on rank or size.
        FileExistsError: ``out_dir`` already holds ``experts.json`` and not ``overwrite``.
    """
    out = Path(out_dir)
    ids = _check_ids(video_ids)
    if not experts:
        raise ValueError("experts is empty; expected at least one expert")
    caps = dict(max_frames or {})
    unknown = sorted(set(caps) - set(experts))
    if unknown:
        raise ValueError(f"max_frames names unknown experts {unknown}; experts: {list(experts)}")
    specs = [_plan_expert(name, experts[name], len(ids), caps.get(name)) for name in experts]
    if (out / EXPERTS_JSON).exists() and not overwrite:
        raise FileExistsError(f"{out / EXPERTS_JSON}: exists; pass overwrite=True to replace it")
    out.mkdir(parents=True, exist_ok=True)
    stale = _old_files(out) if overwrite else set()
    tmp = Path(tempfile.mkdtemp(prefix=".experts-", dir=out))
    try:
        for spec in specs:
            _write_expert(tmp, spec, experts[spec.name])
        (tmp / EXPERT_IDS).write_text("".join(f"{v}\n" for v in ids), encoding="utf-8")
        meta = {"format": FORMAT, "version": VERSION, "experts": [s.to_json() for s in specs]}
        (tmp / EXPERTS_JSON).write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
        (out / EXPERTS_JSON).unlink(missing_ok=True)
        written = {p.name for p in tmp.iterdir()}
        for name in sorted(written - {EXPERTS_JSON}):
            os.replace(tmp / name, out / name)
        for name in sorted(stale - written):
            (out / name).unlink(missing_ok=True)
        os.replace(tmp / EXPERTS_JSON, out / EXPERTS_JSON)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _check_ids(video_ids: Sequence[str]) -> list[str]:
    ids = list(video_ids)
    if not ids:
        raise ValueError("video_ids is empty; expected at least one video")
    seen: set[str] = set()
    for k, vid in enumerate(ids):
        if not isinstance(vid, str) or not vid or vid != vid.strip() or "\n" in vid:
            raise ValueError(
                f"video_ids[{k}] = {vid!r}; expected a non-empty id, no surrounding whitespace"
            )
        if vid in seen:
            raise ValueError(f"video_ids[{k}] = {vid!r} repeats an earlier id")
        seen.add(vid)
    return ids


def _plan_expert(
    name: str, entries: Sequence[np.ndarray | None], n: int, cap: int | None
) -> ExpertSpec:
    """The spec of one expert's entries (checked)."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise ValueError(f"expert name must match [A-Za-z0-9_-]+, got {name!r}")
    if len(entries) != n:
        raise ValueError(f"expert {name}: {len(entries)} entries for {n} video_ids")
    first: tuple[int, tuple[int, ...]] | None = None
    longest = 0
    for k, entry in enumerate(entries):
        if entry is None:
            continue
        arr = np.asarray(entry)
        if not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
            raise ValueError(f"expert {name}, video {k}: dtype {arr.dtype}; expected floats")
        if arr.ndim not in (1, 2) or 0 in arr.shape:
            raise ValueError(
                f"expert {name}, video {k}: shape {arr.shape}; expected (D,) or (T, D) with "
                "T, D >= 1 (None for a video without the expert)"
            )
        if first is None:
            first = (k, arr.shape)
        elif arr.ndim != len(first[1]) or arr.shape[-1] != first[1][-1]:
            raise ValueError(
                f"expert {name}: video {k} has shape {arr.shape} but video {first[0]} has "
                f"{first[1]}; expected one rank and one feature size"
            )
        longest = max(longest, arr.shape[0] if arr.ndim == 2 else 1)
    if first is None:
        raise ValueError(f"expert {name}: None for every video; its kind and size are unknown")
    if len(first[1]) == 1:
        if cap is not None:
            raise ValueError(f"max_frames[{name!r}] given for a pooled expert")
        return ExpertSpec(name, "pooled", int(first[1][0]))
    if cap is not None and not positive_int(cap):
        raise ValueError(f"max_frames[{name!r}] must be a positive int, got {cap!r}")
    frames = longest if cap is None else min(longest, cap)
    return ExpertSpec(name, "temporal", int(first[1][-1]), frames)


def _write_expert(folder: Path, spec: ExpertSpec, entries: Sequence[np.ndarray | None]) -> None:
    paths = expert_paths(folder, spec.name)
    n = len(entries)
    array = np.lib.format.open_memmap(
        paths["features"], mode="w+", dtype=np.float32, shape=(n, *spec.shape)
    )
    present = np.zeros(n, dtype=bool)
    frames = np.zeros(n, dtype=np.int64)
    for k, entry in enumerate(entries):
        if entry is None:
            continue
        arr = np.asarray(entry, dtype=np.float32)
        present[k] = True
        if spec.temporal:
            assert spec.max_frames is not None  # a temporal expert's
            t = min(len(arr), spec.max_frames)
            array[k, :t] = arr[:t]
            frames[k] = t
        else:
            array[k] = arr
    array.flush()
    del array
    np.save(paths["present"], present)
    if spec.temporal:
        np.save(paths["frames"], frames)


def _old_files(out: Path) -> set[str]:
    """The files of the experts an existing ``experts.json`` lists (to remove on overwrite)."""
    try:
        data = json.loads((out / EXPERTS_JSON).read_text(encoding="utf-8"))
        names = [e["name"] for e in data["experts"]]
    except (OSError, ValueError, KeyError, TypeError):
        return set()
    return {
        p.name
        for name in names
        if isinstance(name, str) and NAME_PATTERN.fullmatch(name)
        for p in expert_paths(out, name).values()
    }


# ------------------------------------------------------------------------------ reader


def read_expert_specs(path: str | Path) -> list[ExpertSpec]:
    """Parse and validate ``experts.json``.

    Raises:
        FileNotFoundError: The file is missing.
        DataFormatError: Not JSON of the module's layout; the message names the entry and,
            where it can be found, its line.
    """
    path = Path(path)
    data = read_json(path, "the expert list " + LAYOUT)

    def fail(message: str, at: tuple = ()) -> DataFormatError:
        line = locate_json_line(path, at) if at else None
        return DataFormatError(path, f"{message}; expected {LAYOUT}", line=line)

    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise fail(f"format is not {FORMAT!r}")
    if data.get("version") != VERSION:
        raise fail(f"version {data.get('version')!r} (this reader knows {VERSION})", ("version",))
    entries = data.get("experts")
    if not isinstance(entries, list) or not entries:
        raise fail("'experts' is not a non-empty list")
    specs: list[ExpertSpec] = []
    for k, entry in enumerate(entries):
        at = ("experts", k)
        if not isinstance(entry, dict):
            raise fail(f"experts[{k}] is {type(entry).__name__}", at)
        extra = sorted(set(entry) - {"name", "kind", "dim", "max_frames"})
        if extra:
            raise fail(f"experts[{k}] has unknown keys {extra}", (*at, extra[0]))
        try:
            # unchecked JSON values (None where missing): ExpertSpec checks them
            values: dict[str, Any] = {
                key: entry.get(key) for key in ("name", "kind", "dim", "max_frames")
            }
            spec = ExpertSpec(**values)
        except ValueError as err:
            raise fail(f"experts[{k}]: {err}", at) from None
        if spec.name in {s.name for s in specs}:
            raise fail(f"experts[{k}]: the name {spec.name!r} repeats", (*at, "name"))
        specs.append(spec)
    return specs


__all__ = [
    "EXPERTS_JSON",
    "EXPERT_IDS",
    "FORMAT",
    "KINDS",
    "LAYOUT",
    "NAME_PATTERN",
    "VERSION",
    "ExpertSpec",
    "expert_paths",
    "positive_int",
    "read_expert_specs",
    "write_expert_features",
]
