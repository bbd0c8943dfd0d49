"""Data validation: blank lines in text files, and loader errors that must name the file and the
line or row (issue 12).

Every case writes a tiny data set in the real on-disk format and reproduces one defect.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from vlret.data import (
    DataFormatError,
    KarpathyDataset,
    MSRVTTDataset,
    PrecompDataset,
    read_jsfusion_csv,
    read_train_csv,
)
from vlret.data.msrvtt import msrvtt_vocab_captions
from vlret.data.writers import (
    make_tiny_karpathy,
    make_tiny_msrvtt,
    make_tiny_precomp,
    tiny_captions,
    write_jsfusion_csv,
    write_msrvtt_train_csv,
    write_precomp,
)


def _caps(n: int, seed: int = 0) -> list[str]:
    return tiny_captions(n, np.random.default_rng(seed))


def _feats(n: int, *shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, *shape)).astype(np.float32)


def _append(path, data: bytes) -> None:
    path.write_bytes(path.read_bytes() + data)


# ------------------------------------------------------------------ feature arrays


@pytest.mark.parametrize("shape", [(2, 0, 4), (2, 4, 0), (2, 0)])
def test_empty_region_or_feature_axis_is_refused_on_load(tmp_path, shape):
    write_precomp(tmp_path, "dev", np.zeros(shape, np.float32), _caps(10))
    with pytest.raises(DataFormatError, match=rf"dev_ims\.npy: has shape {re.escape(str(shape))};"):
        PrecompDataset(tmp_path, "dev")


# ------------------------------------------------------------------ Karpathy: empty split


def test_karpathy_split_without_images_is_an_error(tmp_path):
    json_path = tmp_path / "dataset_coco.json"
    make_tiny_karpathy(json_path)
    data = json.loads(json_path.read_text(encoding="utf-8"))
    data["images"] = [im for im in data["images"] if im["split"] != "val"]
    json_path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"dataset_coco\.json: has no images .*'val'"):
        KarpathyDataset(json_path, "dev")


# ------------------------------------------------------------------ blank lines in text files


@pytest.fixture
def video_root(tmp_path):
    make_tiny_msrvtt(tmp_path, feature_shape=(3, 8))  # train 4 / validate 2 / test 3 videos
    return tmp_path


@pytest.mark.parametrize("tail", [b"\n", b"\n\n", b"\r\n\r\n", b"  \n\t\n", b"\n \n \n"])
def test_trailing_blank_lines_in_captions_and_ids_are_accepted(tmp_path, tail):
    make_tiny_precomp(tmp_path)
    for split in ("train", "dev"):
        _append(tmp_path / f"{split}_caps.txt", tail)
        _append(tmp_path / f"{split}_ids.txt", tail)
        ds = PrecompDataset(tmp_path, split)
        assert ds.num_captions == 5 * ds.num_images
        assert all(c.strip() for c in ds.captions)


def test_empty_caption_in_the_middle_is_still_an_error(tmp_path):
    caps = _caps(10)
    caps[3] = ""
    write_precomp(tmp_path, "dev", _feats(2, 4), caps)
    _append(tmp_path / "dev_caps.txt", b"\n\n")
    with pytest.raises(DataFormatError, match=r"dev_caps\.txt, line 4: empty caption"):
        PrecompDataset(tmp_path, "dev")


def test_captions_without_a_final_newline(tmp_path):
    write_precomp(tmp_path, "dev", _feats(1, 4), _caps(5))
    path = tmp_path / "dev_caps.txt"
    path.write_bytes(path.read_bytes().rstrip(b"\n"))
    assert PrecompDataset(tmp_path, "dev").num_captions == 5


def test_empty_line_in_the_middle_of_an_ids_file(tmp_path):
    write_precomp(tmp_path, "train", _feats(3, 4), _caps(15), ids=[7, 8, 9])
    (tmp_path / "train_ids.txt").write_text("7\n\n8\n9\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"train_ids\.txt, line 2: empty line"):
        PrecompDataset(tmp_path, "train")


def test_byte_order_mark_is_not_part_of_the_first_line(tmp_path):
    write_precomp(tmp_path, "train", _feats(2, 4), _caps(10), ids=[7, 8])
    for name in ("train_caps.txt", "train_ids.txt"):
        path = tmp_path / name
        path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    ds = PrecompDataset(tmp_path, "train")
    assert ds.image_ids == [7, 8]
    assert ds.captions[0] == _caps(10)[0]


def test_blank_lines_in_video_ids(video_root):
    _append(video_root / "video_ids.txt", b"\n\n")
    assert MSRVTTDataset(video_root, "train").num_images == 4
    lines = (video_root / "video_ids.txt").read_text(encoding="utf-8").split("\n")
    lines.insert(2, "")
    (video_root / "video_ids.txt").write_text("\n".join(lines), encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"video_ids\.txt, line 3: empty video id"):
        MSRVTTDataset(video_root, "train")


def test_trailing_blank_lines_in_msrvtt_csvs_are_accepted(tmp_path):
    write_msrvtt_train_csv(tmp_path / "train.csv", ["video0", "video1"])
    _append(tmp_path / "train.csv", b"\r\n\n")
    assert read_train_csv(tmp_path / "train.csv") == ["video0", "video1"]
    write_jsfusion_csv(tmp_path / "test.csv", [("video7", "a man talks"), ("video8", "a dog")])
    _append(tmp_path / "test.csv", b"\n\n")
    assert read_jsfusion_csv(tmp_path / "test.csv") == [
        ("video7", "a man talks"),
        ("video8", "a dog"),
    ]


def test_empty_line_in_the_middle_of_msrvtt_csvs(tmp_path):
    (tmp_path / "train.csv").write_text("video_id\nvideo0\n\nvideo1\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"train\.csv, line 3: empty line"):
        read_train_csv(tmp_path / "train.csv")
    path = tmp_path / "test.csv"
    write_jsfusion_csv(path, [("video7", "a man talks"), ("video8", "a dog")])
    lines = path.read_text(encoding="utf-8").split("\n")
    lines.insert(2, "")
    path.write_text("\n".join(lines), encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"test\.csv, line 3: empty line"):
        read_jsfusion_csv(path)


# ------------------------------------------------------------------ errors name the line


def test_video_with_too_few_sentences_names_the_json_line(video_root):
    path = video_root / "MSRVTT_data.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    data["sentences"] = [
        s for s in data["sentences"] if s["video_id"] != "video2" or s["sen_id"] % 2
    ]
    path.write_text(json.dumps(data, indent=1), encoding="utf-8")
    with pytest.raises(DataFormatError) as info:
        MSRVTTDataset(video_root, "train")
    assert "video video2 has 10 sentences; expected 20" in str(info.value)
    assert info.value.line is not None
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines[info.value.line - 1].strip() == '"video_id": "video2",'


def test_train_csv_video_absent_from_json_names_the_csv_line(video_root):
    write_msrvtt_train_csv(video_root / "MSRVTT_train.9k.csv", ["video0", "video1", "video77"])
    with pytest.raises(DataFormatError, match=r"train\.9k\.csv, line 4: .*video77"):
        MSRVTTDataset(video_root, "train", protocol="1k-A")


def test_train_csv_listing_a_test_video_names_the_csv_line(video_root):
    write_msrvtt_train_csv(video_root / "MSRVTT_train.9k.csv", ["video0", "video8", "video1"])
    with pytest.raises(DataFormatError, match=r"train\.9k\.csv, line 3: .*video8"):
        msrvtt_vocab_captions(video_root, protocol="1k-A")
