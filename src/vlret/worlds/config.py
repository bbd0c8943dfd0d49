"""Sizes and knobs of a synthetic world: :class:`SyntheticConfig`, the presets, noise specs and
the seeded random streams.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

FORMATS = ("precomp", "karpathy", "msrvtt")
NOISE_MODES = ("permute_captions", "permute_images", "falsify")
EDIT_KINDS = ("none", "base", "attribute", "binding", "relation", "count")
CAPTION_FORMS = ("primary", "secondary", "pair", "relation")


@dataclass(frozen=True)
class SyntheticConfig:
    """Sizes and knobs of a synthetic world (see :data:`PRESETS`).

    ``splits`` maps our split name (``train``, ``dev``, ``test`` or ``testall``) to its number
    of images, in writing order. ``video`` makes ``(N, frames, feature_dim)`` frame features
    instead of ``(N, regions, feature_dim)`` region features. ``clone_fraction`` of the images
    are in clone groups of 2 to ``max_group_size``; ``secondary_rate`` of the captions of a
    multi-object scene mention only a secondary object. ``n_1ka`` is the number of test videos
    of the MSR-VTT 1k-A split (the last ones of ``test``). ``multi_expert`` makes the four
    expert features of :mod:`~.video_experts` (appearance, motion, audio, scene) instead of
    frame or region features (written in the MSR-VTT format only); ``audio_rate`` is the
    fraction of videos that have the audio expert.
    """

    name: str
    splits: dict[str, int]
    captions_per_image: int = 5
    feature_dim: int = 64
    concept_dim: int = 32
    hidden_dim: int = 128
    regions: int = 36
    frames: int = 12
    video: bool = False
    clone_fraction: float = 0.3
    max_group_size: int = 3
    secondary_rate: float = 0.15
    feature_noise: float = 0.1
    dataset: str = "flickr30k"
    n_1ka: int = 1000
    multi_expert: bool = False
    audio_rate: float = 0.5

    def __post_init__(self) -> None:
        if not self.splits or any(n < 1 for n in self.splits.values()):
            raise ValueError(f"splits must map split names to positive sizes, got {self.splits}")
        bad = [s for s in self.splits if s not in ("train", "dev", "test", "testall")]
        if bad:
            raise ValueError(f"split names must be train, dev, test or testall, got {bad}")
        for name in ("captions_per_image", "feature_dim", "concept_dim", "hidden_dim", "frames"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.regions < 8:
            raise ValueError(f"regions must be >= 8 (objects plus background), got {self.regions}")
        if not 0.0 <= self.clone_fraction < 1.0:
            raise ValueError(f"clone_fraction must be in [0, 1), got {self.clone_fraction}")
        if self.max_group_size < 2:
            raise ValueError(f"max_group_size must be >= 2, got {self.max_group_size}")
        if not 0.0 <= self.secondary_rate <= 1.0:
            raise ValueError(f"secondary_rate must be in [0, 1], got {self.secondary_rate}")
        if not 0.0 <= self.audio_rate <= 1.0:
            raise ValueError(f"audio_rate must be in [0, 1], got {self.audio_rate}")
        if self.feature_noise < 0:
            raise ValueError(f"feature_noise must be >= 0, got {self.feature_noise}")


PRESETS: dict[str, SyntheticConfig] = {
    "tiny": SyntheticConfig(
        "tiny",
        {"train": 240, "dev": 40, "test": 40},
        feature_dim=32,
        concept_dim=16,
        hidden_dim=64,
        n_1ka=20,
    ),
    # The f30k-like world with 6000 train and 500 dev images (a split's stream is keyed by
    # seed and split index: the test split is the f30k-like one; train and dev are other draws
    # of the same distribution): the world of `vlret demo --preset small`.
    "small": SyntheticConfig("small", {"train": 6000, "dev": 500, "test": 1000}),
    "f30k-like": SyntheticConfig("f30k-like", {"train": 29000, "dev": 1000, "test": 1000}),
    "coco-like": SyntheticConfig(
        "coco-like", {"train": 40000, "dev": 5000, "testall": 5000}, dataset="coco"
    ),
    "video": SyntheticConfig(
        "video",
        {"train": 6513, "dev": 497, "test": 2990},
        captions_per_image=20,
        video=True,
        frames=12,
        dataset="msrvtt",
        n_1ka=1000,
    ),
    # The video world with four experts that carry different parts of a scene, audio missing
    # for half the videos (video_experts.py); sized for a few hundred steps per epoch at batch
    # 128 (3000 training videos): the CE / MMT loss comparison (issue 16).
    "video-experts": SyntheticConfig(
        "video-experts",
        {"train": 3000, "dev": 300, "test": 1000},
        captions_per_image=20,
        video=True,
        frames=12,
        dataset="msrvtt",
        n_1ka=1000,
        multi_expert=True,
    ),
}


def get_preset(preset: str | SyntheticConfig, **overrides: Any) -> SyntheticConfig:
    """A preset by name (``tiny``, ``small``, ``f30k-like``, ``coco-like``, ``video``,
    ``video-experts``) with ``overrides`` of :class:`SyntheticConfig` fields (``None`` values
    are ignored)."""
    if isinstance(preset, SyntheticConfig):
        config = preset
    elif preset in PRESETS:
        config = PRESETS[preset]
    else:
        raise ValueError(f"preset must be one of {tuple(PRESETS)}, got {preset!r}")
    overrides = {k: v for k, v in overrides.items() if v is not None}
    unknown = sorted(set(overrides) - set(SyntheticConfig.__dataclass_fields__))
    if unknown:
        raise ValueError(f"unknown synthetic options {unknown}")
    if "splits" in overrides:
        overrides["splits"] = dict(overrides["splits"])
    return replace(config, **overrides)


@dataclass(frozen=True)
class NoiseSpec:
    """Noisy correspondence on the training split: ``mode`` in :data:`NOISE_MODES`, ``rate``
    the fraction of captions (``permute_captions``, ``falsify``) or of images
    (``permute_images``, all of an image's captions move together) that are corrupted."""

    mode: str
    rate: float

    def __post_init__(self) -> None:
        if self.mode not in NOISE_MODES:
            raise ValueError(f"noise mode must be one of {NOISE_MODES}, got {self.mode!r}")
        if not 0.0 <= self.rate <= 1.0:
            raise ValueError(f"noise rate must be in [0, 1], got {self.rate}")


def parse_noise(noise: str | NoiseSpec | Mapping[str, Any] | None) -> NoiseSpec | None:
    """``None``, a :class:`NoiseSpec`, ``{"mode": ..., "rate": ...}`` or ``"mode:rate"``
    (e.g. ``"permute_captions:0.2"``)."""
    if noise is None or isinstance(noise, NoiseSpec):
        return noise
    if isinstance(noise, Mapping):
        return NoiseSpec(str(noise["mode"]), float(noise["rate"]))
    mode, sep, rate = str(noise).partition(":")
    if not sep:
        raise ValueError(
            f"noise must look like 'MODE:RATE' (e.g. permute_captions:0.2), got {noise!r}"
        )
    try:
        value = float(rate)
    except ValueError:
        raise ValueError(f"noise rate must be a number, got {rate!r} in {noise!r}") from None
    return NoiseSpec(mode.strip(), value)


def rng_stream(seed: int, split_index: int, purpose: int) -> np.random.Generator:
    """The random stream of one ``purpose`` in one split, keyed by the world's ``seed``, so
    that one split does not change when another's size does."""
    return np.random.default_rng([int(seed), split_index, purpose])


__all__ = [
    "CAPTION_FORMS",
    "EDIT_KINDS",
    "FORMATS",
    "NOISE_MODES",
    "PRESETS",
    "NoiseSpec",
    "SyntheticConfig",
    "get_preset",
    "parse_noise",
    "rng_stream",
]
