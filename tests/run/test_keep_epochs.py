"""``train.keep_epochs``: the end-of-epoch checkpoint of chosen epochs kept as ``epoch_<N>.pt``,
equal to ``last.pt`` as it stood at that epoch's end, left alone by a resume; bad lists refused
naming the key."""

from __future__ import annotations

import io
import signal

import pytest
import torch

from train_helpers import assert_same_params, model_params, tiny_config, tiny_data
from vlret.run.checkpoint import load_checkpoint
from vlret.run.config_files import ConfigError
from vlret.train import Trainer, TrainingInterrupted
from vlret.train.hooks.core import TrainHook

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return tiny_data(tmp_path_factory.mktemp("data"))


class LastAtEpochEnd(TrainHook):
    """The bytes of ``last.pt`` right after each epoch's checkpoints are written."""

    def __init__(self) -> None:
        self.seen: dict[int, bytes] = {}

    def after_epoch(self, ctx, record) -> None:
        self.seen[record["epoch"]] = (ctx.output_dir / "last.pt").read_bytes()


def _state(blob: bytes | object) -> dict:
    if isinstance(blob, bytes):
        return torch.load(io.BytesIO(blob), map_location="cpu", weights_only=False)
    return load_checkpoint(blob)


def _same_checkpoint(a: dict, b: dict) -> None:
    assert (a["epoch"], a["step"], a["batch_in_epoch"]) == (
        b["epoch"],
        b["step"],
        b["batch_in_epoch"],
    )
    assert_same_params(a["model"], b["model"])


def test_kept_epoch_is_last_pt_at_that_epoch(tmp_path, data):
    hook = LastAtEpochEnd()
    run = tmp_path / "run"
    Trainer(tiny_config(data, run, ["train.keep_epochs=[1]"]), hooks=[hook]).fit()
    assert sorted(p.name for p in run.glob("epoch_*.pt")) == ["epoch_1.pt"]
    kept = load_checkpoint(run / "epoch_1.pt")
    _same_checkpoint(kept, _state(hook.seen[1]))
    # and not the end of the run: epochs 0, 1, 2 trained; last.pt moved on
    last = load_checkpoint(run / "last.pt")
    assert last["step"] > kept["step"]
    assert not all(torch.equal(kept["model"][k], last["model"][k]) for k in last["model"])
    assert not list(run.glob("*.tmp*"))  # written atomically: nothing half-written left


def test_resume_keeps_them_and_writes_the_rest(tmp_path, data, monkeypatch):
    full = Trainer(tiny_config(data, tmp_path / "full", ["train.keep_epochs=[0, 2]"]))
    full.fit()
    cfg = tiny_config(data, tmp_path / "cut", ["train.keep_epochs=[0, 2]"])
    trainer = Trainer(cfg)
    original = Trainer.train_step

    def step_then_ctrl_c(self, batch):
        out = original(self, batch)
        if self.step == 7:  # in the middle of epoch 1 (5 batches per epoch)
            signal.raise_signal(signal.SIGINT)
        return out

    monkeypatch.setattr(Trainer, "train_step", step_then_ctrl_c)
    with pytest.raises(TrainingInterrupted) as err:
        trainer.fit()
    monkeypatch.setattr(Trainer, "train_step", original)
    first = (tmp_path / "cut" / "epoch_0.pt").read_bytes()
    assert not (tmp_path / "cut" / "epoch_2.pt").exists()
    Trainer(cfg, resume=err.value.checkpoint).fit()
    assert (tmp_path / "cut" / "epoch_0.pt").read_bytes() == first
    for n in (0, 2):
        _same_checkpoint(
            load_checkpoint(tmp_path / "cut" / f"epoch_{n}.pt"),
            load_checkpoint(tmp_path / "full" / f"epoch_{n}.pt"),
        )
    assert_same_params(
        load_checkpoint(tmp_path / "cut" / "epoch_2.pt")["model"], model_params(full.model)
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("[3]", "train.keep_epochs[0]: epoch 3 is not trained"),
        ("[1, 1]", "train.keep_epochs[1]: epoch 1 listed twice"),
        ("[-1]", "train.keep_epochs"),
    ],
)
def test_bad_lists_name_the_key(tmp_path, data, value, message):
    with pytest.raises(ConfigError) as err:
        tiny_config(data, tmp_path / "r", [f"train.keep_epochs={value}"])
    assert message in str(err.value) and "\n" not in str(err.value)


def test_overwrite_removes_the_old_runs_kept_epochs(tmp_path, data):
    run = tmp_path / "run"
    one = ["train.epochs=2", "train.max_steps_per_epoch=1"]
    Trainer(tiny_config(data, run, [*one, "train.keep_epochs=[0, 1]"]), print_fn=None).fit()
    (run / "epoch_notes.pt.txt").write_text("mine")  # not a kept checkpoint: left alone
    assert sorted(p.name for p in run.glob("epoch_*.pt")) == ["epoch_0.pt", "epoch_1.pt"]
    Trainer(tiny_config(data, run, [*one, "train.keep_epochs=[1]"]), overwrite=True).fit()
    assert sorted(p.name for p in run.glob("epoch_*.pt")) == ["epoch_1.pt"]
    assert (run / "epoch_notes.pt.txt").read_text() == "mine"
