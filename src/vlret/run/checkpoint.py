"""Checkpoints: atomic writes, ``torch.load(weights_only=True)`` reads, RNG state capture.

A training checkpoint is a plain dict of tensors and Python primitives (so the safe
``weights_only`` unpickler reads it): ``model``, ``optimizer``, ``scheduler``, ``scaler``,
``loss`` (the loss module's ``state_dict``: AdaCL margins, extra state and memory queues),
``momentum_encoder``, ``rng`` (see :func:`capture_rng_state`), ``epoch``, ``batch_in_epoch``,
``step``, ``select_on`` (the dev metric ``best.pt`` maximises, ``train.select_on`` resolved),
``best_metric`` (its best value so far), ``best_epoch`` (the epoch ``best.pt`` holds),
``best_rsum`` (``best_metric`` when ``select_on`` is ``"rsum"``, else ``None``: still written
so that scripts reading it keep working on rsum-selected runs), ``config`` (the resolved run
config; its ``model`` section carries the model's ``scoring``, so evaluation needs no loss:
:func:`~vlret.run.builders.load_trained_model`) and ``vocab`` (its words).

A checkpoint written before ``train.select_on`` existed has no ``select_on`` and selected on
the dev rsum, which it stores as ``best_rsum``: :func:`best_selection` reads both kinds.
"""

from __future__ import annotations

import pickle
import random
import warnings
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .._files import atomic_write
from ..data.formats.experts.pickles import container_bounds_problem
from ..metrics import normalise_metric_key

CHECKPOINT_VERSION = 1


def save_checkpoint(state: dict[str, Any], path: str | Path) -> Path:
    """Write ``state`` to ``path`` atomically (:func:`vlret._files.atomic_write`): a reader, or a
    run killed mid-write, sees the previous file or the new one, never a truncated file, and a
    second Ctrl-C during the write is held back until the file is in place."""
    return atomic_write(path, lambda fh: torch.save(state, fh))


#: the first bytes of a zip archive (PyTorch >= 1.6 checkpoints)
ZIP_MAGIC = b"PK\x03\x04"
#: the pickle protocols that exist (a legacy checkpoint is a pickle of protocol 2)
PICKLE_PROTOCOLS = range(6)
#: torch's warnings while reading a foreign file: the one-line error says what is wrong
_TORCH_LOAD_WARNINGS = ("Detected pickle protocol", "pickle_load_args only works")
#: the bounds of a checkpoint's containers (a config nests a few levels; a vocabulary is one
#: list): a shared list of a shared list ... is tiny saved and exponential when walked
MAX_NESTING, MAX_ELEMENTS = 64, 50_000_000


def checkpoint_file_problem(path: Path) -> str | None:
    """Why ``path`` cannot be a PyTorch checkpoint, seen from its first bytes and its zip
    directory (a truncated copy, another kind of file), or None; no reading beyond that."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(4)
    if head == ZIP_MAGIC and not zipfile.is_zipfile(path):
        return (
            f"a truncated copy or damaged zip archive (the PyTorch checkpoint format, {size} "
            "bytes): the directory at its end is missing"
        )
    if zipfile.is_zipfile(path):
        return None
    if head[:1] == b"\x80" and len(head) > 1 and head[1] not in PICKLE_PROTOCOLS:
        return (
            f"not a PyTorch checkpoint ({size} bytes, neither a zip archive nor a pickle: it "
            f"starts as a pickle of protocol {head[1]}, which does not exist)"
        )
    if head[:1] != b"\x80":
        return f"not a PyTorch checkpoint ({size} bytes, neither a zip archive nor a pickle)"
    return None


def torch_load_quietly(path: Path, **kwargs: Any) -> Any:
    """``torch.load(path, weights_only=True, **kwargs)`` without torch's warnings about the
    pickle's protocol or arguments (the caller's error names what is wrong)."""
    with warnings.catch_warnings():
        for message in _TORCH_LOAD_WARNINGS:
            warnings.filterwarnings("ignore", message=message)
        return torch.load(path, weights_only=True, **kwargs)


def load_error_reason(path: Path, err: BaseException) -> str:
    """One line saying why ``torch.load`` failed on a file that looked like a checkpoint."""
    first = (str(err).strip().splitlines() or [""])[0][:200]
    detail = f"{type(err).__name__}: {first}" if first else type(err).__name__
    if zipfile.is_zipfile(path):
        return f"a damaged PyTorch checkpoint ({path.stat().st_size} bytes; {detail})"
    return (
        f"a damaged legacy PyTorch checkpoint or another pickle ({path.stat().st_size} bytes; "
        f"reading it stopped at {detail})"
    )


def _unreadable_reason(path: Path, err: BaseException) -> str:
    """One line saying why ``torch.load`` failed, without torch's advice to unpickle unsafely."""
    if isinstance(err, pickle.UnpicklingError) and zipfile.is_zipfile(path):
        return (
            "holds objects that the safe loader (weights_only=True) refuses; vlret checkpoints "
            "hold only tensors and plain values"
        )
    return load_error_reason(path, err)


def load_checkpoint(path: str | Path, *, map_location: str | torch.device = "cpu") -> dict:
    """Read a checkpoint with the safe unpickler (``weights_only=True``); a missing, empty,
    truncated or foreign file, and containers out of bounds (:data:`MAX_NESTING` levels,
    :data:`MAX_ELEMENTS` elements counted through shared references), raise an error naming
    the file and what is wrong with it."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: missing; expected a vlret checkpoint (.pt)")
    if not path.is_file():
        raise ValueError(f"{path}: is a folder; expected a vlret checkpoint file (.pt)")
    if path.stat().st_size == 0:
        raise ValueError(f"{path}: empty file (0 bytes); not a vlret checkpoint")
    problem = checkpoint_file_problem(path)
    if problem and problem.startswith("not a PyTorch"):  # the words CI's fault tests know
        problem = "not a complete PyTorch checkpoint" + problem[len("not a PyTorch checkpoint") :]
    if problem:
        raise ValueError(f"{path}: not a readable vlret checkpoint: {problem}")
    try:
        state = torch_load_quietly(path, map_location=map_location)
    except Exception as err:
        raise ValueError(
            f"{path}: not a readable vlret checkpoint: {_unreadable_reason(path, err)}"
        ) from None
    if not isinstance(state, dict) or "model" not in state:
        raise ValueError(f"{path}: not a vlret checkpoint (expected a dict with 'model')")
    bounds = container_bounds_problem(state, max_nesting=MAX_NESTING, max_elements=MAX_ELEMENTS)
    if bounds:
        raise ValueError(f"{path}: refused: the checkpoint {bounds}")
    return state


def best_selection(state: dict[str, Any]) -> tuple[str, float | None]:
    """``(select_on, best value)`` of a training checkpoint: its ``select_on`` and
    ``best_metric``, or for a checkpoint written before ``train.select_on`` existed
    ``("rsum", best_rsum)`` (those runs selected on the dev rsum); an older spelling of the
    metric is read as today's (``t2i_R1``: ``identity_t2i_r1``,
    :func:`vlret.metrics.normalise_metric_key`)."""
    if state.get("select_on") is None:
        best = state.get("best_rsum")
        return "rsum", None if best is None else float(best)
    best = state.get("best_metric")
    return normalise_metric_key(str(state["select_on"])), None if best is None else float(best)


# --------------------------------------------------------------------------------------------
# RNG states as tensors and primitives
# --------------------------------------------------------------------------------------------


def capture_rng_state() -> dict[str, Any]:
    """Python, NumPy, torch CPU and CUDA generator states as tensors and plain values."""
    py_version, py_state, py_gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    state: dict[str, Any] = {
        "python": {
            "version": int(py_version),
            "state": torch.tensor(py_state, dtype=torch.int64),
            "gauss": py_gauss,
        },
        "numpy": {
            "name": str(np_name),
            "keys": torch.from_numpy(np.asarray(np_keys, dtype=np.int64)),
            "pos": int(np_pos),
            "has_gauss": int(np_has_gauss),
            "gauss": float(np_gauss),
        },
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Inverse of :func:`capture_rng_state` (CUDA states only when CUDA is available)."""
    py = state["python"]
    random.setstate((py["version"], tuple(int(v) for v in py["state"].tolist()), py["gauss"]))
    nps = state["numpy"]
    np.random.set_state(
        (
            nps["name"],
            nps["keys"].numpy().astype(np.uint32),
            nps["pos"],
            nps["has_gauss"],
            nps["gauss"],
        )
    )
    torch.set_rng_state(state["torch"].cpu())
    cuda = state.get("cuda") or []
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([t.cpu() for t in cuda[: torch.cuda.device_count()]])
