"""CVSE's concept files: the release's ``category_concepts.json``,
``all_<ds>_concept_label.json`` and ``<ds>_adj_concepts.pkl`` (written and read back), and
vlret's vocabulary map ``cvse_vocab_concepts.json``
(:mod:`vlret.models.matchers.cvse_concepts` says what each holds).

Pickles can run code while loading, so :func:`read_adjacency_pickle` uses an unpickler that
resolves nothing but what a pickle of numpy arrays needs (``numpy.ndarray`` only as
``_reconstruct``'s argument, ``_reconstruct`` only of the empty array numpy pickles,
``numpy.dtype``, protocol 5's ``_frombuffer`` of bytes, latin-1 ``_codecs.encode``), refuses
every other global before importing it, and reads at most ``max_bytes``: numpy arrays hold their
data in the file, so the file size bounds what loading allocates.
"""

from __future__ import annotations

import io
import json
import pickle
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..._files import atomic_write, atomic_write_text
from .cvse_concepts import ADJACENCY_KEYS, ConceptStats, check_concepts

#: File names of a concept folder; ``{ds}`` is the dataset name (``f30k``, ``coco``).
CATEGORY_FILE = "category_concepts.json"
LABELS_FILE = "all_{ds}_concept_label.json"
ADJACENCY_FILE = "{ds}_adj_concepts.pkl"
#: vlret's own file: the vocabulary the concepts were matched against (``{"vocab_size": V,
#: "concept_of_id": {id: concept}}``), read by the model to label captions from their ids.
VOCAB_CONCEPTS_FILE = "cvse_vocab_concepts.json"
#: The largest adjacency pickle read by default (300 concepts take about 2 MB).
MAX_PICKLE_BYTES = 256 * 2**20


def write_category_concepts(path: str | Path, concepts: Sequence[str]) -> Path:
    """Write ``category_concepts.json`` (``{word: index}``, index order)."""
    words = check_concepts(concepts)
    return atomic_write_text(path, json.dumps({w: i for i, w in enumerate(words)}, indent=1))


def read_category_concepts(path: str | Path) -> list[str]:
    """Read ``category_concepts.json`` back as the concept words in index order.

    Raises:
        FileNotFoundError: The file is missing.
        ValueError: Not ``{word: index}`` with indices ``0..C-1`` once each (names the file).
    """
    data = _read_json(path)
    if not isinstance(data, dict) or not data:
        raise ValueError(f"{path}: expected a JSON object {{concept word: index}}")
    words: list[str | None] = [None] * len(data)
    for word, index in data.items():
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(data):
            raise ValueError(f"{path}: {word!r} has index {index!r}; expected 0..{len(data) - 1}")
        if words[index] is not None:
            raise ValueError(f"{path}: index {index} given to {words[index]!r} and {word!r}")
        words[index] = word
    try:
        return check_concepts([w for w in words if w is not None])
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None


def write_concept_labels(path: str | Path, stats: ConceptStats) -> Path:
    """Write ``all_<ds>_concept_label.json``: one ``{"img_id", "concept_labels"}`` per image."""
    entries = [
        {"img_id": i, "concept_labels": list(map(int, labels))}
        for i, labels in zip(stats.image_ids, stats.labels, strict=True)
    ]
    return atomic_write_text(path, json.dumps(entries))


def read_concept_labels(path: str | Path, num_concepts: int) -> dict[str, list[int]]:
    """Read a labels file back: ``{img_id: concept indices}``.

    Raises:
        FileNotFoundError: The file is missing.
        ValueError: Not a list of such entries, a repeated id or an index out of range.
    """
    data = _read_json(path)
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of {{img_id, concept_labels}}")
    out: dict[str, list[int]] = {}
    for k, entry in enumerate(data):
        if not isinstance(entry, dict) or set(entry) != {"img_id", "concept_labels"}:
            raise ValueError(f"{path}: entry {k} must hold exactly img_id and concept_labels")
        img, labels = str(entry["img_id"]), entry["concept_labels"]
        if not isinstance(labels, list) or any(
            isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < num_concepts
            for x in labels
        ):
            raise ValueError(
                f"{path}: entry {k} concept_labels must be ints in 0..{num_concepts - 1}"
            )
        if img in out:
            raise ValueError(f"{path}: img_id {img!r} repeats (entry {k})")
        out[img] = labels
    return out


def write_adjacency_pickle(path: str | Path, stats: ConceptStats) -> Path:
    """Write ``<ds>_adj_concepts.pkl``: a pickle (protocol 2, readable by the release's
    Python 3.6) of the dict of :meth:`ConceptStats.adjacency`."""
    data = pickle.dumps(stats.adjacency(), protocol=2)
    return atomic_write(path, lambda fh: fh.write(data))


class _ArraysOnly(pickle.Unpickler):
    """Resolves only what a pickle of numpy arrays names; refuses any other global."""

    def __init__(self, file: Any, path: Path) -> None:
        super().__init__(file, encoding="latin1")  # Python 2 pickles hold array data as str
        self.path = path

    def find_class(self, module: str, name: str) -> Any:
        core = module.removeprefix("numpy._core.").removeprefix("numpy.core.")
        if (module, name) == ("numpy", "ndarray"):
            return _EmptyArrayType
        if (module, name) == ("numpy", "dtype"):
            return np.dtype
        if module != core and (core, name) == ("multiarray", "_reconstruct"):
            return _reconstruct
        if module != core and (core, name) == ("numeric", "_frombuffer"):
            return _frombuffer
        if (module, name) == ("_codecs", "encode"):
            return _latin1
        raise pickle.UnpicklingError(
            f"refuses {module}.{name}: only numpy arrays in builtin containers are loaded"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("refuses a persistent id")


class _EmptyArrayType:
    """``numpy.ndarray`` as ``_reconstruct``'s first argument; never called."""


def _reconstruct(subtype: Any, shape: Any, dtype: Any) -> np.ndarray:
    # numpy pickles an array as _reconstruct(ndarray, (0,), b"b") followed by its data
    if subtype is not _EmptyArrayType or tuple(shape) != (0,):
        raise pickle.UnpicklingError("refuses _reconstruct of anything but an empty ndarray")
    return np.ndarray((0,), dtype=np.uint8)


def _frombuffer(buf: Any, dtype: Any, shape: Any, order: str) -> np.ndarray:
    # protocol 5: the data in the file; reshape fails unless it holds exactly shape's bytes
    if not isinstance(buf, (bytes, bytearray)) or order not in ("C", "F"):
        raise pickle.UnpicklingError("refuses _frombuffer of anything but bytes")
    array = np.frombuffer(bytes(buf), dtype=dtype)
    return array.reshape(tuple(shape), order="C" if order == "C" else "F").copy()


def _latin1(text: Any, encoding: str = "latin1") -> bytes:
    if not isinstance(text, str) or encoding.replace("-", "").lower() != "latin1":
        raise pickle.UnpicklingError("refuses _codecs.encode other than latin-1 text")
    return text.encode("latin1")


def read_adjacency_pickle(
    path: str | Path, *, max_bytes: int = MAX_PICKLE_BYTES
) -> dict[str, np.ndarray]:
    """Read ``<ds>_adj_concepts.pkl`` safely (see the module docstring) and check it.

    Args:
        path: The pickle.
        max_bytes: Refuse a larger file.

    Returns:
        ``nums`` ``(C,)`` and ``adj_all``, ``adj_O_P``, ``adj_O_M`` ``(C, C)``, float64.

    Raises:
        FileNotFoundError: The file is missing.
        ValueError: Too large, not a readable pickle of numpy arrays, or keys / shapes /
            values not those of the release's file (the message names the file).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing; expected a CVSE adjacency pickle")
    size = path.stat().st_size
    if size > max_bytes:
        raise ValueError(f"{path}: {size} bytes, more than max_bytes={max_bytes}")
    raw = path.read_bytes()[: max_bytes + 1]
    try:
        data = _ArraysOnly(io.BytesIO(raw), path).load()
    except Exception as err:  # a corrupt or hostile pickle raises almost anything
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise ValueError(f"{path}: not a readable pickle of numpy arrays ({first})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: holds a {type(data).__name__}; expected a dict of arrays")
    missing = [k for k in ADJACENCY_KEYS if k not in data]
    if missing:
        raise ValueError(f"{path}: lacks key {missing[0]!r}; expected {list(ADJACENCY_KEYS)}")
    out = {}
    for key in ADJACENCY_KEYS:
        value = data[key]
        if not isinstance(value, np.ndarray) or not (
            np.issubdtype(value.dtype, np.integer) or np.issubdtype(value.dtype, np.floating)
        ):
            raise ValueError(f"{path}: {key} is not a numeric numpy array")
        out[key] = value.astype(np.float64)
        if not np.isfinite(out[key]).all() or (out[key] < 0).any():
            raise ValueError(f"{path}: {key} must hold finite non-negative counts")
    c = out["nums"].shape[0] if out["nums"].ndim == 1 else -1
    for key in ADJACENCY_KEYS[1:]:
        if out[key].shape != (c, c):
            raise ValueError(f"{path}: {key} has shape {out[key].shape}; expected ({c}, {c})")
    return out


def write_vocab_concepts(
    path: str | Path, vocab_words: Sequence[str], concepts: Sequence[str]
) -> Path:
    """Write :data:`VOCAB_CONCEPTS_FILE`: which vocabulary id is which concept (surface form)."""
    index = {w: i for i, w in enumerate(check_concepts(concepts))}
    pairs = {str(i): index[w] for i, w in enumerate(vocab_words) if w in index}
    return atomic_write_text(
        path, json.dumps({"vocab_size": len(vocab_words), "concept_of_id": pairs})
    )


def read_vocab_concepts(path: str | Path, num_concepts: int) -> tuple[int, dict[int, int]]:
    """Read :data:`VOCAB_CONCEPTS_FILE`: ``(vocab_size, {vocabulary id: concept})``.

    Raises:
        FileNotFoundError: The file is missing.
        ValueError: Malformed (the message names the file).
    """
    data = _read_json(path)
    if not isinstance(data, dict) or set(data) != {"vocab_size", "concept_of_id"}:
        raise ValueError(f"{path}: expected {{vocab_size, concept_of_id}}")
    size, pairs = data["vocab_size"], data["concept_of_id"]
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"{path}: vocab_size must be a positive int, got {size!r}")
    if not isinstance(pairs, dict):
        raise ValueError(f"{path}: concept_of_id must be an object {{id: concept}}")
    out: dict[int, int] = {}
    for key, concept in pairs.items():
        if not key.isdigit() or not int(key) < size:
            raise ValueError(f"{path}: id {key!r} outside 0..{size - 1}")
        if (
            isinstance(concept, bool)
            or not isinstance(concept, int)
            or not 0 <= concept < num_concepts
        ):
            raise ValueError(
                f"{path}: id {key} maps to {concept!r}; expected 0..{num_concepts - 1}"
            )
        out[int(key)] = concept
    return size, out


def write_concept_folder(
    out: str | Path, stats: ConceptStats, *, dataset: str, vocab_words: Sequence[str]
) -> list[Path]:
    """Write a concept folder: the release's three files and :data:`VOCAB_CONCEPTS_FILE`."""
    out = Path(out)
    return [
        write_category_concepts(out / CATEGORY_FILE, stats.concepts),
        write_concept_labels(out / LABELS_FILE.format(ds=dataset), stats),
        write_adjacency_pickle(out / ADJACENCY_FILE.format(ds=dataset), stats),
        write_vocab_concepts(out / VOCAB_CONCEPTS_FILE, vocab_words, stats.concepts),
    ]


def find_adjacency_file(folder: str | Path) -> Path:
    """The one ``*_adj_concepts.pkl`` of a concept folder.

    Raises:
        FileNotFoundError: None there.
        ValueError: Several.
    """
    found = sorted(Path(folder).glob(ADJACENCY_FILE.format(ds="*")))
    if not found:
        raise FileNotFoundError(
            f"{folder}: no {ADJACENCY_FILE.format(ds='<ds>')}; write one with vlret cvse-concepts"
        )
    if len(found) > 1:
        raise ValueError(
            f"{folder}: several adjacency pickles ({', '.join(p.name for p in found)})"
        )
    return found[0]


def find_labels_file(folder: str | Path) -> Path:
    """The one ``all_*_concept_label.json`` of a concept folder.

    Raises:
        FileNotFoundError: None there.
        ValueError: Several.
    """
    found = sorted(Path(folder).glob(LABELS_FILE.format(ds="*")))
    if not found:
        raise FileNotFoundError(
            f"{folder}: no {LABELS_FILE.format(ds='<ds>')}; write one with vlret cvse-concepts"
        )
    if len(found) > 1:
        raise ValueError(f"{folder}: several label files ({', '.join(p.name for p in found)})")
    return found[0]


def image_label_matrix(
    path: str | Path, image_ids: Sequence[Any], num_concepts: int
) -> tuple[np.ndarray, int]:
    """The release's training labels of the images ``image_ids`` (in order) from a labels file:
    ``(rows (n, C) float32, images missing from the file)``; a row is 1 at the image's
    concepts, and ``1 / C`` everywhere for an image the file lacks (the release's
    ``PrecompDataset_Flickr30k``)."""
    labels = read_concept_labels(path, num_concepts)
    rows = np.zeros((len(image_ids), num_concepts), dtype=np.float32)
    missing = 0
    for k, img in enumerate(image_ids):
        found = labels.get(str(img))
        if found is None:
            rows[k] = 1.0 / num_concepts
            missing += 1
        else:
            rows[k, found] = 1.0
    return rows, missing


def _read_json(path: str | Path) -> Any:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from None


__all__ = [
    "ADJACENCY_FILE",
    "CATEGORY_FILE",
    "LABELS_FILE",
    "MAX_PICKLE_BYTES",
    "VOCAB_CONCEPTS_FILE",
    "find_adjacency_file",
    "find_labels_file",
    "image_label_matrix",
    "read_adjacency_pickle",
    "read_category_concepts",
    "read_concept_labels",
    "read_vocab_concepts",
    "write_adjacency_pickle",
    "write_category_concepts",
    "write_concept_folder",
    "write_concept_labels",
    "write_vocab_concepts",
]
