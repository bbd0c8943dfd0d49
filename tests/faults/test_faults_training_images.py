"""Issue 39, item 3: bad images in the Karpathy and person-search training splits are skipped
and counted as in shards and CSV (:class:`vlret.data.bad_samples.SkipsBadImages`).

Before: a training image that did not decode, or was over ``data.max_image_pixels``, stopped
the run mid-epoch with the one-line error naming the file, possibly hours in. Now the item is
replaced in its batch by the next one whose image reads (the batch keeps its size), counted
in the batch's ``skipped``, summed into the epoch's ``skipped`` in ``metrics.jsonl`` and on the
epoch line, and more than ``data.max_bad_fraction`` stops the run at the epoch's end in one line
naming ``data.image_root``. Dev, test and evaluation keep the one-line error naming the file.
Images are written by PIL, annotation files by ``json``.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import yaml

pytest.importorskip("transformers")
Image = pytest.importorskip("PIL.Image")

from pedes_helpers import TINY_CLIP, write_pedes  # noqa: E402
from vlret._images import ImageReadError  # noqa: E402
from vlret.cli import main  # noqa: E402
from vlret.data import KarpathyDataset  # noqa: E402
from vlret.data.formats import open_dataset  # noqa: E402
from vlret.data.formats.pedes import PersonSearchDataset  # noqa: E402
from vlret.run.builders import build_train_dataset  # noqa: E402
from vlret.run.config import config_from_dict  # noqa: E402
from vlret.train import Trainer  # noqa: E402

CAP = 1000  # data.max_image_pixels: the good images are 20 x 48 = 960 pixels
N_TRAIN = 8  # one caption each: two batches of 4, every item drawn once an epoch
CORRUPT, BIG = 2, 5  # the bad training images (their index in the split)


def jpeg(seed: int, size: tuple[int, int] = (20, 48)) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG")
    return buffer.getvalue()


def spoil(path: Path, kind: str) -> None:
    """``corrupt``: a truncated JPEG; ``big``: a 40 x 40 one (1600 pixels, over the cap)."""
    path.write_bytes(jpeg(99)[:60] if kind == "corrupt" else jpeg(99, (40, 40)))


def karpathy_world(root: Path) -> Path:
    """A Karpathy JSON with 8 train, 2 val and 2 test images (written with json and PIL)."""
    (root / "images").mkdir(parents=True)
    images = []
    splits = ["train"] * N_TRAIN + ["val"] * 2 + ["test"] * 2
    for i, split in enumerate(splits):
        (root / "images" / f"{i}.jpg").write_bytes(jpeg(i))
        raw = f"a photo of thing {i}"
        images.append(
            {
                "filename": f"{i}.jpg",
                "imgid": i,
                "split": split,
                "sentids": [i],
                "sentences": [{"raw": raw, "tokens": raw.split(), "sentid": i}],
            }
        )
    path = root / "dataset_flickr30k.json"
    path.write_text(json.dumps({"dataset": "flickr30k", "images": images}))
    return root


def karpathy_image(root: Path, index: int) -> Path:
    return root / "images" / f"{index}.jpg"


#: (person, split, captions) per image: 8 train images of 4 persons, one caption each.
PEDES_IMAGES = [(1 + k // 2, "train", 1) for k in range(N_TRAIN)]
PEDES_IMAGES += [(7, "val", 1), (8, "val", 1), (9, "test", 1), (10, "test", 1)]


def pedes_world(root: Path) -> Path:
    write_pedes(root, images=PEDES_IMAGES)
    return root


def pedes_image(root: Path, index: int) -> Path:
    record = json.loads((root / "reid_raw.json").read_text())[index]
    return root / "imgs" / record["file_path"]


WORLDS = {
    "karpathy": (karpathy_world, karpathy_image),
    "cuhk-pedes": (pedes_world, pedes_image),
}


def data_keys(kind: str, root: Path, **keys: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"root": str(root), "format": kind, "num_workers": 0}
    if kind == "karpathy":
        data.update(
            karpathy_json=str(root / "dataset_flickr30k.json"),
            image_root=str(root / "images"),
            captions_per_image=1,
        )
    return {**data, "max_image_pixels": CAP, "max_bad_fraction": 0.3, **keys}


def run_raw(out: Path, data: dict[str, Any]) -> dict[str, Any]:
    return {
        "output_dir": str(out),
        "data": data,
        "model": {"kind": "clip", "preset": "ViT-B-32", "tokenizer": "bytes", "config": TINY_CLIP},
        "loss": {"name": "infonce", "temperature": 0.07},
        "optim": {"name": "adamw", "lr": 1e-3},
        "train": {"epochs": 2, "batch_size": 4, "seed": 0, "progress": False, "log_every": 0},
    }


def epochs(out: Path) -> list[dict[str, Any]]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == "epoch"]


def world_with_bad_training_images(kind: str, root: Path) -> Path:
    make, image = WORLDS[kind]
    make(root)
    spoil(image(root, CORRUPT), "corrupt")
    spoil(image(root, BIG), "big")
    return root


@pytest.mark.parametrize(
    ("kind", "transform"),
    [("karpathy", "none"), ("karpathy", "random_resized_crop"), ("cuhk-pedes", "irra")],
)
def test_training_skips_and_counts_bad_images(tmp_path, monkeypatch, kind, transform):
    """Through the model's transform or the training augmentation (which reads the file
    itself): the run completes, each epoch counts both bad images once, batches keep 4 items
    and never hold a bad image."""
    root = world_with_bad_training_images(kind, tmp_path / "data")
    cls = KarpathyDataset if kind == "karpathy" else PersonSearchDataset
    batches: list[Any] = []
    collate = cls.collate

    def recording(self, items):
        batch = collate(self, items)
        if self.split == "train":
            batches.append(batch)
        return batch

    monkeypatch.setattr(cls, "collate", recording)
    raw = run_raw(tmp_path / "run", data_keys(kind, root, train_transform=transform))
    printed: list[str] = []
    Trainer(config_from_dict(raw), print_fn=printed.append).fit()
    assert [r["skipped"] for r in epochs(tmp_path / "run")] == [2, 2]
    assert sum("2 bad samples skipped" in p for p in printed) == 2, printed
    assert len(batches) == 4 and all(len(b.img_index) == 4 for b in batches)
    assert sum(b.skipped for b in batches) == 4
    seen = {int(i) for b in batches for i in b.img_index}
    assert seen == set(range(N_TRAIN)) - {CORRUPT, BIG}


@pytest.mark.parametrize("kind", list(WORLDS))
def test_too_many_bad_images_stop_the_run_in_one_line_naming_data_image_root(
    tmp_path, capsys, kind
):
    root = world_with_bad_training_images(kind, tmp_path / "data")
    raw = run_raw(tmp_path / "run", data_keys(kind, root, max_bad_fraction=0.1))
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(raw))
    capsys.readouterr()
    assert main(["train", str(tmp_path / "run.yaml")]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert "data.image_root: 2 bad samples against 8 used in epoch 0" in err
    assert "data.max_bad_fraction = 0.1" in err
    assert [r["skipped"] for r in epochs(tmp_path / "run")] == [2]  # logged, then stopped


@pytest.mark.parametrize("kind", list(WORLDS))
def test_dev_and_eval_still_name_the_bad_image_in_one_line(tmp_path, capsys, kind):
    """Training skips its bad images; a bad dev image stops the run naming the file, and a bad
    test image stops ``vlret eval`` the same way."""
    root = world_with_bad_training_images(kind, tmp_path / "data")
    _, image = WORLDS[kind]
    dev_bad, test_bad = image(root, N_TRAIN + 1), image(root, N_TRAIN + 3)
    spoil(dev_bad, "corrupt")
    raw = run_raw(tmp_path / "run", data_keys(kind, root))
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(raw))
    capsys.readouterr()
    assert main(["train", str(tmp_path / "run.yaml")]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{dev_bad}: not a readable image" in err, err
    raw["train"]["validate"] = False  # train without the dev set, evaluate on test
    raw["output_dir"] = str(tmp_path / "run2")
    (tmp_path / "run2.yaml").write_text(yaml.safe_dump(raw))
    assert main(["train", str(tmp_path / "run2.yaml")]) == 0
    spoil(test_bad, "big")
    capsys.readouterr()
    argv = ["eval", str(tmp_path / "run2" / "best.pt"), "--data", str(root), "--split", "test"]
    argv += ["--protocol", kind] if kind != "karpathy" else ["--protocol", "f30k"]
    argv += ["--captions-per-image", "1"] if kind == "karpathy" else []
    assert main([*argv, "--device", "cpu", "--no-progress"]) != 0
    err = capsys.readouterr().err
    lines = [x for x in err.strip().splitlines() if not x.startswith("Loading")]
    assert len(lines) == 1 and str(test_bad) in lines[0], err
    assert "40 x 40 = 1600 pixels, over the cap of 1000" in lines[0]


@pytest.mark.parametrize("kind", list(WORLDS))
def test_only_the_training_split_skips(tmp_path, kind):
    """The training builder turns skipping on; the dev and test builders do not: there a bad
    image is the one-line error naming the file."""
    from vlret.models.clip import CLIPImageTransform

    root = world_with_bad_training_images(kind, tmp_path / "data")
    data = config_from_dict(run_raw(tmp_path / "run", data_keys(kind, root))).data
    transform = CLIPImageTransform(16)
    train = build_train_dataset(data, "train", None, image_transform=transform)
    assert train.counts_skipped and train.bad_key == "data.image_root"
    item = train[CORRUPT]  # the next item whose image reads
    assert (item.img_index, item.cap_index) == (CORRUPT + 1, CORRUPT + 1)
    assert train.collate([train[i] for i in range(4)]).skipped == 1
    plain = open_dataset(data, "train", image_transform=transform)
    assert not plain.counts_skipped
    with pytest.raises(ImageReadError, match=str(WORLDS[kind][1](root, CORRUPT))):
        plain[CORRUPT]
    assert not hasattr(plain.collate([plain[0]]), "skipped")


def test_person_search_features_read_no_image_and_skip_nothing(tmp_path):
    root = pedes_world(tmp_path / "data")
    features = tmp_path / "features"
    features.mkdir()
    np.save(features / "train_ims.npy", np.zeros((N_TRAIN, 4, 16), dtype=np.float32))
    data = config_from_dict(
        run_raw(tmp_path / "run", data_keys("cuhk-pedes", root, features_dir=str(features)))
    ).data
    train = build_train_dataset(data, "train", None)
    assert not train.counts_skipped
    assert not hasattr(train.collate([train[0]]), "skipped")


class FixedDraw:
    """A stand-in for a mined file's sampler: every caption draws images 0 and 1."""

    def __init__(self, captions: int) -> None:
        from vlret.data.offline_negatives import OfflineDraw

        self.mined = SimpleNamespace(num_captions=captions, check_data=lambda base: None)
        self.fixed = OfflineDraw(caption=1, image=0, image_caption=0, caption_image=1)

    def draw(self, index: int, generator: Any) -> Any:
        return self.fixed


def test_aoqs_batches_keep_the_count_of_their_base_set(tmp_path):
    """AOQ's training set (offline negatives around the split) passes the base set's
    ``skipped`` on to its batch, so the epoch counts it."""
    from vlret.data.bad_samples import counts_skipped
    from vlret.data.offline_negatives import OfflineNegativesDataset
    from vlret.models.clip import CLIPImageTransform

    root = world_with_bad_training_images("karpathy", tmp_path / "data")
    data = config_from_dict(run_raw(tmp_path / "run", data_keys("karpathy", root))).data
    train = build_train_dataset(data, "train", None, image_transform=CLIPImageTransform(16))
    aoq = OfflineNegativesDataset(train, FixedDraw(len(train)), seed=0)  # type: ignore[arg-type]
    assert counts_skipped(aoq)
    batch = aoq.collate([aoq[i] for i in range(4)])
    assert batch.skipped == 1 and batch.img_index.tolist() == [0, 1, 3, 3]
    assert len(batch.offline.img_index) == 8
