"""Region and frame features composed from fixed random concept embeddings through a fixed
random non-linear map, plus noise and background regions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .config import SyntheticConfig, rng_stream
from .language import CELLS, COLOURS, MATERIALS, N_CATEGORIES, SIZES
from .scenes import Scene


@dataclass(frozen=True)
class FeatureSpace:
    """Fixed random concept embeddings and the non-linear map ``tanh(x W1 + b1) W2``.

    ``table`` rows: categories, colours, sizes, materials, cells, background concepts, and a
    zero row; ``offsets`` give where each block starts.
    """

    table: np.ndarray
    offsets: dict[str, int]
    w1: np.ndarray
    b1: np.ndarray
    w2: np.ndarray

    @property
    def zero(self) -> int:
        return len(self.table) - 1


N_BACKGROUND = 24


def make_feature_space(config: SyntheticConfig, *, seed: int) -> FeatureSpace:
    rng = rng_stream(seed, 99, 0)
    e, h, d = config.concept_dim, config.hidden_dim, config.feature_dim
    blocks = {
        "category": N_CATEGORIES,
        "colour": len(COLOURS),
        "size": len(SIZES),
        "material": len(MATERIALS),
        "cell": len(CELLS),
        "background": N_BACKGROUND,
    }
    offsets, rows = {}, 0
    for name, n in blocks.items():
        offsets[name] = rows
        rows += n
    table = rng.standard_normal((rows + 1, e)) / math.sqrt(e)
    table[-1] = 0.0
    w1 = rng.standard_normal((e, h)) * (2.0 / math.sqrt(e))
    b1 = rng.standard_normal(h) * 0.5
    w2 = rng.standard_normal((h, d)) / math.sqrt(h)
    return FeatureSpace(table.astype(np.float32), offsets, w1, b1, w2)


def _object_rows(space: FeatureSpace, obj: tuple[int, ...]) -> dict[str, list[int]]:
    o = space.offsets
    cat, colour, size = o["category"] + obj[0], o["colour"] + obj[2], o["size"] + obj[3]
    mat, cell, z = o["material"] + obj[4], o["cell"] + obj[5], space.zero
    return {
        "whole": [cat, colour, size, mat, cell],
        "shape": [cat, size, cell, z, z],
        "surface": [colour, mat, cell, z, z],
    }


def _scene_regions(
    space: FeatureSpace, scene: Scene, regions: int, rng: np.random.Generator
) -> np.ndarray:
    """``(regions, 5)`` table rows summed into each region's input.

    Every object instance gets a whole-object region and ``size`` (+1 for the primary) part
    regions (shape or surface; the cell ties a part to its object), capped so that at least 4
    regions are background; the order is shuffled, as detector regions have no order.
    """
    whole, parts = [], []
    for slot, obj in enumerate(scene):
        rows = _object_rows(space, obj)
        for _ in range(obj[1]):
            whole.append(rows["whole"])
            for p in range(obj[3] + (slot == 0)):
                parts.append(rows["shape" if p % 2 == 0 else "surface"])
    room = regions - 4
    whole = whole[:room]
    if len(whole) + len(parts) > room:
        keep = rng.choice(len(parts), room - len(whole), replace=False)
        parts = [parts[i] for i in sorted(keep)]
    items = whole + parts
    bg_kinds = rng.choice(N_BACKGROUND, 3, replace=False) + space.offsets["background"]
    z = space.zero
    items += [[int(rng.choice(bg_kinds)), z, z, z, z] for _ in range(regions - len(items))]
    out = np.asarray(items, dtype=np.int64)
    return out[rng.permutation(regions)]


def _mlp_hidden(space: FeatureSpace, x: np.ndarray) -> np.ndarray:
    return np.tanh(x @ space.w1 + space.b1)


def region_features(
    space: FeatureSpace,
    scenes: Sequence[Scene],
    config: SyntheticConfig,
    rng: np.random.Generator,
    *,
    chunk: int = 2048,
) -> np.ndarray:
    """``(N, regions, feature_dim)`` float32 region features of the scenes."""
    n, r = len(scenes), config.regions
    idx = np.stack([_scene_regions(space, s, r, rng) for s in scenes]) if n else np.zeros((0, r, 5))
    out = np.empty((n, r, config.feature_dim), dtype=np.float32)
    jitter = 0.1 / math.sqrt(config.concept_dim)
    for a in range(0, n, chunk):
        b = min(a + chunk, n)
        x = space.table[idx[a:b]].sum(axis=2)
        x = x + jitter * rng.standard_normal(x.shape, dtype=np.float32)
        y = _mlp_hidden(space, x) @ space.w2
        y += config.feature_noise * rng.standard_normal(y.shape)
        out[a:b] = y
    return out


def frame_features(
    space: FeatureSpace, scenes: Sequence[Scene], config: SyntheticConfig, rng: np.random.Generator
) -> np.ndarray:
    """``(N, frames, feature_dim)`` float32 frame features.

    Each object is encoded on its own (``tanh(x W1 + b1)`` of its whole-object input, which
    keeps the binding of its attributes), visible in a random subset of frames (the primary
    in most), weighted by its count and summed with a background code; the frame is
    ``tanh(sum) W2`` plus noise.
    """
    t = config.frames
    out = np.empty((len(scenes), t, config.feature_dim), dtype=np.float32)
    bg0 = space.offsets["background"]
    for i, scene in enumerate(scenes):
        x = np.stack([space.table[_object_rows(space, o)["whole"]].sum(0) for o in scene])
        codes = _mlp_hidden(space, x)
        p = np.where(np.arange(len(scene)) == 0, 0.9, 0.6)
        visible = rng.random((t, len(scene))) < p
        visible[rng.integers(t, size=len(scene)), np.arange(len(scene))] = True
        weight = visible * np.array([o[1] for o in scene], dtype=np.float64)
        bg = _mlp_hidden(space, space.table[bg0 + rng.integers(N_BACKGROUND, size=t)])
        hidden = weight @ codes + bg + 0.1 * rng.standard_normal((t, codes.shape[1]))
        y = np.tanh(hidden) @ space.w2
        out[i] = y + config.feature_noise * rng.standard_normal(y.shape)
    return out


__all__ = [
    "N_BACKGROUND",
    "FeatureSpace",
    "frame_features",
    "make_feature_space",
    "region_features",
]
