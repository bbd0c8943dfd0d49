"""Checkpoints: atomic writes, weights_only loading, RNG states, the trainer's saved state."""

from __future__ import annotations

import copy
import math
import random

import numpy as np
import pytest
import torch

from train_helpers import tiny_config, tiny_data
from vlret.run.checkpoint import (
    capture_rng_state,
    load_checkpoint,
    restore_rng_state,
    save_checkpoint,
)
from vlret.run.folder import RunFolderError, check_resume_config
from vlret.train import Trainer
from vlret.train.trainer import StepDecayWarmup


def draws() -> tuple:
    return (random.random(), random.gauss(0, 1), float(np.random.rand()), torch.rand(3).tolist())


def test_rng_states_round_trip_through_a_weights_only_file(tmp_path):
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    random.gauss(0, 1)  # leaves a cached gaussian in the Python state
    np.random.standard_normal()
    path = save_checkpoint({"model": {}, "rng": capture_rng_state()}, tmp_path / "c.pt")
    expected = draws()
    draws()
    restore_rng_state(load_checkpoint(path)["rng"])
    assert draws() == expected


def test_atomic_write_keeps_the_old_file_when_saving_fails(tmp_path, monkeypatch):
    path = save_checkpoint({"model": {"w": torch.ones(2)}}, tmp_path / "last.pt")

    def broken_save(obj, fh):
        fh.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint({"model": {"w": torch.zeros(2)}}, path)
    assert torch.equal(load_checkpoint(path)["model"]["w"], torch.ones(2))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]  # no temporary left


def test_load_errors_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.pt"):
        load_checkpoint(tmp_path / "nope.pt")
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="bad.pt"):
        load_checkpoint(bad)


def test_schedule_decay_and_warmup():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = StepDecayWarmup(opt, decay_epochs=[2, 4], decay_factor=0.1, warmup_steps=4)
    assert sched.apply(epoch=0, step=0) == pytest.approx(0.25)
    assert sched.apply(epoch=0, step=3) == pytest.approx(1.0)
    assert sched.apply(epoch=2, step=10) == pytest.approx(0.1)
    assert sched.apply(epoch=5, step=10) == pytest.approx(0.01)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.01)


def test_schedule_decay_every_k_epochs():
    """``decay_every = k``: ``factor ** (epoch // k)``; k = 1 is every epoch listed from 1 on
    (how the CE / MMT configs were first written); its state survives a round trip, and a
    state without it (older checkpoints) loads as off."""
    params = [torch.nn.Parameter(torch.zeros(1))]
    every = StepDecayWarmup(
        torch.optim.SGD(params, lr=1.0), decay_epochs=[], decay_every=1, decay_factor=0.95
    )
    listed = StepDecayWarmup(
        torch.optim.SGD(params, lr=1.0), decay_epochs=list(range(1, 100)), decay_factor=0.95
    )
    for epoch in range(100):
        assert every.factor(epoch=epoch, step=0) == listed.factor(epoch=epoch, step=0)
    third = StepDecayWarmup(
        torch.optim.SGD(params, lr=2.0),
        decay_epochs=[],
        decay_every=3,
        decay_factor=0.5,
        warmup_steps=2,
    )
    assert [third.apply(epoch=e, step=5) for e in range(7)] == [2, 2, 2, 1, 1, 1, 0.5]
    assert third.apply(epoch=4, step=0) == 0.5  # the warm-up multiplies in
    state = third.state_dict()
    back = StepDecayWarmup(torch.optim.SGD(params, lr=9.0), decay_epochs=[7])
    back.load_state_dict(state)
    assert back.factor(epoch=6, step=9) == third.factor(epoch=6, step=9) == 0.25
    old = {k: v for k, v in state.items() if k != "decay_every"}
    back.load_state_dict(old)
    assert back.decay_every == 0 and back.factor(epoch=6, step=9) == 1.0
    with pytest.raises(ValueError, match="not both"):
        StepDecayWarmup(torch.optim.SGD(params, lr=1.0), decay_epochs=[2], decay_every=1)
    with pytest.raises(ValueError, match="decay_every must be >= 0"):
        StepDecayWarmup(torch.optim.SGD(params, lr=1.0), decay_epochs=[], decay_every=-1)


def test_resume_reads_a_key_added_since_the_checkpoint_at_its_default(tmp_path):
    """A checkpoint written before ``optim.decay_every`` existed resumes (the key is read at
    its default, 0); a real change of the schedule is still refused, naming the keys, and a
    stored config this vlret cannot read is compared as stored."""
    current = tiny_config(tmp_path / "data", tmp_path / "run").to_dict()
    older = copy.deepcopy(current)
    del older["optim"]["decay_every"]
    check_resume_config(older, current, "old.pt")
    every = copy.deepcopy(current)
    every["optim"].update(decay_epochs=[], decay_every=1)
    with pytest.raises(
        RunFolderError,
        match=r"old\.pt: .*optim\.decay_epochs: \[2\] -> \[\]; "
        r"optim\.decay_every: 0 -> 1",
    ):
        check_resume_config(older, every, "old.pt")
    unreadable = copy.deepcopy(older)
    unreadable["optim"]["removed_key"] = 3
    with pytest.raises(
        RunFolderError,
        match=r"optim\.decay_every: '<unset>' -> 0; "
        r"optim\.removed_key: 3 -> '<unset>'",
    ):
        check_resume_config(unreadable, current, "old.pt")


def test_trainer_checkpoint_holds_every_piece_of_state(tmp_path):
    data = tiny_data(tmp_path / "data")
    cfg = tiny_config(
        data,
        tmp_path / "run",
        ["loss.name=adacl", "loss.queue_size=16", "train.momentum_encoder=0.9", "train.epochs=1"],
    )
    trainer = Trainer(cfg)
    trainer.fit()
    state = load_checkpoint(tmp_path / "run" / "last.pt")  # weights_only=True
    for key in ("model", "optimizer", "scheduler", "scaler", "loss", "momentum_encoder", "rng"):
        assert state[key] is not None, key
    assert (state["epoch"], state["batch_in_epoch"], state["step"]) == (1, 0, 5)
    loss_state = state["loss"]
    assert {"m1", "m2", "img_queue.keys", "txt_queue.ids", "_extra_state"} <= set(loss_state)
    assert loss_state["_extra_state"]["steps"] == 5
    assert int(loss_state["img_queue.valid"].sum()) == 16
    assert set(state["rng"]) == {"python", "numpy", "torch", "cuda"}
    assert state["encoder"]["kind"] == "vocab" and state["config"]["loss"]["name"] == "adacl"
    assert (tmp_path / "run" / "best.pt").is_file()

    # A resumed trainer restores the loss buffers, queue and momentum encoder exactly.
    resumed = Trainer(cfg, resume=tmp_path / "run" / "last.pt")
    assert resumed.loss_fn.steps == 5 and resumed.step == 5 and resumed.epoch == 1
    for k, v in trainer.loss_fn.state_dict().items():
        if isinstance(v, torch.Tensor):
            assert torch.equal(v, resumed.loss_fn.state_dict()[k]), k
    for k, v in trainer.momentum_encoder.state_dict().items():
        assert torch.equal(v, resumed.momentum_encoder.state_dict()[k]), k
    assert math.isfinite(resumed.loss_fn.last_stats["m1"])
