"""Issue 39's faults in the pixel readers: webdataset shards (vlret.data.formats.shards) and CSV /
TSV
pairs (vlret.data.formats.csv). Each test failed before its fix; the item numbers are the
issue's.

- 9 (silent): an unclosed quote swallowed the rest of a CSV; rows read are now checked
  against the file and a field holding line breaks needs ``data.csv_multiline``.
- 10 (silent): a dev shard's bad samples were dropped uncounted; now ``dev_skipped`` in the
  epoch record and line, under ``data.max_bad_fraction``.
- 12 (traceback): a CSV row naming a non-image or a corrupt image crashed training; now skipped
  and counted as in shards, and ``data.max_image_pixels`` applies in both readers.
- 13 (unclear): a shard folder was "missing", an early unclosed quote "fewer than one batch",
  bad UTF-8 at "line 0".
- 14 (friction): a comma in ``data.shards``; unbalanced braces without the key.
"""

from __future__ import annotations

import csv
import io
import json
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("webdataset")
pytest.importorskip("transformers")
Image = pytest.importorskip("PIL.Image")

from vlret.cli import main  # noqa: E402
from vlret.data.bad_samples import TooManyBadSamples  # noqa: E402
from vlret.data.checks import DataFormatError  # noqa: E402
from vlret.data.formats.csv import CsvPairsDataset, build_csv_dataset, read_csv_pairs  # noqa: E402
from vlret.data.formats.shards import (  # noqa: E402
    ShardStream,
    build_shard_dev_set,
    expand_shards,
)
from vlret.run.config import apply_overrides, config_from_dict  # noqa: E402
from vlret.train import Trainer  # noqa: E402

TOWER = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1}
TOWER["num_attention_heads"] = 2


def jpeg(seed: int, size: tuple[int, int] = (12, 10)) -> bytes:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "JPEG")
    return buf.getvalue()


def write_shard(path: Path, n: int, bad: set[int] = frozenset(), big: set[int] = frozenset()):
    """A shard of ``n`` samples; ``bad``: indices whose JPEG is corrupt, ``big``: indices whose
    image is 40 x 40 (1600 pixels) instead of 12 x 10 (120)."""
    with tarfile.open(path, "w") as tar:
        for i in range(n):
            key = f"{i:09d}"
            data = (
                b"\xff\xd8 not a jpeg" if i in bad else jpeg(i, (40, 40) if i in big else (12, 10))
            )
            for name, blob in ((f"{key}.jpg", data), (f"{key}.txt", f"photo {i}".encode())):
                info = tarfile.TarInfo(name)
                info.size = len(blob)
                tar.addfile(info, io.BytesIO(blob))


def clip_raw(out: Path, data: dict[str, Any]) -> dict[str, Any]:
    return {
        "output_dir": str(out),
        "data": {"num_workers": 0, **data},
        "model": {
            "kind": "clip",
            "preset": "ViT-B-32",
            "tokenizer": "bytes",
            "config": {
                "projection_dim": 8,
                "vision_config": {**TOWER, "image_size": 16, "patch_size": 8},
                "text_config": {**TOWER, "max_position_embeddings": 40},
            },
        },
        "loss": {"name": "infonce", "temperature": 0.07},
        "optim": {"name": "adamw", "lr": 1e-3},
        "train": {"epochs": 2, "batch_size": 4, "seed": 0, "progress": False, "log_every": 0},
    }


def epochs(out: Path) -> list[dict[str, Any]]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == "epoch"]


def write_csv(path: Path, rows: list[list[str]], **kw: Any) -> None:
    with open(path, "w", encoding="utf-8", newline="") as fh:
        csv.writer(fh, **kw).writerows(rows)


def csv_folder(root: Path, n: int) -> list[list[str]]:
    """``n`` images img{i}.jpg under root and the rows ``[filepath, title]`` naming them."""
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (root / f"img{i}.jpg").write_bytes(jpeg(i))
    return [["filepath", "title"]] + [[f"img{i}.jpg", f"photo {i}"] for i in range(n)]


# -- item 9: an unclosed quote swallows the rest of a CSV -----------------------------------


def test_item9_an_unclosed_quote_in_row_201_of_240_is_refused_naming_its_line(tmp_path):
    lines = ["filepath,title"] + [f"img{i}.jpg,caption {i}" for i in range(240)]
    lines[201] = 'img200.jpg,"caption 200'  # row 201, line 202: the quote is never closed
    path = tmp_path / "train.csv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    for multiline in (False, True):  # refused either way: it runs to the end of the file
        with pytest.raises(DataFormatError) as err:
            read_csv_pairs(path, separator=",", multiline=multiline)
        line = str(err.value)
        assert "train.csv, line 202: a quote opened in field 'title' is never closed" in line
        assert "200 rows read before it (lines 2-201) of the file's 241 lines" in line


def test_item9_a_field_holding_line_breaks_needs_csv_multiline(tmp_path):
    rows = csv_folder(tmp_path, 4)
    rows[2][1] = "a caption\nover two lines, with a comma"
    write_csv(tmp_path / "t.csv", rows)
    with pytest.raises(DataFormatError, match=r"t.csv, line 3: field 'title' runs over lines 3-4"):
        read_csv_pairs(tmp_path / "t.csv", separator=",")
    with pytest.raises(DataFormatError, match=r"data.csv_multiline = true"):
        read_csv_pairs(tmp_path / "t.csv", separator=",")
    csv = str(tmp_path / "t.csv")  # relative to the current folder, not data.root
    raw = clip_raw(tmp_path / "run", {"root": str(tmp_path), "format": "csv", "csv": csv})
    raw["data"].update(csv_separator=",", csv_multiline=True)
    ds = build_csv_dataset(config_from_dict(raw).data, "train", None)
    assert ds.captions[1] == "a caption\nover two lines, with a comma" and len(ds) == 4
    assert ds.source_summary == "4 rows (lines 2-6) of t.csv"  # rows against the file's lines


# -- item 13: unclear errors -----------------------------------------------------------------


def test_item13_an_early_unclosed_quote_is_named_not_fewer_than_one_batch(tmp_path, capsys):
    rows = csv_folder(tmp_path, 12)
    write_csv(tmp_path / "t.csv", rows)
    text = (tmp_path / "t.csv").read_text().replace("img5.jpg,photo 5", 'img5.jpg,"photo 5')
    (tmp_path / "t.csv").write_text(text)
    csv = str(tmp_path / "t.csv")  # relative to the current folder, not data.root
    raw = clip_raw(tmp_path / "run", {"root": str(tmp_path), "format": "csv", "csv": csv})
    raw["data"]["csv_separator"] = ","
    (tmp_path / "run.json").write_text(json.dumps(raw))
    assert main(["train", str(tmp_path / "run.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "t.csv, line 7: a quote opened in field 'title'" in err[0]
    assert "fewer than one batch" not in err[0]


def test_item13_bad_utf8_names_its_real_line(tmp_path):
    path = tmp_path / "t.tsv"
    path.write_bytes(
        b"title\tfilepath\n" + b"fine\ta.jpg\n" * 400 + "café\tb.jpg\n".encode("latin-1")
    )
    with pytest.raises(DataFormatError, match=r"t.tsv, line 402: not UTF-8: byte 0xe9"):
        read_csv_pairs(path)


def test_item13_a_shard_folder_is_named_as_a_folder_not_missing(tmp_path):
    (tmp_path / "shards").mkdir()
    with pytest.raises(FileNotFoundError) as err:
        expand_shards("shards/", root=tmp_path)
    assert "data.shards: " in str(err.value) and "a folder, not a shard" in str(err.value)
    assert "shards/{00000..00009}.tar" in str(err.value) and "missing" not in str(err.value)


# -- item 14: list separators and braces -----------------------------------------------------


def test_item14_a_comma_is_no_separator_and_braces_name_the_key(tmp_path):
    for name in ("a.tar", "b.tar"):
        write_shard(tmp_path / name, 1)
    both = [str(tmp_path / "a.tar"), str(tmp_path / "b.tar")]
    assert expand_shards("a.tar::b.tar", root=tmp_path) == both  # open_clip's joined patterns
    with pytest.raises(FileNotFoundError) as err:
        expand_shards("a.tar,b.tar", root=tmp_path)
    assert "a comma outside braces is no list separator" in str(err.value)
    assert '"::"' in str(err.value) and 'shards = ["a.tar", "b.tar"]' in str(err.value)
    with pytest.raises(ValueError, match=r"^data.dev_shards: '\{a,b.tar': unbalanced braces"):
        expand_shards("{a,b.tar", root=tmp_path, key="data.dev_shards")


# -- item 10: a dev shard's bad samples ------------------------------------------------------


def test_item10_dev_shards_count_their_bad_samples_in_the_record_and_the_line(tmp_path):
    write_shard(tmp_path / "train0.tar", 8)
    write_shard(tmp_path / "train1.tar", 8)
    write_shard(tmp_path / "dev.tar", 8, bad={1, 5})  # 25% bad
    shards = str(tmp_path / "train{0..1}.tar")  # relative to the current folder, not data.root
    data = {"root": str(tmp_path), "format": "webdataset", "shards": shards}
    data.update(dev_shards=str(tmp_path / "dev.tar"), train_num_samples=8, shuffle_buffer=1)
    raw = clip_raw(tmp_path / "run", {**data, "max_bad_fraction": 0.3})
    printed: list[str] = []
    Trainer(config_from_dict(raw), print_fn=printed.append).fit()
    assert [r["dev_skipped"] for r in epochs(tmp_path / "run")] == [2, 2]
    assert sum("2 bad dev samples left out" in line for line in printed) == 2
    assert any("dev 6 images / 6 captions (2 bad samples left out)" in p for p in printed)
    strict = config_from_dict(apply_overrides(raw, ["data.max_bad_fraction=0.2"]))
    with pytest.raises(TooManyBadSamples, match=r"^data.dev_shards: 2 bad samples against 6"):
        build_shard_dev_set(strict.data)


# -- item 12: bad images in a CSV, the pixel cap in both readers -----------------------------


def test_item12_a_csv_skips_and_counts_bad_images_in_training(tmp_path):
    rows = csv_folder(tmp_path, 12)
    (tmp_path / "img3.jpg").write_text("not an image")
    (tmp_path / "img8.jpg").write_bytes(jpeg(8)[:40])  # truncated
    (tmp_path / "img10.jpg").write_bytes(jpeg(10, (40, 40)))  # 1600 pixels, over the cap
    write_csv(tmp_path / "train.csv", rows)
    write_csv(tmp_path / "dev.csv", rows[:5])  # img3 among 4
    data = {"root": str(tmp_path), "format": "csv", "csv": str(tmp_path / "train.csv")}
    data["dev_csv"] = str(tmp_path / "dev.csv")  # relative to the current folder, not data.root
    data.update(csv_separator=",", max_image_pixels=1000, max_bad_fraction=0.3)
    raw = clip_raw(tmp_path / "run", data)
    printed: list[str] = []
    Trainer(config_from_dict(raw), print_fn=printed.append).fit()
    records = epochs(tmp_path / "run")
    assert [r["skipped"] for r in records] == [3, 3]  # every row is drawn once an epoch
    assert [r["dev_skipped"] for r in records] == [1, 1]
    assert sum("3 bad samples skipped, 1 bad dev sample left out" in p for p in printed) == 2
    assert any("train 12 images / 12 captions from 12 rows (lines 2-13)" in p for p in printed)
    raw["data"]["dev_csv"] = None  # 1 of 4 bad: the dev set alone would be refused at 0.1
    strict = apply_overrides(raw, ["data.max_bad_fraction=0.1", f"output_dir={tmp_path / 'b'}"])
    with pytest.raises(TooManyBadSamples, match=r"^data.csv: 3 bad samples against 12 used"):
        Trainer(config_from_dict(strict), print_fn=None).fit()


def test_item12_a_bad_csv_row_is_replaced_by_the_next_readable_one(tmp_path):
    rows = csv_folder(tmp_path, 4)
    (tmp_path / "img1.jpg").write_text("not an image")
    write_csv(tmp_path / "t.csv", rows)
    ds = CsvPairsDataset(tmp_path / "t.csv", separator=",", skip_bad=True)
    batch = ds.collate([ds[i] for i in range(4)])
    assert batch.cap_index.tolist() == [0, 2, 2, 3] and batch.skipped == 1
    with pytest.raises(ValueError, match=r"t.csv line 3: .*img1.jpg"):
        CsvPairsDataset(tmp_path / "t.csv", separator=",")[1]  # outside training: one line


def test_item12_the_pixel_cap_skips_and_counts_in_shards(tmp_path):
    write_shard(tmp_path / "s.tar", 8, big={0, 4})  # 40 x 40: 1600 pixels

    def epoch(**cap: Any) -> tuple[list[str], int]:
        st = ShardStream(
            [str(tmp_path / "s.tar")],
            num_samples=4,
            batch_size=2,
            shuffle_buffer=0,
            max_bad_fraction=0.5,
            **cap,
        )
        batches = list(st.loader(num_workers=0, seed=0))
        return [k for b in batches for k in b.keys], sum(b.skipped for b in batches)

    assert epoch() == (["000000000", "000000001", "000000002", "000000003"], 0)
    keys, skipped = epoch(max_image_pixels=1000)
    assert keys == ["000000001", "000000002", "000000003", "000000005"] and skipped == 2
