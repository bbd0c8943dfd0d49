"""Karpathy split JSON: round trips for COCO and Flickr30K, split logic, image files, errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from vlret.data import (
    DataFormatError,
    KarpathyDataset,
    build_karpathy_vocab,
    read_karpathy_json,
)
from vlret.data.formats.karpathy_json import KarpathyImage, KarpathySentence, locate_json_line
from vlret.data.writers import make_tiny_karpathy, write_karpathy_json


def test_coco_round_trip(tmp_path):
    path = tmp_path / "dataset_coco.json"
    written = make_tiny_karpathy(path, dataset="coco", extra_captions={1: 2})
    raw = json.loads(path.read_text())
    assert raw["dataset"] == "coco"
    entry = raw["images"][0]
    assert set(entry) == {
        "filepath",
        "sentids",
        "filename",
        "imgid",
        "split",
        "sentences",
        "cocoid",
    }
    assert set(entry["sentences"][0]) == {"tokens", "raw", "imgid", "sentid"}
    data = read_karpathy_json(path)
    assert data.dataset == "coco" and data.images == tuple(written)
    first = data.images[0]
    assert first.filepath == "train2014" and first.filename.startswith("COCO_train2014_")
    assert first.path(tmp_path) == tmp_path / "train2014" / first.filename
    assert len(data.images[1].sentences) == 7


def test_flickr_round_trip_has_no_filepath_or_cocoid(tmp_path):
    path = tmp_path / "dataset_flickr30k.json"
    make_tiny_karpathy(path, dataset="flickr30k", splits={"train": 2, "val": 1, "test": 1})
    entry = json.loads(path.read_text())["images"][0]
    assert "filepath" not in entry and "cocoid" not in entry
    data = read_karpathy_json(path)
    im = data.images[0]
    assert (im.filepath, im.cocoid) == (None, None)
    assert im.path(tmp_path) == tmp_path / im.filename
    ds = KarpathyDataset(data, "test")
    assert ds.image_ids == [3]  # imgid for Flickr


def test_split_logic_restval_joins_train(tmp_path):
    # Tiny analogue of COCO: train 82,783 + restval 30,504 = 113,287; val 5000; test 5000.
    path = tmp_path / "dataset_coco.json"
    make_tiny_karpathy(path, splits={"train": 3, "restval": 2, "val": 2, "test": 4})
    data = read_karpathy_json(path)
    assert len(data.split("train")) == 5
    assert len(data.split("train", include_restval=False)) == 3
    assert len(data.split("dev")) == len(data.split("val")) == 2
    assert len(data.split("test")) == len(data.split("testall")) == 4
    ds = KarpathyDataset(path, "train")
    assert ds.num_images == 5 and len(ds) == 25
    assert ds.image_ids == [im.cocoid for im in data.split("train")]
    with pytest.raises(ValueError, match="split must be one of"):
        data.split("restval")


def test_first_five_captions_and_text_fields(tmp_path):
    path = tmp_path / "dataset_coco.json"
    images = make_tiny_karpathy(
        path, splits={"test": 3}, extra_captions={0: 1, 2: 2}, captions_per_image=5
    )
    ds = KarpathyDataset(path, "test")
    assert len(ds) == 15
    assert torch.equal(ds.txt_to_img, torch.arange(15) // 5)
    assert ds.captions[5:10] == [s.raw for s in images[1].sentences]
    assert ds.captions[10:] == [s.raw for s in images[2].sentences[:5]]
    all_caps = KarpathyDataset(path, "test", captions_per_image=None)
    assert len(all_caps) == 18 and all_caps.txt_to_img.tolist().count(2) == 7
    tokens = KarpathyDataset(path, "test", text_field="tokens")
    assert tokens.captions[0] == " ".join(images[0].sentences[0].tokens)
    assert tokens.captions[0] == tokens.captions[0].lower() and "." not in tokens.captions[0]


def test_images_from_the_folder(tmp_path):
    pytest.importorskip("PIL")
    path, root = tmp_path / "dataset_coco.json", tmp_path / "images"
    images = make_tiny_karpathy(path, image_root=root, splits={"val": 2})
    ds = KarpathyDataset(path, "dev", image_root=root)
    item = ds[6]
    assert item.features == images[1].path(root) and item.features.is_file()
    assert (item.img_index, item.cap_index) == (1, 6)
    from PIL import Image

    def load(p):
        with Image.open(p) as im:
            return torch.from_numpy(np.array(im.convert("RGB"), dtype=np.float32))

    ds = KarpathyDataset(path, "dev", image_root=root, image_transform=load)
    batch = ds.collate([ds[0], ds[9]])
    assert batch.features.shape == (2, 8, 8, 3)
    assert batch.img_index.tolist() == [0, 1]


def test_missing_image_files_and_folders(tmp_path):
    path = tmp_path / "dataset_coco.json"
    images = make_tiny_karpathy(path, splits={"test": 1})
    with pytest.raises(FileNotFoundError, match=r"nowhere: missing; expected the image folder"):
        KarpathyDataset(path, "test", image_root=tmp_path / "nowhere")
    with pytest.raises(ValueError, match="without image_root"):
        KarpathyDataset(path, "test")[0]
    ds = KarpathyDataset(path, "test", image_root=tmp_path)
    with pytest.raises(FileNotFoundError, match=rf"{images[0].filename}: missing; .*imgid 0"):
        ds[0]
    # Without the folder, the dataset paths are listable (e.g. to check a download).
    assert ds.image_path(0) == tmp_path / "val2014" / images[0].filename


def _tiny_coco(tmp_path) -> tuple:
    path = tmp_path / "dataset_coco.json"
    make_tiny_karpathy(path, splits={"train": 1, "test": 1})
    data = json.loads(path.read_text())
    return path, data


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.pop("images"), r"top level has no 'images' list"),
        (lambda d: d["images"][1].pop("sentences"), r"images\[1\] \(imgid 1\) has no 'sentences'"),
        (lambda d: d["images"][0].update(split="dev"), r"images\[0\] \(imgid 0\): split 'dev'; "),
        (lambda d: d["images"][1].pop("cocoid"), r"images\[1\] \(imgid 1\) has no 'cocoid'"),
        (lambda d: d["images"][0].update(imgid="7"), r"images\[0\]: 'imgid' is str '7'"),
        (
            lambda d: d["images"][0]["sentids"].pop(),
            r"images\[0\] \(imgid 0\) has 4 sentids and 5 sentences",
        ),
        (
            lambda d: d["images"][1]["sentences"][2].pop("raw"),
            r"images\[1\] \(imgid 1\)\.sentences\[2\] has no 'raw'",
        ),
        (
            lambda d: d["images"][1]["sentences"][2].update(sentid=99),
            r"sentences\[2\]: sentid 99 but sentids\[2\] is 7",
        ),
    ],
)
def test_malformed_entries_are_named(tmp_path, mutate, message):
    path, data = _tiny_coco(tmp_path)
    mutate(data)
    path.write_text(json.dumps(data))
    with pytest.raises(DataFormatError, match=message) as e:
        read_karpathy_json(path)
    assert str(path) in str(e.value)


# One entry field per line: the line numbers below are those of this text.
_FLICKR_LINES = """{"dataset": "flickr30k", "images": [
 {"imgid": 0, "filename": "0.jpg", "split": "train", "sentids": [0],
  "sentences": [{"sentid": 0, "raw": "a dog", "tokens": ["a", "dog"]}]},
 {IMGID "filename": "1.jpg",
  "split": "SPLIT", "sentids": [1, 2],
  "sentences": [{"sentid": 1, "raw": "a cat", "tokens": ["a", "cat"]},
                {"sentid": 2, RAW "tokens": ["a", "cat"]}]}
]}"""


@pytest.mark.parametrize(
    ("imgid", "split", "raw", "message"),
    [
        ('"imgid": 1,', "test", '"raw": "x",', None),
        # A missing key: the line where the entry starts.
        ("", "test", '"raw": "x",', r"line 4: images\[1\] has no 'imgid'; expected \{"),
        # A bad value: the line of the value.
        ('"imgid": 1,', "dev", '"raw": "x",', r"line 5: images\[1\] \(imgid 1\): split 'dev'"),
        ('"imgid": "1",', "test", '"raw": "x",', r"line 4: images\[1\]: 'imgid' is str '1'"),
        ('"imgid": 1,', "test", "", r"line 7: images\[1\] \(imgid 1\)\.sentences\[1\] has no"),
        ('"imgid": 1,', "test", '"raw": 5,', r"line 7: .*sentences\[1\]: 'raw' is int 5"),
    ],
)
def test_entry_errors_name_file_line_and_entry(tmp_path, imgid, split, raw, message):
    path = tmp_path / "dataset_flickr30k.json"
    text = _FLICKR_LINES.replace("IMGID", imgid).replace("SPLIT", split).replace("RAW", raw)
    path.write_text(text)
    if message is None:
        assert [im.imgid for im in read_karpathy_json(path).images] == [0, 1]
        return
    with pytest.raises(DataFormatError, match=message) as e:
        read_karpathy_json(path)
    assert str(e.value).startswith(f"{path}, line ")
    assert e.value.line is not None and str(e.value).count("expected") == 1


def test_locate_json_line_walks_keys_and_indices(tmp_path):
    path = tmp_path / "doc.json"
    path.write_text('{"a": 1,\n "b": [\n  {"x": "[,]"},\n  {"x":\n 2}],\n "a": [0]}')
    assert locate_json_line(path, ()) == 1
    assert locate_json_line(path, ("b", 1)) == 4
    assert locate_json_line(path, ("b", 1, "x")) == 5
    assert locate_json_line(path, ("a", 0)) == 6  # a repeated key: its last value, as json.loads
    assert locate_json_line(path, ("b", 2)) is None
    assert locate_json_line(path, ("c",)) is None
    assert locate_json_line(tmp_path / "missing.json", ("a",)) is None


def test_bad_json_names_the_line(tmp_path):
    path = tmp_path / "dataset_coco.json"
    path.write_text('{"images": [\n{"imgid": 0,\n"split": "train"\n"filename": "x.jpg"}]}')
    with pytest.raises(DataFormatError, match=r"dataset_coco\.json, line 4: invalid JSON") as e:
        read_karpathy_json(path)
    # "expected" once, then the layout (it used to read "expected ... expected {...}").
    assert 'expected a Karpathy split JSON {"images": [{"filename"' in str(e.value)
    assert str(e.value).count("expected") == 1
    with pytest.raises(FileNotFoundError, match=r"missing\.json: missing; expected a Karpathy"):
        read_karpathy_json(tmp_path / "missing.json")


def test_too_few_captions(tmp_path):
    sents = tuple(KarpathySentence(k, f"a dog {k}", ("a", "dog")) for k in range(4))
    image = KarpathyImage(
        imgid=0,
        filename="1.jpg",
        split="test",
        sentids=tuple(range(4)),
        sentences=sents,
    )
    path = write_karpathy_json(tmp_path / "dataset_flickr30k.json", [image], dataset="flickr30k")
    with pytest.raises(DataFormatError, match=r"imgid 0 \(1\.jpg\) has 4 sentences; expected at"):
        KarpathyDataset(path, "test")
    assert len(KarpathyDataset(path, "test", captions_per_image=4)) == 4


def test_vocab_from_train_restval_and_val_only(tmp_path):
    def image(imgid, split, raw):
        sents = tuple(KarpathySentence(5 * imgid + k, raw, tuple(raw.split())) for k in range(5))
        return KarpathyImage(imgid, f"{imgid}.jpg", split, tuple(s.sentid for s in sents), sents)

    images = [
        image(0, "train", "a cat"),
        image(1, "restval", "a zebu"),
        image(2, "val", "an okapi"),
        image(3, "test", "a giraffe"),
    ]
    path = write_karpathy_json(tmp_path / "d.json", images, dataset="flickr30k")
    vocab = build_karpathy_vocab(path)
    assert {"cat", "zebu", "okapi"} <= set(vocab.idx2word) and "giraffe" not in vocab
    assert "zebu" not in build_karpathy_vocab(path, include_restval=False)
