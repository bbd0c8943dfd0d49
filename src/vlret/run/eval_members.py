"""The members of an evaluation, loaded (the second phase of
:func:`vlret.run.evaluate.prepare_evaluation`): each checkpoint read once, its model, stored
run and caption encoder rebuilt (:func:`~vlret.run.builders.trained_model_from_state`), the
further networks it holds (NCR's network B, :func:`checkpoint_networks`), and its data config
adapted to the evaluation by the one function :func:`~vlret.run.eval_data.member_eval_data`;
or a local Hugging Face CLIP (:func:`~vlret.run.builders.load_pretrained_clip`). A run folder
stands for its checkpoint (:func:`run_checkpoint`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..eval import EvalProtocol
from ..models import PairScorer
from .builders import StoredRun, load_pretrained_clip, trained_model_from_state
from .checkpoint import load_checkpoint
from .checkpoint_members import ENSEMBLE_KEY
from .eval_data import EvalData, member_eval_data

#: The checkpoints of a run folder, in the order one is taken: ``best.pt`` (the best dev epoch,
#: or the last epoch of a run without validation once it has ended), else ``last.pt`` (a run
#: without validation still running or stopped early, or stopped before its first epoch ended
#: with ``train.checkpoint_every``).
RUN_CHECKPOINTS = ("best.pt", "last.pt")


def run_checkpoint(run: str | Path) -> Path:
    """``run``'s ``best.pt`` when ``run`` is a run folder (else its ``last.pt``), or ``run``
    itself when it is a file (a checkpoint).

    Raises:
        FileNotFoundError: No such folder or file, or a folder holding neither checkpoint.
    """
    path = Path(run)
    if path.is_dir():
        for name in RUN_CHECKPOINTS:
            if (path / name).is_file():
                return path / name
        raise FileNotFoundError(
            f"{path}: no best.pt or last.pt; expected the run folder of vlret train after its "
            "first epoch (or pass a checkpoint file)"
        )
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing; expected a run folder or a checkpoint")
    return path


def checkpoint_why(given: str | Path, chosen: Path) -> str | None:
    """Why a run folder's checkpoint was taken (``None`` for a checkpoint file given)."""
    if Path(given) == chosen:
        return None
    if chosen.name == "best.pt":
        return "the run's best.pt"
    return "the run has no best.pt yet: its last.pt, the latest epoch"


def checkpoint_networks(
    checkpoint: str | Path, model: nn.Module, *, state: dict[str, Any]
) -> list[tuple[str, nn.Module]]:
    """``model`` (rebuilt from the checkpoint ``state`` read from ``checkpoint``) followed by
    one network per state dict in the checkpoint's ``procedure["ensemble_models"]``
    (:data:`~vlret.run.checkpoint_members.ENSEMBLE_KEY`; a copy of the model holding those
    weights), each with the name an evaluation gives it: the path, or ``PATH (network A)``,
    ``PATH (network B)``, ... when it holds several. A plain checkpoint is one network.

    Raises:
        ValueError: A stored network does not fit the model (the checkpoint named).
    """
    extra = (state.get("procedure") or {}).get(ENSEMBLE_KEY) or []
    networks = [model]
    for i, weights in enumerate(extra):
        twin = copy.deepcopy(model)
        try:
            twin.load_state_dict(weights)
        except RuntimeError as err:
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise ValueError(
                f"{checkpoint}: procedure network {i} does not fit ({first})"
            ) from None
        networks.append(twin.eval())
    if len(networks) == 1:
        return [(str(checkpoint), model)]
    return [(f"{checkpoint} (network {chr(ord('A') + i)})", n) for i, n in enumerate(networks)]


@dataclass(frozen=True)
class Member:
    """One model of an evaluation: its ``name`` (the checkpoint, or ``PATH (network B)``), the
    ``source`` it was read from (a checkpoint's networks share it, and their copy of the
    split), the model, its stored run, caption encoder and the data it reads."""

    name: str
    source: str
    model: nn.Module
    run: StoredRun
    encoder: Any
    data: EvalData


@dataclass(frozen=True)
class Members:
    """The members of an evaluation (:func:`load_members`): the models, the ``shortlist_from``
    model (``None`` without one), the checkpoints the given paths stood for, the data folder
    and split every member reads (the first member's, defaults resolved), and why each
    default was taken (a checkpoint's path, ``"data"``, ``"split"`` -> the reason)."""

    members: tuple[Member, ...]
    shortlist: Member | None
    checkpoints: tuple[Path, ...]
    root: Path
    split: str
    why: dict[str, str] = field(default_factory=dict)


def load_members(
    checkpoints: Sequence[str | Path],
    *,
    protocol: EvalProtocol,
    device: torch.device,
    data: str | Path | None,
    split: str | None,
    counts: Mapping[str, int | None],
    model_dir: str | Path | None = None,
    default_preprocessing: str | None = None,
    shortlist_from: str | Path | None = None,
) -> Members:
    """Read each checkpoint once (run folders: :func:`run_checkpoint`) and rebuild its
    members, each data config adapted by :func:`~vlret.run.eval_data.member_eval_data`: the
    first member's resolves ``data`` and ``split`` where not given, and every later member
    (and the ``shortlist_from`` checkpoint) reads the same folder and split. ``model_dir``: a
    local Hugging Face CLIP instead of checkpoints, on Karpathy JSON + images.

    Raises:
        FileNotFoundError: A missing run folder, checkpoint or data folder.
        ValueError: A checkpoint that is not one of ``vlret train``, a ``shortlist_from``
            checkpoint that is not a two-tower model of the members' data format, or what
            :func:`~vlret.run.eval_data.member_eval_data` refuses (members trained on different
            data formats among it).
    """
    members: list[Member] = []
    shortlist = None
    paths: list[Path] = []
    why: dict[str, str] = {}
    given = [model_dir] if model_dir is not None else list(checkpoints)
    for i, item in enumerate([*given, *([shortlist_from] if shortlist_from is not None else [])]):
        assert item is not None
        checkpoint = i < len(given) and model_dir is None
        if i < len(given) and model_dir is not None:
            model, run, encoder = load_pretrained_clip(
                item, device=device, default_preprocessing=default_preprocessing
            )
            source, networks = f"{item} (Karpathy JSON + images)", [(str(item), model)]
        else:
            path = run_checkpoint(item)
            if checkpoint:
                paths.append(path)
                if (reason := checkpoint_why(item, path)) is not None:
                    why[str(path)] = reason
            state = load_checkpoint(path)
            model, run, encoder = trained_model_from_state(state, path, device=device)
            networks = checkpoint_networks(path, model, state=state)
            source = str(path)
        first = (members[0].source, members[0].data.config.format) if members else None
        adapted = member_eval_data(
            run.data,
            protocol=protocol,
            source=source,
            data=data,
            split=split,
            counts=counts,
            same_as=first if i < len(given) else None,
        )
        if i == len(given):  # the shortlist_from checkpoint: its model alone
            shortlist = Member(str(item), source, model, run, encoder, adapted)
            break
        if not members:  # the first member's folder and split are every member's
            data, split = adapted.root, adapted.split
            why.update(adapted.why)
        members += [Member(n, source, m, run, encoder, adapted) for n, m in networks]
    data_format = members[0].data.config.format
    if shortlist is not None and (
        isinstance(shortlist.model, PairScorer) or shortlist.data.config.format != data_format
    ):
        raise ValueError(
            f"shortlist_from: {shortlist_from} must be a two-tower checkpoint trained on "
            f"{data_format} data"
        )
    assert data is not None and split is not None  # the first member resolved them
    return Members(tuple(members), shortlist, tuple(paths), Path(data), split, why)


__all__ = [
    "RUN_CHECKPOINTS",
    "Member",
    "Members",
    "checkpoint_networks",
    "checkpoint_why",
    "load_members",
    "run_checkpoint",
]
