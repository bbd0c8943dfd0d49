"""The synthetic world's pictures (``vlret synth --webdataset / --imagefolder``): shards in the
img2dataset layout read back with the webdataset package, the KEY scheme and the stats files,
byte-identical reruns, the image folders' classes against the world's labels, the same JPEG as
the Karpathy renderer's, the hint lines, and the rules every world write follows."""

from __future__ import annotations

import errno
import io
import json
import shlex
import tarfile
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("PIL")
wds = pytest.importorskip("webdataset")

from PIL import Image  # noqa: E402

from vlret.worlds import (  # noqa: E402
    generate_world,
    render_jpeg,
    train_hint_lines,
    write_synthetic,
)
from vlret.worlds.language import CATEGORIES, COLOURS, FIELD  # noqa: E402

SIZES = {"train": 30, "dev": 6, "test": 8}
K = 5
NAMES = {"category": [c[0] for c in CATEGORIES], "colour": [c[0] for c in COLOURS]}


def _write(root: Path, **options):
    defaults = {"splits": SIZES, "seed": 4, "webdataset": True, "imagefolder": True}
    return write_synthetic("tiny", root, **{**defaults, **options})


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A tiny world with shards of 64 samples (150 train pairs: 64 + 64 + 22) and folders."""
    root = _write(tmp_path_factory.mktemp("pix") / "w", shard_size=64)
    return root, generate_world("tiny", seed=4, splits=SIZES, features=False)


def _imgid(world, split: str, i: int) -> int:
    names = list(world.splits)
    return sum(world[s].num_images for s in names[: names.index(split)]) + i


def _read(pattern: str) -> list[dict]:
    """Every sample of ``pattern`` through webdataset, in shard order."""
    ds = wds.WebDataset(pattern, shardshuffle=False)
    return list(ds)


def test_shards_read_back_with_webdataset_and_match_the_world(written):
    root, world = written
    meta = json.loads((root / "synthetic.json").read_text())
    train = meta["webdataset"]["splits"]["train"]
    assert train["pattern"] == "webdataset/train/{00000..00002}.tar"
    assert (train["shards"], train["samples"], train["per"]) == (3, 30 * K, "pairs")
    samples = _read(str(root / train["pattern"]))
    assert len(samples) == 30 * K
    raws = world["train"].captions("raw")
    seen = []
    for s in samples:
        assert set(s) >= {"__key__", "jpg", "txt", "json"}
        record = json.loads(s["json"])
        i, c = record["image_index"], record["caption_index"]
        seen.append((i, c))
        assert record["key"] == s["__key__"] and record["status"] == "success"
        assert s["txt"].decode() == record["caption"] == raws[i * K + c]
        assert record["imgid"] == _imgid(world, "train", i) and record["split"] == "train"
        scene = world["train"].scenes[i]
        assert s["jpg"] == render_jpeg(scene, seed=4, imgid=record["imgid"])
        with Image.open(io.BytesIO(s["jpg"])) as im:
            assert im.format == "JPEG" and im.size == (record["width"], record["height"])
    # every (image, caption) pair exactly once, in an order shuffled away from world order
    assert sorted(seen) == [(i, c) for i in range(30) for c in range(K)]
    assert seen != sorted(seen)
    # dev and test: one sample per image, world order, first caption, all captions in json
    for split in ("dev", "test"):
        entry = meta["webdataset"]["splits"][split]
        assert (entry["pattern"], entry["per"]) == (f"webdataset/{split}/00000.tar", "images")
        rows = _read(str(root / entry["pattern"]))
        raws = world[split].captions("raw")
        assert [json.loads(r["json"])["image_index"] for r in rows] == list(range(SIZES[split]))
        for i, r in enumerate(rows):
            assert r["txt"].decode() == raws[i * K]
            assert json.loads(r["json"])["captions"] == raws[i * K : (i + 1) * K]


def test_shard_layout_key_scheme_and_stats(written):
    root, _ = written
    folder = root / "webdataset" / "train"
    assert sorted(p.name for p in folder.iterdir()) == [
        "00000.tar",
        "00000_stats.json",
        "00001.tar",
        "00001_stats.json",
        "00002.tar",
        "00002_stats.json",
    ]
    for shard, count in enumerate((64, 64, 22)):
        with tarfile.open(folder / f"{shard:05d}.tar") as tar:
            members = tar.getmembers()
        keys = [f"{shard * 10_000 + j:09d}" for j in range(count)]
        # img2dataset's member order (webdataset's TarWriter: extensions sorted per sample)
        assert [m.name for m in members] == [
            f"{k}.{e}" for k in keys for e in ("jpg", "json", "txt")
        ]
        assert all(m.mtime == 0 and m.uid == 0 and m.gid == 0 for m in members)
        stats = json.loads((folder / f"{shard:05d}_stats.json").read_text())
        assert stats["count"] == stats["successes"] == stats["status_dict"]["success"] == count
        assert stats["failed_to_download"] == stats["failed_to_resize"] == 0
    assert sorted(p.name for p in (root / "webdataset").iterdir()) == ["dev", "test", "train"]


def test_same_seed_gives_byte_identical_pictures(written, tmp_path):
    root, _ = written
    again = _write(tmp_path / "again", shard_size=64)

    def files(r: Path) -> dict[str, bytes]:
        return {
            str(p.relative_to(r)): p.read_bytes()
            for sub in ("webdataset", "imagefolder")
            for p in sorted((r / sub).rglob("*"))
            if p.is_file()
        }

    first = files(root)
    # 5 shards and their stats, and each image once per label kind
    assert len(first) == 2 * 5 + 2 * sum(SIZES.values())
    assert first == files(again)
    other = files(_write(tmp_path / "other", shard_size=64, seed=5))
    tar = "webdataset/train/00000.tar"
    assert other[tar] != first[tar]


def test_image_folders_hold_the_worlds_labels(written):
    root, world = written
    meta = json.loads((root / "synthetic.json").read_text())["imagefolder"]
    assert meta["folder"] == "imagefolder" and list(meta["kinds"]) == ["category", "colour"]
    for kind in ("category", "colour"):
        for split in SIZES:
            base = root / "imagefolder" / kind / split
            labels = [NAMES[kind][scene[0][FIELD[kind]]] for scene in world[split].scenes]
            # one folder per class present, holding exactly that class's images
            assert sorted(p.name for p in base.iterdir()) == sorted(set(labels))
            got = {int(f.stem): cls.name for cls in base.iterdir() for f in cls.iterdir()}
            want = {_imgid(world, split, i): label for i, label in enumerate(labels)}
            assert got == want
            assert meta["kinds"][kind][split] == dict(sorted(Counter(labels).items()))
            f = next(iter(sorted(base.rglob("*.jpg"))))
            i = int(f.stem) - _imgid(world, split, 0)
            assert f.read_bytes() == render_jpeg(world[split].scenes[i], seed=4, imgid=int(f.stem))


def test_pictures_are_the_karpathy_renderers_and_testall_is_test(tmp_path):
    # coco-like: the Karpathy JSON's COCO names, and a testall split written as `test`
    sizes = {"train": 8, "dev": 3, "testall": 4}
    root = write_synthetic(
        "coco-like", tmp_path / "k", format="karpathy", splits=sizes, seed=2,
        webdataset=True, imagefolder=True,
    )  # fmt: skip
    from vlret.data import KarpathyDataset

    world = generate_world("coco-like", seed=2, splits=sizes, features=False)
    test = KarpathyDataset(root / "dataset_coco.json", "testall", image_root=root / "images")
    rows = _read(str(root / "webdataset" / "test" / "00000.tar"))
    assert len(rows) == 4
    for i, row in enumerate(rows):
        karpathy = Path(test.image(i)).read_bytes()
        assert row["jpg"] == karpathy
        imgid = json.loads(row["json"])["imgid"]
        assert imgid == 8 + 3 + i
        label = NAMES["colour"][world["testall"].scenes[i][0][FIELD["colour"]]]
        folder_file = root / "imagefolder" / "colour" / "test" / label / f"{imgid:06d}.jpg"
        assert folder_file.read_bytes() == karpathy
    assert not (root / "webdataset" / "testall").exists()


def test_train_shards_of_one_sample_per_image(tmp_path):
    root = _write(tmp_path / "i", shard_samples="images", imagefolder=False)
    world = generate_world("tiny", seed=4, splits=SIZES, features=False)
    meta = json.loads((root / "synthetic.json").read_text())
    assert not (root / "imagefolder").exists() and "imagefolder" not in meta
    rows = _read(str(root / "webdataset" / "train" / "00000.tar"))
    raws = world["train"].captions("raw")
    order = [json.loads(r["json"])["image_index"] for r in rows]
    assert sorted(order) == list(range(30))
    for r, i in zip(rows, order, strict=True):
        assert r["txt"].decode() == raws[i * K]
    assert meta["webdataset_config_hint"]["data"]["train_num_samples"] == 30
    assert all("clean" not in json.loads(r["json"]) for r in rows)  # no noise, no mask


def test_noisy_train_shards_carry_the_clean_mask(tmp_path):
    noise = "permute_captions:0.3"
    root = _write(tmp_path / "n", noise=noise, imagefolder=False)
    world = generate_world("tiny", seed=4, splits=SIZES, features=False, noise=noise)
    rows = [json.loads(r["json"]) for r in _read(str(root / "webdataset" / "train" / "00000.tar"))]
    clean = {(r["image_index"], r["caption_index"]): r["clean"] for r in rows}
    assert clean == {(j // K, j % K): bool(world["train"].clean[j]) for j in range(30 * K)}
    assert not all(clean.values())
    raws = world["train"].captions("raw")  # the moved captions, as the Karpathy JSON has them
    assert all(r["caption"] == raws[r["image_index"] * K + r["caption_index"]] for r in rows)
    dev = _read(str(root / "webdataset" / "dev" / "00000.tar"))
    assert all("clean" not in json.loads(r["json"]) for r in dev)


def test_hint_lines_train_on_the_shards_and_classify_the_folders(written):
    root, _ = written
    from braceexpand import braceexpand

    from vlret.run.config import apply_overrides

    lines = train_hint_lines(root)
    (shard_line,) = [x for x in lines if x.startswith("train CLIP on the shards: ")]
    argv = shlex.split(shard_line.split(": ", 1)[1])
    assert argv[:3] == ["vlret", "train", "synth_clip_pretrain"]
    sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    data = apply_overrides({"data": {}}, sets)["data"]
    assert data == {
        "root": str(root),  # the folder vlret eval of the run reads
        "format": "webdataset",
        "shards": f"{root}/webdataset/train/{{00000..00002}}.tar",
        "dev_shards": f"{root}/webdataset/dev/00000.tar",
        "train_num_samples": 150,
    }
    assert list(braceexpand(data["shards"])) == [
        str(p) for p in sorted((root / "webdataset" / "train").glob("*.tar"))
    ]
    # a precomp world holds no Karpathy images: the line after says how to get them
    after = lines[lines.index(shard_line) + 1]
    assert "vlret eval" in after and "--format karpathy" in after
    (zs_line,) = [x for x in lines if x.startswith("zero-shot classification: ")]
    argv = shlex.split(zs_line.split(": ", 1)[1])
    assert argv[:7] == [  # the CLIP the shards' line trains (synth_clip_pretrain's output_dir)
        "vlret",
        "zeroshot",
        "--model",
        "runs/synth_clip_pretrain/best.pt",
        "--dataset",
        "imagefolder",
        "--data-root",
    ]
    assert argv[7] == str(root / "imagefolder" / "category" / "test")
    assert any(str(root / "imagefolder" / "colour" / "test") in x for x in lines)
    # the world's own format keeps its line
    assert any(x.startswith("train on it: vlret train synth_f30k_compare") for x in lines)


def test_synth_command_writes_pictures_with_progress(tmp_path, capsys):
    from vlret.cli import main

    out = tmp_path / "c"
    argv = ["synth", "tiny", "--out", str(out), "--webdataset", "--imagefolder"]
    assert main([*argv, "--shard-size", "500", "--seed", "1"]) == 0
    captured = capsys.readouterr()
    assert "train CLIP on the shards: vlret train synth_clip_pretrain" in captured.out
    # a line per shard and per folder on stderr, the printed path and hints on stdout
    assert f"{out}/webdataset/train/00002.tar: 200 samples" in captured.err.splitlines()
    assert f"{out}/imagefolder/colour/test: 40 images in " in captured.err
    assert sorted(p.name for p in (out / "webdataset" / "train").glob("*.tar")) == [
        "00000.tar",
        "00001.tar",
        "00002.tar",
    ]
    # refused in one line, before anything is written
    for bad, what in (
        (["--shard-size", "0"], "shard_size must be in 1..10000"),
        (["--shard-size", "10001"], "10001"),
    ):
        fresh = tmp_path / f"bad{bad[1]}"
        assert main(["synth", "tiny", "--out", str(fresh), "--webdataset", *bad]) == 2
        err = capsys.readouterr().err
        assert err.startswith("vlret synth: ") and err.count("\n") == 1 and what in err
        assert not fresh.exists()
    assert main(["synth", "tiny", "--out", str(tmp_path / "n"), "--shard-size", "5"]) == 2
    err = capsys.readouterr().err
    assert "--shard-size 5" in err and "--webdataset" in err and err.count("\n") == 1
    assert not (tmp_path / "n").exists()


def test_missing_webdataset_writes_nothing(tmp_path, monkeypatch, capsys):
    import sys

    from vlret.cli import main

    monkeypatch.setitem(sys.modules, "webdataset", None)  # import webdataset -> ImportError
    out = tmp_path / "m"
    assert main(["synth", "tiny", "--out", str(out), "--webdataset"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "vlret synth: writing webdataset shards (--webdataset) needs webdataset: "
        "pip install 'vlret[pixels]'\n"
    )
    assert not out.exists()


def test_rewrites_replace_stale_shards_and_a_failed_write_stays_unfinished(tmp_path, monkeypatch):
    import vlret.worlds.pixels as pixels
    from vlret.worlds.io import UNFINISHED_FILE, WorldWriteFailed

    root = _write(tmp_path / "r", shard_size=40, imagefolder=False)  # 150 pairs: 4 shards
    assert len(list((root / "webdataset" / "train").glob("*.tar"))) == 4
    with pytest.raises(FileExistsError, match="already holds a synthetic world"):
        _write(root, shard_size=100)
    _write(root, shard_size=100, overwrite=True)  # 2 shards: the old 00002, 00003 are gone
    assert sorted(p.name for p in (root / "webdataset" / "train").glob("*.tar")) == [
        "00000.tar",
        "00001.tar",
    ]

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(root / "imagefolder"))

    monkeypatch.setattr(pixels, "_write_imagefolders", full_disk)
    with pytest.raises(WorldWriteFailed, match="marked unfinished"):
        _write(root, overwrite=True)
    assert (root / UNFINISHED_FILE).is_file() and not (root / "synthetic.json").exists()
    monkeypatch.undo()
    _write(root)  # a half-written world is replaced without overwrite
    assert not (root / UNFINISHED_FILE).exists()
    assert (root / "imagefolder" / "category" / "test").is_dir()
