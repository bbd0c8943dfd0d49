"""One rule for relative paths (vlret.data.paths): every path key starts from the current folder,
never from data.root; a config written for the old rule (shards and CSV files under data.root)
is refused with the fix."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

wds = pytest.importorskip("webdataset")
Image = pytest.importorskip("PIL.Image")

from vlret.cli import main  # noqa: E402
from vlret.data.formats.csv import build_csv_dataset  # noqa: E402
from vlret.data.formats.shards import build_shard_dev_set, build_shard_source  # noqa: E402
from vlret.data.paths import relative_path_hint  # noqa: E402
from vlret.run.config import config_from_dict  # noqa: E402

TOWER = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1}
TOWER["num_attention_heads"] = 2


def jpeg(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (10, 12, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "JPEG")
    return buf.getvalue()


def write_world(folder: Path) -> None:
    """``folder/shards/0000{0,1}.tar`` (webdataset's own writer, 4 samples each), a dev shard
    and ``folder/pairs.csv`` naming ``folder/img{i}.jpg``."""
    (folder / "shards").mkdir(parents=True)
    for s, name in enumerate(["00000", "00001", "dev"]):
        with wds.TarWriter(str(folder / "shards" / f"{name}.tar")) as sink:
            for i in range(4):
                sink.write({"__key__": f"{s:04d}{i:05d}", "jpg": jpeg(10 * s + i), "txt": f"c{i}"})
    rows = ["filepath\ttitle"]
    for i in range(4):
        (folder / f"img{i}.jpg").write_bytes(jpeg(i))
        rows.append(f"img{i}.jpg\tcaption {i}")
    (folder / "pairs.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")


def raw_config(data: dict[str, Any]) -> dict[str, Any]:
    return {
        "output_dir": "run",
        "data": {"num_workers": 0, "train_num_samples": 8, "shuffle_buffer": 1, **data},
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
        "train": {"epochs": 1, "batch_size": 4, "seed": 0, "progress": False, "log_every": 0},
    }


@pytest.fixture
def world(tmp_path, monkeypatch):
    """The current folder is tmp_path; the world is its sub-folder ``w``."""
    monkeypatch.chdir(tmp_path)
    write_world(tmp_path / "w")
    return Path("w")


def test_shard_and_csv_keys_start_from_the_current_folder_not_data_root(world):
    # data.root names another folder (where the evaluation data would be): not the shards' base
    data = {"root": "elsewhere", "format": "webdataset"}
    data.update(shards="w/shards/{00000..00001}.tar", dev_shards="w/shards/dev.tar")
    cfg = config_from_dict(raw_config(data)).data
    stream = build_shard_source(cfg, batch_size=4, seed=0)
    assert stream.shards == ["w/shards/00000.tar", "w/shards/00001.tar"]
    dev = build_shard_dev_set(cfg)
    assert (dev.num_images, dev.captions) == (4, ["c0", "c1", "c2", "c3"])
    csv = config_from_dict(raw_config({"root": "elsewhere", "format": "csv", "csv": "w/pairs.csv"}))
    ds = build_csv_dataset(csv.data, "train", None)
    assert ds.captions == [f"caption {i}" for i in range(4)]
    assert ds.image_path(2) == Path("w/img2.jpg")  # the CSV's own layout: its folder


@pytest.mark.parametrize(
    ("key", "value", "fmt", "meant"),
    [
        ("shards", "shards/{00000..00001}.tar", "webdataset", "w/shards/{00000..00001}.tar"),
        ("dev_shards", "shards/dev.tar", "webdataset", "w/shards/dev.tar"),
        ("csv", "pairs.csv", "csv", "w/pairs.csv"),
    ],
)
def test_a_config_of_the_old_rule_is_refused_with_the_fix(world, key, value, fmt, meant):
    data = {"root": "w", "format": fmt, key: value}
    if key == "dev_shards":
        data["shards"] = "w/shards/00000.tar"
    cfg = config_from_dict(raw_config(data)).data
    with pytest.raises(FileNotFoundError) as err:
        if fmt == "csv":
            build_csv_dataset(cfg, "train", None)
        elif key == "shards":
            build_shard_source(cfg, batch_size=4, seed=0)
        else:
            build_shard_dev_set(cfg)
    line = str(err.value)
    assert line.startswith(f"data.{key}: ") and "\n" not in line
    assert f"{value} is relative to the current folder, not to data.root" in line
    assert line.endswith(f"did you mean {meant!r}?")


def test_train_refuses_an_old_rule_config_in_one_line(world, capsys):
    data = {"root": "w", "format": "webdataset", "shards": "shards/{00000..00001}.tar"}
    Path("old.json").write_text(json.dumps(raw_config(data)), encoding="utf-8")
    assert main(["train", "old.json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vlret train: data.shards: ")
    assert "did you mean 'w/shards/{00000..00001}.tar'?" in err[0]
    assert not Path("run/last.pt").exists()


def test_relative_path_hint_only_for_a_missing_relative_path_found_under_data_root(world):
    assert relative_path_hint("pairs.csv", data_root="w").endswith("did you mean 'w/pairs.csv'?")
    assert relative_path_hint("w/pairs.csv", data_root="w") == ""  # exists here
    assert relative_path_hint("nothing.csv", data_root="w") == ""  # nowhere: plain "missing"
    assert relative_path_hint("pairs.csv", data_root=None) == ""
    absolute = Path.cwd() / "gone" / "pairs.csv"
    assert relative_path_hint(absolute, data_root="w") == ""


@pytest.mark.parametrize("key", ["karpathy_json", "vocab", "test_captions", "features_dir"])
def test_every_data_path_key_written_from_data_root_is_refused_with_the_fix(world, key):
    from vlret.data.config import DataConfig

    # any file or folder under data.root will do: the refusal comes before it is read
    from vlret.data.formats import open_dataset
    from vlret.run.builders import build_encoder

    # any file or folder under data.root will do: the refusal comes before it is read
    name = "shards" if key == "features_dir" else "pairs.csv"
    keys = {"karpathy_json": "w/pairs.csv", key: name}
    data = DataConfig(root="w", format="karpathy", **keys)
    for build in (lambda: open_dataset(data, "test"), lambda: build_encoder(data)):
        with pytest.raises(FileNotFoundError) as err:
            build()
        assert str(err.value) == (
            f"data.{key}: {name}: missing; {name} is relative to the current folder, not to "
            f"data.root; did you mean 'w/{name}'?"
        )
