"""The vocabulary and caption grammar of the synthetic person-search world
(:mod:`~.persons`).

A person's captioned attributes are the fields of :data:`VOCABULARY` (value index -> the
canonical name and the caption words); a caption mentions attribute groups (:data:`GROUPS`),
each stating one or both of its fields. Colour words are :mod:`~.language`'s. The grammar puts
one or more clauses (what the person wears, their hair, their bag) in a first sentence after a
subject ("A pedestrian wearing ...", "The person is wearing ...") and the others in sentences
of their own ("They carry a red backpack."); garment phrases vary their word order ("a red
coat", "a coat in red").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from .language import COLOURS

_COLOUR_WORDS = tuple(c[1:] for c in COLOURS)  # the caption words of colour index i
#: Each field's values as (canonical name, caption words...); a field of value -1 is absent.
VOCABULARY: dict[str, tuple[tuple[str, ...], ...]] = {
    "hair_length": (("short", "short"), ("long", "long")),
    "hair_colour": (
        ("black", "black", "dark"),
        ("brown", "brown"),
        ("blond", "blond", "blonde", "fair"),
        ("grey", "grey", "gray"),
    ),
    "upper_type": (
        ("t-shirt", "t-shirt", "tee", "short sleeved shirt"),
        ("sweater", "sweater", "jumper", "long sleeved shirt"),
        ("coat", "coat", "long coat", "overcoat"),
        ("vest", "vest", "sleeveless shirt"),
    ),
    "upper_colour": tuple((c[0], *words) for c, words in zip(COLOURS, _COLOUR_WORDS, strict=True)),
    "lower_type": (
        ("trousers", "trousers", "pants", "jeans"),
        ("shorts", "shorts"),
        ("skirt", "skirt"),
    ),
    "lower_colour": tuple((c[0], *words) for c, words in zip(COLOURS, _COLOUR_WORDS, strict=True)),
    "shoes_colour": tuple((c[0], *words) for c, words in zip(COLOURS, _COLOUR_WORDS, strict=True)),
    "hat_colour": tuple((c[0], *words) for c, words in zip(COLOURS, _COLOUR_WORDS, strict=True)),
    "bag_type": (
        ("backpack", "backpack", "rucksack"),
        ("handbag", "handbag", "shoulder bag", "purse"),
    ),
    "bag_colour": tuple((c[0], *words) for c, words in zip(COLOURS, _COLOUR_WORDS, strict=True)),
}
#: The captioned fields of a person, in caption-group order.
FIELDS = tuple(VOCABULARY)
#: Attribute groups a caption mentions (a group states one or both of its fields).
GROUPS: dict[str, tuple[str, ...]] = {
    "upper": ("upper_type", "upper_colour"),
    "lower": ("lower_type", "lower_colour"),
    "hair": ("hair_length", "hair_colour"),
    "shoes": ("shoes_colour",),
    "hat": ("hat_colour",),
    "bag": ("bag_type", "bag_colour"),
}

# ------------------------------------------------------------------------------ captions

_SUBJECTS = ("a person", "the person", "a pedestrian", "this pedestrian", "someone")
_LATER = (("the person", False), ("this person", False), ("they", True), ("the pedestrian", False))


@dataclass(frozen=True)
class CaptionStyle:
    """How a domain's annotators write (:mod:`~.persons_features`): ``word_weights`` are the
    relative chances of a value's synonyms in :data:`VOCABULARY` order, its last ``n`` for a
    value of ``n`` synonyms (``None``: uniform, domain 0); ``subjects`` the phrases a caption
    opens with (``None``: the grammar's own)."""

    word_weights: tuple[float, ...] | None = None
    subjects: tuple[str, ...] | None = None


#: Domain 0's style: the grammar's uniform synonyms and its subjects.
DEFAULT_STYLE = CaptionStyle()
#: Another domain's style: a value's first of three synonyms never, its last most often; other
#: subjects.
OTHER_STYLE = CaptionStyle(
    word_weights=(0.0, 0.25, 0.75),
    subjects=("an individual", "the individual", "a walker", "this figure"),
)


def _word(rng: np.random.Generator, f: str, value: int, style: CaptionStyle) -> str:
    words = VOCABULARY[f][value][1:]
    if style.word_weights is None or len(words) == 1:
        return words[int(rng.integers(len(words)))]
    w = np.asarray(style.word_weights[-len(words) :], dtype=float)
    return words[int(rng.choice(len(words), p=w / w.sum()))]


def _article(phrase: str) -> str:
    return ("an " if phrase[0] in "aeiou" else "a ") + phrase


def _garment(rng, colour: str | None, noun: str, plural: bool) -> str:
    if colour is None:
        phrase = noun
    elif rng.random() < 0.2:
        phrase = f"{noun} in {colour}"
    else:
        phrase = f"{colour} {noun}"
    return phrase if plural else _article(phrase)


def _clauses(
    rng: np.random.Generator,
    person: dict[str, int],
    groups: list[str],
    stated: dict[str, str],
    style: CaptionStyle,
) -> list[tuple[str, str, str]]:
    """``(participle, singular, plural)`` forms of each clause; records what each states in
    ``stated``."""

    def take(f: str) -> str:
        stated[f] = VOCABULARY[f][person[f]][0]
        return _word(rng, f, person[f], style)

    def fields_of(group: str) -> tuple[str, ...]:
        fields = GROUPS[group]
        if len(fields) == 2 and rng.random() < 0.25:  # only one of the two
            return (fields[int(rng.integers(2))],)
        return fields

    wear: list[str] = []
    out: list[tuple[str, str, str]] = []
    for group in groups:
        fs = fields_of(group)
        if group in ("upper", "lower"):
            kind, colour_field = GROUPS[group]
            colour = take(colour_field) if colour_field in fs else None
            if kind in fs:
                noun = take(kind)
                plural = noun in ("trousers", "pants", "jeans", "shorts")
            else:
                noun, plural = ("top", False) if group == "upper" else ("bottoms", True)
            wear.append(_garment(rng, colour, noun, plural))
        elif group == "shoes":
            noun = ("shoes", "sneakers", "trainers")[int(rng.integers(3))]
            wear.append(_garment(rng, take("shoes_colour"), noun, True))
        elif group == "hat":
            wear.append(
                _garment(rng, take("hat_colour"), ("hat", "cap")[int(rng.integers(2))], False)
            )
        elif group == "hair":
            words = [take(f) for f in fs]
            hair = " ".join(words) + " hair"
            out.append((f"with {hair}", f"has {hair}", f"have {hair}"))
        else:  # bag
            colour = take("bag_colour") if "bag_colour" in fs else None
            noun = take("bag_type") if "bag_type" in fs else "bag"
            bag = _garment(rng, colour, noun, False)
            out.append((f"carrying {bag}", f"carries {bag}", f"carry {bag}"))
    if wear:
        listed = wear[0] if len(wear) == 1 else ", ".join(wear[:-1]) + " and " + wear[-1]
        verb = ("wearing", "is wearing", "are wearing")
        if rng.random() < 0.3:
            verb = ("dressed in", "is dressed in", "are dressed in")
        at = int(rng.integers(len(out) + 1))
        out.insert(at, tuple(f"{v} {listed}" for v in verb))  # type: ignore[arg-type]
    return out


def _join(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def _sentence(words: str) -> str:
    return words[:1].upper() + words[1:] + "."


def make_caption(
    rng: np.random.Generator, person: dict[str, int], style: CaptionStyle = DEFAULT_STYLE
) -> tuple[str, dict[str, str]]:
    """One caption of ``person`` and what it states (field -> canonical value name), in the
    annotators' ``style`` (a domain's, :mod:`~.persons_features`).

    Most captions (60%) mention every attribute group the person has (a group may still state
    only its type or only its colour), the others one to three groups; the first sentence
    holds one or more clauses, the rest follow as sentences of their own.
    """
    groups = ["upper", "lower", "hair", "shoes"]
    groups += [g for g, f in (("hat", "hat_colour"), ("bag", "bag_type")) if person[f] >= 0]
    if rng.random() < 0.4:
        groups = [groups[i] for i in sorted(rng.choice(len(groups), 1 + rng.integers(3), False))]
    elif rng.random() < 0.5:
        groups = [groups[i] for i in rng.permutation(len(groups))]
    stated: dict[str, str] = {}
    clauses = _clauses(rng, person, groups, stated, style)
    first = 1 + int(rng.integers(len(clauses)))
    subjects = style.subjects or _SUBJECTS
    subject = subjects[int(rng.integers(len(subjects)))]
    finite = rng.random() < 0.5  # "A person wearing ..." or "A person is wearing ..."
    head = [c[1] if finite else c[0] for c in clauses[:first]]
    sentences = [_sentence(f"{subject} {_join(head)}")]
    for clause in clauses[first:]:
        who, plural = _LATER[int(rng.integers(len(_LATER)))]
        sentences.append(_sentence(f"{who} {clause[2] if plural else clause[1]}"))
    return " ".join(sentences), dict(sorted(stated.items()))


def processed_tokens(caption: str) -> list[str]:
    """CUHK-PEDES's ``processed_tokens`` of a caption as this world writes them: its
    lower-cased runs of letters."""
    return re.findall("[a-z]+", caption.lower())


__all__ = [
    "DEFAULT_STYLE",
    "FIELDS",
    "GROUPS",
    "OTHER_STYLE",
    "VOCABULARY",
    "CaptionStyle",
    "make_caption",
    "processed_tokens",
]
