"""Captions files read in place of a split's annotations (data.train_captions, ...)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from vlret.captioning import read_captions_file, sidecar_path, write_captions_file
from vlret.data import DataFormatError, KarpathyDataset, PrecompDataset
from vlret.data.captioning_files import captions_file_key
from vlret.data.config import DataConfig
from vlret.data.formats import open_dataset
from vlret.data.writers import make_tiny_karpathy, make_tiny_precomp
from vlret.run.builders import build_encoder
from vlret.run.config import ConfigError, config_from_dict


def _pseudo(n_images: int, k: int, tag: str = "pc") -> list[str]:
    """Caption j of image i names both, so alignment is checkable from the text alone."""
    return [f"{tag} image{i} caption{j}" for i in range(n_images) for j in range(k)]


def _check_aligned(ds, n_images: int, k: int, tag: str = "pc") -> None:
    assert ds.num_images == n_images and ds.num_captions == n_images * k
    for index in range(ds.num_captions):
        item = ds[index]
        i, j = divmod(index, k)
        assert item.caption == f"{tag} image{i} caption{j}"  # no encoder: the text
        assert item.img_index == i == int(ds.txt_to_img[index]) and item.cap_index == index
        if isinstance(ds, PrecompDataset):  # the item carries image i's own feature row
            assert torch.equal(item.features, torch.from_numpy(ds.array[i].copy()))


@pytest.mark.parametrize("k", [1, 3])
def test_precomp_split_reads_captions_file_aligned(tmp_path: Path, k: int) -> None:
    make_tiny_precomp(tmp_path / "d", sizes={"train": 4, "dev": 2}, captions_per_image=5)
    path = write_captions_file(
        tmp_path / "pc.txt", _pseudo(4, k), split="train", captions_per_image=k, source="test"
    )
    ds = PrecompDataset(tmp_path / "d", "train", captions_file=path)
    _check_aligned(ds, 4, k)
    assert ds.captions_per_image == k
    # the per-image ids file still reads (it follows the annotations' 5 per image)
    assert ds.image_ids == [100, 101, 102, 103]
    dev = PrecompDataset(tmp_path / "d", "dev")  # untouched: its own 5 annotations per image
    assert dev.num_captions == 10


def test_karpathy_split_reads_captions_file_aligned(tmp_path: Path) -> None:
    json_path = tmp_path / "dataset_coco.json"
    images = make_tiny_karpathy(
        json_path,
        splits={"train": 2, "restval": 1, "val": 2, "test": 2},
        image_root=tmp_path / "images",
    )
    # no sidecar: k = lines / images (train = train + restval = 3 images)
    (tmp_path / "pc.txt").write_text("".join(c + "\n" for c in _pseudo(3, 2)), encoding="utf-8")
    ds = KarpathyDataset(
        json_path, "train", image_root=tmp_path / "images", captions_file=tmp_path / "pc.txt"
    )
    _check_aligned(ds, 3, 2)
    for index in range(ds.num_captions):  # the item's image is the JSON's image index // 2
        assert ds[index].features == images[index // 2].path(tmp_path / "images")
    assert ds.image_ids == [400000, 400007, 400014]


def test_wrong_line_count_is_refused_naming_file_and_counts(tmp_path: Path) -> None:
    make_tiny_precomp(tmp_path / "d", sizes={"train": 4}, captions_per_image=5)
    bad = tmp_path / "bad.txt"
    bad.write_text("".join(c + "\n" for c in _pseudo(3, 2)), encoding="utf-8")  # 6 lines
    with pytest.raises(DataFormatError) as err:
        PrecompDataset(
            tmp_path / "d", "train", captions_file=bad, captions_key="data.train_captions"
        )
    text = str(err.value)
    assert "\n" not in text
    assert str(bad) in text and "data.train_captions" in text
    assert "6 lines for 4 images" in text
    # a sidecar's k that the lines do not fill
    write_captions_file(bad, _pseudo(4, 1), split="train", captions_per_image=1, source="t")
    side = json.loads(sidecar_path(bad).read_text())
    sidecar_path(bad).write_text(json.dumps({**side, "captions_per_image": 2}))
    with pytest.raises(DataFormatError, match=r"4 lines for 4 images; expected 8 \(2 per image"):
        PrecompDataset(tmp_path / "d", "train", captions_file=bad)
    # a sidecar written for another split
    write_captions_file(bad, _pseudo(4, 1), split="test", captions_per_image=1, source="t")
    with pytest.raises(DataFormatError, match="describes split 'test'"):
        PrecompDataset(tmp_path / "d", "train", captions_file=bad)


def test_missing_captions_file_names_the_key(tmp_path: Path) -> None:
    make_tiny_precomp(tmp_path / "d", sizes={"train": 2, "dev": 2}, captions_per_image=5)
    data = DataConfig(root=str(tmp_path / "d"), dev_captions=str(tmp_path / "none.txt"))
    with pytest.raises(FileNotFoundError) as err:
        open_dataset(data, "dev")
    assert "data.dev_captions" in str(err.value) and "none.txt" in str(err.value)


def test_empty_lines_are_empty_captions_and_exact(tmp_path: Path) -> None:
    path = tmp_path / "c.txt"
    path.write_bytes(b"a\r\n\nc\n")  # CRLF, an empty caption in the middle
    read = read_captions_file(path, num_images=3)
    assert read.captions == ["a", "", "c"] and read.captions_per_image == 1
    with pytest.raises(ValueError, match="line break"):
        write_captions_file(path, ["a\nb"], split="train", captions_per_image=1, source="t")


def test_builders_route_each_split_to_its_key_and_vocab(tmp_path: Path) -> None:
    make_tiny_precomp(tmp_path / "d", sizes={"train": 4, "dev": 2, "test": 2}, captions_per_image=5)
    train = write_captions_file(
        tmp_path / "tr.txt",
        ["zebra alpha"] * 4,
        split="train",
        captions_per_image=1,
        source="t",
    )
    data = DataConfig(root=str(tmp_path / "d"), train_captions=str(train), min_count=1)
    assert [captions_file_key(data, s) for s in ("train", "dev", "test")] == [
        "train_captions",
        "dev_captions",
        "test_captions",
    ]
    vocab = build_encoder(data)
    # built from the file alone: its two words and the four specials
    assert sorted(vocab.idx2word[4:]) == ["alpha", "zebra"]
    encoded = open_dataset(data, "train", encoder=vocab)
    assert encoded.num_captions == 4
    assert torch.equal(encoded.caption(0), torch.tensor(vocab.encode("zebra alpha")))
    # the test split keeps its real captions (5 per image) when test_captions is unset
    assert open_dataset(data, "test", encoder=vocab).num_captions == 10
    assert open_dataset(data, "dev", encoder=vocab, max_images=1).num_captions == 5


def test_config_checks_captions_keys(tmp_path: Path) -> None:
    base = {
        "output_dir": "runs/x",
        "loss": {"name": "triplet"},
        "train": {"epochs": 1, "batch_size": 2},
    }
    ok = config_from_dict({**base, "data": {"root": "d", "train_captions": "pc.txt"}})
    assert ok.data.train_captions == "pc.txt" and ok.data.test_captions is None
    with pytest.raises(ConfigError, match=r"data\.train_captions.*data\.format precomp or"):
        config_from_dict(
            {**base, "data": {"root": "d", "format": "msrvtt", "train_captions": "x.txt"}}
        )
    with pytest.raises(ConfigError, match=r"data\.test_captions.*empty"):
        config_from_dict({**base, "data": {"root": "d", "test_captions": " "}})
    with pytest.raises(ConfigError, match=r"data\.dev_captions.*dev_split is null"):
        config_from_dict(
            {**base, "data": {"root": "d", "dev_split": None, "dev_captions": "x.txt"}}
        )
