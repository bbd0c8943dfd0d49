"""The expert feature pickles released with CE and MMT, read without running their code.

A pickle can name any importable callable and call it while loading (``os.system`` included),
so the released files are read with :class:`RestrictedUnpickler`: it resolves only what numpy
arrays and builtin containers need and refuses every other ``module.name`` with a
:class:`~vlret.data.checks.DataFormatError`, before anything is imported or called. What it
admits is bounded while loading (``numpy.ndarray`` only as ``_reconstruct``'s argument,
``_reconstruct`` only of the empty array numpy pickles, containers only from containers: no
view of a few bytes as a huge array) and after (at most :data:`MAX_NESTING` levels and
:data:`MAX_ELEMENTS` elements counted through shared references, no container holding
itself). :func:`read_released_experts` turns the two forms of the files into per-expert
entries for :func:`vlret.data.formats.experts.features.write_expert_features`
(:func:`vlret.data.formats.experts.features.convert_experts`).
"""

from __future__ import annotations

import codecs
import collections
import pickle
import reprlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ...checks import DataFormatError, require_file
from .layout import NAME_PATTERN

PICKLE_SUFFIXES = (".pkl", ".pickle")
_ALLOWED_WHAT = (
    "only numpy arrays, numpy scalars and builtin containers (dict, list, tuple, set, "
    "frozenset, OrderedDict) are loaded"
)
#: the most containers a released pickle nests (video -> expert -> array is 2)
MAX_NESTING = 32
#: the most container elements a released pickle holds, a shared container counted each time
#: it is reached (what a walk or a copy would visit)
MAX_ELEMENTS = 50_000_000

_CONTAINERS = (dict, list, tuple, set, frozenset)


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 3, 60, 60


def _shown(value: Any) -> str:
    """A short repr of a value from a pickle (bounded however deep or wide it is)."""
    return _REPR.repr(value)


class _Refused(pickle.UnpicklingError):
    """A call the restricted unpickler refuses (the message says which)."""


def _children(node: Any) -> Any:
    if isinstance(node, dict):
        return [*node.keys(), *node.values()]
    if isinstance(node, _CONTAINERS):
        return node
    return vars(node).values()  # an argparse.Namespace (reference checkpoints)


def container_bounds_problem(
    obj: Any, *, max_nesting: int, max_elements: int, walk: tuple[type, ...] = ()
) -> str | None:
    """Why the containers of a loaded pickle are out of bounds, or None: nested deeper than
    ``max_nesting``, holding more than ``max_elements`` elements counted through shared
    references (a list of a list of ... shared at each level is tiny pickled and exponential
    when walked), or holding itself. Containers are dicts, lists, tuples, sets and the
    ``walk`` types (their ``vars``); one pass over the distinct containers, without recursion.
    """
    kinds = _CONTAINERS + walk
    if not isinstance(obj, kinds):
        return None
    expanded: dict[int, int] = {}  # id -> elements reached from it; id -> nesting below
    nesting: dict[int, int] = {}
    entered: set[int] = set()
    stack: list[tuple[Any, bool]] = [(obj, False)]
    while stack:
        node, leaving = stack.pop()
        key = id(node)
        if leaving:
            kids = [k for k in _children(node) if isinstance(k, kinds)]
            expanded[key] = len(_children(node)) + sum(expanded[id(k)] for k in kids)
            nesting[key] = 1 + max((nesting[id(k)] for k in kids), default=0)
            if nesting[key] > max_nesting:
                return f"nests containers more than {max_nesting} levels deep"
            if expanded[key] > max_elements:
                return (
                    f"holds more than {max_elements} container elements counted through shared "
                    f"references (a {type(node).__name__} in it reaches {expanded[key]})"
                )
            continue
        if key in expanded:
            continue
        if key in entered:  # entered and not left: reached from its own contents
            return f"holds a {type(node).__name__} that contains itself"
        entered.add(key)
        stack.append((node, True))
        stack.extend((k, False) for k in _children(node) if isinstance(k, kinds))
    return None


def _container(kind: type) -> Any:
    """``kind`` as a pickle may call it: nothing, or one builtin container to copy."""

    def make(*args: Any) -> Any:
        if len(args) > 1 or (args and not isinstance(args[0], _CONTAINERS)):
            shown = ", ".join(type(a).__name__ for a in args)
            raise _Refused(f"refuses {kind.__name__}({shown}): {_ALLOWED_WHAT}")
        return kind(*args)

    return make


class _NdarrayType:
    """``numpy.ndarray`` as the first argument of ``_reconstruct``, the one use a pickle of
    arrays makes of it; called directly (a view of any shape and strides over a few bytes) it
    is refused."""

    def __call__(self, *args: Any) -> Any:
        raise _Refused(
            "refuses a direct call of numpy.ndarray (an array built around other data, not "
            "a pickled array)"
        )


_NDARRAY = _NdarrayType()


def _latin1_encode(text: str, encoding: str = "latin1") -> bytes:
    """``_codecs.encode`` as pickles of bytes (protocols 0-2) use it: latin-1 only."""
    name = encoding.replace("-", "").replace("_", "").lower() if isinstance(encoding, str) else ""
    if name != "latin1" or not isinstance(text, str):
        raise _Refused(f"refuses _codecs.encode with encoding {_shown(encoding)}")
    return codecs.encode(text, "latin1")


def _bytes(*args: Any) -> bytes:
    """``bytes`` as pickles of empty bytes (protocols 0-2) use it: no size argument."""
    if args and not isinstance(args[0], str | bytes):
        raise _Refused(f"refuses bytes({type(args[0]).__name__})")
    return bytes(*args)


def _allowed_globals() -> dict[tuple[str, str], Any]:
    """``(module, name) -> object`` for everything a pickle of numpy arrays may name."""
    try:
        from numpy._core import multiarray, numeric
    except ImportError:  # numpy < 2
        from numpy.core import multiarray, numeric  # type: ignore[no-redef]

    def reconstruct(subtype: Any, shape: Any, dtype: Any) -> Any:
        # numpy pickles an array as _reconstruct(ndarray, (0,), b"b") and its data as state
        if subtype is not _NDARRAY or tuple(shape) != (0,):
            raise _Refused(
                f"refuses _reconstruct of shape {_shown(shape)}: numpy pickles an empty array and "
                "its data, never an array of a given shape without its data"
            )
        return multiarray._reconstruct(np.ndarray, shape, dtype)

    table: dict[tuple[str, str], Any] = {
        ("numpy", "ndarray"): _NDARRAY,
        ("numpy", "dtype"): np.dtype,
        ("_codecs", "encode"): _latin1_encode,
        ("builtins", "bytes"): _bytes,
        ("__builtin__", "bytes"): _bytes,
        ("collections", "OrderedDict"): _container(collections.OrderedDict),
    }
    for core in ("numpy.core", "numpy._core"):  # numpy 1 and numpy 2 write different names
        table[(f"{core}.multiarray", "_reconstruct")] = reconstruct
        table[(f"{core}.multiarray", "scalar")] = multiarray.scalar
        # private numpy, absent from its stubs
        table[(f"{core}.numeric", "_frombuffer")] = numeric._frombuffer  # type: ignore[attr-defined]
    for kind in (dict, list, tuple, set, frozenset):
        for module in ("builtins", "__builtin__"):  # Python 3 and Python 2 pickles
            table[(module, kind.__name__)] = _container(kind)
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
        raise DataFormatError(self.path, f"refuses a persistent id {_shown(pid)}: {_ALLOWED_WHAT}")


def load_pickle(path: str | Path) -> Any:
    """Load a pickle with :class:`RestrictedUnpickler`; its containers are bounded
    (:data:`MAX_NESTING` levels, :data:`MAX_ELEMENTS` elements counted through shared
    references, no container holding itself).

    Raises:
        FileNotFoundError: The file is missing.
        DataFormatError: A refused global or call, containers out of bounds, or not a
            readable pickle.
    """
    path = Path(path)
    require_file(path, "a pickle of numpy arrays")
    with path.open("rb") as f:
        try:
            data = RestrictedUnpickler(f, path).load()
        except DataFormatError:
            raise
        except _Refused as err:
            raise DataFormatError(path, str(err)) from None
        except Exception as err:  # a corrupt pickle raises almost anything
            first = (str(err).strip().splitlines() or [""])[0][:200]
            raise DataFormatError(
                path, f"not a readable pickle ({type(err).__name__}: {first}); {_ALLOWED_WHAT}"
            ) from None
    problem = container_bounds_problem(data, max_nesting=MAX_NESTING, max_elements=MAX_ELEMENTS)
    if problem:
        raise DataFormatError(path, f"refused: the pickle {problem}")
    return data


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
            raise DataFormatError(path, f"key {_shown(vid)}; expected video ids (non-empty str)")
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
    src: str | Path,
    *,
    experts: Sequence[str] | Mapping[str, str] | None = None,
    flags: Mapping[str, str] | None = None,
) -> tuple[list[str], dict[str, list[np.ndarray | None]]]:
    """Read released expert pickles (the forms of
    :func:`vlret.data.formats.experts.features.convert_experts`).

    Args:
        src: A folder of per-expert pickles, or one pickle of per-video dicts.
        experts: None: every expert (every ``.pkl``/``.pickle`` file under the folder, named
            by its stem; every key of the per-video dicts). A list: those names. A mapping:
            expert name -> file path relative to the folder, or -> key of the per-video dicts.
        flags: How errors name the arguments to change (:data:`API_FLAGS`' keys); a command
            passes its own options.

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
        files = _expert_files(src, experts, flags=flags)
        tables = {n: _table(load_pickle(p), p, n) for n, p in files.items()}
    elif src.is_file():
        data = load_pickle(src)
        keys = _per_video_keys(data, src, experts, flags=flags)
        tables = {name: _table(data, src, name, key) for name, key in keys.items()}
    else:
        raise FileNotFoundError(f"{src}: missing; expected a folder of pickles or a pickle")
    ids: dict[str, None] = {}
    for table in tables.values():
        ids.update(dict.fromkeys(table))
    return list(ids), {n: [t.get(v) for v in ids] for n, t in tables.items()}


#: how the errors of :func:`read_released_experts` name what to pass (the Python arguments)
API_FLAGS = {
    "experts": "experts={name: ...}",
    "experts_paths": "experts={name: relative path}",
    "overwrite": "overwrite=True",
    "out": "out",
}


def _checked_name(name: Any, path: Path, what: str, flags: Mapping[str, str] | None) -> str:
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        hint = {**API_FLAGS, **(flags or {})}["experts"]
        raise DataFormatError(
            path,
            f"{what} {_shown(name)} is not an expert name ([A-Za-z0-9_-]+); pass {hint}",
        )
    return name


def _expert_files(
    src: Path,
    experts: Sequence[str] | Mapping[str, str] | None,
    *,
    flags: Mapping[str, str] | None = None,
) -> dict[str, Path]:
    """Expert name -> pickle of a folder (form a)."""
    if isinstance(experts, Mapping):
        return {
            _checked_name(n, src, "the name", flags): require_file(
                src / p, f"the pickle of expert {n}"
            )
            for n, p in experts.items()
        }
    files = sorted(p for p in src.rglob("*") if p.is_file() and p.suffix in PICKLE_SUFFIXES)
    if not files:
        raise DataFormatError(src, f"holds no {' or '.join(PICKLE_SUFFIXES)} file")
    by_stem: dict[str, Path] = {}
    for path in files:
        if path.stem in by_stem:
            hint = {**API_FLAGS, **(flags or {})}["experts_paths"]
            raise DataFormatError(
                path, f"has the name of {by_stem[path.stem]}; name the experts with {hint}"
            )
        by_stem[path.stem] = path
    if experts is None:
        return {_checked_name(s, p, "the file stem", flags): p for s, p in by_stem.items()}
    unknown = [n for n in experts if n not in by_stem]
    if unknown:
        raise DataFormatError(
            src, f"has no pickle for expert {unknown[0]!r}; it has {list(by_stem)}"
        )
    return {_checked_name(n, by_stem[n], "the file stem", flags): by_stem[n] for n in experts}


def _per_video_keys(
    data: Any,
    path: Path,
    experts: Sequence[str] | Mapping[str, str] | None,
    *,
    flags: Mapping[str, str] | None = None,
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
                f"video {_shown(vid)}: a {type(value).__name__}; expected {{expert: array}} (a "
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
        _checked_name(name, path, "the expert", flags)
        if key not in known:
            raise DataFormatError(path, f"no video has expert {key!r}; they have {list(known)}")
    if not pairs:
        raise DataFormatError(path, "no video has any expert")
    return pairs


__all__ = [
    "API_FLAGS",
    "MAX_ELEMENTS",
    "MAX_NESTING",
    "PICKLE_SUFFIXES",
    "container_bounds_problem",
    "RestrictedUnpickler",
    "load_pickle",
    "missing",
    "read_released_experts",
]
