"""The world's ground-truth facts as a captions file (data.semantic_captions for VSL's TF-IDF)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from train_helpers import tiny_raw
from vlret.captioning import read_captions_file, sidecar_path
from vlret.data.formats import open_dataset
from vlret.losses import VisualSemanticLoss
from vlret.run.config import ConfigError, apply_overrides, config_from_dict
from vlret.run.loss_builder import build_run_loss, train_captions_by_image
from vlret.semantic import CaptionTfidf
from vlret.worlds import load_synthetic, write_synthetic
from vlret.worlds.fact_captions import write_fact_captions
from vlret.worlds.language import attr_fact, fact_names

VSL = ["loss.name=vsl", "loss.base=triplet"]


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("facts") / "w"
    write_synthetic("tiny", root, format="precomp", seed=0, relevance_splits=())
    return root


def test_each_line_lists_every_fact_of_its_image(world):
    path = write_fact_captions(world)
    assert path == world / "facts" / "train_caps.txt"
    assert json.loads(sidecar_path(path).read_text())["source"] == "synthetic-facts"
    scenes = load_synthetic(world, "train").scenes
    read = read_captions_file(path, num_images=len(scenes), split="train")
    assert read.captions_per_image == 1
    names = fact_names()
    for i, line in enumerate(read.captions):
        ids = [int(t.removeprefix("fact")) for t in line.split()]
        assert ids == sorted(ids)
        objects = [obj for obj in scenes[i] if obj[0] >= 0]
        # naive: each object's count and colour facts are listed (field 1 count, 2 colour)
        for obj in objects:
            assert attr_fact("count", int(obj[0]), int(obj[1]) - 1) in ids
            assert attr_fact("colour", int(obj[0]), int(obj[2])) in ids
        # five attribute facts per object, and only relations besides
        attrs = [f for f in ids if "(" in names[f] and "=" in names[f]]
        assert len(attrs) == 5 * len(objects)
    with pytest.raises(FileNotFoundError, match="no split 'nope'"):
        write_fact_captions(world, split="nope")


def test_vsl_fits_its_tfidf_on_data_semantic_captions(world, tmp_path):
    facts = write_fact_captions(world)
    raw = apply_overrides(tiny_raw(world, tmp_path / "run"), VSL)
    raw["model"]["image"]["in_dim"] = 32
    train = open_dataset(config_from_dict(raw).data, "train", encoder=None)
    plain = build_run_loss(config_from_dict(raw), train)
    raw["data"]["semantic_captions"] = str(facts)
    oracle = build_run_loss(config_from_dict(raw), train)
    assert isinstance(oracle, VisualSemanticLoss)
    ids = torch.arange(min(12, train.num_images))
    lines = facts.read_text().splitlines()
    want = CaptionTfidf().fit({i: [lines[i]] for i in range(train.num_images)}).similarity(ids)
    torch.testing.assert_close(oracle.semantic.similarity(ids), want)
    base = CaptionTfidf().fit(train_captions_by_image(train)).similarity(ids)
    torch.testing.assert_close(plain.semantic.similarity(ids), base)
    assert not torch.allclose(want, base)  # the facts are another similarity


def test_a_bad_semantic_captions_file_is_named(world, tmp_path):
    raw = apply_overrides(tiny_raw(world, tmp_path / "run"), VSL)
    raw["model"]["image"]["in_dim"] = 32
    short = tmp_path / "short.txt"
    short.write_text("fact1\nfact2\n")
    raw["data"]["semantic_captions"] = str(short)
    config = config_from_dict(raw)
    train = open_dataset(config.data, "train", encoder=None)
    with pytest.raises(ValueError, match="data.semantic_captions: 2 lines for"):
        build_run_loss(config, train)
    raw["loss"] = {"name": "triplet"}
    with pytest.raises(ConfigError, match="data.semantic_captions: read only by a loss"):
        config_from_dict(raw)
