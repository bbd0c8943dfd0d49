"""Person-search readers (issue 28, items 1 and 6): CUHK-PEDES, ICFG-PEDES and RSTPReid in
their released JSON layouts, one item per caption, raw ids for evaluation, batches carrying the
relabelled identity, the precomputed-feature route, the config wiring and each bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

pytest.importorskip("PIL")

from pedes_helpers import CUHK_IMAGES, TINY_CLIP_TOML, caption, write_pedes  # noqa: E402
from vlret.data import DataFormatError  # noqa: E402
from vlret.data.formats import open_dataset  # noqa: E402
from vlret.data.formats.pedes import (  # noqa: E402
    CUHKPedesDataset,
    ICFGPedesDataset,
    PersonSearchDataset,
    ResizeNormalize,
    RSTPReidDataset,
    open_person_search,
    read_pedes_json,
)
from vlret.run.builders import build_encoder  # noqa: E402
from vlret.run.config import ConfigError, config_from_dict  # noqa: E402


@pytest.fixture(scope="module")
def cuhk(tmp_path_factory):
    root = tmp_path_factory.mktemp("cuhk") / "CUHK-PEDES"
    write_pedes(root)
    return root


def irra_reference(images, split):
    """IRRA's CUHKPEDES._process_anno written out: training rows (pid = id - 1, image_id,
    caption) or the evaluation lists (image_pids, caption_pids, captions)."""
    annos = [(p, s, n, k) for k, (p, s, n) in enumerate(images) if s == split]
    if split == "train":
        return [
            (p - 1, image_id, caption(p, k * 10 + c))
            for image_id, (p, _, n, k) in enumerate(annos)
            for c in range(n)
        ]
    caps = [(p, caption(p, k * 10 + c)) for p, _, n, k in annos for c in range(n)]
    return [p for p, *_ in annos], [p for p, _ in caps], [c for _, c in caps]


def test_cuhk_train_rows_are_irras_one_per_caption_with_ids_relabelled(cuhk):
    ds = CUHKPedesDataset(cuhk / "reid_raw.json", "train")
    rows = [(int(ds.identity[int(i)]), int(i), ds.captions[j]) for j, i in enumerate(ds.txt_to_img)]
    assert rows == irra_reference(CUHK_IMAGES, "train")
    assert len(ds) == 10 and ds.num_images == 6 and ds.num_identities == 3
    assert ds.image_identity.tolist() == [1, 3, 1, 2, 1, 3]  # raw, as the file writes them
    assert ds.raw_identities == [1, 2, 3]
    item = ds[3]  # the fourth caption: image 2 (person 1)
    assert item.img_index == 2 and item.cap_index == 3 and item.caption == ds.captions[3]
    assert item.features == cuhk / "imgs" / "CUHK01" / "0001002.jpg"  # no transform: the path


@pytest.mark.parametrize("split", ["val", "dev", "test"])
def test_cuhk_evaluation_splits_keep_raw_ids(cuhk, split):
    ds = CUHKPedesDataset(cuhk / "reid_raw.json", split)
    image_pids, caption_pids, captions = irra_reference(
        CUHK_IMAGES, "val" if split == "dev" else split
    )
    assert ds.image_identity.tolist() == image_pids
    assert ds.image_identity[ds.txt_to_img].tolist() == caption_pids
    assert ds.captions == captions
    assert ds.identity.tolist() == [sorted(set(image_pids)).index(p) for p in image_pids]


def test_batches_carry_each_items_identity_through_the_loader(cuhk):
    transform = ResizeNormalize((16, 8))
    ds = CUHKPedesDataset(cuhk / "reid_raw.json", "train", image_transform=transform)
    loader = DataLoader(ds, batch_size=4, shuffle=True, collate_fn=ds.collate)
    seen = 0
    for batch in loader:
        assert batch.features.shape == (len(batch.img_index), 3, 16, 8)
        want = [int(ds.image_identity[i]) - 1 for i in batch.img_index]  # CUHK: id - 1
        assert batch.identity.tolist() == want
        seen += len(batch.img_index)
        for part in batch.chunks(3):  # gradient caching keeps each item's identity
            assert part.identity.tolist() == [int(ds.identity[i]) for i in part.img_index]
    assert seen == len(ds)


def test_rstpreid_reads_img_path_and_its_raw_ids(tmp_path):
    images = [(0, "train", 2), (2, "train", 2), (0, "train", 2), (4, "val", 2), (6, "test", 2)]
    path = write_pedes(tmp_path / "RSTPReid", "rstpreid", images)
    train = RSTPReidDataset(path, "train")
    assert train.image_identity.tolist() == [0, 2, 0]
    assert train.identity.tolist() == [0, 1, 0]  # relabelled: 0, 2 -> 0, 1
    assert train.image_path(1).name == "0002_c1_0001.jpg"
    test = open_person_search("rstpreid", tmp_path / "RSTPReid", "test")
    assert test.image_identity.tolist() == [6] and len(test) == 2


@pytest.mark.parametrize("name", ["ICFG-PEDES.json", "ICFG_PEDES.json"])
def test_icfg_reads_both_spellings_and_has_no_validation_split(tmp_path, name):
    images = [(p, s, 1) for p, s, _ in CUHK_IMAGES if s != "val"]
    write_pedes(tmp_path / "ICFG", "icfg-pedes", images, name=name)
    train = open_person_search("icfg-pedes", tmp_path / "ICFG", "train")
    assert train.num_images == 6 and isinstance(train, PersonSearchDataset)
    assert ICFGPedesDataset(tmp_path / "ICFG" / name, "test").image_identity.tolist() == [9, 11, 9]
    for split in ("val", "dev"):
        with pytest.raises(ValueError, match=r"ICFG-PEDES has no validation split \(only train "):
            open_person_search("icfg-pedes", tmp_path / "ICFG", split)


def test_precomputed_features_route(tmp_path):
    root = tmp_path / "CUHK-PEDES"
    path = write_pedes(root)
    feats = tmp_path / "features"
    feats.mkdir()
    rng = np.random.default_rng(0)
    arrays = {s: rng.standard_normal((n, 5)).astype(np.float32) for s, n in [("train", 6)]}
    np.save(feats / "train_ims.npy", arrays["train"])
    np.save(feats / "test_ims.npy", np.zeros((2, 5), np.float32))  # the test split has 3
    (root / "imgs").rename(tmp_path / "elsewhere")  # features need no image
    ds = CUHKPedesDataset(path, "train", features_dir=feats)
    for i in range(ds.num_images):
        assert torch.equal(ds.image(i), torch.from_numpy(arrays["train"][i]))
    batch = ds.collate([ds[j] for j in range(4)])
    assert batch.features.shape == (4, 5) and batch.identity.tolist() == [0, 0, 2, 0]
    ds.check_features(in_dim=5)
    with pytest.raises(DataFormatError, match=r"test_ims\.npy: has 2 rows; expected one per"):
        CUHKPedesDataset(path, "test", features_dir=feats)
    with pytest.raises(FileNotFoundError, match=r"val_ims\.npy"):
        CUHKPedesDataset(path, "val", features_dir=feats)


# -- bad input: each an error naming the file and the record -----------------------------------


def _records(tmp_path):
    path = write_pedes(tmp_path / "data")
    return path, json.loads(path.read_text())


def _rewrite(path, records):
    path.write_text(json.dumps(records, indent=1))


def test_a_caption_without_an_identity_names_the_record_and_line(tmp_path):
    path, records = _records(tmp_path)
    del records[4]["id"]
    _rewrite(path, records)
    with pytest.raises(DataFormatError) as err:
        read_pedes_json(path, "cuhk-pedes")
    lines = [n for n, t in enumerate(path.read_text().splitlines(), 1) if t == " {"]
    assert err.value.line == lines[4]  # the record's opening brace
    assert str(err.value).startswith(f"{path}, line {lines[4]}: record 4: a caption without an")
    assert "no 'id'" in str(err.value)


@pytest.mark.parametrize(
    ("edit", "pattern"),
    [
        (lambda r: r[2].update(id="7"), r"record 2 key 'id': is '7'; expected the integer"),
        (lambda r: r[1].update(captions=[]), r"record 1 key 'captions': is \[\]; expected a non"),
        (
            lambda r: r[3].update(captions=["ok", "  "]),
            r"record 3 key 'captions': caption 1 is '  '; expected a non-empty string",
        ),
        (lambda r: r[5].update(split="dev"), r"record 5 key 'split': unknown split 'dev'"),
        (lambda r: r[0].pop("file_path"), r"record 0: a record: no 'file_path'"),
        (
            lambda r: r[8].update(file_path=r[6]["file_path"]),
            r"record 8 key 'file_path': duplicate image file 'CUHK01/0005006.jpg' with id 7 "
            r"in split 'val'; record 6 gives it id 5",
        ),
    ],
)
def test_malformed_records_name_the_file_record_and_key(tmp_path, edit, pattern):
    path, records = _records(tmp_path)
    edit(records)
    _rewrite(path, records)
    with pytest.raises(DataFormatError, match=pattern) as err:
        read_pedes_json(path, "cuhk-pedes")
    assert str(err.value).startswith(f"{path}, line ")


def test_duplicate_file_of_one_person_is_one_image(tmp_path):
    path, records = _records(tmp_path)
    records[2]["file_path"] = records[0]["file_path"]  # both person 1, train
    _rewrite(path, records)
    ds = CUHKPedesDataset(path, "train")
    assert ds.num_images == 5 and len(ds) == 10
    assert ds.captions[:4] == records[0]["captions"] + records[2]["captions"]


def test_a_missing_image_is_found_when_the_split_opens(tmp_path):
    path, records = _records(tmp_path)
    (path.parent / "imgs" / records[10]["file_path"]).unlink()
    CUHKPedesDataset(path, "train")  # another split: not checked
    with pytest.raises(DataFormatError) as err:
        CUHKPedesDataset(path, "test")
    text = str(err.value)
    assert text.startswith(f"{path}, line ") and "record 10 key 'file_path': image file " in text
    assert "(1 of the 3 images of the test split are missing" in text
    ds = CUHKPedesDataset(path, "test", check_images=False)
    with pytest.raises(DataFormatError, match=r"record 10 key 'file_path'"):
        ds.check_features()


def test_unknown_split_and_format_and_an_empty_split(tmp_path):
    path, records = _records(tmp_path)
    with pytest.raises(ValueError, match=r"split must be one of .* got 'testall'"):
        CUHKPedesDataset(path, "testall")
    with pytest.raises(ValueError, match=r"format must be one of"):
        read_pedes_json(path, "cuhk")
    _rewrite(path, [r for r in records if r["split"] != "val"])
    with pytest.raises(DataFormatError, match=r"has no record with split 'val'"):
        CUHKPedesDataset(path, "val")
    path.write_text(json.dumps({"annotations": records}))
    with pytest.raises(DataFormatError, match=r"top level is dict; expected a list of"):
        read_pedes_json(path, "cuhk-pedes")


# -- the run config ----------------------------------------------------------------------------


def _config(root, fmt="cuhk-pedes", **data):
    raw = {
        "output_dir": "unused",
        "data": {"root": str(root), "format": fmt, **data},
        "loss": {"name": "infonce"},
        "train": {"epochs": 1, "batch_size": 4},
    }
    return config_from_dict(raw, source="run.toml")


def test_config_defaults_and_icfg_never_falls_back_to_test(cuhk):
    data = _config(cuhk).data
    assert data.dev_split == "dev" and data.dev_max_images is None  # the whole val gallery
    assert _config(cuhk, dev_max_images=2).data.dev_max_images == 2
    assert _config(cuhk, "icfg-pedes").data.dev_split is None  # no validation: last epoch
    assert _config(cuhk, "icfg-pedes", dev_split="test").data.dev_split == "test"  # by name
    for split in ("val", "dev"):
        with pytest.raises(ConfigError, match=r"data\.dev_split: ICFG-PEDES has no '"):
            _config(cuhk, "icfg-pedes", dev_split=split)
    with pytest.raises(ConfigError, match=r"data\.annotations: only read with formats cuhk-"):
        _config(cuhk, "karpathy", annotations="x.json")
    with pytest.raises(ConfigError, match=r"data\.train_transform: data\.features_dir serves"):
        _config(cuhk, train_transform="irra", features_dir="feats")
    with pytest.raises(ConfigError, match=r"data\.dev_split: expected \"val\""):
        _config(cuhk, "rstpreid", dev_split="testall")


def test_builders_open_the_splits_and_build_the_vocabulary_without_test(cuhk, tmp_path):
    from vlret.models.clip import CLIPImageTransform

    data = _config(cuhk, train_transform="irra", min_count=1).data
    dev = open_dataset(data, "dev", image_transform=CLIPImageTransform((16, 8)))
    assert isinstance(dev, CUHKPedesDataset) and dev.num_images == 3
    # IRRA's evaluation resize (behind the pixel cap's wrapper where builders add one)
    transform = getattr(dev.image_transform, "transform", dev.image_transform)
    assert isinstance(transform, ResizeNormalize)
    assert dev.image(0).shape == (3, 16, 8)
    records = json.loads((cuhk / "reid_raw.json").read_text())
    for r in records:  # a word only in val captions, another only in test captions
        r["captions"] = [
            c + {"val": " walrus", "test": " zebra"}.get(r["split"], "") for c in r["captions"]
        ]
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "reid_raw.json").write_text(json.dumps(records))
    vocab = build_encoder(_config(copy, min_count=1).data)
    assert vocab.encode("walrus") != vocab.encode("qqqq")
    assert vocab.encode("zebra") == vocab.encode("qqqq")  # test captions never build it
    renamed = tmp_path / "moved"
    (renamed / "imgs").mkdir(parents=True)
    (renamed / "ann.json").write_text((cuhk / "reid_raw.json").read_text())
    from vlret.run.eval_data import eval_data_config

    moved = eval_data_config(_config(cuhk, annotations=str(cuhk / "ann.json")).data, renamed)
    assert moved.annotations == str(renamed / "ann.json") and moved.image_root is None


# -- vlret train on a CUHK-PEDES folder --------------------------------------------------------


def test_vlret_train_on_a_cuhk_pedes_folder_with_irras_augmentation(cuhk, tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    from vlret.cli import main
    from vlret.data.formats.pedes import IRRAAugment

    seen = []
    collate = PersonSearchDataset.collate

    def recording(self, items):
        batch = collate(self, items)
        seen.append((self.split, type(self.augment), batch.features.shape, batch))
        return batch

    monkeypatch.setattr(PersonSearchDataset, "collate", recording)
    out = tmp_path / "run"
    config = tmp_path / "pedes.toml"
    config.write_text(
        f'output_dir = "{out}"\n[data]\nroot = "{cuhk}"\nformat = "cuhk-pedes"\n'
        'train_transform = "irra"\n'
        '[model]\nkind = "clip"\npreset = "ViT-B-32"\ntokenizer = "bytes"\n'
        f"config = {TINY_CLIP_TOML}\n"
        '[loss]\nname = "infonce"\n[optim]\nlr = 1e-4\n'
        "[train]\nepochs = 1\nbatch_size = 4\nprogress = false\neval_batch_size = 8\n"
    )
    assert main(["train", str(config)]) == 0
    train = [s for s in seen if s[0] == "train"]
    assert len(train) == 2  # 10 captions, batch 4, drop_last
    for _, augment, shape, batch in train:
        assert augment is IRRAAugment and shape == (4, 3, 16, 16)
        ds = CUHKPedesDataset(cuhk / "reid_raw.json", "train", check_images=False)
        want = [int(ds.image_identity[i]) - 1 for i in batch.img_index]
        assert batch.identity.tolist() == want
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    epoch = next(r for r in records if r["kind"] == "epoch")
    assert epoch["step"] == 2 and np.isfinite(epoch["dev_rsum"])
    for key in ("dev_identity_t2i_r1", "dev_identity_t2i_map", "dev_identity_i2t_minp"):
        assert 0.0 <= epoch[key] <= 100.0, key
    assert (out / "best.pt").is_file()
    # the trained checkpoint under the identity protocol, end to end through vlret eval
    record = tmp_path / "eval.json"
    cmd = ["eval", str(out / "best.pt"), "--data", str(cuhk), "--split", "test"]
    assert main([*cmd, "--protocol", "cuhk-pedes", "--json", str(record), "--no-progress"]) == 0
    found = json.loads(record.read_text())
    assert found["protocol"] == "cuhk-pedes" and found["split"] == "test"
    assert 0.0 <= found["metrics"]["identity_t2i_r1"] <= found["metrics"]["identity_t2i_r10"] <= 100
