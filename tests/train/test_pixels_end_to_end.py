"""From pixels, end to end, on the rendered synthetic world: ``vlret synth --webdataset``, the
shipped ``synth_clip_pretrain`` config trained from scratch on the shards (a bad sample in an
extra shard skipped and counted), zero-shot retrieval of the checkpoint on the world's Karpathy
JSON + images, and zero-shot classification on its image folders."""

from __future__ import annotations

import io
import json
import math
import tarfile

import pytest

pytest.importorskip("PIL")
pytest.importorskip("webdataset")
pytest.importorskip("transformers")

from vlret.cli import main  # noqa: E402


def _add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("pix") / "world"
    argv = ["synth", "tiny", "--out", str(root), "--format", "karpathy", "--webdataset"]
    assert main([*argv, "--imagefolder", "--shard-size", "300"]) == 0
    return root


@pytest.fixture(scope="module")
def trained(world, tmp_path_factory):
    """2 steps of batch 8 on the world's first 8 train samples, re-packed into one shard with a
    ninth sample whose JPEG is garbage (the shipped config, shrunk by overrides)."""
    extra = tmp_path_factory.mktemp("extra") / "mixed.tar"
    with tarfile.open(world / "webdataset/train/00000.tar") as source:
        members = source.getmembers()[:24]  # 8 samples of KEY.jpg, KEY.json, KEY.txt
        good = [(m.name, source.extractfile(m).read()) for m in members]
    assert len({name.split(".")[0] for name, _ in good}) == 8
    with tarfile.open(extra, "w") as tar:
        for name, data in good:
            _add_member(tar, name, data)
        _add_member(tar, "999999999.jpg", b"\xff\xd8 not a jpeg")
        _add_member(tar, "999999999.txt", b"a caption of a broken image")
    out = tmp_path_factory.mktemp("run") / "run"
    overrides = {
        "data.root": str(world),
        "data.shards": str(extra),
        "data.dev_shards": str(world / "webdataset/dev/00000.tar"),
        "data.train_num_samples": "16",
        "data.num_workers": "0",
        "data.max_bad_fraction": "0.5",
        "train.batch_size": "8",
        "train.epochs": "1",
        "optim.warmup_steps": "1",
        "output_dir": str(out),
    }
    argv = ["train", "synth_clip_pretrain"]
    for key, value in overrides.items():
        argv += ["--set", f"{key}={value}"]
    assert main(argv) == 0
    return out


def test_training_on_shards_logs_steps_and_the_skipped_sample(trained):
    records = [json.loads(x) for x in (trained / "metrics.jsonl").read_text().splitlines()]
    epochs = [r for r in records if r["kind"] == "epoch"]
    steps = [r for r in records if r["kind"] == "step"]
    assert len(epochs) == 1 and epochs[0]["step"] == 2  # 16 samples // batch 8
    # 16 good samples are two passes over the shard: the garbage JPEG is met in the first
    # (and in the second if its place in the shuffle buffer comes before the last good one)
    assert epochs[0]["skipped"] in (1, 2)
    assert all(math.isfinite(r["loss"]) for r in steps)
    assert math.isfinite(epochs[0]["dev_rsum"])
    assert (trained / "best.pt").is_file() and (trained / "last.pt").is_file()


def test_the_checkpoint_evaluates_zero_shot_on_karpathy_images(trained, world, capsys, tmp_path):
    out = tmp_path / "m.json"
    argv = ["eval", str(trained / "best.pt"), "--data", str(world), "--split", "test"]
    assert main([*argv, "--protocol", "f30k", "--json", str(out), "--no-progress"]) == 0
    record = json.loads(out.read_text())
    assert (record["n_images"], record["n_texts"]) == (40, 200)
    recalls = [record["metrics"][k] for k in ("i2t_r1", "i2t_r5", "i2t_r10")]
    assert 0.0 <= recalls[0] <= recalls[1] <= recalls[2] <= 100.0


def test_the_checkpoint_classifies_the_image_folders_zero_shot(trained, world, tmp_path):
    out = tmp_path / "zs.json"
    folder = world / "imagefolder/category/test"
    argv = ["zeroshot", "--model", str(trained / "best.pt"), "--dataset", "imagefolder"]
    assert main([*argv, "--data-root", str(folder), "--json", str(out), "--no-progress"]) == 0
    record = json.loads(out.read_text())
    assert record["task"] == "zeroshot_classification"
    # CLIP_benchmark's columns: the set by its folder, the shipped config's architecture (the
    # shape of synth_clip_pretrain's model), the checkpoint as the weights
    assert record["dataset"] == "imagefolder/category"
    assert record["model"] == "ViT-custom-v64x2-t64x2-p8-d64-32"
    assert record["pretrained"] == str(trained / "best.pt")
    classes = sorted(p.name for p in folder.iterdir() if p.is_dir())
    assert record["vlret"]["num_classes"] == len(classes)
    metrics = record["metrics"]
    assert 0.0 <= metrics["acc1"] <= metrics["acc5"] <= 1.0
