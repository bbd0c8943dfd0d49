"""The contract hooks receive (vlret.train.context): a TrainContext instead of the trainer, and
the TrainControl flags the loop honours: stop after a step (last.pt holds that step and a resume
ends bit for bit where the uninterrupted run ends), stop at an epoch's end, save mid-epoch,
evaluate mid-epoch; each flag reset once honoured."""

from __future__ import annotations

import json

import pytest
import torch

from train_helpers import assert_same_params, model_params, tiny_config, tiny_data
from vlret.train import Trainer, TrainHook
from vlret.train.context import TrainContext, TrainControl

# Tiny data: 40 train captions, batch 8 -> 5 steps per epoch, 3 epochs.
STEPS_PER_EPOCH = 5


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return tiny_data(tmp_path_factory.mktemp("data"))


def _records(folder):
    return [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]


class StopAfter(TrainHook):
    """Asks for a stop after step ``at``; remembers what it saw."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.params: dict[str, torch.Tensor] = {}
        self.ends: list[tuple[bool, int]] = []

    def after_step(self, ctx, step):
        assert isinstance(ctx, TrainContext)
        if ctx.step == self.at:
            ctx.control.should_stop = True
            self.params = model_params(ctx.model)

    def before_step(self, ctx, batch):
        assert ctx.step < self.at  # no step after the one that asked

    def on_fit_end(self, ctx, result):
        self.ends.append((result.stopped, ctx.step))


def test_a_hook_stops_after_step_k_and_resume_ends_where_the_full_run_ends(tmp_path, data):
    full = Trainer(tiny_config(data, tmp_path / "full"))
    full.fit()
    want = model_params(full.model)

    k = STEPS_PER_EPOCH + 2  # inside epoch 1
    config = tiny_config(data, tmp_path / "stopped")
    hook = StopAfter(k)
    trainer = Trainer(config, hooks=[hook])
    result = trainer.fit()  # returns: no exception, the lock let go
    assert result.stopped and result.steps == k and result.epochs_done == 1
    assert hook.ends == [(True, k)]  # on_fit_end ran, after the stop
    assert trainer.context.control.requested() is False  # reset once honoured
    state = torch.load(tmp_path / "stopped" / "last.pt", weights_only=False)
    assert (state["step"], state["epoch"], state["batch_in_epoch"]) == (k, 1, 2)
    assert_same_params(hook.params, {k_: v for k_, v in state["model"].items()})
    # no record of the unfinished epoch; the last step record is at most step k
    records = _records(tmp_path / "stopped")
    assert [r["epoch"] for r in records if r["kind"] == "epoch"] == [0]
    assert max(r["step"] for r in records if r["kind"] == "step") <= k

    resumed = Trainer(config, resume=tmp_path / "stopped" / "last.pt")
    done = resumed.fit()
    assert not done.stopped and done.steps == full.step
    assert_same_params(want, model_params(resumed.model))  # bit for bit


class StopAtEpochEnd(TrainHook):
    def __init__(self, epochs_done: int) -> None:
        self.epochs_done = epochs_done

    def after_epoch(self, ctx, record):
        if ctx.epoch == self.epochs_done:
            ctx.control.should_stop = True
            ctx.control.should_save = True  # reset without a second save: the epoch saved


def test_a_stop_at_an_epoch_end_keeps_that_epochs_checkpoint(tmp_path, data):
    config = tiny_config(data, tmp_path / "run")
    trainer = Trainer(config, hooks=[StopAtEpochEnd(1)])
    result = trainer.fit()
    assert result.stopped and result.epochs_done == 1 and result.steps == STEPS_PER_EPOCH
    state = torch.load(tmp_path / "run" / "last.pt", weights_only=False)
    assert (state["epoch"], state["batch_in_epoch"]) == (1, 0)
    assert not trainer.context.control.requested()
    # asked after the last epoch there is nothing left to stop
    last = Trainer(tiny_config(data, tmp_path / "last"), hooks=[StopAtEpochEnd(3)]).fit()
    assert not last.stopped and last.epochs_done == 3


class SaveAndEvaluate(TrainHook):
    """Asks for validation after step 2 and a checkpoint after step 3, and checks both."""

    def __init__(self) -> None:
        self.evaluated: list[dict] = []
        self.checked = False

    def after_step(self, ctx, step):
        if ctx.step == 2:
            ctx.control.should_evaluate = True
        if ctx.step == 3:
            ctx.control.should_save = True

    def after_evaluate(self, ctx, record):
        self.evaluated.append(dict(record))

    def before_step(self, ctx, batch):
        assert not ctx.control.requested()  # the flags of the last step were reset
        assert ctx.model.training  # back in training mode after the validation
        if ctx.step == 4:  # the checkpoint written after step 3
            state = torch.load(ctx.output_dir / "last.pt", weights_only=False)
            assert (state["step"], state["batch_in_epoch"]) == (3, 3)
            self.checked = True


def test_save_and_evaluate_requests_mid_epoch(tmp_path, data):
    hook = SaveAndEvaluate()
    config = tiny_config(data, tmp_path / "run", ["train.epochs=1"])
    trainer = Trainer(config, hooks=[hook])
    trainer.fit()
    assert hook.checked
    assert len(hook.evaluated) == 1
    record = hook.evaluated[0]
    assert (record["kind"], record["epoch"], record["step"]) == ("dev", 0, 2)
    # the same validation the epoch's end runs: the same keys, rsum among them
    epoch = next(r for r in _records(tmp_path / "run") if r["kind"] == "epoch")
    assert {k for k in record if k.startswith("dev_")} <= set(epoch) | {"dev_loss"}
    assert 0 <= record["dev_rsum"] <= 600
    logged = [r for r in _records(tmp_path / "run") if r["kind"] == "dev"]
    assert logged == [record]
    assert trainer.best_epoch == 0  # the selection is the epoch end's alone


def test_the_context_is_a_current_read_only_view(tmp_path, data):
    trainer = Trainer(tiny_config(data, tmp_path / "run"))
    ctx = trainer.context
    assert ctx.model is trainer.model and ctx.ddp_model is trainer.model  # one process
    assert ctx.optimizer is trainer.optimizer and ctx.loss_fn is trainer.loss_fn
    assert (ctx.world_size, ctx.rank, ctx.is_main) == (1, 0, True)
    assert ctx.steps_per_epoch == STEPS_PER_EPOCH and ctx.grad_cache is None
    trainer.epoch, trainer.step = 2, 11
    assert (ctx.epoch, ctx.step) == (2, 11)  # read when asked
    with pytest.raises(AttributeError):
        ctx.epoch = 3  # type: ignore[misc]
    with ctx.autocast():  # AMP off: float32 matmuls
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32


def test_control_reset_and_requested():
    c = TrainControl()
    assert not c.requested()
    c.should_evaluate = True
    assert c.requested()
    c.should_stop = c.should_save = True
    c.reset()
    assert (c.should_stop, c.should_save, c.should_evaluate) == (False, False, False)
