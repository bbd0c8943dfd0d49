"""The expert feature pickles released with CE and MMT, read without running their code.

A pickle can name any importable callable and call it while loading (``os.system`` included),
so the released files are read with :class:`RestrictedUnpickler`: it resolves only what numpy
arrays and builtin containers need and refuses every other ``module.name`` with a
:class:`~vlret.data.checks.DataFormatError`, before anything is imported or called.
:func:`read_released_experts` turns the two forms of the files into per-expert entries for
:func:`vlret.data.experts.write_expert_features` (:func:`vlret.data.experts.convert_experts`).
"""

from __future__ import annotations

import codecs
import collections
import pickle
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .checks import DataFormatError, require_file
from .expert_layout import NAME_PATTERN

PICKLE_SUFFIXES = (".pkl", ".pickle")
_ALLOWED_WHAT = (
    "only numpy arrays, numpy scalars and builtin containers (dict, list, tuple, set, "
    "frozenset, OrderedDict) are loaded"
)


def _latin1_encode(text: str, encoding: str = "latin1") -> bytes:
    """``_codecs.encode`` as pickles of bytes (protocols 0-2) use it: latin-1 only."""
    if encoding.replace("-", "").replace("_", "").lower() != "latin1" or not isinstance(text, str):
        raise pickle.UnpicklingError(f"_codecs.encode with encoding {encoding!r} is refused")
    return codecs.encode(text, "latin1")


def _bytes(*args: Any) -> bytes:
    """``bytes`` as pickles of empty bytes (protocols 0-2) use it: no size argument."""
    if args and not isinstance(args[0], str | bytes):
        raise pickle.UnpicklingError(f"bytes({type(args[0]).__name__}) is refused")
    return bytes(*args)


def _allowed_globals() -> dict[tuple[str, str], Any]:
    """``(module, name) -> object`` for everything a pickle of numpy arrays may name."""
    try:
        from numpy._core import multiarray, numeric
    except ImportError:  # numpy < 2
        from numpy.core import multiarray, numeric  # type: ignore[no-redef]
    table: dict[tuple[str, str], Any] = {
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        ("_codecs", "encode"): _latin1_encode,
        ("builtins", "bytes"): _bytes,
        ("__builtin__", "bytes"): _bytes,
        ("collections", "OrderedDict"): collections.OrderedDict,
    }
    for core in ("numpy.core", "numpy._core"):  # numpy 1 and numpy 2 write different names
        table[(f"{core}.multiarray", "_reconstruct")] = multiarray._reconstruct
        table[(f"{core}.multiarray", "scalar")] = multiarray.scalar
        # private numpy, absent from its stubs
        table[(f"{core}.numeric", "_frombuffer")] = numeric._frombuffer  # type: ignore[attr-defined]
    for kind in (dict, list, tuple, set, frozenset):
        for module in ("builtins", "__builtin__"):  # Python 3 and Python 2 pickles
            table[(module, kind.__name__)] = kind
    return table


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that admits numpy arrays and builtin containers only.

    Args:
        file: The open binary file.
        path: Its path, named in errors.

    Raises:
        DataFormatError: From :meth:`load`, for any other global (``module.name`` named) or a
            persistent id.
    """

    _ALLOWED: dict[tuple[str, str], Any] | None = None

    def __init__(self, file: Any, path: str | Path) -> None:
        # latin1: Python 2 pickles of numpy arrays hold their data as 8-bit strings.
        super().__init__(file, encoding="latin1")
        self.path = Path(path)
        if RestrictedUnpickler._ALLOWED is None:
            RestrictedUnpickler._ALLOWED = _allowed_globals()

    def find_class(self, module: str, name: str) -> Any:
        """Resolve an allowed global; refuse anything else without importing it."""
        found = (self._ALLOWED or {}).get((module, name))
        if found is None:
            raise DataFormatError(self.path, f"refuses to load {module}.{name}: {_ALLOWED_WHAT}")
        return found

    def persistent_load(self, pid: Any) -> Any:
        """Refuse persistent ids (no released feature file uses them)."""
        raise DataFormatError(self.path, f"refuses a persistent id {pid!r:.60}: {_ALLOWED_WHAT}")


def load_pickle(path: str | Path) -> Any:
    """Load a pickle with :class:`RestrictedUnpickler`.

    Raises:
        FileNotFoundError: The file is missing.
        DataFormatError: A refused global, or not a readable pickle.
    """
    path = Path(path)
    require_file(path, "a pickle of numpy arrays")
    with path.open("rb") as f:
        try:
            return RestrictedUnpickler(f, path).load()
        except DataFormatError:
            raise
        except Exception as err:  # a corrupt pickle raises almost anything
            raise DataFormatError(
                path, f"not a readable pickle ({type(err).__name__}: {err}); {_ALLOWED_WHAT}"
            ) from None


def missing(value: Any) -> bool:
    """Whether a released entry means "this video lacks the expert": ``None``, a NaN number
    (CE's marker), an empty array, or an array of NaN only (MMT tests the first value)."""
    if value is None:
        return True
    if isinstance(value, float | np.floating) or (
        isinstance(value, np.ndarray) and value.ndim == 0
    ):
        return bool(np.isnan(value))
    if isinstance(value, np.ndarray) and np.issubdtype(value.dtype, np.number):
        return value.size == 0 or bool(np.isnan(value).all())
    return False


def _entry(value: Any, path: Path, vid: str, name: str) -> np.ndarray | None:
    """One video's checked features (float32, ``(D,)`` or ``(T, D)``), or None if missing."""
    if missing(value):
        return None
    where = f"video {vid!r}, expert {name}"
    if not isinstance(value, np.ndarray):
        hint: dict[type, str] = {
            dict: " (a per-video dict: pass this file itself as SRC)",
            list: "",
        }
        raise DataFormatError(
            path,
            f"{where}: a {type(value).__name__}{hint.get(type(value), '')}; expected a numpy "
            "array of features (None, NaN or an empty array for a missing one)",
        )
    if not (np.issubdtype(value.dtype, np.floating) or np.issubdtype(value.dtype, np.integer)):
        raise DataFormatError(path, f"{where}: dtype {value.dtype}; expected float features")
    if value.ndim not in (1, 2) or 0 in value.shape:
        raise DataFormatError(path, f"{where}: shape {value.shape}; expected (D,) or (T, D)")
    arr = value.astype(np.float32, copy=False)
    bad = int((~np.isfinite(arr)).sum())
    if bad:
        raise DataFormatError(
            path,
            f"{where}: {bad} of its {arr.size} values are NaN or inf; expected finite features "
            "(or all NaN for a missing one)",
        )
    return arr


def _table(data: Any, path: Path, name: str, key: Any = None) -> dict[str, np.ndarray | None]:
    """``{video: entry}`` of one expert from ``{video: array}`` or, with ``key``, from
    ``{video: {key: array}}``."""
    if not isinstance(data, dict):
        raise DataFormatError(
            path, f"holds a {type(data).__name__}; expected a dict keyed by video id"
        )
    out: dict[str, np.ndarray | None] = {}
    for vid, value in data.items():
        if not isinstance(vid, str) or not vid.strip() or vid != vid.strip():
            raise DataFormatError(path, f"key {vid!r:.60}; expected video ids (non-empty str)")
        if key is not None:
            if not isinstance(value, dict):
                raise DataFormatError(
                    path, f"video {vid!r}: a {type(value).__name__}; expected {{expert: array}}"
                )
            value = value.get(key)
        out[vid] = _entry(value, path, vid, name)
    _check_shapes(out, path, name)
    return out


def _check_shapes(table: dict[str, np.ndarray | None], path: Path, name: str) -> None:
    """One rank and size per expert; ``(1, D)`` entries throughout (MMT's ``avg``/``max``
    files) become pooled ``(D,)``."""
    present = [(v, a) for v, a in table.items() if a is not None]
    if not present:
        raise DataFormatError(path, f"expert {name}: no video has features")
    vid0, a0 = present[0]
    for vid, arr in present[1:]:
        if arr.ndim != a0.ndim or arr.shape[-1] != a0.shape[-1]:
            raise DataFormatError(
                path,
                f"expert {name}: video {vid!r} has shape {arr.shape} but video {vid0!r} has "
                f"{a0.shape}; expected one rank and one feature size",
            )
    if a0.ndim == 2 and all(a.shape[0] == 1 for _, a in present):
        for vid, arr in present:
            table[vid] = arr[0]


def read_released_experts(
    src: str | Path, *, experts: Sequence[str] | Mapping[str, str] | None = None
) -> tuple[list[str], dict[str, list[np.ndarray | None]]]:
    """Read released expert pickles (the forms of :func:`vlret.data.experts.convert_experts`).

    Args:
        src: A folder of per-expert pickles, or one pickle of per-video dicts.
        experts: None: every expert (every ``.pkl``/``.pickle`` file under the folder, named
            by its stem; every key of the per-video dicts). A list: those names. A mapping:
            expert name -> file path relative to the folder, or -> key of the per-video dicts.

    Returns:
        The video ids (first appearance, expert by expert) and, per expert, one entry per
        video (None where missing).

    Raises:
        FileNotFoundError: ``src`` or a named file is missing.
        DataFormatError: A refused or unreadable pickle, an unexpected structure, an entry
            that is not a float array, partly non-finite features, an expert absent for every
            video or of varying rank or size, or an unknown expert (the known are listed).
    """
    src = Path(src)
    if isinstance(experts, str):
        raise ValueError(f"experts must be a list or a mapping of names, got {experts!r}")
    if src.is_dir():
        tables = {n: _table(load_pickle(p), p, n) for n, p in _expert_files(src, experts).items()}
    elif src.is_file():
        data = load_pickle(src)
        keys = _per_video_keys(data, src, experts)
        tables = {name: _table(data, src, name, key) for name, key in keys.items()}
    else:
        raise FileNotFoundError(f"{src}: missing; expected a folder of pickles or a pickle")
    ids: dict[str, None] = {}
    for table in tables.values():
        ids.update(dict.fromkeys(table))
    return list(ids), {n: [t.get(v) for v in ids] for n, t in tables.items()}


def _checked_name(name: Any, path: Path, what: str) -> str:
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise DataFormatError(
            path,
            f"{what} {name!r} is not an expert name ([A-Za-z0-9_-]+); pass experts={{name: ...}}",
        )
    return name


def _expert_files(src: Path, experts: Sequence[str] | Mapping[str, str] | None) -> dict[str, Path]:
    """Expert name -> pickle of a folder (form a)."""
    if isinstance(experts, Mapping):
        return {
            _checked_name(n, src, "the name"): require_file(src / p, f"the pickle of expert {n}")
            for n, p in experts.items()
        }
    files = sorted(p for p in src.rglob("*") if p.is_file() and p.suffix in PICKLE_SUFFIXES)
    if not files:
        raise DataFormatError(src, f"holds no {' or '.join(PICKLE_SUFFIXES)} file")
    by_stem: dict[str, Path] = {}
    for path in files:
        if path.stem in by_stem:
            raise DataFormatError(
                path,
                f"has the name of {by_stem[path.stem]}; name the experts with "
                "experts={name: relative path}",
            )
        by_stem[path.stem] = path
    if experts is None:
        return {_checked_name(s, p, "the file stem"): p for s, p in by_stem.items()}
    unknown = [n for n in experts if n not in by_stem]
    if unknown:
        raise DataFormatError(
            src, f"has no pickle for expert {unknown[0]!r}; it has {list(by_stem)}"
        )
    return {_checked_name(n, by_stem[n], "the file stem"): by_stem[n] for n in experts}


def _per_video_keys(
    data: Any, path: Path, experts: Sequence[str] | Mapping[str, str] | None
) -> dict[str, Any]:
    """Expert name -> key of the per-video dicts (form b)."""
    if not isinstance(data, dict):
        raise DataFormatError(
            path, f"holds a {type(data).__name__}; expected {{video id: {{expert: array}}}}"
        )
    known: dict[Any, None] = {}
    for vid, value in data.items():
        if not isinstance(value, dict):
            raise DataFormatError(
                path,
                f"video {vid!r:.60}: a {type(value).__name__}; expected {{expert: array}} (a "
                "per-expert file {video: array} goes in a folder given as SRC)",
            )
        known.update(dict.fromkeys(value))
    if isinstance(experts, Mapping):
        pairs = dict(experts)
    elif experts is None:
        pairs = {k: k for k in known}
    else:
        pairs = {n: n for n in experts}
    for name, key in pairs.items():
        _checked_name(name, path, "the expert")
        if key not in known:
            raise DataFormatError(path, f"no video has expert {key!r}; they have {list(known)}")
    if not pairs:
        raise DataFormatError(path, "no video has any expert")
    return pairs


__all__ = [
    "PICKLE_SUFFIXES",
    "RestrictedUnpickler",
    "load_pickle",
    "missing",
    "read_released_experts",
]
