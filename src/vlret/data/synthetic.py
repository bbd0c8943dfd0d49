"""A procedural image-text retrieval world that exercises what the papers claim.

Each image is a scene: one primary object and 0-3 secondary ones, each with a category,
count, colour, size, material and a cell of a 3 x 3 grid; relations (left of, above) follow
from the cells. The scene's facts are atomic propositions (``colour(square)=red``,
``left_of(square, circle)``; :mod:`~vlret.data.synthetic_language`). Each image gets ``K``
captions from a grammar with synonyms and varied word order, each stating a random subset of
the facts: most describe the primary object, some only a secondary one (so they also fit
images whose primary object it is, the case VSL targets). Clone siblings, images that differ
from a base image by one edit (an attribute, a binding swap, a relation flip, a count), share
their caption plans, so their captions are near-duplicates (the case AdaCL targets).

Because the facts are known, relevance is exhaustive: a caption is relevant to every image
whose facts include its facts (:mod:`~vlret.data.synthetic_metrics`). Region features are
composed from fixed random embeddings of the concepts through a fixed random non-linear map,
plus noise and background regions, so an encoder has to learn the composition; the video
preset has frame features instead. The writers emit the real on-disk formats (SCAN precomp,
Karpathy JSON with rendered images, MSR-VTT) through :mod:`vlret.data.writers`, plus side files
with the facts, relevance, clone groups and the clean mask (``docs/synthetic.md``)::

    from vlret.data.synthetic import write_synthetic
    write_synthetic("tiny", "data/synth_tiny", format="precomp", seed=0,
                    noise="permute_captions:0.2")

A fixed seed gives the same world (``numpy.random.Generator`` streams keyed by seed, split and
purpose, so one split does not change when another's size does).
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .karpathy import KarpathyImage, KarpathySentence
from .msrvtt import DATA_JSON, JSFUSION_CSV, TRAIN_9K_CSV
from .synthetic_hint import META_FILE, config_hint, train_hint_lines, train_overrides
from .synthetic_language import (
    CELLS,
    COLOURS,
    FIELD,
    MATERIALS,
    N_CATEGORIES,
    N_FACTS,
    SIZES,
    CaptionPlan,
    fact_names,
    render_caption,
    sample_plan,
    scene_facts,
    tokens_to_text,
)
from .synthetic_metrics import (
    CloneChoice,
    ExtendedMetrics,
    FactSets,
    SubsetRecall,
    clone_forced_choice,
    clone_group_images,
    extended_metrics,
    fact_oracle_embeddings,
    iter_relevance,
    pairs_to_matrix,
    relevance_matrix,
    relevance_pairs,
    subset_recalls,
)
from .writers import (
    karpathy_tokens,
    write_jsfusion_csv,
    write_karpathy_json,
    write_msrvtt_json,
    write_msrvtt_train_csv,
    write_precomp,
    write_video_features,
)

Scene = tuple[tuple[int, ...], ...]
FORMATS = ("precomp", "karpathy", "msrvtt")
NOISE_MODES = ("permute_captions", "permute_images", "falsify")
EDIT_KINDS = ("none", "base", "attribute", "binding", "relation", "count")
CAPTION_FORMS = ("primary", "secondary", "pair", "relation")
MAX_OBJECTS = 4


# ------------------------------------------------------------------------------ config


@dataclass(frozen=True)
class SyntheticConfig:
    """Sizes and knobs of a synthetic world (see :data:`PRESETS`).

    ``splits`` maps our split name (``train``, ``dev``, ``test`` or ``testall``) to its number
    of images, in writing order. ``video`` makes ``(N, frames, feature_dim)`` frame features
    instead of ``(N, regions, feature_dim)`` region features. ``clone_fraction`` of the images
    are in clone groups of 2 to ``max_group_size``; ``secondary_rate`` of the captions of a
    multi-object scene mention only a secondary object. ``n_1ka`` is the number of test videos
    of the MSR-VTT 1k-A split (the last ones of ``test``).
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
}


def get_preset(preset: str | SyntheticConfig, **overrides: Any) -> SyntheticConfig:
    """A preset by name (``tiny``, ``small``, ``f30k-like``, ``coco-like``, ``video``) with
    ``overrides``
    of :class:`SyntheticConfig` fields (``None`` values are ignored)."""
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


# ------------------------------------------------------------------------------ scenes


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


# ------------------------------------------------------------------------------ splits


@dataclass
class SyntheticSplit:
    """One split of a world: scenes, captions with their facts, clone groups, noise, features.

    Captions are stored as tokens (``captions(style)`` renders them); caption ``j`` belongs to
    image ``txt_to_img[j]`` (``K`` consecutive captions per image). ``groups[i]`` is the clone
    group of image ``i`` (a unique id for an image in no group); ``edit_kind[i]`` indexes
    :data:`EDIT_KINDS` and ``edit_parent[i]`` is the base image of a sibling (-1 otherwise).
    ``clean[j]`` is False for a caption that noise made wrong for its image.
    """

    name: str
    scenes: list[Scene]
    image_facts: FactSets
    tokens: list[list[str]]
    caption_facts: FactSets
    caption_form: np.ndarray
    txt_to_img: np.ndarray
    groups: np.ndarray
    edit_kind: np.ndarray
    edit_parent: np.ndarray
    edits: list[Edit | None]
    plans: list[CaptionPlan]
    clean: np.ndarray
    features: np.ndarray | None = None

    @property
    def num_images(self) -> int:
        return len(self.scenes)

    @property
    def num_captions(self) -> int:
        return len(self.tokens)

    def captions(self, style: str = "precomp") -> list[str]:
        """Caption texts: ``precomp``, ``raw`` (Karpathy) or ``msrvtt`` (see
        :func:`~vlret.data.synthetic_language.tokens_to_text`)."""
        return [tokens_to_text(t, style) for t in self.tokens]

    def relevance(self, *, chunk_size: int = 4096) -> np.ndarray:
        """Dense ``(N_txt, N_img)`` relevance matrix (small splits; see ``iter_relevance``)."""
        return relevance_matrix(self.caption_facts, self.image_facts, chunk_size=chunk_size)

    def scene_array(self) -> np.ndarray:
        """``(N, 4, 6)`` int16 objects (``-1`` rows for absent objects)."""
        out = np.full((len(self.scenes), MAX_OBJECTS, 6), -1, dtype=np.int16)
        for i, scene in enumerate(self.scenes):
            out[i, : len(scene)] = scene
        return out


def _stream(seed: int, split_index: int, purpose: int) -> np.random.Generator:
    return np.random.default_rng([int(seed), split_index, purpose])


def _group_sizes(rng: np.random.Generator, n: int, config: SyntheticConfig) -> list[int]:
    """Image counts of consecutive units (1 = no clone group) covering ``n`` images."""
    mean_group = (2 + config.max_group_size) / 2
    f = config.clone_fraction
    p_group = f / (mean_group - f * (mean_group - 1))
    sizes, total = [], 0
    while total < n:
        left = n - total
        if left >= 2 and rng.random() < p_group:
            g = int(rng.integers(2, min(config.max_group_size, left) + 1))
        else:
            g = 1
        sizes.append(g)
        total += g
    return sizes


def build_split(
    config: SyntheticConfig, name: str, n_images: int, *, seed: int, split_index: int
) -> SyntheticSplit:
    """Scenes, clone groups and captions of one split (features and noise come later)."""
    rng_scene = _stream(seed, split_index, 1)
    rng_caps = _stream(seed, split_index, 2)
    k = config.captions_per_image
    scenes: list[Scene] = []
    edits: list[Edit | None] = []
    groups, kinds, parents = [], [], []
    plans: list[CaptionPlan] = []
    for unit, size in enumerate(_group_sizes(rng_scene, n_images, config)):
        if size == 1:
            scene = sample_scene(rng_scene)
            members, member_edits = [scene], [None]
        else:
            scene = sample_scene(rng_scene, min_secondary=1)
            members, member_edits = [scene], [None]
            seen = {tuple(scene_facts(scene))}
            for _ in range(20 * size):
                if len(members) == size:
                    break
                edit = sample_edit(rng_scene, scene)
                sibling = apply_edit(scene, edit)
                key = tuple(scene_facts(sibling))
                if key not in seen:
                    seen.add(key)
                    members.append(sibling)
                    member_edits.append(edit)
        base_index = len(scenes)
        unit_plans = [
            sample_plan(rng_caps, len(scene), secondary_rate=config.secondary_rate)
            for _ in range(k)
        ]
        for s, edit in enumerate(member_edits[1:]):  # every edit shows in at least one caption
            unit_plans[s % k] = sample_plan(rng_caps, len(scene), focus=edit.focus)
        for m, (member, edit) in enumerate(zip(members, member_edits, strict=True)):
            scenes.append(member)
            edits.append(edit)
            groups.append(unit)
            if len(members) == 1:
                kinds.append(0)
                parents.append(-1)
            else:
                kinds.append(1 if m == 0 else EDIT_KINDS.index(edit.kind))
                parents.append(-1 if m == 0 else base_index)
            plans.extend(unit_plans)
    tokens, cap_facts, forms = [], [], []
    for j, plan in enumerate(plans):
        words, facts = render_caption(plan, scenes[j // k])
        tokens.append(words)
        cap_facts.append(facts)
        forms.append(_form(plan))
    n_txt = len(plans)
    return SyntheticSplit(
        name=name,
        scenes=scenes,
        image_facts=FactSets.from_lists([scene_facts(s) for s in scenes]),
        tokens=tokens,
        caption_facts=FactSets.from_lists(cap_facts),
        caption_form=np.asarray(forms, dtype=np.int8),
        txt_to_img=np.arange(n_txt, dtype=np.int64) // k,
        groups=np.asarray(groups, dtype=np.int32),
        edit_kind=np.asarray(kinds, dtype=np.int8),
        edit_parent=np.asarray(parents, dtype=np.int32),
        edits=edits,
        plans=plans,
        clean=np.ones(n_txt, dtype=bool),
    )


def _form(plan: CaptionPlan) -> int:
    if plan.form == "single":
        return 0 if plan.mentions[0].slot == 0 else 1
    return 2 if plan.form == "pair" else 3


# ------------------------------------------------------------------------------ noise


def _falsified(plan: CaptionPlan, scene: Scene, rng: np.random.Generator) -> CaptionPlan:
    """The plan with one stated fact made false."""
    options: list[tuple] = []
    for m in plan.mentions:
        options.append((m.slot, "count"))
        for kind in m.kinds:
            if not (kind == "cell" and plan.form == "relation"):
                options.append((m.slot, kind))
    if plan.form == "relation":
        options.append(("flip",))
    choice = options[int(rng.integers(len(options)))]
    if choice[0] == "flip":
        return replace(plan, flip=True)
    slot, kind = choice
    obj = scene[slot]
    if kind == "count":
        value = int(rng.choice([c for c in (1, 2, 3) if c != obj[1]])) - 1
    elif kind == "cell":
        taken = {o[5] for o in scene}
        value = int(rng.choice([c for c in range(9) if c not in taken]))
    else:
        n = {"colour": len(COLOURS), "size": len(SIZES), "material": len(MATERIALS)}[kind]
        value = int(rng.choice([v for v in range(n) if v != obj[FIELD[kind]]]))
    return plan.with_lie(slot, kind, value)


def apply_noise(split: SyntheticSplit, noise: NoiseSpec, *, seed: int, split_index: int) -> None:
    """Corrupt ``split`` in place (see :class:`NoiseSpec`) and set ``split.clean``.

    ``permute_captions`` (NCR style) moves the chosen captions one step along a random cycle;
    ``permute_images`` (DECL style) does that with whole caption blocks of the chosen images;
    ``falsify`` re-renders a caption with one stated fact changed. ``clean[j]`` is then
    whether caption ``j``'s facts are a subset of its (new) image's facts: a moved caption
    that happens to fit its new image counts as clean.
    """
    rng = _stream(seed, split_index, 4)
    k = int(np.bincount(split.txt_to_img).max())
    n_txt = split.num_captions
    order = np.arange(n_txt)
    caps = [list(split.caption_facts[j]) for j in range(n_txt)]
    if noise.mode == "permute_captions":
        m = int(round(noise.rate * n_txt))
        if m >= 2:
            chosen = rng.choice(n_txt, m, replace=False)
            order[np.roll(chosen, -1)] = chosen
    elif noise.mode == "permute_images":
        n_img = split.num_images
        m = int(round(noise.rate * n_img))
        if m >= 2:
            chosen = rng.choice(n_img, m, replace=False)
            for src, dst in zip(chosen, np.roll(chosen, -1), strict=True):
                order[dst * k : dst * k + k] = np.arange(src * k, src * k + k)
    else:
        m = int(round(noise.rate * n_txt))
        for j in rng.choice(n_txt, m, replace=False):
            scene = split.scenes[split.txt_to_img[j]]
            plan = _falsified(split.plans[j], scene, rng)
            words, facts = render_caption(plan, scene)
            split.plans[j], split.tokens[j], caps[j] = plan, words, facts
    split.tokens = [split.tokens[s] for s in order]
    split.plans = [split.plans[s] for s in order]
    split.caption_form = split.caption_form[order]
    split.caption_facts = FactSets.from_lists([caps[s] for s in order])
    img_sets = [set(split.image_facts[i].tolist()) for i in range(split.num_images)]
    split.clean = np.array(
        [
            set(split.caption_facts[j].tolist()) <= img_sets[split.txt_to_img[j]]
            for j in range(n_txt)
        ],
        dtype=bool,
    )


# ------------------------------------------------------------------------------ features


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
    rng = _stream(seed, 99, 0)
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


# ------------------------------------------------------------------------------ world


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
    take most of the time on large presets).
    """
    config = get_preset(preset, **overrides)
    spec = parse_noise(noise)
    space = make_feature_space(config, seed=seed)
    world = SyntheticWorld(config, int(seed), spec)
    for index, (name, n) in enumerate(config.splits.items()):
        split = build_split(config, name, n, seed=seed, split_index=index)
        if spec is not None and name == "train":
            apply_noise(split, spec, seed=seed, split_index=index)
        if features:
            rng = _stream(seed, index, 3)
            make = frame_features if config.video else region_features
            split.features = make(space, split.scenes, config, rng)
        world.splits[name] = split
    return world


# ------------------------------------------------------------------------------ writers


def _image_ids(world: SyntheticWorld) -> dict[str, list[int]]:
    out, next_id = {}, 1000
    for name, split in world.splits.items():
        out[name] = list(range(next_id, next_id + split.num_images))
        next_id += split.num_images
    return out


def _write_precomp(world: SyntheticWorld, root: Path) -> dict[str, Any]:
    ids = _image_ids(world)
    files = {}
    for name, split in world.splits.items():
        k = world.config.captions_per_image
        per = ids[name] if name == "train" else [i for i in ids[name] for _ in range(k)]
        paths = write_precomp(root, name, split.features, split.captions("precomp"), ids=per)
        files[name] = {key: p.name for key, p in paths.items()}
    return files


_KARPATHY_SPLIT = {"dev": "val", "test": "test", "testall": "test"}


def _write_karpathy(world: SyntheticWorld, root: Path, *, render_images: bool) -> dict[str, Any]:
    coco = world.config.dataset == "coco"
    dataset = "coco" if coco else "flickr30k"
    images: list[KarpathyImage] = []
    scenes: list[Scene] = []
    sentid = 0
    for name, split in world.splits.items():
        raws = split.captions("raw")
        k = world.config.captions_per_image
        n_train = int(round(0.73 * split.num_images))  # COCO: Karpathy train, then restval
        for i in range(split.num_images):
            imgid = len(images)
            if name == "train":
                label = "restval" if coco and i >= n_train else "train"
            else:
                label = _KARPATHY_SPLIT[name]
            sents = tuple(
                KarpathySentence(
                    sentid + c, raws[i * k + c], tuple(karpathy_tokens(raws[i * k + c]))
                )
                for c in range(k)
            )
            sentid += k
            if coco:
                cocoid = 100000 + imgid
                folder = "train2014" if label == "train" else "val2014"
                filepath, filename = folder, f"COCO_{folder}_{cocoid:012d}.jpg"
            else:
                cocoid, filepath, filename = None, None, f"{1000000000 + imgid}.jpg"
            images.append(
                KarpathyImage(
                    imgid=imgid,
                    filename=filename,
                    split=label,
                    sentids=tuple(s.sentid for s in sents),
                    sentences=sents,
                    filepath=filepath,
                    cocoid=cocoid,
                )
            )
            scenes.append(split.scenes[i])
    json_path = write_karpathy_json(root / f"dataset_{dataset}.json", images, dataset=dataset)
    out: dict[str, Any] = {"json": json_path.name}
    if render_images:
        from .synthetic_render import render_scene

        image_root = root / "images"
        for im, scene in zip(images, scenes, strict=True):
            path = im.path(image_root)
            path.parent.mkdir(parents=True, exist_ok=True)
            render_scene(scene, seed=world.seed * 1_000_003 + im.imgid).save(
                path, format="JPEG", quality=90
            )
        out["image_root"] = "images"
    return out


_MSRVTT_SPLIT = {"train": "train", "dev": "validate", "test": "test", "testall": "test"}


def _write_msrvtt(world: SyntheticWorld, root: Path) -> dict[str, Any]:
    videos, captions, feats, vid_of = [], {}, [], {}
    for name, split in world.splits.items():
        texts = split.captions("msrvtt")
        k = world.config.captions_per_image
        vid_of[name] = []
        for i in range(split.num_images):
            vid = f"video{len(videos)}"
            videos.append((vid, _MSRVTT_SPLIT[name]))
            captions[vid] = texts[i * k : (i + 1) * k]
            vid_of[name].append(vid)
        feats.append(split.features)
    write_msrvtt_json(root / DATA_JSON, videos, captions)
    test_name = "test" if "test" in vid_of else ("testall" if "testall" in vid_of else None)
    test_1ka: list[str] = []
    if test_name is not None:
        test = vid_of[test_name]
        test_1ka = test[len(test) - min(world.config.n_1ka, len(test)) :]
    held = set(test_1ka)
    write_msrvtt_train_csv(root / TRAIN_9K_CSV, [v for v, _ in videos if v not in held])
    write_jsfusion_csv(root / JSFUSION_CSV, [(v, captions[v][0]) for v in test_1ka])
    write_video_features(root, [v for v, _ in videos], np.concatenate(feats))
    first = len(vid_of[test_name]) - len(test_1ka) if test_name else 0
    return {
        "json": DATA_JSON,
        "train_csv": TRAIN_9K_CSV,
        "jsfusion_csv": JSFUSION_CSV,
        "videos": {name: [vids[0], vids[-1]] for name, vids in vid_of.items()},
        "1k-A test": {"split": test_name, "first_image": first, "caption": 0},
    }


def _write_side_files(
    world: SyntheticWorld, root: Path, *, relevance_splits: Sequence[str]
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, split in world.splits.items():
        files = {}
        np.savez_compressed(
            root / f"{name}_synth.npz",
            image_fact_indptr=split.image_facts.indptr,
            image_fact_indices=split.image_facts.indices,
            caption_fact_indptr=split.caption_facts.indptr,
            caption_fact_indices=split.caption_facts.indices,
            txt_to_img=split.txt_to_img.astype(np.int32),
            scenes=split.scene_array(),
            caption_form=split.caption_form,
            edit_kind=split.edit_kind,
            edit_parent=split.edit_parent,
        )
        files["synth"] = f"{name}_synth.npz"
        np.save(root / f"{name}_groups.npy", split.groups)
        files["groups"] = f"{name}_groups.npy"
        if name in relevance_splits:
            txt, img = relevance_pairs(split.caption_facts, split.image_facts)
            np.savez_compressed(
                root / f"{name}_relevance.npz",
                txt=txt,
                img=img,
                shape=np.array([split.num_captions, split.num_images], dtype=np.int64),
            )
            files["relevance"] = f"{name}_relevance.npz"
        if world.noise is not None and name == "train":
            np.save(root / "train_clean.npy", split.clean)
            files["clean"] = "train_clean.npy"
        out[name] = files
    return out


def _summary(split: SyntheticSplit) -> dict[str, Any]:
    edits = np.bincount(split.edit_kind, minlength=len(EDIT_KINDS))
    forms = np.bincount(split.caption_form, minlength=len(CAPTION_FORMS))
    return {
        "images": split.num_images,
        "captions": split.num_captions,
        "images_in_clone_groups": int((split.edit_kind > 0).sum()),
        "edit_kinds": {k: int(v) for k, v in zip(EDIT_KINDS, edits, strict=True)},
        "caption_forms": {k: int(v) for k, v in zip(CAPTION_FORMS, forms, strict=True)},
        "clean_captions": int(split.clean.sum()),
        "features": list(split.features.shape) if split.features is not None else None,
    }


def write_synthetic(
    preset: str | SyntheticConfig,
    out_dir: str | Path,
    *,
    format: str = "precomp",
    seed: int = 0,
    noise: str | NoiseSpec | Mapping[str, Any] | None = None,
    relevance_splits: Sequence[str] | None = None,
    render_images: bool = True,
    overwrite: bool = False,
    **overrides: Any,
) -> Path:
    """Generate a world and write it to ``out_dir`` in ``format``; returns ``out_dir``.

    * ``precomp``: ``{split}_ims.npy`` / ``_caps.txt`` / ``_ids.txt`` (train ids per image,
      the others per caption, as in the real folders);
    * ``karpathy``: ``dataset_flickr30k.json`` (``dataset_coco.json`` for coco-like, train
      split into train + restval) and, with ``render_images`` (needs Pillow), a small JPEG per
      scene under ``images/``;
    * ``msrvtt``: ``MSRVTT_data.json`` (dev is ``validate``), the 9k train CSV (every video
      but the 1k-A test ones), ``MSRVTT_JSFUSION_test.csv`` (the last ``n_1ka`` test videos,
      first caption each), ``video_feats.npy`` + ``video_ids.txt``.

    Side files (any format): ``synthetic.json`` (config, counts, fact names, a config hint
    for ``vlret train``), ``{split}_synth.npz`` (facts, scenes, edits), ``{split}_groups.npy``,
    ``{split}_relevance.npz`` for ``relevance_splits`` (default: every split but train) and
    ``train_clean.npy`` with ``noise``. ``overrides`` are :class:`SyntheticConfig` fields
    (``feature_dim``, ``regions``, ``frames``, ``captions_per_image``, ``splits``, ...).
    An existing non-empty ``out_dir`` (an earlier world included: data trained on must not
    change under a model) is refused unless ``overwrite`` is set.
    """
    if format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {format!r}")
    root = Path(out_dir)
    check_out_dir(root, overwrite=overwrite)
    if render_images and format == "karpathy":
        try:
            import PIL  # noqa: F401
        except ImportError:
            raise ImportError(
                "format 'karpathy' renders images with Pillow (pip install pillow); pass "
                "render_images=False to write the JSON only"
            ) from None
    world = generate_world(preset, seed=seed, noise=noise, **overrides)
    if format == "karpathy" and (root / META_FILE).is_file() and (root / "images").is_dir():
        shutil.rmtree(root / "images")  # stale renders of an earlier synthetic world
    root.mkdir(parents=True, exist_ok=True)
    if format == "precomp":
        format_files = _write_precomp(world, root)
    elif format == "karpathy":
        format_files = _write_karpathy(world, root, render_images=render_images)
    else:
        format_files = _write_msrvtt(world, root)
    if relevance_splits is None:
        relevance_splits = [s for s in world.splits if s != "train"]
    side = _write_side_files(world, root, relevance_splits=relevance_splits)
    config = world.config
    meta = {
        "vlret_synthetic": 1,
        "preset": config.name,
        "format": format,
        "seed": world.seed,
        "noise": asdict(world.noise) if world.noise is not None else None,
        "config": asdict(config),
        "splits": {name: _summary(split) for name, split in world.splits.items()},
        "format_files": format_files,
        "side_files": side,
        "train_config_hint": config_hint(
            root=root,
            format=format,
            files=format_files,
            captions_per_image=config.captions_per_image,
            feature_dim=config.feature_dim,
            has_dev="dev" in world.splits,
        ),
        "n_facts": N_FACTS,
        "facts": fact_names(),
        "edit_kinds": list(EDIT_KINDS),
        "caption_forms": list(CAPTION_FORMS),
    }
    (root / META_FILE).write_text(json.dumps(meta, indent=1), encoding="utf-8")
    return root


def check_out_dir(root: Path, *, overwrite: bool, flag: str = "overwrite=True") -> None:
    """Refuse (``FileExistsError`` naming ``root`` and ``flag``) a non-empty ``root``, an
    earlier synthetic world included, unless ``overwrite``; ``ValueError`` for a file."""
    if root.exists() and not root.is_dir():
        raise ValueError(f"out_dir {root} exists and is not a directory")
    if overwrite or not root.is_dir() or not any(root.iterdir()):
        return
    meta_path = root / META_FILE
    if meta_path.is_file():
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
            what = f" ({meta.get('preset')}, seed {meta.get('seed')}, {meta.get('format')})"
        except (json.JSONDecodeError, AttributeError):
            what = ""
        raise FileExistsError(
            f"{root} already holds a synthetic world{what}; pass {flag} to replace it"
        )
    raise FileExistsError(
        f"{root} is not empty and holds no {META_FILE}; pass {flag} to write into it anyway"
    )


# ------------------------------------------------------------------------------ reading


@dataclass
class SyntheticAnnotations:
    """The side files of one written split (see :func:`load_synthetic`)."""

    root: Path
    split: str
    image_facts: FactSets
    caption_facts: FactSets
    txt_to_img: np.ndarray
    groups: np.ndarray
    scenes: np.ndarray
    caption_form: np.ndarray
    edit_kind: np.ndarray
    edit_parent: np.ndarray
    clean: np.ndarray | None

    def relevance(self) -> np.ndarray:
        """Dense ``(N_txt, N_img)`` relevance: from ``{split}_relevance.npz`` when written,
        else computed from the facts."""
        path = self.root / f"{self.split}_relevance.npz"
        if path.is_file():
            with np.load(path) as z:
                return pairs_to_matrix(z["txt"], z["img"], tuple(int(v) for v in z["shape"]))
        return relevance_matrix(self.caption_facts, self.image_facts)


def load_synthetic(root: str | Path, split: str) -> SyntheticAnnotations:
    """Read the side files of ``split`` written by :func:`write_synthetic`."""
    root = Path(root)
    path = root / f"{split}_synth.npz"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing; expected the side file of split {split!r}")
    with np.load(path) as z:
        data = {key: z[key] for key in z.files}
    clean_path = root / "train_clean.npy"
    clean = np.load(clean_path) if split == "train" and clean_path.is_file() else None
    return SyntheticAnnotations(
        root=root,
        split=split,
        image_facts=FactSets(data["image_fact_indptr"], data["image_fact_indices"]),
        caption_facts=FactSets(data["caption_fact_indptr"], data["caption_fact_indices"]),
        txt_to_img=data["txt_to_img"].astype(np.int64),
        groups=np.load(root / f"{split}_groups.npy"),
        scenes=data["scenes"],
        caption_form=data["caption_form"],
        edit_kind=data["edit_kind"],
        edit_parent=data["edit_parent"],
        clean=clean,
    )


def evaluate_synthetic(
    img_emb, txt_emb, annotations: SyntheticAnnotations | SyntheticSplit
) -> dict[str, Any]:
    """Standard metrics beside the relevance-aware ones for embeddings of a split.

    Returns ``{"standard": RetrievalMetrics, "extended": ExtendedMetrics, "clone":
    CloneChoice, "secondary_t2i_r1": float, "subsets": {name: SubsetRecall}}``:
    ``secondary_t2i_r1`` is the text-to-image R@1 of the captions that mention only a secondary
    object (NaN without any); ``subsets`` the standard R@1/5/10 of query subsets
    (:func:`~vlret.data.synthetic_metrics.subset_recalls`): ``"secondary"`` (those captions,
    T->I), ``"primary"`` (the captions of the primary object alone, T->I), ``"clone_group"``
    (the images in a clone group of two or more and their captions, both directions) and
    ``"no_clone"`` (the other images and their captions).
    """
    from ..metrics import retrieval_metrics, retrieval_ranks

    img = torch.as_tensor(img_emb)
    txt = torch.as_tensor(txt_emb)
    t2i = torch.as_tensor(annotations.txt_to_img, dtype=torch.long)
    relevance = annotations.relevance()
    standard = retrieval_metrics(img, txt, t2i)
    extended: ExtendedMetrics = extended_metrics(img, txt, relevance, txt_to_img=t2i)
    clone: CloneChoice = clone_forced_choice(
        img,
        txt,
        txt_to_img=t2i,
        groups=annotations.groups,
        caption_facts=annotations.caption_facts,
        image_facts=annotations.image_facts,
    )
    _, t2i_ranks = retrieval_ranks(img, txt, t2i)
    secondary = torch.as_tensor(np.asarray(annotations.caption_form) == 1)
    sec_r1 = (
        100.0 * float((t2i_ranks[secondary] < 1).to(torch.float64).mean())
        if bool(secondary.any())
        else float("nan")
    )
    form = np.asarray(annotations.caption_form)
    in_group = clone_group_images(annotations.groups)
    cap_in_group = in_group[t2i.numpy()]
    masks = {
        "secondary": (form == 1, None),
        "primary": (form == 0, None),
        "clone_group": (cap_in_group, in_group),
        "no_clone": (~cap_in_group, ~in_group),
    }
    subsets: dict[str, SubsetRecall] = {
        name: subset_recalls(img, txt, txt_to_img=t2i, caption_mask=cap, image_mask=im)
        for name, (cap, im) in masks.items()
    }
    return {
        "standard": standard,
        "extended": extended,
        "clone": clone,
        "secondary_t2i_r1": sec_r1,
        "subsets": subsets,
    }


def synth_main(preset: str, out: str | Path, **options: Any) -> Path:
    """Entry point of ``vlret synth PRESET --out DIR``: :func:`write_synthetic` with
    ``options`` (``format``, ``seed``, ``noise`` as ``"MODE:RATE"``, ``relevance_splits``,
    ``render_images``, ``overwrite`` and :class:`SyntheticConfig` fields such as
    ``feature_dim``, ``regions``, ``frames``, ``captions_per_image``); ``None`` values mean
    the preset's default. Returns the output folder. A non-empty ``out`` (an earlier world
    included) is refused unless ``overwrite`` (``--overwrite``)."""
    options = {k: v for k, v in options.items() if v is not None}
    check_out_dir(Path(out), overwrite=bool(options.get("overwrite")), flag="--overwrite")
    return write_synthetic(preset, out, **options)


__all__ = [
    "CAPTION_FORMS",
    "EDIT_KINDS",
    "FORMATS",
    "NOISE_MODES",
    "PRESETS",
    "CloneChoice",
    "Edit",
    "ExtendedMetrics",
    "FactSets",
    "FeatureSpace",
    "NoiseSpec",
    "SubsetRecall",
    "SyntheticAnnotations",
    "SyntheticConfig",
    "SyntheticSplit",
    "SyntheticWorld",
    "apply_edit",
    "apply_noise",
    "build_split",
    "check_out_dir",
    "clone_forced_choice",
    "clone_group_images",
    "evaluate_synthetic",
    "extended_metrics",
    "fact_oracle_embeddings",
    "frame_features",
    "generate_world",
    "get_preset",
    "iter_relevance",
    "load_synthetic",
    "make_feature_space",
    "parse_noise",
    "region_features",
    "relevance_matrix",
    "relevance_pairs",
    "sample_edit",
    "sample_scene",
    "subset_recalls",
    "synth_main",
    "train_hint_lines",
    "train_overrides",
    "write_synthetic",
]
