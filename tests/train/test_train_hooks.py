"""Trainer hooks (vlret.train.hooks.core): the order of the calls, learning-rate multipliers through
the schedule and across a resume, modules frozen for the first epochs, AdaCL's margin sync as a
hook, and the StepInputs path that lets VSL's text side (Eq. 7) train."""

from __future__ import annotations

import json
import math
import signal
from pathlib import Path

import pytest
import torch

from train_helpers import assert_same_params, model_params, tiny_config, tiny_data
from vlret.losses import build_loss
from vlret.run import ConfigError
from vlret.train import Trainer, TrainHook, TrainingInterrupted
from vlret.train.hooks.core import FreezeModules, LrMultipliers, StepOutput, SyncLossBuffers
from vlret.train.optim_groups import ParamGroup

# Tiny data: 40 train captions, batch 8 -> 5 steps per epoch; warm-up 3 steps, decay at epoch 2.
STEPS_PER_EPOCH = 5


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return tiny_data(tmp_path_factory.mktemp("data"))


class Recorder(TrainHook):
    """Every call, with the trainer's epoch and step at that moment."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int]] = []

    def _note(self, name: str, trainer) -> None:
        self.calls.append((name, trainer.epoch, trainer.step))

    def param_groups(self, ctx, groups):
        self._note("param_groups", ctx)
        return groups

    def on_fit_start(self, ctx):
        self._note("on_fit_start", ctx)

    def before_epoch(self, ctx):
        self._note("before_epoch", ctx)

    def before_step(self, ctx, batch):
        self._note("before_step", ctx)

    def before_optimizer_step(self, ctx):
        # the gradients exist here and the parameters have not moved yet
        assert any(p.grad is not None for p in ctx.model.parameters())
        self._note("before_optimizer_step", ctx)

    def after_step(self, ctx, step):
        assert isinstance(step, StepOutput) and math.isfinite(step.loss)
        self._note("after_step", ctx)

    def after_epoch(self, ctx, record):
        assert record["epoch"] == ctx.epoch - 1  # ctx.epoch counts the epochs done
        assert (ctx.output_dir / "last.pt").is_file()
        self._note("after_epoch", ctx)

    def on_fit_end(self, ctx, result):
        assert result.epochs_done == ctx.epoch
        self._note("on_fit_end", ctx)


def test_hooks_are_called_in_the_documented_order(tmp_path, data):
    cfg = tiny_config(data, tmp_path / "run", ["train.epochs=2", "train.max_steps_per_epoch=2"])
    first, second = Recorder(), Recorder()
    trainer = Trainer(cfg, hooks=[first, second])
    trainer.fit()
    expected = [("param_groups", 0, 0), ("on_fit_start", 0, 0)]
    step = 0
    for epoch in range(2):
        expected.append(("before_epoch", epoch, step))
        for _ in range(2):
            expected += [("before_step", epoch, step), ("before_optimizer_step", epoch, step)]
            step += 1
            expected.append(("after_step", epoch, step))
        expected.append(("after_epoch", epoch + 1, step))
    expected.append(("on_fit_end", 2, step))
    assert first.calls == expected
    assert second.calls == expected
    assert list(trainer.hooks) == [first, second]  # no config hook for this config


def test_config_hooks_come_first_in_their_fixed_order(tmp_path, data):
    overrides = [
        "train.all_negatives_epochs=1",
        'train.freeze=["image_encoder"]',
        "train.freeze_epochs=1",
        "optim.lr_multipliers.text_encoder=0.5",
    ]
    mine = Recorder()
    trainer = Trainer(tiny_config(data, tmp_path / "run", overrides), hooks=[mine])
    kinds = [type(h).__name__ for h in trainer.hooks]
    assert kinds == ["AllNegativesWarmup", "FreezeModules", "LrMultipliers", "Recorder"]


def test_hooks_must_be_train_hooks(tmp_path, data):
    with pytest.raises(TypeError, match="TrainHook"):
        Trainer(tiny_config(data, tmp_path / "run"), hooks=[lambda trainer: None])


# -- learning-rate multipliers -----------------------------------------------------------------


def _factor(epoch: int, step: int) -> float:
    """tiny_config's schedule, written out: x0.1 from epoch 2, linear warm-up over 3 steps."""
    return 0.1 ** (1 if epoch >= 2 else 0) * min(1.0, (step + 1) / 3)


class LrLog(TrainHook):
    def __init__(self) -> None:
        self.seen: list[tuple[int, int, list[float]]] = []

    def before_optimizer_step(self, ctx):
        lrs = [g["lr"] for g in ctx.optimizer.param_groups]
        self.seen.append((ctx.epoch, ctx.step, lrs))


def test_lr_multipliers_make_groups_kept_through_warmup_and_decay(tmp_path, data):
    overrides = ["optim.lr_multipliers.text_encoder=0.1", "train.max_steps_per_epoch=2"]
    log = LrLog()
    trainer = Trainer(tiny_config(data, tmp_path / "run", overrides), hooks=[log])
    groups = trainer.optimizer.param_groups
    names = {id(p): n for n, p in trainer.model.named_parameters()}
    assert [sorted(names[id(p)].split(".")[0] for p in g["params"])[0] for g in groups] == [
        "image_encoder",
        "text_encoder",
    ]
    assert sum(len(g["params"]) for g in groups) == len(list(trainer.model.parameters()))
    init = model_params(trainer.model)
    trainer.train_step(next(iter(_loader(trainer))))
    # Adam's first step moves every entry by at most its lr (|m / sqrt(v)| <= 1)
    moved = {k: (v - init[k]).abs().max().item() for k, v in model_params(trainer.model).items()}
    lr0 = 1e-3 * _factor(0, 0)
    assert max(v for k, v in moved.items() if k.startswith("text_encoder")) <= 0.1 * lr0 * 1.001
    assert max(v for k, v in moved.items() if k.startswith("image_encoder")) > 0.5 * lr0
    trainer.fit()  # resumes inside epoch 0 from the state of that step
    assert len(log.seen) == 1 + 3 * 2
    for epoch, step, (lr_rest, lr_text) in log.seen:
        assert lr_rest == 1e-3 * _factor(epoch, step)
        assert lr_text == (1e-3 * 0.1) * _factor(epoch, step)


def _loader(trainer):
    trainer.sampler.set_epoch(0)
    return torch.utils.data.DataLoader(
        trainer.train_set, batch_sampler=trainer.sampler, collate_fn=trainer.train_set.collate
    )


def test_longest_prefix_wins_and_loss_parameters_have_a_name(tmp_path, data):
    cfg = tiny_config(
        data,
        tmp_path / "run",
        [
            "loss.name=infonce",
            "loss.learnable_temperature=true",
            'optim.lr_multipliers={text_encoder = 0.5, "text_encoder.gru" = 0.1, loss = 2}',
        ],
    )
    trainer = Trainer(cfg)
    names = {id(p): n for n, p in trainer.model.named_parameters()}
    names.update({id(p): f"loss.{n}" for n, p in trainer.loss_fn.named_parameters()})
    got = [
        (g["lr"], sorted(names[id(p)] for p in g["params"])) for g in trainer.optimizer.param_groups
    ]
    assert got == [
        (1e-3, ["image_encoder.fc.bias", "image_encoder.fc.weight"]),
        (1e-3 * 0.5, ["text_encoder.embed.weight"]),
        (1e-3 * 0.1, sorted(n for n in names.values() if n.startswith("text_encoder.gru"))),
        (1e-3 * 2.0, ["loss.log_scale"]),
    ]


def test_lr_multiplier_groups_compose_with_an_earlier_hook():
    a, b = torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))
    groups = [ParamGroup(("enc.a",), (a,), 1.0), ParamGroup(("enc.b",), (b,), 0.5)]
    out = LrMultipliers({"enc": 0.1}).param_groups(None, groups)  # type: ignore[arg-type]
    assert [(g.names, g.lr_scale) for g in out] == [(("enc.a",), 0.1), (("enc.b",), 0.05)]


def test_lr_multiplier_config_errors_name_the_key(tmp_path, data):
    with pytest.raises(ConfigError, match=r"optim\.lr_multipliers\.text_encoder\.bert: matches no"):
        Trainer(tiny_config(data, tmp_path / "a", ["optim.lr_multipliers.text_encoder.bert=0.1"]))
    with pytest.raises(ConfigError, match=r"optim\.lr_multipliers\.text_encoder: expected a pos"):
        tiny_config(data, tmp_path / "b", ["optim.lr_multipliers.text_encoder=0"])
    with pytest.raises(ConfigError, match=r"optim\.lr_multipliers\.text_encoder: expected a pos"):
        tiny_config(data, tmp_path / "c", ["optim.lr_multipliers.text_encoder=true"])
    with pytest.raises(ConfigError, match=r"optim\.lr_multipliers: expected a table"):
        tiny_config(data, tmp_path / "d", ["optim.lr_multipliers=0.1"])
    # a TOML table with a quoted dotted key and nested tables read the same
    flat = tiny_config(data, tmp_path / "e", ['optim.lr_multipliers={"text_encoder.gru" = 0.1}'])
    nested = tiny_config(data, tmp_path / "e", ["optim.lr_multipliers.text_encoder.gru=0.1"])
    assert flat.optim.lr_multipliers == nested.optim.lr_multipliers == {"text_encoder.gru": 0.1}


# -- frozen modules ----------------------------------------------------------------------------


class Snapshots(TrainHook):
    """The model's parameters after each epoch, and an optional Ctrl-C after step ``stop_at``."""

    def __init__(self, stop_at: int | None = None) -> None:
        self.after: dict[int, dict[str, torch.Tensor]] = {}
        self.stop_at = stop_at

    def after_step(self, ctx, step):
        if ctx.step == self.stop_at:
            signal.raise_signal(signal.SIGINT)  # the ctx saves last.pt and stops

    def after_epoch(self, ctx, record):
        self.after[ctx.epoch] = model_params(ctx.model)


FREEZE = ['train.freeze=["text_encoder.gru", "image_encoder"]', "train.freeze_epochs=2"]


def test_frozen_modules_are_unchanged_then_trained(tmp_path, data):
    snaps = Snapshots()
    trainer = Trainer(tiny_config(data, tmp_path / "run", FREEZE), hooks=[snaps])
    init = model_params(trainer.model)
    trainer.fit()
    frozen = [k for k in init if k.startswith(("text_encoder.gru", "image_encoder"))]
    assert len(frozen) == 10
    for epoch in (1, 2):
        for k in init:
            same = torch.equal(snaps.after[epoch][k], init[k])
            assert same == (k in frozen), (epoch, k)
    for k in frozen:  # trained in the third epoch
        assert not torch.equal(snaps.after[3][k], init[k]), k
    assert all(p.requires_grad for p in trainer.model.parameters())


def test_a_frozen_encoder_with_gradient_caching(tmp_path, data):
    """An encoder frozen whole has outputs without a graph: gradient caching sends them nothing."""
    overrides = [
        'train.freeze=["image_encoder"]',
        "train.freeze_epochs=1",
        "train.grad_cache_chunk=3",
        "train.epochs=2",
        "train.max_steps_per_epoch=2",
    ]
    snaps = Snapshots()
    trainer = Trainer(tiny_config(data, tmp_path / "run", overrides), hooks=[snaps])
    init = model_params(trainer.model)
    trainer.fit()
    for k in init:
        frozen_then = torch.equal(snaps.after[1][k], init[k])
        assert frozen_then == k.startswith("image_encoder"), k
        assert not torch.equal(snaps.after[2][k], init[k]), k


def test_an_old_checkpoint_without_the_new_keys_resumes(tmp_path, data):
    """A checkpoint written before lr_multipliers / freeze existed: read with their defaults."""
    Trainer(tiny_config(data, tmp_path / "run", ["train.epochs=1"])).fit()
    path = tmp_path / "run" / "last.pt"
    state = torch.load(path, weights_only=False)
    del state["config"]["optim"]["lr_multipliers"]
    del state["config"]["train"]["freeze"], state["config"]["train"]["freeze_epochs"]
    torch.save(state, path)
    resumed = Trainer(tiny_config(data, tmp_path / "run", ["train.epochs=2"]), resume=path)
    assert resumed.fit().epochs_done == 2


@pytest.mark.parametrize(
    "overrides",
    [FREEZE, ["optim.lr_multipliers.text_encoder=0.1", "optim.lr_multipliers.image_encoder=3"]],
    ids=["freeze", "lr_multipliers"],
)
def test_resume_inside_the_phase_continues_identically(tmp_path, data, overrides):
    full = Trainer(tiny_config(data, tmp_path / "full", overrides))
    full.fit()
    cfg = tiny_config(data, tmp_path / "cut", overrides)
    with pytest.raises(TrainingInterrupted) as err:
        Trainer(cfg, hooks=[Snapshots(stop_at=7)]).fit()  # epoch 1 of the 2 frozen epochs
    resumed = Trainer(cfg, resume=err.value.checkpoint)
    assert resumed.epoch == 1 and resumed.batch_in_epoch == 2
    resumed.fit()
    assert_same_params(model_params(resumed.model), model_params(full.model))
    got = [g["lr"] for g in resumed.optimizer.param_groups]
    assert got == [g["lr"] for g in full.optimizer.param_groups]
    assert resumed.scheduler.base_lrs == full.scheduler.base_lrs


def test_resume_refuses_a_changed_freeze(tmp_path, data):
    Trainer(tiny_config(data, tmp_path / "run", [*FREEZE, "train.epochs=1"])).fit()
    cfg = tiny_config(
        data, tmp_path / "run", ["train.epochs=2", *FREEZE[:1], "train.freeze_epochs=1"]
    )
    with pytest.raises(ValueError, match="train.freeze_epochs: 2 -> 1"):
        Trainer(cfg, resume=tmp_path / "run" / "last.pt")


def test_freeze_config_errors_name_the_key(tmp_path, data):
    with pytest.raises(ConfigError, match=r"train\.freeze\[1\]: 'text_encoder\.lstm' is not a mod"):
        Trainer(
            tiny_config(
                data,
                tmp_path / "a",
                ['train.freeze=["image_encoder", "text_encoder.lstm"]', "train.freeze_epochs=1"],
            )
        )
    with pytest.raises(ConfigError, match=r"train\.freeze_epochs: train\.freeze lists"):
        tiny_config(data, tmp_path / "b", ['train.freeze=["image_encoder"]'])
    with pytest.raises(ConfigError, match=r"train\.freeze: freeze_epochs = 1 but no module"):
        tiny_config(data, tmp_path / "c", ["train.freeze_epochs=1"])
    with pytest.raises(ConfigError, match=r"train\.freeze\[1\]: 'a' is listed twice"):
        tiny_config(data, tmp_path / "d", ['train.freeze=["a", "a"]', "train.freeze_epochs=1"])


def test_freeze_drops_gradients_when_parameters_stay_differentiable():
    """Under torchrun requires_grad stays on (DDP fixed its parameters): the gradient is dropped
    before the optimiser step, so the step leaves the parameter alone."""
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    hook = FreezeModules(model, ["0"], epochs=1)

    class Fake:
        epoch, world_size = 0, 2  # what a TrainContext has

    hook.before_epoch(Fake())  # type: ignore[arg-type]
    model(torch.ones(1, 2)).sum().backward()
    hook.before_optimizer_step(Fake())  # type: ignore[arg-type]
    assert all(p.grad is None for p in model[0].parameters())
    assert all(p.grad is not None and p.requires_grad for p in model[1].parameters())


# -- AdaCL's margin sync -------------------------------------------------------------------------


def test_adacl_declares_its_margins_for_the_sync_hook(tmp_path, data):
    loss = build_loss("adacl")
    assert loss.synced_buffers() == (loss.m1, loss.m2)
    assert all(a is b for a, b in zip(loss.synced_buffers(), (loss.m1, loss.m2), strict=True))
    assert build_loss("adacl", sync_margins=False).synced_buffers() == ()
    # One process: nothing to sync, so no hook; SyncLossBuffers itself is then a no-op.
    trainer = Trainer(tiny_config(data, tmp_path / "run", ["loss.name=adacl"]))
    assert not any(isinstance(h, SyncLossBuffers) for h in trainer.hooks)
    hook = SyncLossBuffers(loss.synced_buffers())
    before = (loss.m1.clone(), loss.m2.clone())
    hook.after_step(trainer, StepOutput(loss=0.0, lr=0.0))
    assert torch.equal(loss.m1, before[0]) and torch.equal(loss.m2, before[1])


# -- the worked example of docs/training.md --------------------------------------------------


def test_the_docs_worked_example_stops_a_stalled_run(tmp_path, data):
    text = (Path(__file__).parents[2] / "docs" / "training.md").read_text(encoding="utf-8")
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict = {}
    exec(code.split("\noverrides = ", 1)[0], namespace)  # the hook class, not the demo run
    hook = namespace["StopWhenStalled"](patience=1)
    cfg = tiny_config(data, tmp_path / "run", ["train.epochs=8"])
    result = Trainer(cfg, hooks=[hook]).fit()  # ctx.control.should_stop: fit returns
    assert result.stopped and result.epochs_done < 8
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    epochs = [r for r in map(json.loads, lines) if r["kind"] == "epoch"]
    stalled = [r["epoch"] - r["best_epoch"] >= 1 for r in epochs]
    assert stalled[-1] and not any(stalled[:-1])  # stopped at the first stalled epoch
    assert len(epochs) < 8
    # The page's claims: both checkpoints of the last epoch are written before the hook runs,
    # best.pt holds the best epoch, and the run folder's lock is let go.
    last = torch.load(tmp_path / "run" / "last.pt", weights_only=False)
    best = torch.load(tmp_path / "run" / "best.pt", weights_only=False)
    assert last["epoch"] == len(epochs) and best["best_epoch"] == epochs[-1]["best_epoch"]
    Trainer(cfg, hooks=[], resume=tmp_path / "run" / "last.pt").release_lock()  # not locked
