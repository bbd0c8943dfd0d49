"""MSR-VTT: full split and 1k-A on tiny analogues, feature layout, metrics contract, errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from vlret.data import (
    DataFormatError,
    MSRVTTDataset,
    build_msrvtt_vocab,
    read_jsfusion_csv,
    read_msrvtt_json,
    read_train_csv,
)
from vlret.data.writers import (
    make_tiny_msrvtt,
    write_jsfusion_csv,
    write_msrvtt_json,
    write_video_features,
)
from vlret.metrics import retrieval_metrics


@pytest.fixture
def root(tmp_path):
    make_tiny_msrvtt(tmp_path)  # train 4 / validate 2 / test 3 videos, 20 captions; 1k-A test 2
    return tmp_path


def test_annotation_files_round_trip(root):
    raw = json.loads((root / "MSRVTT_data.json").read_text())
    video = raw["videos"][0]
    assert {"category", "url", "video_id", "start time", "end time", "split", "id"} <= set(video)
    assert set(raw["sentences"][0]) == {"caption", "video_id", "sen_id"}
    ann = read_msrvtt_json(root / "MSRVTT_data.json")
    assert ann.split_videos("validate") == ["video4", "video5"]
    assert all(len(c) == 20 for c in ann.captions.values())
    header = (root / "MSRVTT_JSFUSION_test.csv").read_text().splitlines()
    assert header[0] == "key,vid_key,video_id,sentence"
    assert header[1].startswith("ret0,msr7,video7,")
    assert read_jsfusion_csv(root / "MSRVTT_JSFUSION_test.csv") == [
        ("video7", ann.captions["video7"][0]),
        ("video8", ann.captions["video8"][0]),
    ]
    assert read_train_csv(root / "MSRVTT_train.9k.csv") == [f"video{k}" for k in range(7)]


def test_full_split_sizes_and_captions(root):
    # Tiny analogue of 6513 / 497 / 2990 videos with 20 captions each.
    ann = read_msrvtt_json(root / "MSRVTT_data.json")
    for split, videos in {"train": 4, "dev": 2, "test": 3}.items():
        ds = MSRVTTDataset(root, split, expected_videos=videos)
        assert ds.num_images == videos and len(ds) == 20 * videos
        assert torch.equal(ds.txt_to_img, torch.arange(20 * videos) // 20)
        for i, vid in enumerate(ds.video_ids):
            assert ds.captions[20 * i : 20 * i + 20] == ann.captions[vid]
    assert MSRVTTDataset(root, "val").video_ids == ["video4", "video5"]
    with pytest.raises(DataFormatError, match=r"gives 3 videos for full test; expected 2990"):
        MSRVTTDataset(root, "test", expected_videos=2990)


def test_features_follow_the_id_list_not_the_row_order(root):
    feats = np.load(root / "video_feats.npy")
    ids = (root / "video_ids.txt").read_text().split()
    assert ids[0] == "video8"  # the writer stores rows in reverse order
    ds = MSRVTTDataset(root, "test")
    item = ds[45]  # caption 5 of the third test video
    assert (item.img_index, item.cap_index) == (2, 45)
    np.testing.assert_array_equal(item.features.numpy(), feats[ids.index("video8")])
    assert item.features.shape == (3, 8)


def test_one_k_a_protocol(root):
    # Tiny analogue of 9000 training videos (all captions) and 1000 test pairs.
    train = MSRVTTDataset(root, "train", protocol="1k-A")
    assert train.num_images == 7 and len(train) == 140
    test = MSRVTTDataset(root, "test", protocol="msrvtt-1ka")
    assert test.video_ids == ["video7", "video8"] and len(test) == 2
    assert torch.equal(test.txt_to_img, torch.arange(2))  # square: one caption per video
    with pytest.raises(ValueError, match="1k-A has the splits 'train' and 'test'"):
        MSRVTTDataset(root, "dev", protocol="1k-A")
    with pytest.raises(ValueError, match="protocol must be one of"):
        MSRVTTDataset(root, "test", protocol="7k")


def test_metrics_contract_best_of_a_videos_captions(root):
    ds = MSRVTTDataset(root, "test")
    n_vid = ds.num_images
    vid_emb = torch.eye(n_vid)
    txt_emb = torch.zeros(len(ds), n_vid)
    # Only the 4th caption of each video points to its video; the others, more weakly, elsewhere.
    for j in range(len(ds)):
        own = int(ds.txt_to_img[j])
        if j % 20 == 3:
            txt_emb[j, own] = 1.0
        else:
            txt_emb[j, (own + 1) % n_vid] = 0.5
    metrics = retrieval_metrics(vid_emb, txt_emb, ds.txt_to_img)
    assert metrics.i2t_r1 == 100.0  # video->text: the best of the video's 20 captions
    assert metrics.t2i_r1 == pytest.approx(100.0 / 20)


def test_collate_and_views(root):
    class Enc:
        pad_id = 0

        def encode(self, text):
            return list(range(1, len(text.split()) + 1))

    ds = MSRVTTDataset(root, "dev", encoder=Enc())
    batch = ds.collate([ds[0], ds[25], ds[39]])
    assert batch.features.shape == (3, 3, 8)
    assert batch.img_index.tolist() == [0, 1, 1] and batch.cap_index.tolist() == [0, 25, 39]
    assert batch.lengths.tolist() == [len(ds.captions[j].split()) for j in (0, 25, 39)]
    feats, index = ds.images().collate([ds.images()[1]])
    assert feats.shape == (1, 3, 8) and index.tolist() == [1]


def test_vocab_never_counts_test_captions(tmp_path):
    videos = [("video0", "train"), ("video1", "validate"), ("video2", "test"), ("video3", "test")]
    caps = {
        "video0": ["a cat runs"] * 20,
        "video1": ["an okapi"] * 20,
        "video2": ["a giraffe"] * 20,
        "video3": ["a zebu"] * 20,
    }
    write_msrvtt_json(tmp_path / "MSRVTT_data.json", videos, caps)
    (tmp_path / "MSRVTT_train.9k.csv").write_text("video_id\nvideo0\nvideo1\nvideo2\n")
    write_jsfusion_csv(tmp_path / "MSRVTT_JSFUSION_test.csv", [("video3", "a zebu")])
    full = build_msrvtt_vocab(tmp_path)
    assert {"cat", "okapi"} <= set(full.idx2word) and "giraffe" not in full
    one_k = build_msrvtt_vocab(tmp_path, protocol="1k-A")
    assert "giraffe" in one_k and "zebu" not in one_k
    (tmp_path / "MSRVTT_train.9k.csv").write_text("video_id\nvideo0\nvideo3\n")
    with pytest.raises(DataFormatError, match=r"train\.9k\.csv, line 3: lists 1k-A test videos"):
        build_msrvtt_vocab(tmp_path, protocol="1k-A")


# ----------------------------------------------------------------------------- errors


def test_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"MSRVTT_data\.json: missing"):
        MSRVTTDataset(tmp_path, "train")
    with pytest.raises(FileNotFoundError, match=r"MSRVTT_JSFUSION_test\.csv: missing"):
        MSRVTTDataset(tmp_path, "test", protocol="1k-A")
    make_tiny_msrvtt(tmp_path)
    (tmp_path / "video_ids.txt").unlink()
    with pytest.raises(FileNotFoundError, match=r"video_ids\.txt: missing; expected one video id"):
        MSRVTTDataset(tmp_path, "train")


def test_feature_errors(root):
    write_video_features(root, ["video0", "video1"], np.zeros((2, 3, 8), np.float32))
    with pytest.raises(DataFormatError, match=r"video_ids\.txt: has no features for 2 videos"):
        MSRVTTDataset(root, "train")
    (root / "video_ids.txt").write_text("video0\nvideo1\nvideo2\n")
    with pytest.raises(DataFormatError, match=r"has 3 ids for 2 rows in video_feats\.npy"):
        MSRVTTDataset(root, "train")
    (root / "video_ids.txt").write_text("video0\nvideo0\n")
    with pytest.raises(DataFormatError, match=r"video_ids\.txt, line 2: video id 'video0' repeats"):
        MSRVTTDataset(root, "train")
    np.save(root / "video_feats.npy", np.zeros((2, 3, 8, 1), np.float32))
    with pytest.raises(DataFormatError, match=r"video_feats\.npy: has shape \(2, 3, 8, 1\)"):
        MSRVTTDataset(root, "train")


def test_caption_counts(tmp_path):
    videos = [("video0", "test"), ("video1", "test")]
    write_msrvtt_json(
        tmp_path / "MSRVTT_data.json", videos, {"video0": ["a"] * 20, "video1": ["b"] * 19}
    )
    write_video_features(tmp_path, ["video0", "video1"], np.zeros((2, 4), np.float32))
    with pytest.raises(DataFormatError, match=r"video video1 has 19 sentences; expected 20"):
        MSRVTTDataset(tmp_path, "test")
    ds = MSRVTTDataset(tmp_path, "test", captions_per_video=None)
    assert len(ds) == 39 and ds.image(1).shape == (4,)


def test_captions_are_ordered_by_sen_id(tmp_path):
    data = {
        "videos": [{"video_id": "video0", "split": "train"}],
        "sentences": [
            {"caption": f"caption {k}", "video_id": "video0", "sen_id": 100 - k} for k in range(3)
        ],
    }
    (tmp_path / "MSRVTT_data.json").write_text(json.dumps(data))
    write_video_features(tmp_path, ["video0"], np.zeros((1, 4), np.float32))
    ds = MSRVTTDataset(tmp_path, "train", captions_per_video=3)
    assert ds.captions == ["caption 2", "caption 1", "caption 0"]


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.pop("sentences"), r"lacks the 'videos' and 'sentences' lists"),
        (lambda d: d["videos"][1].update(split="val"), r"videos\[1\] \(video1\): split 'val'"),
        (lambda d: d["videos"][0].pop("video_id"), r"videos\[0\]: 'video_id' is None"),
        (
            lambda d: d["sentences"][3].update(video_id="video99"),
            r"sentences\[3\]: video_id 'video99",
        ),
        (lambda d: d["sentences"][2].update(sen_id="2"), r"sentences\[2\]: 'sen_id' is '2'"),
        (lambda d: d["videos"].append(dict(d["videos"][0])), r"video_id 'video0' appears twice"),
    ],
)
def test_malformed_json(tmp_path, mutate, message):
    write_msrvtt_json(
        tmp_path / "MSRVTT_data.json",
        [("video0", "train"), ("video1", "test")],
        {"video0": ["a dog"] * 2, "video1": ["a cat"] * 2},
    )
    data = json.loads((tmp_path / "MSRVTT_data.json").read_text())
    mutate(data)
    (tmp_path / "MSRVTT_data.json").write_text(json.dumps(data))
    with pytest.raises(DataFormatError, match=message):
        read_msrvtt_json(tmp_path / "MSRVTT_data.json")


_MSRVTT_LINES = """{"videos": [
  {"video_id": "video0", "split": "train"},
  {"video_id": "video1",
   "split": SPLIT}],
 "sentences": [
  {"caption": "a dog", "video_id": "video0", "sen_id": 0},
  {"caption": "a cat",
   VIDEO "sen_id": 1}]}"""


@pytest.mark.parametrize(
    ("split", "video", "message"),
    [
        ('"test"', '"video_id": "video1",', None),
        ('"val"', '"video_id": "video1",', r"line 4: videos\[1\] \(video1\): split 'val'"),
        ("3", '"video_id": "video1",', r"line 4: videos\[1\] \(video1\): 'split' is 3"),
        ('"test"', "", r"line 7: sentences\[1\]: 'video_id' is None; expected \{"),
        ('"test"', '"video_id": "video9",', r"line 8: sentences\[1\]: video_id 'video9' is not"),
        ('"test"', '"video_id": "video0",', None),
    ],
)
def test_entry_errors_name_file_line_and_entry(tmp_path, split, video, message):
    path = tmp_path / "MSRVTT_data.json"
    path.write_text(_MSRVTT_LINES.replace("SPLIT", split).replace("VIDEO", video))
    if message is None:
        assert read_msrvtt_json(path).video_ids == ("video0", "video1")
        return
    with pytest.raises(DataFormatError, match=message) as e:
        read_msrvtt_json(path)
    assert str(e.value).startswith(f"{path}, line ")


def test_repeated_video_names_both_entries_and_the_line(tmp_path):
    path = tmp_path / "MSRVTT_data.json"
    text = _MSRVTT_LINES.replace("SPLIT", '"test"').replace("VIDEO", '"video_id": "video0",')
    path.write_text(text.replace("video1", "video0"))
    with pytest.raises(
        DataFormatError,
        match=r"line 3: videos\[1\]: video_id 'video0' appears twice \(first at videos\[0\]\)",
    ):
        read_msrvtt_json(path)


def test_bad_json_syntax(tmp_path):
    (tmp_path / "MSRVTT_data.json").write_text('{"videos": [],\n"sentences": [,]}')
    with pytest.raises(DataFormatError, match=r"MSRVTT_data\.json, line 2: invalid JSON") as e:
        read_msrvtt_json(tmp_path / "MSRVTT_data.json")
    assert 'expected the MSR-VTT annotations {"videos"' in str(e.value)
    assert str(e.value).count("expected") == 1


def test_bad_csv(tmp_path):
    path = tmp_path / "MSRVTT_JSFUSION_test.csv"
    path.write_text("key,video_id,sentence\nret0,video1,a dog\n")
    with pytest.raises(DataFormatError, match=r"test\.csv, line 1: header key,video_id,sentence;"):
        read_jsfusion_csv(path)
    path.write_text("key,vid_key,video_id,sentence\nret0,msr1,video1,a dog\nret1,msr2,video2\n")
    with pytest.raises(DataFormatError, match=r"test\.csv, line 3: 3 fields; expected 4"):
        read_jsfusion_csv(path)
    path.write_text('key,vid_key,video_id,sentence\nret0,msr1,video1,"a dog, running"\n')
    assert read_jsfusion_csv(path) == [("video1", "a dog, running")]
    path.write_text('key,vid_key,video_id,sentence\nret0,msr1,video1,"a dog\n')
    with pytest.raises(DataFormatError, match=r"test\.csv, line \d: bad CSV"):
        read_jsfusion_csv(path)
    train = tmp_path / "MSRVTT_train.9k.csv"
    train.write_text("vid\nvideo0\n")
    with pytest.raises(
        DataFormatError, match=r"9k\.csv, line 1: header \['vid'\] has no 'video_id'"
    ):
        read_train_csv(train)
    train.write_text("video_id\nvideo0\nvideo1\nvideo0\n")
    with pytest.raises(DataFormatError, match=r"9k\.csv, line 4: video_id 'video0' repeated"):
        read_train_csv(train)


def test_train_csv_must_name_known_videos(root):
    (root / "MSRVTT_train.9k.csv").write_text("video_id\nvideo0\nvideo42\n")
    with pytest.raises(DataFormatError, match=r"lists 1 videos absent from MSRVTT_data\.json"):
        MSRVTTDataset(root, "train", protocol="1k-A")
