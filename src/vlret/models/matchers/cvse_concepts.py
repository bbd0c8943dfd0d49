"""CVSE's concept statistics: the concept list, per-image concept labels, the co-occurrence
counts and the processed concept graph, in the file formats the authors' release reads.

CVSE (Wang et al., ECCV 2020, Sec. 3.2) builds a graph over ``q`` concept words from how often
they occur together in the training captions. The release (``BruceW91/CVSE``) ships only the
outputs of that step, not the scripts that made them; what its consumer reads fixes the
formats, and this module computes them from the training captions:

* ``category_concepts.json``: ``{word: index}``, indices ``0..C-1``.
* ``all_<ds>_concept_label.json``: ``[{"img_id": "<id>", "concept_labels": [index, ...]},
  ...]``, one entry per training image: the concepts any of its captions contains.
* ``<ds>_adj_concepts.pkl``: a pickle of ``{"nums": (C,), "adj_all": (C, C), "adj_O_P": (C, C),
  "adj_O_M": (C, C)}`` numpy arrays of counts, read by the release's ``gen_A_concept``.

Choices where the release is silent (its generating scripts are not published):

* The concept list. The release's lists are 210 nouns, 60 adjectives and 30 verbs, each group
  by descending frequency, which needs a part-of-speech tagger; NLTK's tagger data and spaCy's
  English models are downloads, not packages, so vlret offers instead the ``num_concepts`` most
  frequent caption tokens that are words (letters, inner hyphens) and not in
  :data:`STOP_WORDS` (:func:`select_concepts`, ties alphabetical), or a list the user gives
  (for example the release's own ``category_concepts.json``).
* Matching. A concept fires for a caption when one of its tokens IS the concept word (surface
  form): the release's training labels of F30K image "0" hold "hands" without "hand" and
  "guys" without "guy", which neither a lemma match nor a first-index rule gives.
* The counting unit. Per image (the labels file is per image): ``nums[c]`` is the number of
  training images whose label set holds ``c``, ``adj_all[c, c']`` the number holding both
  (``c != c'``; the diagonal is 0, as in the ML-GCN adjacency files the code derives from).
* ``adj_O_P`` / ``adj_O_M``: ``adj_all`` restricted to the object x property and object x
  motion blocks of the index ranges ``groups`` (the release's 210 / 60 / 30 split, meaningful
  for a part-of-speech ordered list). The released configuration (``whole_graph``) never reads
  them; they are written so the release's loader finds its keys.

:func:`gen_a_concept` is the release's ``gen_A_concept(..., t=0.3, gen_mode="Complex")``:
conditional probabilities, the long-tail rescale ``5**(P - 0.02) - 5**(-0.02)`` (paper Eq. 2),
binarised at 0.3, re-weighted to column sums 0.25 (Eq. 3), plus the identity; the release
divides by ``nums`` unguarded, here a concept that never occurs gets an empty row.

The files are written and read by :mod:`vlret.models.matchers.cvse_files`. No torch is
imported here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

#: Concepts in the release (``num_attribute``).
DEFAULT_NUM_CONCEPTS = 300
#: The release's noun / adjective / verb group sizes (objects, properties, motions).
RELEASE_GROUPS = (210, 60, 30)
#: The release's ``gen_A_concept`` constants: rescale base and offset, binarising threshold,
#: re-weighting mass, and the two column-sum eps.
RESCALE_BASE, RESCALE_OFFSET, BINARY_THRESHOLD, REWEIGHT = 5.0, 0.02, 0.3, 0.25
REWEIGHT_EPS, COLUMN_EPS = 1e-6, 1e-8
ADJACENCY_KEYS = ("nums", "adj_all", "adj_O_P", "adj_O_M")

#: Function words left out of a frequency-selected concept list (articles, pronouns,
#: prepositions, conjunctions, auxiliaries' forms that carry no content, number words).
STOP_WORDS = frozenset(
    """a an the this that these those there here it its it's they them their he him his she
    her hers we us our you your i me my one two three four five some any each other another
    of in on at to from by with without into onto over under above below near behind beside
    next through across along around between among against toward towards up down out off
    about after before during while for as than then so and or but nor not no yet also very
    too just only both either neither all most more much many few several such own same
    is are was were be been being am do does did has have had having will would can could
    shall should may might must what which who whom whose where when why how""".split()
)


def is_word(token: str) -> bool:
    """Whether a token can be a concept: letters with inner hyphens (``t-shirt``)."""
    parts = token.split("-")
    return bool(token) and all(p.isalpha() for p in parts)


def select_concepts(
    captions: Iterable[Sequence[str]],
    *,
    num_concepts: int = DEFAULT_NUM_CONCEPTS,
    stop_words: Iterable[str] = STOP_WORDS,
) -> list[str]:
    """The ``num_concepts`` most frequent word tokens of tokenised captions, stop words left
    out, most frequent first (ties alphabetical).

    Args:
        captions: Each caption's tokens.
        num_concepts: How many concepts.
        stop_words: Tokens never chosen.

    Returns:
        The concept words, index order.

    Raises:
        ValueError: ``num_concepts`` is not a positive int, or the captions hold fewer
            distinct candidate words.
    """
    _positive(num_concepts, "num_concepts")
    stop = set(stop_words)
    counts: Counter[str] = Counter()
    for tokens in captions:
        counts.update(t for t in tokens if t not in stop and is_word(t))
    if len(counts) < num_concepts:
        raise ValueError(
            f"num_concepts: {num_concepts} asked, but the captions hold only {len(counts)} "
            "distinct words outside the stop list"
        )
    ranked = sorted(counts, key=lambda w: (-counts[w], w))
    return ranked[:num_concepts]


def check_concepts(concepts: Sequence[str]) -> list[str]:
    """A concept list: non-empty, distinct, non-empty strings without surrounding spaces.

    Raises:
        ValueError: The list breaks one of these (the message names the first offender).
    """
    out = list(concepts)
    if not out:
        raise ValueError("concepts: the list is empty")
    seen: dict[str, int] = {}
    for i, word in enumerate(out):
        if not isinstance(word, str) or not word or word != word.strip():
            raise ValueError(f"concepts[{i}]: {word!r} is not a word")
        if word in seen:
            raise ValueError(f"concepts[{i}]: {word!r} repeats concepts[{seen[word]}]")
        seen[word] = i
    return out


def caption_concepts(tokens: Iterable[str], index: Mapping[str, int]) -> set[int]:
    """The concepts a caption's tokens contain (surface-form match)."""
    return {index[t] for t in tokens if t in index}


def image_labels(
    captions: Iterable[Sequence[str]],
    image_of_caption: Sequence[int],
    num_images: int,
    concepts: Sequence[str],
) -> list[list[int]]:
    """Per image, the sorted concepts any of its captions contains.

    Args:
        captions: Each caption's tokens.
        image_of_caption: Each caption's image index in ``0..num_images-1``.
        num_images: Number of images.
        concepts: The concept words.

    Returns:
        ``num_images`` sorted lists of concept indices.

    Raises:
        ValueError: An image index out of range, or more captions than image indices.
    """
    index = {w: i for i, w in enumerate(check_concepts(concepts))}
    labels: list[set[int]] = [set() for _ in range(num_images)]
    owners = list(image_of_caption)
    count = 0
    for count, tokens in enumerate(captions, start=1):
        if count > len(owners):
            raise ValueError(f"image_of_caption: {len(owners)} entries for more captions")
        owner = owners[count - 1]
        if not 0 <= owner < num_images:
            raise ValueError(f"image_of_caption[{count - 1}]: {owner} outside 0..{num_images - 1}")
        labels[owner] |= caption_concepts(tokens, index)
    if count != len(owners):
        raise ValueError(f"image_of_caption: {len(owners)} entries for {count} captions")
    return [sorted(s) for s in labels]


def cooccurrence(
    labels: Sequence[Iterable[int]], num_concepts: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(nums, adj_all)``: per concept the number of label sets holding it, per pair of
    distinct concepts the number holding both (diagonal 0), int64.

    Raises:
        ValueError: A label outside ``0..num_concepts-1``.
    """
    _positive(num_concepts, "num_concepts")
    nums = np.zeros(num_concepts, dtype=np.int64)
    rows = []
    for k, labels_k in enumerate(labels):
        row = np.zeros(num_concepts, dtype=np.int64)
        present = sorted(set(labels_k))
        if present and (present[0] < 0 or present[-1] >= num_concepts):
            raise ValueError(f"labels[{k}]: concept indices must lie in 0..{num_concepts - 1}")
        row[present] = 1
        rows.append(row)
    if not rows:
        return nums, np.zeros((num_concepts, num_concepts), dtype=np.int64)
    onehot = np.stack(rows)
    nums = onehot.sum(axis=0)
    adj = onehot.T @ onehot
    np.fill_diagonal(adj, 0)
    return nums, adj


def group_blocks(
    adj_all: np.ndarray, groups: Sequence[int] = RELEASE_GROUPS
) -> tuple[np.ndarray, np.ndarray]:
    """``(adj_O_P, adj_O_M)``: ``adj_all`` kept only between the objects (the first
    ``groups[0]`` concepts) and the properties (the next ``groups[1]``), and between the
    objects and the motions (the last ``groups[2]``), both ways; zero elsewhere.

    Raises:
        ValueError: ``groups`` are not three non-negative ints summing to ``len(adj_all)``.
    """
    c = adj_all.shape[0]
    if (
        len(groups) != 3
        or any(isinstance(g, bool) or not isinstance(g, int) or g < 0 for g in groups)
        or sum(groups) != c
    ):
        raise ValueError(
            f"groups: three non-negative sizes (objects, properties, motions) summing to the "
            f"{c} concepts expected, got {list(groups)}"
        )
    o, p = groups[0], groups[0] + groups[1]
    objects = np.zeros(c, dtype=bool)
    objects[:o] = True
    props = np.zeros(c, dtype=bool)
    props[o:p] = True
    motions = np.zeros(c, dtype=bool)
    motions[p:] = True

    def keep(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        mask = np.outer(a, b) | np.outer(b, a)
        return np.where(mask, adj_all, 0).astype(adj_all.dtype)

    return keep(objects, props), keep(objects, motions)


@dataclass
class ConceptStats:
    """The statistics of one training split (see the module docstring).

    Attributes:
        concepts: The concept words, index order.
        image_ids: Each training image's id (a string, as the labels file stores it).
        labels: Each training image's sorted concept indices.
        nums: ``(C,)`` images per concept.
        adj_all: ``(C, C)`` images per pair of distinct concepts.
        adj_O_P: ``adj_all`` on the object x property blocks.
        adj_O_M: ``adj_all`` on the object x motion blocks.
    """

    concepts: list[str]
    image_ids: list[str]
    labels: list[list[int]]
    nums: np.ndarray
    adj_all: np.ndarray
    adj_O_P: np.ndarray
    adj_O_M: np.ndarray

    def adjacency(self) -> dict[str, np.ndarray]:
        """The pickle's dict (``nums``, ``adj_all``, ``adj_O_P``, ``adj_O_M``)."""
        return {k: getattr(self, k) for k in ADJACENCY_KEYS}


def compute_concept_stats(
    captions: Sequence[Sequence[str]],
    image_of_caption: Sequence[int],
    image_ids: Sequence[str],
    *,
    concepts: Sequence[str] | None = None,
    num_concepts: int = DEFAULT_NUM_CONCEPTS,
    groups: Sequence[int] | None = None,
) -> ConceptStats:
    """The concept statistics of a training split.

    Args:
        captions: Each training caption's tokens.
        image_of_caption: Each caption's image index.
        image_ids: Each image's id.
        concepts: The concept words; None selects them by frequency (:func:`select_concepts`).
        num_concepts: How many to select when ``concepts`` is None.
        groups: Objects / properties / motions sizes; None takes :data:`RELEASE_GROUPS` for
            300 concepts, else all concepts objects.

    Returns:
        The statistics.

    Raises:
        ValueError: A malformed input (the message names it).
    """
    words = (
        check_concepts(concepts)
        if concepts is not None
        else select_concepts(captions, num_concepts=num_concepts)
    )
    if groups is None:
        groups = RELEASE_GROUPS if len(words) == sum(RELEASE_GROUPS) else (len(words), 0, 0)
    labels = image_labels(captions, image_of_caption, len(image_ids), words)
    nums, adj = cooccurrence(labels, len(words))
    o_p, o_m = group_blocks(adj, groups)
    return ConceptStats(words, [str(i) for i in image_ids], labels, nums, adj, o_p, o_m)


# ----------------------------------------------------------------------------- the graph


def rescale(p: np.ndarray) -> np.ndarray:
    """The release's ``rescale_adj_matrix`` (paper Eq. 2): ``5**(p - 0.02) - 5**(-0.02)``."""
    return RESCALE_BASE ** (p - RESCALE_OFFSET) - RESCALE_BASE ** (-RESCALE_OFFSET)


def process_adjacency(
    counts: np.ndarray, nums: np.ndarray, *, normalise_columns: bool = False
) -> np.ndarray:
    """One matrix of ``gen_A_concept(..., gen_mode="Complex")``, float64.

    ``P = counts / nums[:, None]`` (zero rows where ``nums`` is 0), rescaled (:func:`rescale`),
    binarised at ``>= 0.3``, re-weighted ``B * 0.25 / (column sums + 1e-6)``; with
    ``normalise_columns`` (the release's ``adj_O_P`` and ``adj_O_M``, not ``adj_all``) divided
    once more by its column sums ``+ 1e-8``; then the identity added.

    Args:
        counts: ``(C, C)`` co-occurrence counts.
        nums: ``(C,)`` occurrence counts.
        normalise_columns: The second column normalisation.

    Returns:
        The processed ``(C, C)`` adjacency.

    Raises:
        ValueError: Shapes that disagree or negative counts.
    """
    counts = np.asarray(counts, dtype=np.float64)
    nums = np.asarray(nums, dtype=np.float64)
    c = nums.shape[0] if nums.ndim == 1 else -1
    if nums.ndim != 1 or counts.shape != (c, c):
        raise ValueError(
            f"adjacency: counts {counts.shape} and nums {nums.shape} must be (C, C) and (C,)"
        )
    if (nums < 0).any() or (counts < 0).any() or not np.isfinite(counts).all():
        raise ValueError("adjacency: counts must be finite and non-negative")
    safe = np.where(nums > 0, nums, 1.0)
    p = np.where(nums[:, None] > 0, counts / safe[:, None], 0.0)
    binary = (rescale(p) >= BINARY_THRESHOLD).astype(np.float64)
    out = binary * REWEIGHT / (binary.sum(axis=0, keepdims=True) + REWEIGHT_EPS)
    if normalise_columns:
        out = out / (out.sum(axis=0, keepdims=True) + COLUMN_EPS)
    return out + np.identity(c)


def gen_a_concept(stats: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The release's three processed matrices (float32, as its ``nn.Parameter``s):
    ``adj_all`` without, ``adj_O_P`` / ``adj_O_M`` with the second column normalisation."""
    nums = stats["nums"]
    return {
        key: process_adjacency(stats[key], nums, normalise_columns=key != "adj_all").astype(
            np.float32
        )
        for key in ("adj_O_P", "adj_O_M", "adj_all")
    }


def gen_adj(a: np.ndarray) -> np.ndarray:
    """The release's ``gen_adj``: ``D A^T D`` with ``D = diag(rowsum(A)^-1/2)``."""
    d = np.power(a.sum(axis=1), -0.5)
    return (a * d[None, :]).T * d[None, :]


def _positive(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: must be a positive int, got {value!r}")
    return value


__all__ = [
    "ADJACENCY_KEYS",
    "DEFAULT_NUM_CONCEPTS",
    "RELEASE_GROUPS",
    "STOP_WORDS",
    "ConceptStats",
    "caption_concepts",
    "check_concepts",
    "compute_concept_stats",
    "cooccurrence",
    "gen_a_concept",
    "gen_adj",
    "group_blocks",
    "image_labels",
    "is_word",
    "process_adjacency",
    "rescale",
    "select_concepts",
]
