"""The worked example of docs/adding-a-data-format.md: a new data format is one module (here
the test itself) that registers a :class:`~vlret.data.formats.DataFormat` record; then
:func:`~vlret.data.formats.open_dataset`, the vocabulary builder, the evaluation's folder
rule and the config checks serve it without an edit anywhere else.

The format: ``{split}.jsonl`` (JSON Lines, written by Python's ``json``), one image per line,
``{"image": id, "features": [floats], "captions": [texts]}``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from vlret.data.config import DataConfig
from vlret.data.dataset import RetrievalDataset
from vlret.data.formats import (
    DataFormat,
    OpenRequest,
    format_names,
    formats_where,
    get_format,
    open_dataset,
    register_format,
)
from vlret.data.formats import registry as registry_module
from vlret.data.vocab import build_vocab


class JsonlFeatures(RetrievalDataset):
    """One split of the JSON Lines format: the features of each image, its captions."""

    def __init__(self, path: Path, *, encoder: Any = None) -> None:
        self.encoder = encoder
        self.captions, self.image_ids, rows, pairing = [], [], [], []
        with open(path, encoding="utf-8") as lines:
            for number, line in enumerate(lines, start=1):
                entry = json.loads(line)
                if not entry.get("captions"):
                    raise ValueError(f"{path}:{number}: an image without captions")
                rows.append(entry["features"])
                self.image_ids.append(entry["image"])
                pairing += [len(self.image_ids) - 1] * len(entry["captions"])
                self.captions += entry["captions"]
        self.features = torch.tensor(rows, dtype=torch.float32)
        self.txt_to_img = torch.tensor(pairing, dtype=torch.long)

    def image(self, index: int) -> torch.Tensor:
        return self.features[index]


def _open(data: Any, split: str, request: OpenRequest) -> JsonlFeatures:
    return JsonlFeatures(request.root / f"{split}.jsonl", encoder=request.encoder)


def _vocabulary(data: Any) -> Any:
    train = JsonlFeatures(Path(data.root) / f"{data.train_split}.jsonl")
    return build_vocab(train.captions, min_count=data.min_count)


JSONL = DataFormat(
    name="jsonl-features",
    summary="{split}.jsonl: one image per line, its features and captions",
    reader=__name__,
    open=_open,
    splits=("train", "dev", "test"),
    inputs="features",
    reads_root=True,
    vocabulary=_vocabulary,
)


@pytest.fixture
def jsonl_format():
    """The format registered for one test (the registry is the process's)."""
    register_format(JSONL)
    yield JSONL
    registry_module._REGISTRY.pop(JSONL.name)


def _write(root: Path, split: str, images: list[tuple[str, list[float], list[str]]]) -> None:
    with open(root / f"{split}.jsonl", "w", encoding="utf-8") as out:
        for image, features, captions in images:
            out.write(json.dumps({"image": image, "features": features, "captions": captions}))
            out.write("\n")


def test_a_registered_format_opens_through_open_dataset(tmp_path, jsonl_format):
    _write(
        tmp_path, "train", [("a", [1.0, 0.0], ["a red cup", "a cup"]), ("b", [0.0, 1.0], ["a dog"])]
    )
    data = DataConfig(root=str(tmp_path), format="jsonl-features", min_count=1)
    assert "jsonl-features" in format_names() and get_format("jsonl-features") is JSONL
    train = open_dataset(data, "train")
    assert train.captions == ["a red cup", "a cup", "a dog"]
    assert train.txt_to_img.tolist() == [0, 0, 1]
    assert train.image_ids == ["a", "b"]
    assert torch.equal(train[2].features, torch.tensor([0.0, 1.0]))
    vocab = JSONL.vocabulary(data)
    assert {"red", "cup", "dog"} <= set(vocab.idx2word)
    encoded = open_dataset(data, "train", encoder=vocab)
    assert encoded[2].caption.tolist() == vocab.encode("a dog")


def test_the_harness_asks_the_record_not_the_name(tmp_path, jsonl_format):
    data = DataConfig(root=str(tmp_path), format="jsonl-features")
    # what it does not declare, it is not offered: noise, captions files, offline negatives
    assert "jsonl-features" not in formats_where(lambda f: f.noise_index)
    assert "jsonl-features" not in formats_where(lambda f: f.captions_files)
    assert JSONL.root_required(data) and JSONL.evaluated_format == "jsonl-features"
    # the evaluation's folder rule: its default reads its files from the folder named
    elsewhere = JSONL.at_root(data, tmp_path / "other")
    assert elsewhere.root == str(tmp_path / "other")
    assert dataclasses.replace(elsewhere, root=data.root) == data


def test_a_second_record_of_the_same_name_is_refused(jsonl_format):
    with pytest.raises(ValueError, match="data format 'jsonl-features' is already registered"):
        register_format(dataclasses.replace(JSONL, summary="another"))
    with pytest.raises(ValueError, match="unknown data format 'jsonl'; expected one of precomp"):
        get_format("jsonl")


def test_a_bad_line_is_named(tmp_path, jsonl_format):
    _write(tmp_path, "test", [("a", [1.0], ["one"]), ("b", [2.0], [])])
    data = DataConfig(root=str(tmp_path), format="jsonl-features")
    with pytest.raises(ValueError, match=r"test\.jsonl:2: an image without captions"):
        open_dataset(data, "test")
