"""A captions file written by another tool (CoCa through open_clip, which vlret cannot run here)
in the documented format, by hand with plain Python, is what a training config's
data.train_captions reads: its lines become the training captions, in the split's image order,
with or without the sidecar; a file for another split is refused naming it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from train_helpers import tiny_data, tiny_raw
from vlret.captioning.generate import COCA_NOTE, resolve_arch
from vlret.data import DataFormatError
from vlret.run.config import apply_overrides, config_from_dict
from vlret.train import Trainer

pytestmark = pytest.mark.usefixtures("one_thread")

ONE_STEP = ["train.epochs=1", "train.max_steps_per_epoch=1", "train.batch_size=4"]
N_TRAIN = 8  # tiny_data's training images


def coca_lines(k: int) -> list[str]:
    """Caption j of image i says which, in words no human caption of tiny_data has."""
    words = ["zero", "one", "two", "three", "four", "five", "six", "seven"]
    return [f"a cocaword photo {words[i]} take {j}" for i in range(N_TRAIN) for j in range(k)]


def write_by_hand(path: Path, lines: list[str], *, sidecar: dict | None, newline: str) -> None:
    """As another program would: Python's text mode, its own line ends, json.dump."""
    with open(path, "w", encoding="utf-8", newline=newline) as fh:
        for line in lines:
            fh.write(line + "\n")
    if sidecar is not None:
        with open(path.with_name(path.name + ".json"), "w", encoding="utf-8") as fh:
            json.dump(sidecar, fh)


@pytest.mark.parametrize(
    ("k", "sidecar", "newline"),
    [
        (1, {"vlret_captions": 1, "split": "train", "images": 8, "captions_per_image": 1,
             "source": "coca:coca_ViT-L-14"}, "\n"),
        (2, {"split": "train", "captions_per_image": 2, "source": "coca"}, "\r\n"),
        (2, None, "\n"),  # no sidecar: k = lines / images
    ],
)  # fmt: skip
def test_a_hand_written_file_trains(tmp_path, k, sidecar, newline):
    data = tiny_data(tmp_path / "data")
    caps = tmp_path / "coca_train_caps.txt"
    write_by_hand(caps, coca_lines(k), sidecar=sidecar, newline=newline)
    raw = tiny_raw(data, tmp_path / "run")
    raw["data"]["train_captions"] = str(caps)
    trainer = Trainer(config_from_dict(apply_overrides(raw, ONE_STEP)), print_fn=None)
    train = trainer.train_set
    assert train.num_images == N_TRAIN and train.num_captions == N_TRAIN * k
    assert list(train.captions) == coca_lines(k)  # the lines, exactly, in order
    assert [int(i) for i in train.txt_to_img] == [i for i in range(N_TRAIN) for _ in range(k)]
    vocab = trainer.encoder  # built from the file: its own words, none of the annotations'
    assert {"cocaword", "seven", "take"} <= set(vocab.word2idx)
    trainer.fit()
    assert (tmp_path / "run" / "last.pt").is_file()


def test_a_file_of_another_split_is_refused_naming_it(tmp_path):
    data = tiny_data(tmp_path / "data")
    caps = tmp_path / "coca_test_caps.txt"
    write_by_hand(caps, coca_lines(1), sidecar={"split": "test"}, newline="\n")
    raw = tiny_raw(data, tmp_path / "run")
    raw["data"]["train_captions"] = str(caps)
    with pytest.raises(DataFormatError) as err:
        Trainer(config_from_dict(apply_overrides(raw, ONE_STEP)), print_fn=None)
    message = str(err.value)
    assert "coca_test_caps.txt.json" in message and "'test'" in message and "\n" not in message


def test_coca_is_refused_saying_why(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "coca"}), encoding="utf-8")
    for arch in ("coca", "auto"):
        with pytest.raises(Exception, match="open_clip") as err:
            resolve_arch(tmp_path, arch)
        assert COCA_NOTE in str(err.value) and "\n" not in str(err.value)
