"""The synthetic world's terse captioner (vlret synth --pseudo-captions)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from vlret.cli import main
from vlret.data import PrecompDataset
from vlret.data.captioning import read_captions_file, sidecar_path
from vlret.data.synthetic import generate_world, load_synthetic
from vlret.data.synthetic.language import CATEGORIES, COLOURS, SIZES
from vlret.data.synthetic.terse import terse_captions, write_terse_captions


def _words(names: tuple[str, ...]) -> set[str]:
    return {w for name in names for w in (name, name + "s", name + "es")}


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
    categories = [name[1] for name in CATEGORIES]
    for i, caption in enumerate(ds.captions):
        scene = [obj for obj in annotations.scenes[i] if obj[0] >= 0]
        words = set(re.findall(r"[a-z]+", caption.lower()))
        primary = CATEGORIES[int(scene[0][0])][1]
        assert words & _words((primary,)), (i, caption)  # the main object, always
        # nothing outside the scene: every category word is one of its objects'
        named = {c for c in categories if words & _words((c,))}
        assert named <= {CATEGORIES[int(o[0])][1] for o in scene}, (i, caption)
        colours = {c[1] for c in COLOURS} & words
        assert colours <= {COLOURS[int(scene[0][2])][1]}, (i, caption)  # the primary's only
        sizes = {s[1] for s in SIZES} & words
        assert sizes <= {SIZES[int(scene[0][3])][1]}
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
    assert len(set(a)) / len(a) < len(set(human)) / len(human)
    # what write_terse_captions writes from a written world is the in-memory world's
    from vlret.data.synthetic import write_synthetic

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
