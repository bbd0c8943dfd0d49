"""The synthetic world's terse captioner (vlret synth --pseudo-captions)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from vlret.captioning import read_captions_file, sidecar_path
from vlret.cli import main
from vlret.data import PrecompDataset
from vlret.worlds import generate_world, load_synthetic
from vlret.worlds.language import CATEGORIES, COLOURS, SIZES
from vlret.worlds.terse import terse_captions, write_terse_captions


def _phrases(lexicon: tuple[tuple[str, ...], ...]) -> list[tuple[tuple[str, ...], int]]:
    """Every synonym of every value (and its plural), longest first: ``(words, value)``."""
    out = []
    for value, names in enumerate(lexicon):
        for name in names[1:]:
            words = name.split()
            for last in {words[-1], words[-1] + "s", words[-1] + "es"}:
                out.append(((*words[:-1], last), value))
    return sorted(out, key=lambda p: -len(p[0]))


def _named(tokens: list[str], lexicon: tuple[tuple[str, ...], ...]) -> set[int]:
    """The values the caption names: longest synonym phrases first, left to right."""
    phrases, found, i = _phrases(lexicon), set(), 0
    while i < len(tokens):
        for words, value in phrases:
            if tuple(tokens[i : i + len(words)]) == words:
                found.add(value)
                i += len(words)
                break
        else:
            i += 1
    return found


def test_cli_writes_one_aligned_terse_caption_per_training_image(tmp_path: Path, capsys) -> None:
    out = tmp_path / "w"
    assert main(["synth", "tiny", "--out", str(out), "--pseudo-captions"]) == 0
    printed = capsys.readouterr().out.split()
    path = out / "pseudo" / "train_caps.txt"
    assert str(path) in printed
    side = json.loads(sidecar_path(path).read_text())
    assert side["source"] == "synthetic-terse" and side["captions_per_image"] == 1
    annotations = load_synthetic(out, "train")
    n = len(annotations.scenes)
    read = read_captions_file(path, num_images=n, split="train")
    assert read.captions_per_image == 1 and len(read.captions) == n
    ds = PrecompDataset(out, "train", captions_file=path)
    assert ds.num_captions == n  # the split's own features, one terse caption each
    for i, caption in enumerate(ds.captions):
        scene = [obj for obj in annotations.scenes[i] if obj[0] >= 0]
        tokens = re.findall(r"[a-z]+", caption.lower())
        named = _named(tokens, CATEGORIES)
        assert int(scene[0][0]) in named, (i, caption)  # the main object, always
        # nothing outside the scene: every category named is one of its objects'
        assert named <= {int(o[0]) for o in scene}, (i, caption)
        assert _named(tokens, COLOURS) <= {int(scene[0][2])}, (i, caption)  # the primary's only
        assert _named(tokens, SIZES) <= {int(scene[0][3])}, (i, caption)
        assert len(caption.split()) <= 16  # terse


def test_terse_captions_are_deterministic_and_miss_details(tmp_path: Path) -> None:
    world = generate_world("tiny", seed=3, features=False)
    scenes = world["train"].scenes
    a = terse_captions(scenes, seed=3, split_index=0)
    assert a == terse_captions(scenes, seed=3, split_index=0)
    assert a != terse_captions(scenes, seed=4, split_index=0)
    # shorter than the world's human-style captions, and fewer distinct ones (clones)
    human = world["train"].captions("precomp")
    assert np.mean([len(c.split()) for c in a]) < np.mean([len(c.split()) for c in human])
    # never a material, a cell or a relation: none of their words (the human captions use them)
    from vlret.worlds.language import ABOVE, BELOW, CELLS, LEFT, MATERIALS, RIGHT

    phrases = [*(p for m in MATERIALS for part in m for p in part), *(p for c in CELLS for p in c)]
    phrases += [*LEFT, *RIGHT, *ABOVE, *BELOW]
    detail = {w for p in phrases for w in p.split()} - {"a", "of"}  # "a picture of"
    said = {w for c in a for w in re.findall(r"[a-z]+", c.lower())}
    assert not said & detail, sorted(said & detail)
    assert {w for c in human for w in re.findall(r"[a-z]+", c.lower())} & detail
    # what write_terse_captions writes from a written world is the in-memory world's
    from vlret.worlds import write_synthetic

    root = write_synthetic("tiny", tmp_path / "k", format="karpathy", seed=3)
    path = write_terse_captions(root)
    styled = terse_captions(scenes, seed=3, split_index=0, style="raw")
    assert path.read_text().splitlines() == styled
    assert path.read_bytes() == write_terse_captions(root).read_bytes()


def test_persons_and_msrvtt_refuse_pseudo_captions(tmp_path: Path, capsys) -> None:
    out = str(tmp_path / "p")
    assert main(["synth", "persons", "--out", out, "--pseudo-captions"]) == 2
    assert "--pseudo-captions: not an option of the persons world" in capsys.readouterr().err
    args = ["synth", "tiny", "--out", out, "--format", "msrvtt", "--pseudo-captions"]
    assert main(args) == 2
    assert "precomp and karpathy" in capsys.readouterr().err
