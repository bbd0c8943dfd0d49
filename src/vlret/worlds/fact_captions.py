"""Every fact of each image as one "caption": the synthetic world's ground-truth semantics in
the captions-file format, for fitting VSL's caption TF-IDF on the truth instead of on what
the annotators happened to write (docs/results.md, "VSL on secondary content: in its regime, but its
term too small to act").

A fact caption lists the scene's facts (:func:`~.language.scene_facts`: every object's count,
colour, size, material and cell, and the relations between objects) as tokens ``fact<id>``,
one per fact, sorted. The TF-IDF cosine of two such captions is then an idf-weighted overlap
of the two scenes' fact sets: the similarity VSL's Eq. (3) stands for, with no template words,
synonyms or omissions. It is for analysis only: a model trained on these strings would learn
ids, not language.
"""

from __future__ import annotations

from pathlib import Path

from ..data.captioning_files import write_captions_file
from .language import scene_facts
from .terse import world_scenes

#: The folder of a world's fact captions.
FACTS_FOLDER = "facts"


def fact_caption(scene: tuple[tuple[int, ...], ...]) -> str:
    """The facts of ``scene`` as ``"fact<id> fact<id> ..."``, ascending ids."""
    return " ".join(f"fact{f}" for f in scene_facts(scene))


def write_fact_captions(root: str | Path, *, split: str = "train") -> Path:
    """Write ``root/facts/{split}_caps.txt`` (and its ``.json`` sidecar): one fact caption per
    image of ``split`` of the world written in ``root``, in the split's image order; the file
    ``data.semantic_captions`` reads.

    Args:
        root: A folder ``vlret synth`` wrote (``synthetic.json``, ``{split}_synth.npz``).
        split: The split to describe.

    Returns:
        The captions file.

    Raises:
        FileNotFoundError: ``root`` holds no world or no such split.
    """
    root = Path(root)
    meta, scenes = world_scenes(root, split)
    return write_captions_file(
        root / FACTS_FOLDER / f"{split}_caps.txt",
        [fact_caption(scene) for scene in scenes],
        split=split,
        captions_per_image=1,
        source="synthetic-facts",
        world=str(root),
        preset=meta.get("preset"),
        seed=meta.get("seed"),
    )


__all__ = ["FACTS_FOLDER", "fact_caption", "write_fact_captions"]
