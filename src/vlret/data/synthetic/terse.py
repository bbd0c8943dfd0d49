"""The synthetic world's own captioner: a second, terser grammar over the same scenes, standing
in for BLIP's pseudo captions (AdaCL 3.4, A.2; docs/captions.md).

One caption per image, short and standardised as a captioner's are: a fixed word per concept
(the first synonym, no variety), always the primary object's count and category, its colour
about half the time and its size rarely, a secondary object by its category alone now and
then, never a material, a cell or a relation. So it is right about what it says but misses
most secondary objects and attributes, and clone siblings that differ there get the same
caption: more clone negatives than the human-style captions, the setting AdaCL's robustness
claim is about.

Deterministic from the world's seed (a random stream of its own per split, so the world's
other streams are untouched): :func:`write_terse_captions` reads a written world's scenes and
writes ``pseudo/{split}_caps.txt`` with its sidecar, the captions-file format of
:mod:`vlret.data.captioning_files`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..captioning_files import write_captions_file
from .config import rng_stream
from .hint import META_FILE
from .language import CATEGORIES, COLOURS, COUNT_WORDS, SIZES, tokens_to_text
from .scenes import Scene

#: The folder of a world's pseudo captions.
PSEUDO_FOLDER = "pseudo"
#: The random-stream purpose of the terse captions (:func:`~.config.rng_stream`).
TERSE_PURPOSE = 17
#: Probabilities: the primary's colour, its size, and naming one secondary object.
P_COLOUR, P_SIZE, P_SECONDARY = 0.5, 0.15, 0.3
#: The caption text style of each world format (:func:`~.language.tokens_to_text`).
FORMAT_STYLES = {"precomp": "precomp", "karpathy": "raw", "msrvtt": "msrvtt"}
_PLURAL = {"box": "boxes", "cross": "crosses", "hourglass": "hourglasses"}


def _noun(category: int, count: int) -> str:
    word = CATEGORIES[category][1]
    return word if count == 1 else _PLURAL.get(word, word + "s")


def _np(obj: Sequence[int], adjectives: list[str]) -> list[str]:
    count = int(obj[1])
    head = COUNT_WORDS[count - 1][0]  # "a", "two", "three"
    words = [*adjectives, _noun(int(obj[0]), count)]
    if head == "a" and (words[0][0] in "aeiou" or words[0].startswith("hour")):
        head = "an"
    return [head, *words]


def terse_caption(scene: Scene, rng: np.random.Generator) -> list[str]:
    """The tokens of one terse caption of ``scene`` (module docstring)."""
    primary = scene[0]
    adjectives = []
    if rng.random() < P_SIZE:
        adjectives.append(SIZES[primary[3]][1])
    if rng.random() < P_COLOUR:
        adjectives.append(COLOURS[primary[2]][1])
    words = _np(primary, adjectives)
    if len(scene) > 1 and rng.random() < P_SECONDARY:
        other = scene[1 + int(rng.integers(len(scene) - 1))]
        words += ["and", *_np(other, [])]
    form = int(rng.integers(3))
    if form == 1:
        words = ["a", "picture", "of", *words]
    elif form == 2:
        words = [*words, "on", "a", "plain", "background"]
    return [*words, "."]


def terse_captions(
    scenes: Sequence[Scene], *, seed: int, split_index: int, style: str = "precomp"
) -> list[str]:
    """One terse caption per scene, in order, from the world's ``seed`` and the split's index
    in the world (``style``: :func:`~.language.tokens_to_text`)."""
    rng = rng_stream(seed, split_index, TERSE_PURPOSE)
    return [tokens_to_text(terse_caption(scene, rng), style) for scene in scenes]


def _scenes(array: np.ndarray) -> list[Scene]:
    """Scenes from a side file's ``(N, 4, 6)`` array (``-1`` rows: absent objects)."""
    return [tuple(tuple(int(v) for v in obj) for obj in row if obj[0] >= 0) for row in array]


def write_terse_captions(root: str | Path, *, split: str = "train") -> Path:
    """Write ``root/pseudo/{split}_caps.txt`` (and its ``.json`` sidecar): one terse caption
    per image of ``split`` of the world written in ``root``, in the split's image order.

    Args:
        root: A folder ``vlret synth`` wrote (``synthetic.json``, ``{split}_synth.npz``).
        split: The split to caption.

    Returns:
        The captions file.

    Raises:
        FileNotFoundError: ``root`` holds no world or no such split.
    """
    root = Path(root)
    meta_path = root / META_FILE
    if not meta_path.is_file():
        raise FileNotFoundError(f"{meta_path}: missing; expected a world `vlret synth` wrote")
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    names = list(meta.get("splits") or {})
    if split not in names:
        raise FileNotFoundError(f"{meta_path}: the world has no split {split!r} ({names})")
    with np.load(root / f"{split}_synth.npz") as z:
        scenes = _scenes(z["scenes"])
    style = FORMAT_STYLES.get(meta.get("format", "precomp"), "precomp")
    captions = terse_captions(
        scenes, seed=int(meta["seed"]), split_index=names.index(split), style=style
    )
    return write_captions_file(
        root / PSEUDO_FOLDER / f"{split}_caps.txt",
        captions,
        split=split,
        captions_per_image=1,
        source="synthetic-terse",
        world=str(root),
        preset=meta.get("preset"),
        seed=meta.get("seed"),
        probabilities={"colour": P_COLOUR, "size": P_SIZE, "secondary": P_SECONDARY},
    )


__all__ = [
    "PSEUDO_FOLDER",
    "TERSE_PURPOSE",
    "terse_caption",
    "terse_captions",
    "write_terse_captions",
]
