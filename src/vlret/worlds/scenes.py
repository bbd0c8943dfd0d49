"""Scenes (one primary object and 0-3 secondary ones) and the one-edit changes that make clone
siblings.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .config import EDIT_KINDS
from .language import COLOURS, FIELD, MATERIALS, N_CATEGORIES, SIZES

#: A scene: objects ``(category, count, colour, size, material, cell)``, the primary first.
Scene = tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class Edit:
    """One clone edit of a base scene (see :func:`apply_edit`)."""

    kind: str
    slot: int
    other: int = -1
    attr: str = ""
    value: int = -1

    @property
    def focus(self) -> tuple:
        """What a caption must state for the edit to show (see ``sample_plan``)."""
        if self.kind == "attribute":
            return ("attr", self.slot, self.attr)
        if self.kind == "count":
            return ("count", self.slot)
        if self.kind == "binding":
            return ("binding", self.slot, self.other, self.attr)
        return ("relation", self.slot, self.other)


def sample_scene(rng: np.random.Generator, *, min_secondary: int = 0) -> Scene:
    """A random scene; objects are ``(category, count, colour, size, material, cell)``."""
    probs = np.array([0.25, 0.35, 0.25, 0.15])[min_secondary:]
    n = 1 + min_secondary + int(rng.choice(len(probs), p=probs / probs.sum()))
    cats = rng.choice(N_CATEGORIES, n, replace=False)
    cells = rng.choice(9, n, replace=False)
    counts = rng.choice(3, n, p=[0.75, 0.15, 0.10]) + 1
    colours = rng.integers(len(COLOURS), size=n)
    materials = rng.integers(len(MATERIALS), size=n)
    sizes = [
        int(rng.choice(3, p=[0.2, 0.35, 0.45] if k == 0 else [0.45, 0.35, 0.2])) for k in range(n)
    ]
    return tuple(
        (int(cats[k]), int(counts[k]), int(colours[k]), sizes[k], int(materials[k]), int(cells[k]))
        for k in range(n)
    )


def apply_edit(scene: Scene, edit: Edit) -> Scene:
    """The scene with one edit: ``attribute`` sets ``attr`` of ``slot`` to ``value``; ``count``
    sets its count to ``value``; ``binding`` swaps ``attr`` between ``slot`` and ``other``;
    ``relation`` swaps their cells (which flips their relations)."""
    objs = [list(o) for o in scene]
    if edit.kind == "attribute":
        objs[edit.slot][FIELD[edit.attr]] = edit.value
    elif edit.kind == "count":
        objs[edit.slot][1] = edit.value
    elif edit.kind in ("binding", "relation"):
        f = FIELD[edit.attr] if edit.kind == "binding" else FIELD["cell"]
        objs[edit.slot][f], objs[edit.other][f] = objs[edit.other][f], objs[edit.slot][f]
    else:
        raise ValueError(f"edit kind must be one of {EDIT_KINDS[2:]}, got {edit.kind!r}")
    return tuple(tuple(o) for o in objs)


_N_ATTR = {"colour": len(COLOURS), "size": len(SIZES), "material": len(MATERIALS)}


def sample_edit(rng: np.random.Generator, scene: Scene) -> Edit:
    """A random one-edit change of ``scene`` (binding and relation need two objects)."""
    n = len(scene)
    kind = str(rng.choice(["attribute", "binding", "relation", "count"], p=[0.3, 0.3, 0.2, 0.2]))
    other = int(rng.integers(1, n)) if n > 1 else -1
    if kind == "binding" and n > 1:
        differ = [a for a in _N_ATTR if scene[0][FIELD[a]] != scene[other][FIELD[a]]]
        if differ:
            return Edit("binding", 0, other, str(rng.choice(differ)))
        kind = "attribute"
    if kind == "relation" and n > 1:
        return Edit("relation", 0, other)
    slot = 0 if n == 1 or rng.random() < 0.7 else int(rng.integers(1, n))
    if kind == "count":
        values = [c for c in (1, 2, 3) if c != scene[slot][1]]
        return Edit("count", slot, value=int(rng.choice(values)))
    attr = str(rng.choice(list(_N_ATTR)))
    values = [v for v in range(_N_ATTR[attr]) if v != scene[slot][FIELD[attr]]]
    return Edit("attribute", slot, attr=attr, value=int(rng.choice(values)))


__all__ = [
    "Edit",
    "Scene",
    "apply_edit",
    "sample_edit",
    "sample_scene",
]
