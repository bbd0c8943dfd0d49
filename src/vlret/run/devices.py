"""The process a run is in: torchrun's environment (:class:`DistEnv`), the device a run or an
evaluation uses (``train.device``, ``--device``: :func:`parse_device`, :func:`resolve_device`)
and the collectives' timeout setting (``train.dist_timeout``: :data:`DIST_TIMEOUT`,
:func:`check_timeout`).

The collectives themselves, which use these, are the trainer's
(:mod:`vlret.train.parallel.distributed`); a command that only evaluates or inspects a run needs
this module alone.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DistEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def env_from_torchrun() -> DistEnv:
    """``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` as set by torchrun (single process without)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", str(rank)))
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"bad torchrun environment: RANK={rank}, WORLD_SIZE={world}")
    return DistEnv(rank=rank, world_size=world, local_rank=local)


#: Seconds a rank waits in one collective for the others (``train.dist_timeout``'s default).
DIST_TIMEOUT = 600.0
#: The config key that sets it, named in :class:`DistributedTimeout`'s message.
TIMEOUT_KEY = "train.dist_timeout"


def check_timeout(timeout: object) -> float:
    """``timeout`` as seconds: a finite number > 0 (``ValueError`` naming the key otherwise)."""
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise ValueError(f"{TIMEOUT_KEY}: expected seconds (a number > 0), got {timeout!r}")
    if not (math.isfinite(timeout) and 0 < timeout <= 10**9):
        raise ValueError(f"{TIMEOUT_KEY}: expected seconds in (0, 1e9], got {timeout!r}")
    return float(timeout)


def parse_device(name: str) -> torch.device | None:
    """``None`` for ``auto``, else the ``cpu``, ``cuda`` or ``cuda:N`` device; any other name
    raises ``ValueError`` (whether the device exists is :func:`resolve_device`'s question)."""
    if name == "auto":
        return None
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise ValueError(f"expected auto, cpu, cuda or cuda:N, got {name!r}")
    return device


def resolve_device(name: str, *, local_rank: int = 0) -> torch.device:
    """``auto`` (this rank's GPU when CUDA is available, else the CPU), ``cpu``, ``cuda`` or
    ``cuda:N``; a malformed name or a device this machine lacks raises ``ValueError``."""
    device = parse_device(name)
    if device is None:
        if torch.cuda.is_available():
            return torch.device("cuda", local_rank)
        return torch.device("cpu")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            build = "a CPU-only build" if torch.version.cuda is None else "no GPU visible"
            raise ValueError(
                f"{name!r} requested but CUDA is not available (torch {torch.__version__}: "
                f"{build}); use auto or cpu"
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(
                f"{name!r} requested but only {torch.cuda.device_count()} GPU(s) are visible"
            )
    return device


__all__ = [
    "DIST_TIMEOUT",
    "TIMEOUT_KEY",
    "DistEnv",
    "check_timeout",
    "env_from_torchrun",
    "parse_device",
    "resolve_device",
]
