"""Checkpoints: atomic writes, ``torch.load(weights_only=True)`` reads, RNG state capture.

A training checkpoint is a plain dict of tensors and Python primitives (so the safe
``weights_only`` unpickler reads it): ``model``, ``optimizer``, ``scheduler``, ``scaler``,
``loss`` (the loss module's ``state_dict``: AdaCL margins, extra state and memory queues),
``momentum_encoder``, ``rng`` (see :func:`capture_rng_state`), ``epoch``, ``batch_in_epoch``,
``step``, ``best_rsum``, ``config`` (the resolved run config) and ``vocab`` (its words).
"""

from __future__ import annotations

import os
import random
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

CHECKPOINT_VERSION = 1


def save_checkpoint(state: dict[str, Any], path: str | Path) -> Path:
    """Write ``state`` to ``path`` atomically: temporary file in the same folder, fsync, rename.

    A reader (or a run killed with SIGKILL mid-write) sees either the previous file or the new
    one, never a truncated file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            torch.save(state, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    try:  # make the rename itself durable
        dir_fd = os.open(path.parent, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return path
    try:
        os.fsync(dir_fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(dir_fd)
    return path


def load_checkpoint(path: str | Path, *, map_location: str | torch.device = "cpu") -> dict:
    """Read a checkpoint with the safe unpickler (``weights_only=True``)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing; expected a vlret checkpoint (.pt)")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:
        raise ValueError(f"{path}: not a readable vlret checkpoint ({err})") from None
    if not isinstance(state, dict) or "model" not in state:
        raise ValueError(f"{path}: not a vlret checkpoint (expected a dict with 'model')")
    return state


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
