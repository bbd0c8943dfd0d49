"""Data validation before training: non-finite or mis-sized features, blank lines in text files,
and loader errors that must name the file and the line or row (issue 12).

Every case writes a tiny data set in the real on-disk format and reproduces one defect.
"""

from __future__ import annotations

import json
import re
import tracemalloc

import numpy as np
import pytest

from vlret.data import (
    DataFormatError,
    KarpathyDataset,
    MSRVTTDataset,
    PrecompDataset,
    check_features,
    read_jsfusion_csv,
    read_train_csv,
)
from vlret.data.checks import find_non_finite
from vlret.data.formats.msrvtt import msrvtt_vocab_captions
from vlret.data.writers import (
    make_tiny_karpathy,
    make_tiny_msrvtt,
    make_tiny_precomp,
    tiny_captions,
    write_jsfusion_csv,
    write_msrvtt_train_csv,
    write_precomp,
    write_video_features,
)


def _caps(n: int, seed: int = 0) -> list[str]:
    return tiny_captions(n, np.random.default_rng(seed))


def _feats(n: int, *shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, *shape)).astype(np.float32)


def _append(path, data: bytes) -> None:
    path.write_bytes(path.read_bytes() + data)


# ------------------------------------------------------------------ precomp: finite features


def test_clean_precomp_features_pass_with_and_without_in_dim(tmp_path):
    make_tiny_precomp(tmp_path, feature_shape=(4, 16))
    for split in ("train", "dev"):
        ds = PrecompDataset(tmp_path, split)
        check_features(ds)
        check_features(ds, in_dim=16)


def test_nan_in_train_regions_names_file_image_region_and_dimension(tmp_path):
    feats = _feats(6, 4, 16)
    feats[3, 2, 5] = np.nan
    feats[3, 3, 0] = np.nan
    write_precomp(tmp_path, "train", feats, _caps(30))
    ds = PrecompDataset(tmp_path, "train")
    with pytest.raises(DataFormatError) as info:
        check_features(ds, in_dim=16)
    err = info.value
    assert err.path == tmp_path / "train_ims.npy"
    assert err.row == 3
    assert str(err).startswith(f"{tmp_path / 'train_ims.npy'}, row 3")
    assert "image 3, region 2, dimension 5: NaN" in str(err)
    assert "2 of its 64 values are not finite" in str(err)


@pytest.mark.parametrize("value, word", [(np.inf, "inf"), (-np.inf, "-inf")])
def test_inf_in_pooled_vectors(tmp_path, value, word):
    feats = _feats(3, 8)
    feats[1, 7] = value
    write_precomp(tmp_path, "dev", feats, _caps(15))
    with pytest.raises(
        DataFormatError, match=rf"dev_ims\.npy, row 1: image 1, dimension 7: {word}"
    ):
        check_features(PrecompDataset(tmp_path, "dev"))


def test_first_bad_row_is_reported_across_chunks(tmp_path):
    feats = _feats(40, 2, 4)
    feats[29, 1, 1] = np.inf
    feats[17, 0, 3] = np.nan
    write_precomp(tmp_path, "train", feats, _caps(200))
    ds = PrecompDataset(tmp_path, "train")
    # chunks of 3 rows (96 bytes): row 17 is in the sixth chunk, not at a chunk start
    with pytest.raises(DataFormatError, match=r"row 17: image 17, region 0, dimension 3: NaN"):
        ds.check_features(chunk_bytes=3 * 2 * 4 * 4)
    with pytest.raises(DataFormatError, match=r"row 17: image 17, region 0, dimension 3: NaN"):
        ds.check_features(chunk_bytes=1)  # smaller than a row: one row per chunk


def test_in_memory_features_are_checked_too(tmp_path):
    feats = _feats(4, 3)
    feats[2, 0] = np.nan
    write_precomp(tmp_path, "test", feats, _caps(20))
    with pytest.raises(DataFormatError, match=r"row 2: image 2, dimension 0: NaN"):
        check_features(PrecompDataset(tmp_path, "test", mmap=False))


def test_only_the_images_a_dataset_uses_are_checked(tmp_path):
    feats = _feats(5, 2, 4)
    feats[3, 0, 0] = np.nan  # beyond max_images: never read by this dataset
    write_precomp(tmp_path, "dev", feats, _caps(25))
    check_features(PrecompDataset(tmp_path, "dev", max_images=3))
    with pytest.raises(DataFormatError, match="row 3"):
        check_features(PrecompDataset(tmp_path, "dev", max_images=4))


def test_half_precision_features_are_scanned(tmp_path):
    feats = _feats(3, 2, 4).astype(np.float16)
    feats[2, 1, 2] = np.inf
    write_precomp(tmp_path, "dev", feats, _caps(15))
    with pytest.raises(DataFormatError, match=r"row 2: image 2, region 1, dimension 2: inf"):
        check_features(PrecompDataset(tmp_path, "dev"))


def test_scan_streams_a_memory_mapped_file_in_bounded_chunks(tmp_path):
    feats = _feats(256, 8, 1024)  # 8 MiB
    write_precomp(tmp_path, "train", feats, ["a cat ."] * 1280)
    ds = PrecompDataset(tmp_path, "train")
    tracemalloc.start()
    try:
        ds.check_features(chunk_bytes=256 << 10)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak  # a copy of the array would be 8 MiB


def _naive_first_non_finite(array: np.ndarray, rows) -> tuple[int, tuple[int, ...]] | None:
    for row in rows:
        for index in np.ndindex(array.shape[1:]):
            if not np.isfinite(array[row][index]):
                return row, index
    return None


@pytest.mark.parametrize("seed", range(6))
def test_find_non_finite_matches_a_naive_loop(tmp_path, seed):
    rng = np.random.default_rng(seed)
    shape = (int(rng.integers(1, 30)), *[int(d) for d in rng.integers(1, 5, rng.integers(1, 3))])
    array = rng.standard_normal(shape).astype(np.float32)
    for _ in range(rng.integers(0, 4)):
        spot = tuple(int(rng.integers(0, d)) for d in shape)
        array[spot] = rng.choice([np.nan, np.inf, -np.inf])
    np.save(tmp_path / "a.npy", array)
    mapped = np.load(tmp_path / "a.npy", mmap_mode="r")
    subset = np.sort(rng.choice(shape[0], size=int(rng.integers(1, shape[0] + 1)), replace=False))
    row_bytes = array[0].nbytes
    for chunk_bytes in (1, 2 * row_bytes + 1, 1 << 20):
        for source in (array, mapped):
            for rows in (None, subset):
                found = find_non_finite(source, rows=rows, chunk_bytes=chunk_bytes)
                expected = _naive_first_non_finite(array, range(shape[0]) if rows is None else rows)
                got = None if found is None else (found.row, found.index)
                assert got == expected, (chunk_bytes, type(source), rows)
                if found is not None:
                    bad_row = array[found.row]
                    assert found.count == int((~np.isfinite(bad_row)).sum())
                    assert np.array_equal(found.value, bad_row[found.index], equal_nan=True)


# ------------------------------------------------------------------ precomp: feature size


def test_feature_size_differs_from_model_in_dim(tmp_path):
    write_precomp(tmp_path, "train", _feats(2, 36, 16), _caps(10))
    with pytest.raises(DataFormatError) as info:
        check_features(PrecompDataset(tmp_path, "train"), in_dim=2048)
    text = str(info.value)
    assert text.startswith(str(tmp_path / "train_ims.npy"))
    assert "shape (2, 36, 16)" in text
    assert "model.image.in_dim = 2048" in text
    assert info.value.row is None


def test_size_is_checked_before_the_scan(tmp_path):
    feats = _feats(2, 8)
    feats[0, 0] = np.nan
    write_precomp(tmp_path, "train", feats, _caps(10))
    with pytest.raises(DataFormatError, match="model.image.in_dim"):
        check_features(PrecompDataset(tmp_path, "train"), in_dim=4)


@pytest.mark.parametrize("in_dim", [0, -3, 2.0, True, "2048"])
def test_bad_in_dim_argument(tmp_path, in_dim):
    write_precomp(tmp_path, "dev", _feats(1, 4), _caps(5))
    with pytest.raises(ValueError, match="in_dim must be a positive int"):
        check_features(PrecompDataset(tmp_path, "dev"), in_dim=in_dim)


@pytest.mark.parametrize("shape", [(2, 0, 4), (2, 4, 0), (2, 0)])
def test_empty_region_or_feature_axis_is_refused_on_load(tmp_path, shape):
    write_precomp(tmp_path, "dev", np.zeros(shape, np.float32), _caps(10))
    with pytest.raises(DataFormatError, match=rf"dev_ims\.npy: has shape {re.escape(str(shape))};"):
        PrecompDataset(tmp_path, "dev")


# ------------------------------------------------------------------ MSR-VTT frame features


@pytest.fixture
def video_root(tmp_path):
    make_tiny_msrvtt(tmp_path, feature_shape=(3, 8))  # train 4 / validate 2 / test 3 videos
    return tmp_path


def _poison_video(root, video_id: str, frame: int, dim: int, value: float) -> int:
    """Write ``value`` into a video's features; returns its row in video_feats.npy."""
    ids = (root / "video_ids.txt").read_text(encoding="utf-8").split()
    feats = np.load(root / "video_feats.npy")
    row = ids.index(video_id)
    feats[row, frame, dim] = value
    write_video_features(root, ids, feats)
    return row


def test_nan_in_a_dev_video_names_row_video_and_frame(video_root):
    row = _poison_video(video_root, "video5", frame=1, dim=6, value=np.nan)
    ds = MSRVTTDataset(video_root, "dev")
    assert ds.video_ids == ["video4", "video5"]
    with pytest.raises(DataFormatError) as info:
        check_features(ds, in_dim=8)
    err = info.value
    assert err.path == video_root / "video_feats.npy"
    assert err.row == row
    assert f"row {row}: video5 (video 1 of the full dev split), frame 1, dimension 6: NaN" in (
        str(err)
    )
    check_features(MSRVTTDataset(video_root, "train"))  # the bad video is not in train


def test_first_bad_video_in_file_order_within_the_split(video_root):
    # rows are written in reverse video order: video3 is row 5, video1 is row 7
    _poison_video(video_root, "video1", 0, 0, np.inf)
    row = _poison_video(video_root, "video3", 2, 3, -np.inf)
    with pytest.raises(DataFormatError, match=rf"row {row}: video3 .* -inf"):
        MSRVTTDataset(video_root, "train").check_features(chunk_bytes=1)


def test_msrvtt_truncated_split_checks_only_the_kept_videos(video_root):
    _poison_video(video_root, "video3", 0, 0, np.nan)
    ds = MSRVTTDataset(video_root, "train")
    # what vlret.run.builders does for max_images: keep the first images in place
    ds.image_ids = ds.image_ids[:2]
    ds.txt_to_img = ds.txt_to_img[ds.txt_to_img < 2]
    ds.captions = ds.captions[: len(ds.txt_to_img)]
    check_features(ds)


def test_msrvtt_feature_size_names_the_config_key(video_root):
    with pytest.raises(DataFormatError, match=r"video_feats\.npy: has shape \(9, 3, 8\).*in_dim"):
        check_features(MSRVTTDataset(video_root, "test"), in_dim=2048)


def test_msrvtt_pooled_vectors(tmp_path):
    make_tiny_msrvtt(tmp_path, feature_shape=(8,))
    row = _poison_pooled(tmp_path, "video0")
    with pytest.raises(DataFormatError, match=rf"row {row}: video0 .*, dimension 2: inf"):
        check_features(MSRVTTDataset(tmp_path, "train", protocol="1k-A"))


def _poison_pooled(root, video_id: str) -> int:
    ids = (root / "video_ids.txt").read_text(encoding="utf-8").split()
    feats = np.load(root / "video_feats.npy")
    row = ids.index(video_id)
    feats[row, 2] = np.inf
    write_video_features(root, ids, feats)
    return row


# ------------------------------------------------------------------ Karpathy: image files


def test_karpathy_missing_image_file_names_json_line_and_path(tmp_path):
    json_path = tmp_path / "dataset_coco.json"
    images = make_tiny_karpathy(json_path)
    # one value per line, as the real files pretty-printed: the line number then means something
    json_path.write_text(json.dumps(json.loads(json_path.read_text()), indent=1))
    image_root = tmp_path / "images"
    train = [im for im in images if im.split in ("train", "restval")]
    for im in train:
        path = im.path(image_root)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")
    ds = KarpathyDataset(json_path, "train", image_root=image_root)
    check_features(ds, in_dim=2048)  # in_dim has no meaning for raw images
    missing = train[3].path(image_root)
    missing.unlink()
    train[4].path(image_root).unlink()
    with pytest.raises(DataFormatError) as info:
        check_features(ds)
    text = str(info.value)
    assert text.startswith(f"{json_path}, line ")
    assert str(missing) in text
    assert "2 of the 5 images of the train split are missing" in text
    # indent=1 puts each image entry's opening brace alone on a line indented by 2
    entry_lines = [
        n for n, text in enumerate(json_path.read_text().splitlines(), start=1) if text == "  {"
    ]
    assert info.value.line == entry_lines[images.index(train[3])]


def test_karpathy_without_image_root_has_nothing_to_check(tmp_path):
    json_path = tmp_path / "dataset_coco.json"
    make_tiny_karpathy(json_path)
    check_features(KarpathyDataset(json_path, "train"))


def test_karpathy_split_without_images_is_an_error(tmp_path):
    json_path = tmp_path / "dataset_coco.json"
    make_tiny_karpathy(json_path)
    data = json.loads(json_path.read_text(encoding="utf-8"))
    data["images"] = [im for im in data["images"] if im["split"] != "val"]
    json_path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"dataset_coco\.json: has no images .*'val'"):
        KarpathyDataset(json_path, "dev")


# ------------------------------------------------------------------ blank lines in text files


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
