"""The synthetic world's own captioner: a second, terser grammar over the same scenes, standing
in for BLIP's pseudo captions (AdaCL 3.4, A.2; docs/captions.md).

One caption per image, short and standardised as a captioner's are: always the primary object's
count and category, its colour about half the time and its size rarely, a secondary object by
its category alone now and then, never a material, a cell or a relation, in one of four fixed
frames ("a picture of ...", "an image showing ...", "there is ...", or the bare phrase). So it
is right about what it says but misses most secondary objects and attributes, and clone
siblings that differ there get the same kind of caption: more clone negatives than the
human-style captions, the setting AdaCL's robustness claim is about.

Its words are the world's lexicon (each value's synonyms, drawn at random per caption), as a
captioner trained on human captions speaks the annotators' language. A first version used one
fixed word per value and frames of its own; 64% of the test captions' words were then outside
its vocabulary, which measured the vocabulary gap, not the weak supervision (docs/results.md).

Deterministic from the world's seed (a random stream of its own per split, so the world's
other streams are untouched): :func:`write_terse_captions` reads a written world's scenes and
writes ``pseudo/{split}_caps.txt`` with its sidecar, the captions-file format of
:mod:`vlret.data.captioning_files`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..data.captioning_files import write_captions_file
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


def _word(rng: np.random.Generator, lexicon: tuple[str, ...]) -> list[str]:
    """One synonym of a value (``lexicon[1:]``; ``lexicon[0]`` is its name), as words."""
    return str(lexicon[1 + int(rng.integers(len(lexicon) - 1))]).split()


def _np(rng: np.random.Generator, obj: Sequence[int], adjectives: list[str]) -> list[str]:
    count = int(obj[1])
    noun = _word(rng, CATEGORIES[int(obj[0])])
    if count > 1:
        noun[-1] = _PLURAL.get(noun[-1], noun[-1] + "s")
    words = [*adjectives, *noun]
    head = _word(rng, ("count", *COUNT_WORDS[count - 1]))  # "a" / "one" / "a single", ...
    if head == ["a"] and (words[0][0] in "aeiou" or words[0].startswith("hour")):
        head = ["an"]
    return [*head, *words]


def terse_caption(scene: Scene, rng: np.random.Generator) -> list[str]:
    """The tokens of one terse caption of ``scene`` (module docstring)."""
    primary = scene[0]
    adjectives = []
    if rng.random() < P_SIZE:
        adjectives += _word(rng, SIZES[primary[3]])
    if rng.random() < P_COLOUR:
        adjectives += _word(rng, COLOURS[primary[2]])
    words = _np(rng, primary, adjectives)
    if len(scene) > 1 and rng.random() < P_SECONDARY:
        other = scene[1 + int(rng.integers(len(scene) - 1))]
        words += ["and", *_np(rng, other, [])]
    form = int(rng.integers(4))
    if form == 1:
        words = ["a", "picture", "of", *words]
    elif form == 2:
        words = ["an", "image", "showing", *words]
    elif form == 3:
        words = ["there", "is" if int(primary[1]) == 1 else "are", *words]
    return [*words, "."]


def terse_captions(
    scenes: Sequence[Scene], *, seed: int, split_index: int, style: str = "precomp"
) -> list[str]:
    """One terse caption per scene, in order, from the world's ``seed`` and the split's index
    in the world (``style``: :func:`~.language.tokens_to_text`)."""
    rng = rng_stream(seed, split_index, TERSE_PURPOSE)
    return [tokens_to_text(terse_caption(scene, rng), style) for scene in scenes]


def scenes_of(array: np.ndarray) -> list[Scene]:
    """Scenes from a side file's ``(N, 4, 6)`` array (``-1`` rows: absent objects)."""
    return [tuple(tuple(int(v) for v in obj) for obj in row if obj[0] >= 0) for row in array]


def world_scenes(root: str | Path, split: str) -> tuple[dict[str, Any], list[Scene]]:
    """The world's ``synthetic.json`` and the scenes of its split ``split``, in image order.

    Raises:
        FileNotFoundError: ``root`` holds no world or no such split.
    """
    meta_path = Path(root) / META_FILE
    if not meta_path.is_file():
        raise FileNotFoundError(f"{meta_path}: missing; expected a world `vlret synth` wrote")
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    names = list(meta.get("splits") or {})
    if split not in names:
        raise FileNotFoundError(f"{meta_path}: the world has no split {split!r} ({names})")
    with np.load(Path(root) / f"{split}_synth.npz") as z:
        return meta, scenes_of(z["scenes"])


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
    meta, scenes = world_scenes(root, split)
    names = list(meta["splits"])
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
    "scenes_of",
    "world_scenes",
    "terse_caption",
    "terse_captions",
    "write_terse_captions",
]
