"""Multi-expert video features of the ``video-experts`` world: four experts that each carry a
different part of a scene, one of them missing for about half the videos.

Real multi-expert video retrieval (CE, Liu et al. 2019; MMT, Gabeur et al. 2020) combines
features from separately trained networks (appearance, motion, audio, scene, ...), some of
which are missing for some videos (no audio track). Here the parts are disjoint by design, so
that a model has to combine the experts and cope with a missing one:

========== ========= ====== ==========================================================
expert     kind      dim    content
========== ========= ====== ==========================================================
appearance temporal  48     the primary object's category and colour, in most frames
motion     pooled    32     the primary object's count, size and cell (where it is)
audio      temporal  24     the primary object's category and material; present for
                            ``audio_rate`` (0.5) of the videos, drawn per video
scene      pooled    40     the secondary objects only (category, count, colour, size,
                            material, cell of each), nothing about the primary
========== ========= ====== ==========================================================

Each expert has its own :class:`~.features.FeatureSpace`: fixed random concept embeddings
(its own table) and its own random map ``tanh(x W1 + b1) W2`` to its own dimension. An object
part is encoded as ``tanh(sum of its concept rows @ W1 + b1)`` (which keeps the binding of its
attributes); the parts and a background code are summed, and the feature is
``tanh(sum) W2`` plus Gaussian noise (``feature_noise``). Temporal experts have a random
number of real frames per video (appearance 2/3 to all of ``frames``, audio ``frames // 4`` to
``frames // 2``), zero padding after them; the object is visible (audible) in a random subset
of the real frames (90 %; 80 % for audio), at least one. The material of the primary object is
only in ``audio``: when audio is missing, a caption's material cannot be checked, which is the
case the text-side mixture weights renormalised over the present experts are for.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .config import SyntheticConfig, rng_stream
from .features import N_BACKGROUND, FeatureSpace
from .language import CELLS, COLOURS, MATERIALS, N_CATEGORIES, SIZES
from .scenes import Scene

#: The experts, in order: ``name -> (kind, dim)``.
EXPERTS: dict[str, tuple[str, int]] = {
    "appearance": ("temporal", 48),
    "motion": ("pooled", 32),
    "audio": ("temporal", 24),
    "scene": ("pooled", 40),
}
#: The expert present for only part of the videos (``SyntheticConfig.audio_rate``).
PARTIAL_EXPERT = "audio"
#: The concept blocks each expert's table has (``background`` always last).
_BLOCKS: dict[str, tuple[str, ...]] = {
    "appearance": ("category", "colour"),
    "motion": ("count", "size", "cell"),
    "audio": ("category", "material"),
    "scene": ("category", "count", "colour", "size", "material", "cell"),
}
_BLOCK_SIZE = {
    "category": N_CATEGORIES,
    "count": 3,
    "colour": len(COLOURS),
    "size": len(SIZES),
    "material": len(MATERIALS),
    "cell": len(CELLS),
    "background": N_BACKGROUND,
}
#: Column of each field in ``SyntheticSplit.scene_array()`` rows.
_FIELD = {"category": 0, "count": 1, "colour": 2, "size": 3, "material": 4, "cell": 5}


@dataclass
class SyntheticExperts:
    """The expert features of one split, padded, with presence and real frame counts.

    Attributes:
        features: ``name -> (N, D)`` (pooled) or ``(N, T, D)`` (temporal) float32, zeros for
            an absent video and after a temporal expert's real frames.
        present: ``name -> (N,)`` bool.
        frames: ``name -> (N,)`` int64 real frames (temporal: 0 when absent; pooled: 1 when
            present, else 0).
    """

    features: dict[str, np.ndarray]
    present: dict[str, np.ndarray]
    frames: dict[str, np.ndarray]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.features)

    def __len__(self) -> int:
        return len(next(iter(self.present.values())))

    def entries(self, name: str) -> list[np.ndarray | None]:
        """Expert ``name`` per video as
        :func:`vlret.data.formats.experts.features.write_expert_features` takes
        it: ``None`` when absent, the ``(D,)`` vector or the ``(T_real, D)`` real frames."""
        feats, present, frames = self.features[name], self.present[name], self.frames[name]
        temporal = feats.ndim == 3
        return [
            (feats[i, : frames[i]] if temporal else feats[i]) if present[i] else None
            for i in range(len(present))
        ]

    def summary(self) -> dict[str, dict[str, object]]:
        """Kind, dimension, padded frames and present count of each expert (``synthetic.json``)."""
        out: dict[str, dict[str, object]] = {}
        for name, feats in self.features.items():
            info: dict[str, object] = {"kind": EXPERTS[name][0], "dim": int(feats.shape[-1])}
            if feats.ndim == 3:
                info["max_frames"] = int(feats.shape[1])
            info["present"] = int(self.present[name].sum())
            out[name] = info
        return out


def expert_dims() -> dict[str, int]:
    """``name -> dim`` of the experts, in order (the ``[model] experts`` table of CE / MMT)."""
    return {name: dim for name, (_, dim) in EXPERTS.items()}


def expert_frames(config: SyntheticConfig) -> dict[str, tuple[int, int]]:
    """``(fewest, most)`` real frames of each temporal expert for ``config.frames``
    (appearance: 2/3 of ``frames`` to all; audio: ``frames // 4`` to ``frames // 2``)."""
    t = config.frames
    return {
        "appearance": (max(1, math.ceil(2 * t / 3)), t),
        "audio": (max(1, t // 4), max(1, t // 2)),
    }


def make_expert_spaces(config: SyntheticConfig, *, seed: int) -> dict[str, FeatureSpace]:
    """Each expert's own concept table and random map.

    Args:
        config: The world's config (``concept_dim``, ``hidden_dim``).
        seed: The world's seed; each expert's space comes from its own stream
            ``rng_stream(seed, 99, 1 + expert index)`` (the frame/region space is stream 0).

    Returns:
        ``name -> FeatureSpace`` in :data:`EXPERTS` order.
    """
    spaces = {}
    e, h = config.concept_dim, config.hidden_dim
    for index, (name, (_, dim)) in enumerate(EXPERTS.items()):
        rng = rng_stream(seed, 99, 1 + index)
        offsets, rows = {}, 0
        for block in (*_BLOCKS[name], "background"):
            offsets[block] = rows
            rows += _BLOCK_SIZE[block]
        table = rng.standard_normal((rows + 1, e)) / math.sqrt(e)
        table[-1] = 0.0
        w1 = rng.standard_normal((e, h)) * (2.0 / math.sqrt(e))
        b1 = rng.standard_normal(h) * 0.5
        w2 = rng.standard_normal((h, dim)) / math.sqrt(h)
        spaces[name] = FeatureSpace(table.astype(np.float32), offsets, w1, b1, w2)
    return spaces


def _rows(space: FeatureSpace, name: str, objects: np.ndarray) -> np.ndarray:
    """Table rows ``(..., n_blocks)`` of ``objects`` (``(..., 6)`` scene-array rows)."""
    cols = []
    for block in _BLOCKS[name]:
        value = objects[..., _FIELD[block]].astype(np.int64)
        cols.append(space.offsets[block] + (value - 1 if block == "count" else value))
    return np.stack(cols, axis=-1)


def _hidden(space: FeatureSpace, rows: np.ndarray) -> np.ndarray:
    return np.tanh(space.table[rows].sum(axis=-2) @ space.w1 + space.b1)


def _background(space: FeatureSpace, shape: tuple[int, ...], rng: np.random.Generator):
    kinds = space.offsets["background"] + rng.integers(N_BACKGROUND, size=shape)
    return np.tanh(space.table[kinds] @ space.w1 + space.b1)


def _output(space: FeatureSpace, hidden: np.ndarray, noise: float, rng: np.random.Generator):
    hidden = hidden + 0.1 * rng.standard_normal(hidden.shape)
    y = np.tanh(hidden) @ space.w2
    return (y + noise * rng.standard_normal(y.shape)).astype(np.float32)


def _temporal(
    space: FeatureSpace,
    name: str,
    primary: np.ndarray,
    span: tuple[int, int],
    visible_rate: float,
    noise: float,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray]:
    n, t = len(primary), span[1]
    lengths = rng.integers(span[0], span[1] + 1, size=n)
    real = np.arange(t)[None, :] < lengths[:, None]
    visible = (rng.random((n, t)) < visible_rate) & real
    visible[np.arange(n), rng.integers(lengths)] = True  # seen at least once
    code = _hidden(space, _rows(space, name, primary))
    hidden = visible[..., None] * code[:, None, :] + _background(space, (n, t), rng)
    out = _output(space, hidden, noise, rng)
    out[~real] = 0.0
    return out, lengths.astype(np.int64)


def expert_features(
    spaces: dict[str, FeatureSpace],
    scenes: Sequence[Scene] | np.ndarray,
    config: SyntheticConfig,
    rng: np.random.Generator,
    present_rng: np.random.Generator,
) -> SyntheticExperts:
    """The experts of a split's scenes (see the module docstring).

    Args:
        spaces: :func:`make_expert_spaces` of the world.
        scenes: The scenes, or their ``(N, 4, 6)`` scene array (``-1`` rows for no object).
        config: The world's config (``frames``, ``feature_noise``, ``audio_rate``).
        rng: The features' random stream.
        present_rng: The stream that draws which videos have the partial expert (its own, so
            that presence does not depend on the features).

    Returns:
        The split's :class:`SyntheticExperts`.
    """
    arr = _scene_array(scenes)
    n, noise = len(arr), config.feature_noise
    primary = arr[:, 0]
    spans = expert_frames(config)
    feats, frames = {}, {}
    feats["appearance"], frames["appearance"] = _temporal(
        spaces["appearance"], "appearance", primary, spans["appearance"], 0.9, noise, rng
    )
    motion = spaces["motion"]
    hidden = _hidden(motion, _rows(motion, "motion", primary)) + _background(motion, (n,), rng)
    feats["motion"] = _output(motion, hidden, noise, rng)
    feats["audio"], frames["audio"] = _temporal(
        spaces["audio"], "audio", primary, spans["audio"], 0.8, noise, rng
    )
    scene = spaces["scene"]
    secondary = arr[:, 1:]
    exists = secondary[..., 0] >= 0
    codes = _hidden(scene, _rows(scene, "scene", np.where(exists[..., None], secondary, 1)))
    hidden = (exists[..., None] * codes).sum(axis=1) + _background(scene, (n,), rng)
    feats["scene"] = _output(scene, hidden, noise, rng)
    present = {name: np.ones(n, dtype=bool) for name in EXPERTS}
    present[PARTIAL_EXPERT] = present_rng.random(n) < config.audio_rate
    for name, f in feats.items():
        f[~present[name]] = 0.0
        frames[name] = np.where(present[name], frames.get(name, 1), 0).astype(np.int64)
    return SyntheticExperts(feats, present, frames)


def _scene_array(scenes: Sequence[Scene] | np.ndarray) -> np.ndarray:
    if isinstance(scenes, np.ndarray):
        return scenes.astype(np.int64)
    out = np.full((len(scenes), 4, 6), -1, dtype=np.int64)
    for i, scene in enumerate(scenes):
        for k, obj in enumerate(scene):
            out[i, k] = obj
    return out


__all__ = [
    "EXPERTS",
    "PARTIAL_EXPERT",
    "SyntheticExperts",
    "expert_dims",
    "expert_features",
    "expert_frames",
    "make_expert_spaces",
]
