"""A generated world: its config, seed, noise and splits, with features, in memory."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .config import NoiseSpec, SyntheticConfig, get_preset, parse_noise, rng_stream
from .features import frame_features, make_feature_space, region_features
from .splits import SyntheticSplit, apply_noise, build_split
from .video_experts import expert_features, make_expert_spaces


@dataclass
class SyntheticWorld:
    """A generated world: its config, seed, noise and splits (in ``config.splits`` order)."""

    config: SyntheticConfig
    seed: int
    noise: NoiseSpec | None
    splits: dict[str, SyntheticSplit] = field(default_factory=dict)

    def __getitem__(self, split: str) -> SyntheticSplit:
        return self.splits[split]


def generate_world(
    preset: str | SyntheticConfig = "tiny",
    *,
    seed: int = 0,
    noise: str | NoiseSpec | Mapping[str, Any] | None = None,
    features: bool = True,
    **overrides: Any,
) -> SyntheticWorld:
    """Generate a world in memory (``overrides``: :class:`SyntheticConfig` fields).

    ``noise`` corrupts the training split only. ``features=False`` skips the features (they
    take most of the time on large presets). A ``multi_expert`` world (``video-experts``) sets
    each split's ``experts`` (:class:`~.video_experts.SyntheticExperts`) instead of
    ``features``.
    """
    config = get_preset(preset, **overrides)
    spec = parse_noise(noise)
    if config.multi_expert:
        spaces = make_expert_spaces(config, seed=seed)
    else:
        space = make_feature_space(config, seed=seed)
    world = SyntheticWorld(config, int(seed), spec)
    for index, (name, n) in enumerate(config.splits.items()):
        split = build_split(config, name, n, seed=seed, split_index=index)
        if spec is not None and name == "train":
            apply_noise(split, spec, seed=seed, split_index=index)
        if features and config.multi_expert:
            split.experts = expert_features(
                spaces,
                split.scene_array(),
                config,
                rng_stream(seed, index, 3),
                rng_stream(seed, index, 5),
            )
        elif features:
            rng = rng_stream(seed, index, 3)
            make = frame_features if config.video else region_features
            split.features = make(space, split.scenes, config, rng)
        world.splits[name] = split
    return world


__all__ = [
    "SyntheticWorld",
    "generate_world",
]
