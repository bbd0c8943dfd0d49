"""CSV / TSV pairs (open_clip's --csv-img-key / --csv-caption-key convention): columns, paths,
grouping of rows by image, errors naming the line, augmentation through the dataset."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vlret.data.checks import DataFormatError
from vlret.data.formats.csv import CsvPairsDataset, build_csv_dataset, read_csv_pairs
from vlret.run.config import ConfigError, config_from_dict

Image = pytest.importorskip("PIL.Image")


def write_images(folder, names):
    folder.mkdir(parents=True, exist_ok=True)
    for k, name in enumerate(names):
        pixels = np.full((5, 6, 3), 40 * k, dtype=np.uint8)
        Image.fromarray(pixels).save(folder / name)


def test_tsv_rows_group_by_image_and_resolve_next_to_the_file(tmp_path):
    write_images(tmp_path / "imgs", ["a.jpg", "b.png"])
    tsv = tmp_path / "train.tsv"
    tsv.write_text(
        "title\tfilepath\textra\n"
        "a dog\timgs/a.jpg\tx\n"
        "a red ball\timgs/b.png\ty\n"
        '"a dog, again\twith a tab"\timgs/a.jpg\tz\n',
        encoding="utf-8",
    )
    ds = CsvPairsDataset(tsv, image_transform=lambda im: (im.mode, im.size))
    assert ds.captions == ["a dog", "a red ball", "a dog, again\twith a tab"]
    assert ds.txt_to_img.tolist() == [0, 1, 0] and ds.image_ids == ["imgs/a.jpg", "imgs/b.png"]
    assert ds[2].features == ("RGB", (6, 5)) and ds[2].img_index == 0 and ds.num_images == 2
    ds.check_features()


def test_csv_with_other_keys_and_an_image_root(tmp_path):
    write_images(tmp_path / "root", ["x.jpg"])
    path = tmp_path / "pairs.csv"
    path.write_text("url,caption\nx.jpg,hello\n", encoding="utf-8")
    rows = read_csv_pairs(path, img_key="url", caption_key="caption", separator=",")
    assert [(r.image, r.caption, r.line) for r in rows] == [("x.jpg", "hello", 2)]
    ds = CsvPairsDataset(
        path, img_key="url", caption_key="caption", separator=",", image_root=tmp_path / "root"
    )
    assert ds.image_path(0) == tmp_path / "root" / "x.jpg"
    assert np.asarray(ds.image(0)).shape == (5, 6, 3)  # read as RGB pixels


@pytest.mark.parametrize(
    "text, match",
    [
        ("filepath\tcaption\na.jpg\tx\n", r"line 1: header has no column 'title'"),
        ("title\tfilepath\n\ta.jpg\n", r"line 2: empty 'title'"),
        ("title\tfilepath\nx\n", r"line 2: 1 fields; expected 2"),
        ("title\tfilepath\n", "has a header but no pairs"),
    ],
)
def test_errors_name_the_file_and_line(tmp_path, text, match):
    path = tmp_path / "bad.tsv"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(DataFormatError, match=match):
        read_csv_pairs(path)


def test_a_missing_image_names_its_line(tmp_path):
    path = tmp_path / "t.tsv"
    path.write_text("title\tfilepath\nhi\tgone.jpg\n", encoding="utf-8")
    ds = CsvPairsDataset(path)
    with pytest.raises(DataFormatError, match=r"t.tsv, line 2: image file .*gone.jpg is missing"):
        ds.check_features()
    with pytest.raises(FileNotFoundError, match="line 2"):
        ds[0]


def test_augmentation_keys_are_seed_epoch_and_caption_index(tmp_path):
    write_images(tmp_path, ["a.jpg", "b.jpg"])
    path = tmp_path / "t.tsv"
    path.write_text("title\tfilepath\none\ta.jpg\ntwo\tb.jpg\n", encoding="utf-8")
    ds = CsvPairsDataset(path, image_transform=lambda p: "eval")
    keys = []
    ds.set_augment(
        lambda im, key: keys.append((im.getpixel((0, 0)), key)) or torch.zeros(1), seed=4
    )
    ds.set_epoch(2)
    ds[1]
    assert keys == [((40, 40, 40), (4, 2, 1))]  # b.jpg: grey 40
    assert ds.images()[1][0] == "eval"  # evaluation never augments


def config(**data):
    return {
        "output_dir": "run",
        "data": {"root": "r", "format": "csv", "vocab": "v.json", **data},
        "loss": {"name": "infonce"},
        "train": {"epochs": 1, "batch_size": 4},
    }


def test_config_keys_build_and_errors(tmp_path):
    write_images(tmp_path, ["a.jpg"])
    (tmp_path / "t.tsv").write_text("title\tfilepath\n" + "a\ta.jpg\n" * 3, encoding="utf-8")
    tsv = str(tmp_path / "t.tsv")  # relative to the current folder, not data.root
    cfg = config_from_dict(config(root=str(tmp_path), csv=tsv, dev_csv=tsv))
    d = cfg.data
    assert (d.csv_img_key, d.csv_caption_key, d.csv_separator) == ("filepath", "title", "\t")
    dev = build_csv_dataset(d, "dev", None)
    assert dev.num_captions == 3 and dev.num_images == 1
    with pytest.raises(ConfigError, match=r"data\.csv"):
        config_from_dict(config())
    with pytest.raises(ConfigError, match=r"data\.csv_separator"):
        config_from_dict(config(csv="t.tsv", csv_separator="ab"))
