"""``train.init_from``: start a run from another run's model weights.

A run whose ``train.init_from`` names a vlret checkpoint (a run's ``best.pt`` / ``last.pt``, or
what ``vlret import-checkpoint`` writes) loads that checkpoint's ``model`` weights into the
freshly built model before the first step; the optimiser, the schedule, the loss's state and the
epoch count start fresh. This is the two-round recipe of the comparison losses: AOQ's second
round and the polynomial losses train from a first-round model, and a warm-up run with one loss
can be continued with another (docs/results.md, "Noisy correspondence in miniature").

The load is strict: every weight of the model must be in the checkpoint with its shape, and
nothing else. A word-indexed text tower means nothing under another vocabulary, so a checkpoint
whose caption encoder (``encoder`` entry) differs from this run's is refused too, naming the
first word that differs. A resumed run does not read ``init_from`` again: ``last.pt`` holds
the weights it had reached.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from .checkpoint import load_checkpoint


class InitFromError(ValueError):
    """``train.init_from`` names a checkpoint that does not fit this run's model."""


def _encoder_difference(stored: Any, ours: dict[str, Any]) -> str | None:
    """Why the checkpoint's caption encoder is not this run's (``None``: the same, or the
    checkpoint records none)."""
    if not isinstance(stored, dict):
        return None
    if stored.get("kind") != ours.get("kind"):
        return f"its caption encoder is {stored.get('kind')!r}, this run's {ours.get('kind')!r}"
    if ours.get("kind") != "vocab":
        return None if stored == ours else "its caption encoder's settings differ from this run's"
    theirs, mine = list(stored.get("idx2word", [])), list(ours.get("idx2word", []))
    if theirs == mine and stored.get("tokenizer") == ours.get("tokenizer"):
        return None
    if stored.get("tokenizer") != ours.get("tokenizer"):
        return f"its tokenizer is {stored.get('tokenizer')!r}, this run's {ours.get('tokenizer')!r}"
    for i, (a, b) in enumerate(zip(theirs, mine, strict=False)):
        if a != b:
            return f"its vocabulary differs at index {i} ({a!r} there, {b!r} here)"
    return f"its vocabulary has {len(theirs)} words, this run's {len(mine)}"


def load_init_weights(
    model: nn.Module, path: str | Path, *, encoder: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Load the ``model`` weights of the checkpoint ``path`` into ``model`` (strictly) and
    return a summary for the run log (``path``, the checkpoint's epoch and step).

    ``encoder``: this run's checkpoint ``encoder`` entry
    (:func:`vlret.run.builders.encoder_state`), compared with the checkpoint's. Errors:
    ``FileNotFoundError`` / ``ValueError`` from :func:`~vlret.run.checkpoint.load_checkpoint`
    for an unreadable file, :class:`InitFromError` naming ``train.init_from``, the file and
    what does not fit."""
    state = load_checkpoint(path, map_location="cpu")
    where = f"train.init_from: {path}"
    if encoder is not None:
        problem = _encoder_difference(state.get("encoder"), encoder)
        if problem:
            raise InitFromError(f"{where}: {problem}; the text tower's weights would not fit")
    weights = state["model"]
    if not isinstance(weights, dict):
        raise InitFromError(f"{where}: its 'model' entry is not a state dict")
    ours = model.state_dict()
    missing = [k for k in ours if k not in weights]
    extra = [k for k in weights if k not in ours]
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"{len(missing)} of this model's weights missing (first {missing[0]!r})")
        if extra:
            parts.append(f"{len(extra)} weights this model lacks (first {extra[0]!r})")
        raise InitFromError(f"{where}: not this model: {'; '.join(parts)}")
    for key, value in ours.items():
        theirs = weights[key]
        if not isinstance(theirs, torch.Tensor) or theirs.shape != value.shape:
            shape = tuple(theirs.shape) if isinstance(theirs, torch.Tensor) else type(theirs)
            raise InitFromError(
                f"{where}: weight {key!r} has shape {shape} there, {tuple(value.shape)} here"
            )
    model.load_state_dict(weights, strict=True)
    return {"path": str(path), "epoch": state.get("epoch"), "step": state.get("step")}
