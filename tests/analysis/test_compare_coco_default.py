"""``vlret compare``'s default test protocol and split follow the data: MS-COCO data is tested
on COCO 5K (``testall`` of precomputed features, ``test`` of a Karpathy JSON), the rest by the
format's registered default."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from train_helpers import tiny_data
from vlret.analysis.compare import (
    CompareError,
    eval_settings,
    plan_runs,
    read_compare_config,
    resolve_variants,
)
from vlret.analysis.compare.runner import check_eval_plan
from vlret.analysis.compare.spec import coco_data, default_split
from vlret.data.writers import make_tiny_precomp


def settings(data: dict, section: dict | None = None) -> tuple[str, str]:
    got = eval_settings({"data": data}, section or {})
    return got.protocol, got.split


def karpathy_json(path: Path, top: dict) -> str:
    path.write_text(json.dumps(top), encoding="utf-8")
    return str(path)


def test_precomputed_coco_is_tested_on_coco5k_testall():
    assert settings({"root": "data/coco_precomp", "format": "precomp"}) == ("coco5k", "testall")
    assert settings({"root": "/x/MSCOCO/"}) == ("coco5k", "testall")  # precomp by default
    assert settings({"root": "data/f30k_precomp", "format": "precomp"}) == ("f30k", "test")
    # the folder's name, not a parent's: a Flickr folder under a folder named coco is Flickr
    assert settings({"root": "coco/f30k_precomp"}) == ("f30k", "test")
    # compare.data (the test data folder) is what is tested
    assert settings({"root": "data/f30k"}, {"data": "data/coco_precomp"}) == ("coco5k", "testall")
    # a given protocol or split wins; a given COCO protocol alone picks its split
    assert settings({"root": "data/coco_precomp"}, {"protocol": "coco1k"}) == ("coco1k", "testall")
    assert settings({"root": "data/coco"}, {"split": "dev"}) == ("coco5k", "dev")
    assert settings({"root": "data/f30k"}, {"protocol": "coco5k"}) == ("coco5k", "testall")
    assert settings({"root": "data/coco"}, {"protocol": "f30k"}) == ("f30k", "test")


def test_karpathy_coco_is_tested_on_coco5k_test(tmp_path):
    coco = karpathy_json(tmp_path / "split.json", {"images": [], "dataset": "coco"})
    flickr = karpathy_json(tmp_path / "dataset_coco.json", {"images": [], "dataset": "flickr30k"})
    fmt = {"format": "karpathy", "root": str(tmp_path)}
    assert settings({**fmt, "karpathy_json": coco}) == ("coco5k", "test")
    # the file's dataset field, not its name, once the file is there
    assert settings({**fmt, "karpathy_json": flickr}) == ("f30k", "test")
    # without the field, as the reader infers it: COCO entries carry a filepath
    entry = {"filename": "a.jpg", "imgid": 0, "split": "test", "sentids": [], "sentences": []}
    unnamed = karpathy_json(tmp_path / "a.json", {"images": [{**entry, "filepath": "val2014"}]})
    plain = karpathy_json(tmp_path / "b.json", {"images": [entry]})
    assert settings({**fmt, "karpathy_json": unnamed}) == ("coco5k", "test")
    assert settings({**fmt, "karpathy_json": plain}) == ("f30k", "test")
    # not written yet (planning before the data is there), or unreadable: the file's name
    missing = {**fmt, "karpathy_json": str(tmp_path / "later" / "dataset_coco.json")}
    assert settings(missing) == ("coco5k", "test")
    (tmp_path / "coco_broken.json").write_text("{", encoding="utf-8")
    assert coco_data({"data": {**fmt, "karpathy_json": str(tmp_path / "coco_broken.json")}}, {})
    assert settings({**fmt, "karpathy_json": str(tmp_path / "f30k.json")}) == ("f30k", "test")


def test_other_formats_keep_their_registered_default():
    assert settings({"root": "data/coco_msrvtt", "format": "msrvtt"}) == ("msrvtt-full", "test")
    assert not coco_data({"data": {"format": "csv", "root": "coco"}}, {})
    assert default_split("f30k", "precomp") == "test"
    assert default_split("coco5k", "precomp") == "testall"
    assert default_split("coco5k", "karpathy") == "test"
    assert default_split("cuhk-pedes", "cuhk-pedes") == "test"


def test_compare_on_coco_data_plans_coco5k_from_the_config_file(tmp_path):
    """The path GOAL's COCO grids take: a config file naming COCO data and no protocol; the
    plan check opens the 5K split (testall) in the data folder before anything trains."""
    data = tiny_data(tmp_path / "coco_precomp")
    lines = [
        f'output_dir = "{tmp_path / "out"}"',
        "[data]",
        f'root = "{data}"',
        "min_count = 1",
        "[model]",
        "embed_dim = 16",
        'image = { kind = "precomp", in_dim = 16, pooling = "max" }',
        'text = { kind = "gru", word_dim = 8, bidirectional = true, pooling = "last" }',
        "[loss]",
        'name = "triplet"',
        "[train]",
        "epochs = 1",
        "batch_size = 8",
    ]
    path = tmp_path / "coco.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    raw, section = read_compare_config(path)
    got = eval_settings(raw, section)
    assert (got.protocol, got.split) == ("coco5k", "testall")
    given = read_compare_config(path, ["compare.protocol=f30k", "compare.split=test"])[1]
    assert (eval_settings(raw, given).protocol, eval_settings(raw, given).split) == ("f30k", "test")
    back = read_compare_config(path, ["compare.protocol=f30k", "compare.protocol=null"])[1]
    assert "protocol" not in back and eval_settings(raw, back).protocol == "coco5k"
    specs = plan_runs(raw, resolve_variants(raw, section, ["triplet"]), 1, tmp_path / "cmp")
    check_eval_plan(specs, got)  # testall holds the data's 5 images: no error
    # a folder holding only the 5K split (as SCAN's coco_precomp, whose test is not 5K): the
    # default opens it, the old default split (test) is refused before anything trains
    make_tiny_precomp(tmp_path / "coco_only", sizes={"train": 8, "dev": 2, "testall": 5})
    only = eval_settings(raw, {"data": str(tmp_path / "coco_only")})
    check_eval_plan(specs, only)
    with pytest.raises(CompareError, match="compare.split"):
        check_eval_plan(
            specs, eval_settings(raw, {"data": str(tmp_path / "coco_only"), "split": "test"})
        )
