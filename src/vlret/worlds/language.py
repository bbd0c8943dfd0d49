"""Lexicon, atomic facts and the caption grammar of the synthetic world.

A scene is a tuple of objects, primary first; an object is ``(category, count, colour, size,
material, cell)`` with value indices (``count`` is 1-3, the others 0-based). Categories are
distinct within a scene, so a fact names an object by its category:

* attribute facts ``count(square)=2``, ``colour(square)=red``, ``size``, ``material``,
  ``cell(square)=top left`` (a 3 x 3 grid);
* relation facts ``left_of(square, circle)`` and ``above(square, circle)``, derived from the
  cells (``right_of`` and ``below`` are the same facts read the other way).

A caption is rendered from a :class:`CaptionPlan`: which objects it mentions (by slot: 0 is the
primary object), which of their attributes, the sentence form and the random choices of words.
The plan refers to slots, not values, so the same plan rendered on two clone siblings gives
near-duplicate captions, and on a binding swap (red square and blue circle vs blue square and
red circle) the same bag of words. Synonyms are chosen per *value* within a caption (not per
position), which is what keeps a binding swap's bag of words identical. Every attribute word
starts with a consonant so that ``a``/``an`` does not change under a swap.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

# (canonical name, synonyms...). The first entry is the canonical name used in fact names.
CATEGORIES: tuple[tuple[str, ...], ...] = (
    ("square", "square", "box", "block"),
    ("circle", "circle", "ball", "disc"),
    ("triangle", "triangle", "wedge"),
    ("pentagon", "pentagon"),
    ("hexagon", "hexagon"),
    ("star", "star"),
    ("ring", "ring", "hoop", "donut"),
    ("cross", "cross", "plus sign"),
    ("diamond", "diamond", "rhombus"),
    ("heart", "heart"),
    ("arrow", "arrow", "pointer"),
    ("crescent", "crescent", "moon"),
    ("bar", "bar", "rod", "stick"),
    ("egg", "egg", "oval"),
    ("dome", "dome", "half circle"),
    ("trapezoid", "trapezoid"),
    ("octagon", "octagon"),
    ("kite", "kite"),
    ("hourglass", "hourglass", "bowtie"),
    ("frame", "frame", "square outline"),
)
_PLURAL = {"box": "boxes", "cross": "crosses", "hourglass": "hourglasses"}

COLOURS: tuple[tuple[str, ...], ...] = (
    ("red", "red", "crimson", "scarlet"),
    ("blue", "blue", "navy"),
    ("green", "green", "lime"),
    ("yellow", "yellow", "golden"),
    ("white", "white", "snowy"),
    ("black", "black", "dark"),
    ("pink", "pink", "rosy"),
    ("purple", "purple", "violet"),
    ("brown", "brown", "tan"),
    ("grey", "grey", "gray"),
)
SIZES: tuple[tuple[str, ...], ...] = (
    ("small", "small", "tiny", "little"),
    ("medium", "medium", "medium sized"),
    ("large", "large", "big", "huge"),
)
# (canonical, adjectives..., "|", nouns after "made of" ...)
MATERIALS: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = (
    (("metal", "metal", "metallic", "steel"), ("metal", "steel")),
    (("rubber", "rubber", "matte"), ("rubber",)),
    (("wood", "wooden"), ("wood",)),
    (("glass", "glass", "glassy"), ("glass",)),
    (("stone", "stone", "rocky"), ("stone",)),
)
CELLS: tuple[tuple[str, ...], ...] = (
    ("top left", "in the top left corner", "at the upper left"),
    ("top", "at the top", "in the top middle"),
    ("top right", "in the top right corner", "at the upper right"),
    ("left", "on the left", "at the left side"),
    ("center", "in the center", "in the middle"),
    ("right", "on the right", "at the right side"),
    ("bottom left", "in the bottom left corner", "at the lower left"),
    ("bottom", "at the bottom", "in the bottom middle"),
    ("bottom right", "in the bottom right corner", "at the lower right"),
)
COUNT_WORDS: tuple[tuple[str, ...], ...] = (
    ("a", "one", "a single"),
    ("two", "a pair of"),
    ("three", "a group of three"),
)
LEFT, RIGHT = ("to the left of", "left of"), ("to the right of", "right of")
ABOVE, BELOW = ("above", "over"), ("below", "under", "beneath")

N_CATEGORIES = len(CATEGORIES)
#: Attribute kinds of an object, in the order of its tuple after the category.
KINDS = ("count", "colour", "size", "material", "cell")
N_VALUES = {"count": 3, "colour": len(COLOURS), "size": len(SIZES), "material": 5, "cell": 9}
#: Kinds a caption may mention besides the count (which every mention states).
MENTION_KINDS = ("size", "colour", "material", "cell")
#: Position of each kind in an object tuple.
FIELD = {"category": 0, "count": 1, "colour": 2, "size": 3, "material": 4, "cell": 5}

_ATTR_BASE: dict[str, int] = {}
_offset = 0
for _kind in KINDS:
    _ATTR_BASE[_kind] = _offset
    _offset += N_CATEGORIES * N_VALUES[_kind]
REL_BASE = _offset
RELATIONS = ("left_of", "above")
N_FACTS = REL_BASE + len(RELATIONS) * N_CATEGORIES * N_CATEGORIES


def attr_fact(kind: str, category: int, value: int) -> int:
    """Id of ``kind(category) = value`` (``value`` 0-based; a count of 1 is value 0)."""
    return _ATTR_BASE[kind] + category * N_VALUES[kind] + value


def rel_fact(relation: int, a: int, b: int) -> int:
    """Id of ``left_of(a, b)`` (``relation`` 0) or ``above(a, b)`` (1), by category."""
    return REL_BASE + (relation * N_CATEGORIES + a) * N_CATEGORIES + b


def fact_names() -> list[str]:
    """Readable name of every fact id (``N_FACTS`` strings; unused relation slots ``a == b``
    are named too, so that ``names[i]`` is fact ``i``)."""
    names: list[str] = []
    cats = [c[0] for c in CATEGORIES]
    values = {
        "count": ["1", "2", "3"],
        "colour": [c[0] for c in COLOURS],
        "size": [s[0] for s in SIZES],
        "material": [m[0][0] for m in MATERIALS],
        "cell": [c[0] for c in CELLS],
    }
    for kind in KINDS:
        for c in cats:
            names.extend(f"{kind}({c})={v}" for v in values[kind])
    for rel in RELATIONS:
        for a in cats:
            names.extend(f"{rel}({a},{b})" for b in cats)
    return names


def cell_row_col(cell: int) -> tuple[int, int]:
    return divmod(int(cell), 3)


def pair_relations(obj_a: tuple[int, ...], obj_b: tuple[int, ...]) -> list[int]:
    """Relation facts between two objects of a scene (one per axis on which their cells
    differ)."""
    ra, ca = cell_row_col(obj_a[5])
    rb, cb = cell_row_col(obj_b[5])
    out = []
    if ca != cb:
        out.append(rel_fact(0, obj_a[0], obj_b[0]) if ca < cb else rel_fact(0, obj_b[0], obj_a[0]))
    if ra != rb:
        out.append(rel_fact(1, obj_a[0], obj_b[0]) if ra < rb else rel_fact(1, obj_b[0], obj_a[0]))
    return out


def scene_facts(scene: tuple[tuple[int, ...], ...]) -> list[int]:
    """All facts true of a scene, sorted."""
    facts = []
    for obj in scene:
        cat = obj[0]
        facts.append(attr_fact("count", cat, obj[1] - 1))
        for kind in ("colour", "size", "material", "cell"):
            facts.append(attr_fact(kind, cat, obj[FIELD[kind]]))
    for i in range(len(scene)):
        for j in range(i + 1, len(scene)):
            facts.extend(pair_relations(scene[i], scene[j]))
    return sorted(facts)


# ------------------------------------------------------------------------------ plans


@dataclass(frozen=True)
class Mention:
    """One object of a caption: its ``slot`` in the scene, the ``kinds`` it states (besides its
    count) and the phrase ``style`` (0 all adjectives, 1 "made of", 2 "that is <colour>")."""

    slot: int
    kinds: tuple[str, ...]
    style: int = 0


@dataclass(frozen=True)
class CaptionPlan:
    """Everything about a caption except the scene's values (see the module docstring).

    ``form``: ``single`` (one object), ``pair`` (two objects) or ``relation`` (two objects and
    their spatial relation on ``axis`` 0 horizontal / 1 vertical, falling back to the other
    axis where the cells share a column or row). ``lies`` overrides values as
    ``(slot, kind, value)`` and ``flip`` reverses the stated relation: that is how a caption is
    falsified.
    """

    form: str
    mentions: tuple[Mention, ...]
    variant: int
    seed: int
    axis: int = 0
    lies: tuple[tuple[int, str, int], ...] = ()
    flip: bool = False

    def with_lie(self, slot: int, kind: str, value: int) -> CaptionPlan:
        return replace(self, lies=(*self.lies, (slot, kind, value)))


def _mix(seed: int, key: int) -> int:
    """A splitmix64 hash of ``(seed, key)``: per-caption word choices independent of order."""
    z = (seed * 0x9E3779B97F4A7C15 + key * 0xBF58476D1CE4E5B9 + 0x94D049BB133111EB) & (2**64 - 1)
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & (2**64 - 1)
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & (2**64 - 1)
    return z ^ (z >> 31)


def _pick(seed: int, key: int, options: tuple[str, ...]) -> str:
    return options[_mix(seed, key) % len(options)]


# Keys of _pick: kind * 1000 + value, so the same value gets the same word within a caption.
_K_NOUN, _K_COLOUR, _K_SIZE, _K_MAT, _K_MADE, _K_CELL, _K_COUNT, _K_REL = range(1, 9)


def _noun(seed: int, cat: int, count: int) -> str:
    word = _pick(seed, _K_NOUN * 1000 + cat, CATEGORIES[cat][1:])
    if count == 1:
        return word
    return _PLURAL.get(word, word + "s")


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" or word.startswith("hour") else "a"


def noun_phrase(seed: int, obj: tuple[int, ...], mention: Mention) -> list[str]:
    """Words of one object mention (count, stated attributes, noun, cell phrase)."""
    cat, count = obj[0], obj[1]
    kinds = set(mention.kinds)
    size = _pick(seed, _K_SIZE * 1000 + obj[3], SIZES[obj[3]][1:]) if "size" in kinds else None
    colour = (
        _pick(seed, _K_COLOUR * 1000 + obj[2], COLOURS[obj[2]][1:]) if "colour" in kinds else None
    )
    mat_adj = _pick(seed, _K_MAT * 1000 + obj[4], MATERIALS[obj[4]][0][1:])
    mat_noun = _pick(seed, _K_MADE * 1000 + obj[4], MATERIALS[obj[4]][1])
    noun = _noun(seed, cat, count)
    style = mention.style
    pre: list[str] = []
    post: list[str] = []
    if size:
        pre.append(size)
    if colour and style != 2:
        pre.append(colour)
    if "material" in kinds:
        if style == 1:
            post += ["made", "of", mat_noun]
        else:
            pre.append(mat_adj)
    if colour and style == 2:
        post += ["that", "is" if count == 1 else "are", colour]
    if "cell" in kinds:
        post.append(_pick(seed, _K_CELL * 1000 + obj[5], CELLS[obj[5]][1:]))
    det = _pick(seed, _K_COUNT * 1000 + count, COUNT_WORDS[count - 1])
    first = (pre or [noun])[0]
    if det == "a":
        det = _article(first)
    words = [det, *pre, noun, *post]
    return " ".join(words).split()


def _verb(count: int) -> str:
    return "is" if count == 1 else "are"


def _apply_lies(plan: CaptionPlan, scene: tuple[tuple[int, ...], ...]):
    objs = [list(o) for o in scene]
    for slot, kind, value in plan.lies:
        objs[slot][FIELD[kind]] = value + 1 if kind == "count" else value
    return [tuple(o) for o in objs]


def relation_of(
    obj_a: tuple[int, ...], obj_b: tuple[int, ...], axis: int
) -> tuple[int, bool] | None:
    """``(axis, a_first)`` of the relation between two objects on ``axis`` (or the other axis
    if their cells agree on it): ``a_first`` is True when ``a`` is left of / above ``b``."""
    ra, ca = cell_row_col(obj_a[5])
    rb, cb = cell_row_col(obj_b[5])
    for ax in (axis, 1 - axis):
        pa, pb = (ca, cb) if ax == 0 else (ra, rb)
        if pa != pb:
            return ax, pa < pb
    return None


def render_caption(
    plan: CaptionPlan, scene: tuple[tuple[int, ...], ...]
) -> tuple[list[str], list[int]]:
    """Tokens (words and ``,``/``.``) of the caption and the sorted ids of the facts it states.

    The facts are read from what was rendered, so a falsified plan states a false fact.
    """
    objs = _apply_lies(plan, scene)
    seed = plan.seed
    facts: set[int] = set()
    for m in plan.mentions:
        obj = objs[m.slot]
        facts.add(attr_fact("count", obj[0], obj[1] - 1))
        for kind in m.kinds:
            facts.add(attr_fact(kind, obj[0], obj[FIELD[kind]]))
    nps = [noun_phrase(seed, objs[m.slot], m) for m in plan.mentions]
    v = plan.variant
    if plan.form == "single":
        np0, count = nps[0], objs[plan.mentions[0].slot][1]
        templates: tuple[list[str], ...] = (
            [*np0, "."],
            ["there", _verb(count), *np0, "."],
            ["a", "picture", "of", *np0, "."],
            ["an", "image", "showing", *np0, "."],
        )
        words = templates[v % len(templates)]
    elif plan.form == "pair":
        np0, np1 = nps
        templates = (
            [*np0, "and", *np1, "."],
            [*np0, "together", "with", *np1, "."],
            ["a", "scene", "with", *np0, "and", *np1, "."],
            ["there", "is", *np0, "and", *np1, "."],
        )
        words = templates[v % len(templates)]
    elif plan.form == "relation":
        m0, m1 = plan.mentions
        a, b = objs[m0.slot], objs[m1.slot]
        rel = relation_of(a, b, plan.axis)
        if rel is None:  # same cell cannot happen in a scene; guard for hand-made ones
            raise ValueError("relation caption on two objects in the same cell")
        axis, a_first = rel
        if plan.flip:
            a_first = not a_first
        facts.add(rel_fact(axis, a[0], b[0]) if a_first else rel_fact(axis, b[0], a[0]))
        if axis == 0:
            phrase = _pick(seed, _K_REL * 1000 + a_first, LEFT if a_first else RIGHT)
        else:
            phrase = _pick(seed, _K_REL * 1000 + 2 + a_first, ABOVE if a_first else BELOW)
        templates = (
            [*nps[0], _verb(a[1]), *phrase.split(), *nps[1], "."],
            ["there", _verb(a[1]), *nps[0], *phrase.split(), *nps[1], "."],
            ["in", "this", "image", ",", *nps[0], _verb(a[1]), *phrase.split(), *nps[1], "."],
        )
        words = templates[v % len(templates)]
    else:
        raise ValueError(f"plan.form must be 'single', 'pair' or 'relation', got {plan.form!r}")
    return words, sorted(facts)


def tokens_to_text(tokens: list[str], style: str) -> str:
    """``precomp``: capitalised, a space before punctuation ("A red star .");
    ``raw`` (Karpathy): "A red star."; ``msrvtt``: lower case without punctuation."""
    if style == "msrvtt":
        return " ".join(t for t in tokens if t not in (",", "."))
    text = " ".join(tokens)
    text = text[:1].upper() + text[1:]
    if style == "raw":
        text = text.replace(" .", ".").replace(" ,", ",")
    elif style != "precomp":
        raise ValueError(f"style must be 'precomp', 'raw' or 'msrvtt', got {style!r}")
    return text


# ------------------------------------------------------------------------------ sampling

_PRIMARY_P = {"colour": 0.85, "size": 0.5, "material": 0.5, "cell": 0.45}
_SECONDARY_P = {"colour": 0.7, "size": 0.3, "material": 0.35, "cell": 0.2}


def _kinds(rng: np.random.Generator, probs: dict[str, float], at_least: int) -> list[str]:
    u = rng.random(len(MENTION_KINDS))
    kinds = [k for k, x in zip(MENTION_KINDS, u, strict=True) if x < probs[k]]
    order = rng.permutation(len(MENTION_KINDS))
    for idx in order:  # top up to the minimum in a random order
        if len(kinds) >= at_least:
            break
        if MENTION_KINDS[idx] not in kinds:
            kinds.append(MENTION_KINDS[idx])
    return sorted(kinds, key=MENTION_KINDS.index)


def _mention(rng, slot: int, probs, at_least: int, force: tuple[str, ...] = ()) -> Mention:
    kinds = set(_kinds(rng, probs, at_least)) | set(force)
    return Mention(slot, tuple(k for k in MENTION_KINDS if k in kinds), int(rng.integers(3)))


def sample_plan(
    rng: np.random.Generator,
    n_objects: int,
    *,
    secondary_rate: float = 0.15,
    focus: tuple | None = None,
) -> CaptionPlan:
    """A random caption plan for a scene of ``n_objects`` objects.

    Forms: one object (the primary; or, with probability ``secondary_rate``, a secondary one
    alone: such a caption also fits images whose primary object it is), two objects, or two
    objects and their relation. ``focus`` forces the caption to state what a clone edit
    changed: ``("attr", slot, kind)``, ``("count", slot)``, ``("binding", a, b, kind)`` or
    ``("relation", a, b)``.
    """
    variant, seed = int(rng.integers(12)), int(rng.integers(2**31))
    axis = int(rng.integers(2))
    if focus is not None:
        tag = focus[0]
        if tag in ("attr", "count"):
            slot = focus[1]
            force = (focus[2],) if tag == "attr" else ()
            probs = _PRIMARY_P if slot == 0 else _SECONDARY_P
            m = _mention(rng, slot, probs, 1, force)
            return CaptionPlan("single", (m,), variant, seed, axis)
        a, b = focus[1], focus[2]
        if tag == "binding":
            kind = focus[3]
            m0 = _mention(rng, a, _PRIMARY_P, 1, (kind,))
            m1 = _mention(rng, b, _SECONDARY_P, 0, (kind,))
            return CaptionPlan("pair", (m0, m1), variant, seed, axis)
        if tag == "relation":
            m0 = _mention(rng, a, _SECONDARY_P, 0)
            m1 = _mention(rng, b, _SECONDARY_P, 0)
            return CaptionPlan("relation", (m0, m1), variant, seed, axis)
        raise ValueError(f"unknown focus {focus!r}")
    if n_objects == 1:
        return CaptionPlan("single", (_mention(rng, 0, _PRIMARY_P, 2),), variant, seed, axis)
    u = rng.random()
    other = int(rng.integers(1, n_objects))
    if u < secondary_rate:
        return CaptionPlan("single", (_mention(rng, other, _PRIMARY_P, 2),), variant, seed, axis)
    u = (u - secondary_rate) / (1 - secondary_rate)
    if u < 0.4:
        return CaptionPlan("single", (_mention(rng, 0, _PRIMARY_P, 2),), variant, seed, axis)
    m0 = _mention(rng, 0, _PRIMARY_P, 1)
    if u < 0.7:
        m1 = _mention(rng, other, _SECONDARY_P, 1)
        return CaptionPlan("pair", (m0, m1), variant, seed, axis)
    m1 = _mention(rng, other, _SECONDARY_P, 0)
    if rng.random() < 0.5:
        m0, m1 = m1, m0
    return CaptionPlan("relation", (m0, m1), variant, seed, axis)


__all__ = [
    "CATEGORIES",
    "CELLS",
    "COLOURS",
    "KINDS",
    "MATERIALS",
    "MENTION_KINDS",
    "N_CATEGORIES",
    "N_FACTS",
    "N_VALUES",
    "SIZES",
    "CaptionPlan",
    "Mention",
    "attr_fact",
    "fact_names",
    "noun_phrase",
    "pair_relations",
    "rel_fact",
    "relation_of",
    "render_caption",
    "sample_plan",
    "scene_facts",
    "tokens_to_text",
]
