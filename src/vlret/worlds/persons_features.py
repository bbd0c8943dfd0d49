"""Precomputed region features of the synthetic persons world (``vlret synth persons
--features``), and the domains of the world (``--domain``).

**Features.** As a frozen detector would give them: one region per visible captioned part
(hair, hat, upper garment, lower garment, shoes, bag) and background regions up to
:data:`REGIONS`, in a random order. A part's region sums fixed random concept embeddings (the
part, its colour, its type where it has one) with the picture's nuisance (its view, its
lighting, the domain's camera), a small jitter, goes through a fixed random map
``tanh(x W1 + b1) W2`` and gets noise. The concept table and the map are keyed by a constant
(:data:`EXTRACTOR_SEED`), never by the world's seed: every world, whatever its seed or domain,
is seen through the same "feature extractor", so a model trained on one world can be tested on
another (domain generalisation). Written as ``DIR/features/{train,val,test}_ims.npy``,
``(images of the split, REGIONS, FEATURE_DIM)`` float32, rows in the split's file order (the
person-search readers' precomputed-feature route, ``data.features_dir``).

**Domains.** Domain 0 is the world as the rest of the module describes it. Another domain
``d`` is a second "camera network and annotators" over people drawn the same way: its
captions prefer other synonyms and subjects (:class:`~.persons_language.CaptionStyle`), its
pictures get a colour cast (:func:`domain_lighting`), and its features the camera's offset in
concept space. The cast and the offset are keyed by ``d`` alone, so two worlds of one domain
share them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from .language import COLOURS
from .persons_language import DEFAULT_STYLE, OTHER_STYLE, VOCABULARY, CaptionStyle
from .persons_render import VIEWS, Pose

#: The seed of the concept table and the random map (the same for every world).
EXTRACTOR_SEED = 20211
#: Regions per picture, their size, the concept and hidden sizes of the map.
REGIONS, FEATURE_DIM, CONCEPT_DIM, HIDDEN_DIM = 8, 64, 32, 128
#: Standard deviations: the concept-space jitter (times 1/sqrt(CONCEPT_DIM)) and the output noise.
JITTER, FEATURE_NOISE = 0.15, 0.1
#: Weights of the nuisance concepts: the view, the lighting, the domain's camera.
VIEW_WEIGHT, LIGHT_WEIGHT, CAMERA_WEIGHT = 0.4, 0.8, 1.5
#: Background concepts (the kinds of non-person region).
N_BACKGROUND = 12
#: The captioned parts in region order before the shuffle, and the fields each region shows.
PART_FIELDS: dict[str, tuple[str, ...]] = {
    "hair": ("hair_length", "hair_colour"),
    "hat": ("hat_colour",),
    "upper": ("upper_type", "upper_colour"),
    "lower": ("lower_type", "lower_colour"),
    "shoes": ("shoes_colour",),
    "bag": ("bag_type", "bag_colour"),
}
#: Fields whose values are the shared colours (one concept block for all of them).
_COLOUR_FIELDS = ("upper_colour", "lower_colour", "shoes_colour", "hat_colour", "bag_colour")
# Random-stream purposes of a domain (np.random.default_rng([domain, purpose])).
_CAST, _CAMERA = 1, 2


def check_domain(domain: object) -> int:
    """``domain`` as an int >= 0, else a ValueError naming it."""
    if isinstance(domain, bool) or not isinstance(domain, int | np.integer) or domain < 0:
        raise ValueError(f"domain must be an integer >= 0, got {domain!r}")
    return int(domain)


def caption_style(domain: int) -> CaptionStyle:
    """The caption style of ``domain``: the grammar's own for 0, the other annotators'
    (:data:`~.persons_language.OTHER_STYLE`) else."""
    return DEFAULT_STYLE if check_domain(domain) == 0 else OTHER_STYLE


def domain_lighting(pose: Pose, domain: int) -> Pose:
    """``pose`` under the domain's colour cast: domain 0 unchanged; another domain scales the
    gain by a factor in [0.85, 0.95] and adds a tint of up to 18 per channel, both fixed by the
    domain."""
    if check_domain(domain) == 0:
        return pose
    rng = np.random.default_rng([domain, _CAST])
    factor = float(rng.uniform(0.85, 0.95))
    cast = rng.uniform(-18.0, 18.0, 3)
    tint = tuple(round(float(t + c), 2) for t, c in zip(pose.tint, cast, strict=True))
    return replace(pose, gain=round(pose.gain * factor, 4), tint=tint)  # type: ignore[arg-type]


@dataclass(frozen=True)
class PersonFeatureSpace:
    """The fixed concept table (``offsets[block] + value`` indexes a row) and random map."""

    table: np.ndarray
    offsets: dict[str, int]
    w1: np.ndarray
    b1: np.ndarray
    w2: np.ndarray


def feature_space() -> PersonFeatureSpace:
    """The extractor every world shares (keyed by :data:`EXTRACTOR_SEED`)."""
    rng = np.random.default_rng([EXTRACTOR_SEED, 0])
    blocks = {"part": len(PART_FIELDS), "colour": len(COLOURS), "view": len(VIEWS)}
    blocks["background"] = N_BACKGROUND
    blocks["light"] = 1
    for f in ("hair_length", "hair_colour", "upper_type", "lower_type", "bag_type"):
        blocks[f] = len(VOCABULARY[f])
    offsets, rows = {}, 0
    for name, n in blocks.items():
        offsets[name] = rows
        rows += n
    e, h = CONCEPT_DIM, HIDDEN_DIM
    table = rng.standard_normal((rows, e)) / math.sqrt(e)
    w1 = rng.standard_normal((e, h)) * (2.0 / math.sqrt(e))
    b1 = rng.standard_normal(h) * 0.5
    w2 = rng.standard_normal((h, FEATURE_DIM)) / math.sqrt(h)
    return PersonFeatureSpace(table, offsets, w1, b1, w2)


def camera_offset(domain: int) -> np.ndarray:
    """The domain's camera in concept space (zeros for domain 0)."""
    if check_domain(domain) == 0:
        return np.zeros(CONCEPT_DIM)
    rng = np.random.default_rng([domain, _CAMERA])
    return CAMERA_WEIGHT * rng.standard_normal(CONCEPT_DIM) / math.sqrt(CONCEPT_DIM)


def _concept(space: PersonFeatureSpace, f: str, value: int) -> np.ndarray:
    block = "colour" if f in _COLOUR_FIELDS else f
    return space.table[space.offsets[block] + value]


def picture_concepts(
    space: PersonFeatureSpace,
    person: Mapping[str, int],
    pose: Pose,
    camera: np.ndarray,
    rng: np.random.Generator,
) -> np.ndarray:
    """The ``(REGIONS, CONCEPT_DIM)`` concept sums of one picture, regions shuffled."""
    nuisance = VIEW_WEIGHT * space.table[space.offsets["view"] + pose.view] + camera
    nuisance = nuisance + LIGHT_WEIGHT * (pose.gain - 1.0) * space.table[space.offsets["light"]]
    rows = []
    for k, fields in enumerate(PART_FIELDS.values()):
        if any(person[f] < 0 for f in fields):  # no hat, no bag
            continue
        x = space.table[space.offsets["part"] + k] + nuisance
        rows.append(x + sum(_concept(space, f, person[f]) for f in fields))
    kinds = rng.choice(N_BACKGROUND, 2, replace=False)
    while len(rows) < REGIONS:
        kind = int(kinds[int(rng.integers(2))])
        rows.append(space.table[space.offsets["background"] + kind] + nuisance)
    out = np.stack(rows)
    return out[rng.permutation(REGIONS)]


def region_features(
    space: PersonFeatureSpace,
    pictures: Sequence[tuple[Mapping[str, int], Pose]],
    *,
    domain: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """``(len(pictures), REGIONS, FEATURE_DIM)`` float32 features of ``(person, pose)``
    pictures."""
    camera = camera_offset(domain)
    if not pictures:
        return np.zeros((0, REGIONS, FEATURE_DIM), dtype=np.float32)
    x = np.stack([picture_concepts(space, p, pose, camera, rng) for p, pose in pictures])
    x = x + (JITTER / math.sqrt(CONCEPT_DIM)) * rng.standard_normal(x.shape)
    y = np.tanh(x @ space.w1 + space.b1) @ space.w2
    y += FEATURE_NOISE * rng.standard_normal(y.shape)
    return y.astype(np.float32)


__all__ = [
    "EXTRACTOR_SEED",
    "FEATURE_DIM",
    "REGIONS",
    "PersonFeatureSpace",
    "camera_offset",
    "caption_style",
    "check_domain",
    "domain_lighting",
    "feature_space",
    "picture_concepts",
    "region_features",
]
