"""One split of a world: scenes, clone groups, captions with their facts, and the noisy
correspondence of the training split.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import cast

import numpy as np

from .config import EDIT_KINDS, NoiseSpec, SyntheticConfig, rng_stream
from .language import (
    COLOURS,
    FIELD,
    MATERIALS,
    SIZES,
    CaptionPlan,
    render_caption,
    sample_plan,
    scene_facts,
    tokens_to_text,
)
from .relevance import FactSets, relevance_matrix
from .scenes import Edit, Scene, apply_edit, sample_edit, sample_scene
from .video_experts import SyntheticExperts

MAX_OBJECTS = 4


@dataclass
class SyntheticSplit:
    """One split of a world: scenes, captions with their facts, clone groups, noise, features.

    Captions are stored as tokens (``captions(style)`` renders them); caption ``j`` belongs to
    image ``txt_to_img[j]`` (``K`` consecutive captions per image). ``groups[i]`` is the clone
    group of image ``i`` (a unique id for an image in no group); ``edit_kind[i]`` indexes
    :data:`EDIT_KINDS` and ``edit_parent[i]`` is the base image of a sibling (-1 otherwise).
    ``clean[j]`` is False for a caption that noise made wrong for its image. ``features`` are
    the region or frame features; a multi-expert world has ``experts``
    (:class:`~.video_experts.SyntheticExperts`) instead.
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
    experts: SyntheticExperts | None = None

    @property
    def num_images(self) -> int:
        return len(self.scenes)

    @property
    def num_captions(self) -> int:
        return len(self.tokens)

    def captions(self, style: str = "precomp") -> list[str]:
        """Caption texts: ``precomp``, ``raw`` (Karpathy) or ``msrvtt`` (see
        :func:`~vlret.worlds.language.tokens_to_text`)."""
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
    rng_scene = rng_stream(seed, split_index, 1)
    rng_caps = rng_stream(seed, split_index, 2)
    k = config.captions_per_image
    scenes: list[Scene] = []
    edits: list[Edit | None] = []
    groups, kinds, parents = [], [], []
    plans: list[CaptionPlan] = []
    member_edits: list[Edit | None]  # None for a unit's first scene, then its siblings' edits
    edit: Edit | None
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
            unit_plans[s % k] = sample_plan(rng_caps, len(scene), focus=cast(Edit, edit).focus)
        for m, (member, edit) in enumerate(zip(members, member_edits, strict=True)):
            scenes.append(member)
            edits.append(edit)
            groups.append(unit)
            if len(members) == 1:
                kinds.append(0)
                parents.append(-1)
            else:
                kinds.append(1 if m == 0 else EDIT_KINDS.index(cast(Edit, edit).kind))
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
    rng = rng_stream(seed, split_index, 4)
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


__all__ = [
    "MAX_OBJECTS",
    "SyntheticSplit",
    "apply_noise",
    "build_split",
]
