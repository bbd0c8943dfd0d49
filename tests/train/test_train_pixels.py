"""Training what pixels need (issue 27, item 3): open_clip's cosine schedule in steps, AdamW
without weight decay on norms, biases and the temperature, VSE++'s BatchNorm rule while a
backbone is frozen, LiT-locked towers, bfloat16 autocast on the CPU, clipping after the
scaler's unscale, and the opt-in torch.compile / activation checkpointing."""

from __future__ import annotations

import json
import math
import signal
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from train_helpers import assert_same_params, model_params, tiny_config, tiny_data
from vlret.run import ConfigError
from vlret.run.config import OptimConfig
from vlret.train import Trainer, TrainHook, TrainingInterrupted
from vlret.train.hooks.core import FreezeModules, LockModules, NoWeightDecay
from vlret.train.optim_groups import (
    OPEN_CLIP_NO_DECAY,
    ParamGroup,
    build_optimizer,
    set_group_weight_decay,
)
from vlret.train.schedule import (
    CosineWarmup,
    amp_dtype,
    enable_activation_checkpointing,
    prepare_model,
)

STEPS_PER_EPOCH = 5  # tiny_data: 40 train captions, batch 8


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return tiny_data(tmp_path_factory.mktemp("data"))


# -- the cosine schedule -----------------------------------------------------------------------


def open_clip_lr(base: float, warmup: int, total: int, step: int) -> float:
    """open_clip's cosine_lr written out (float64)."""
    if step < warmup:
        return base * (step + 1) / warmup
    e, es = step - warmup, total - warmup
    return 0.5 * (1 + math.cos(math.pi * e / es)) * base


def _optimizer(*lrs: float) -> torch.optim.Optimizer:
    groups = [{"params": [nn.Parameter(torch.zeros(1))], "lr": lr} for lr in lrs]
    return torch.optim.SGD(groups, lr=lrs[0])


def test_cosine_follows_open_clips_formula_in_every_group():
    opt = _optimizer(0.5, 0.05)
    sched = CosineWarmup(opt, total_steps=lambda: 20, warmup_steps=4)
    for step in (0, 1, 3, 4, 5, 9, 12, 19):
        got = sched.apply(epoch=step // 5, step=step)
        assert got == pytest.approx(open_clip_lr(0.5, 4, 20, step), rel=1e-12, abs=1e-15)
        assert opt.param_groups[1]["lr"] == pytest.approx(
            open_clip_lr(0.05, 4, 20, step), rel=1e-12, abs=1e-16
        )
    assert sched.factor(epoch=0, step=3) == 1.0  # the warm-up ends at the full rate
    assert sched.factor(epoch=0, step=12) == pytest.approx(0.5)  # halfway through the cosine
    assert sched.factor(epoch=9, step=40) == 0.0  # past the end: clamped, never rising again
    without = CosineWarmup(_optimizer(1.0), total_steps=10)
    assert without.factor(epoch=0, step=0) == 1.0


def test_cosine_needs_steps_after_the_warm_up():
    sched = CosineWarmup(_optimizer(1.0), total_steps=5, warmup_steps=5)
    with pytest.raises(ValueError, match=r"warmup_steps = 5 must be below the run's 5 steps"):
        sched.apply(epoch=0, step=0)


def test_cosine_config_refuses_step_decay(tmp_path, data):
    with pytest.raises(ConfigError, match=r"optim\.decay_epochs: the cosine schedule has no"):
        tiny_config(data, tmp_path / "a", ["optim.schedule=cosine"])  # tiny lists [2]
    with pytest.raises(ConfigError, match=r"optim\.schedule: expected one of step, cosine"):
        tiny_config(data, tmp_path / "b", ["optim.schedule=linear"])


class Stop(TrainHook):
    """Ctrl-C after step ``at`` (the trainer writes last.pt and raises)."""

    def __init__(self, at: int) -> None:
        self.at = at

    def after_step(self, trainer, step):
        if trainer.step == self.at:
            signal.raise_signal(signal.SIGINT)


COSINE = ["optim.schedule=cosine", "optim.decay_epochs=[]", "train.epochs=2"]


def test_cosine_in_the_trainer_logs_the_formula_and_resumes_exactly(tmp_path, data):
    full = Trainer(tiny_config(data, tmp_path / "full", [*COSINE, "train.log_every=1"]))
    full.fit()
    total = 2 * STEPS_PER_EPOCH
    with open(tmp_path / "full" / "metrics.jsonl") as f:
        lrs = [r["lr"] for r in map(json.loads, f) if r["kind"] == "step"]
    # tiny_config: lr 1e-3, warm-up 3 steps; step s is logged after it ran at lr(s - 1)
    want = [open_clip_lr(1e-3, 3, total, s) for s in range(total)]
    assert lrs == pytest.approx(want, rel=1e-12)
    cfg = tiny_config(data, tmp_path / "cut", COSINE)
    with pytest.raises(TrainingInterrupted) as err:
        Trainer(cfg, hooks=[Stop(at=7)]).fit()
    resumed = Trainer(cfg, resume=err.value.checkpoint)
    assert resumed.scheduler.state_dict()["total_steps"] == total
    resumed.fit()
    assert_same_params(model_params(resumed.model), model_params(full.model))


# -- no weight decay on norms, biases and the temperature --------------------------------------


class Tower(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 3)
        self.norm = nn.LayerNorm(3)
        self.bn = nn.BatchNorm1d(3)
        self.pos_embed = nn.Parameter(torch.randn(2, 3))
        self.logit_scale = nn.Parameter(torch.tensor(2.0))


def _groups(module: nn.Module, lr_scales: dict[str, float] | None = None) -> list[ParamGroup]:
    named = list(module.named_parameters())
    groups = [ParamGroup(tuple(n for n, _ in named), tuple(p for _, p in named))]
    if lr_scales:
        from vlret.train.hooks.core import LrMultipliers

        groups = LrMultipliers(lr_scales).param_groups(None, groups)  # type: ignore[arg-type]
    return NoWeightDecay(OPEN_CLIP_NO_DECAY).param_groups(None, groups)  # type: ignore[arg-type]


def test_no_decay_groups_hold_exactly_norms_biases_and_the_scale():
    groups = _groups(Tower())
    norms = ("norm.weight", "norm.bias", "bn.weight", "bn.bias")
    assert [(g.names, g.weight_decay) for g in groups] == [
        (("pos_embed", "proj.weight"), None),  # a 2-d positional embedding is decayed
        (("logit_scale", "proj.bias", *norms), 0.0),
    ]
    # composed with learning-rate multipliers: each factor's group split in two
    composed = _groups(Tower(), {"proj": 0.1})
    assert [(g.names, g.lr_scale, g.weight_decay) for g in composed] == [
        (("pos_embed",), 1.0, None),
        (("logit_scale", *norms), 1.0, 0.0),
        (("proj.weight",), 0.1, None),
        (("proj.bias",), 0.1, 0.0),
    ]


def test_adamw_decays_only_the_decayed_group():
    """Zero gradients: AdamW's update is its decoupled decay alone, p * (1 - lr * wd)."""
    torch.manual_seed(0)
    tower = Tower().double()
    groups = _groups(tower)
    optim = OptimConfig(name="adamw", lr=0.1, weight_decay=0.5)
    opt = set_group_weight_decay(build_optimizer(optim, groups), groups)
    before = {n: p.detach().clone() for n, p in tower.named_parameters()}
    for p in tower.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    for name, p in tower.named_parameters():
        exempt = name in groups[1].names
        want = before[name] if exempt else before[name] * (1 - 0.1 * 0.5)
        torch.testing.assert_close(p.detach(), want, rtol=1e-15, atol=0), name


def test_trainer_default_no_decay_with_adamw_only(tmp_path, data):
    over = ["optim.name=adamw", "optim.weight_decay=0.1", "loss.name=infonce"]
    over.append("loss.learnable_temperature=true")
    trainer = Trainer(tiny_config(data, tmp_path / "a", over))
    names = {id(p): n for n, p in trainer.model.named_parameters()}
    names.update({id(p): f"loss.{n}" for n, p in trainer.loss_fn.named_parameters()})
    got = [
        (g["weight_decay"], sorted(names[id(p)] for p in g["params"]))
        for g in trainer.optimizer.param_groups
    ]
    one_dim = sorted(n for n, p in trainer.model.named_parameters() if p.ndim < 2)
    two_dim = sorted(n for n, p in trainer.model.named_parameters() if p.ndim >= 2)
    assert got == [(0.1, two_dim), (0.0, sorted([*one_dim, "loss.log_scale"]))]
    assert any("bias" in n for n in one_dim)
    # adam keeps one group decaying everything; an explicit empty rule too
    adam = Trainer(tiny_config(data, tmp_path / "b", ["optim.weight_decay=0.1"]))
    assert len(adam.optimizer.param_groups) == 1
    none = Trainer(tiny_config(data, tmp_path / "c", [*over[:2], "optim.no_decay=[]"]))
    assert [g["weight_decay"] for g in none.optimizer.param_groups] == [0.1]


# -- BatchNorm while frozen, and locked towers -------------------------------------------------


class BNModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.backbone(x))


@pytest.mark.parametrize("bn", ["eval", "train"])
def test_freeze_bn_rule_for_running_statistics(bn):
    model = BNModel()
    hook = FreezeModules(model, ["backbone"], epochs=1, bn=bn)
    stats = model.backbone[1].running_mean
    x = torch.randn(8, 3) + 5.0
    for epoch in (0, 1):
        trainer = SimpleNamespace(epoch=epoch, world_size=1)  # a TrainContext's names
        hook.before_epoch(trainer)  # type: ignore[arg-type]
        model.train()  # what the trainer does after before_epoch
        hook.before_step(trainer, None)  # type: ignore[arg-type]
        before = stats.clone()
        model(x)
        moved = not torch.equal(stats, before)
        assert moved == (epoch == 1 or bn == "train"), (bn, epoch)
        assert model.head.training


def test_locked_tower_never_changes_and_has_no_optimiser_state(tmp_path, data):
    class Modes(TrainHook):
        def __init__(self) -> None:
            self.seen: list[bool] = []

        def before_optimizer_step(self, trainer):
            self.seen.append(trainer.model.image_encoder.training)

    over = ['train.lock=["image_encoder"]', "train.epochs=2", "train.max_steps_per_epoch=2"]
    modes = Modes()
    trainer = Trainer(tiny_config(data, tmp_path / "run", over), hooks=[modes])
    assert [type(h).__name__ for h in trainer.hooks][:1] == ["LockModules"]
    init = model_params(trainer.model)
    trainer.fit()
    after = model_params(trainer.model)
    for k in init:
        assert torch.equal(after[k], init[k]) == k.startswith("image_encoder"), k
    locked = {id(p) for p in trainer.model.image_encoder.parameters()}
    in_optimizer = {id(p) for g in trainer.optimizer.param_groups for p in g["params"]}
    assert locked and not locked & in_optimizer
    assert not locked & {id(p) for p in trainer.optimizer.state}
    assert modes.seen == [False] * 4  # eval mode at every step
    assert not any(p.requires_grad for p in trainer.model.image_encoder.parameters())


ONE_EPOCH = ["train.freeze_epochs=1"]


def test_lock_config_errors_name_the_key(tmp_path, data):
    with pytest.raises(ConfigError, match=r"train\.lock\[0\]: 'image_encoder' overlaps"):
        tiny_config(
            data,
            tmp_path / "a",
            ['train.lock=["image_encoder"]', 'train.freeze=["image_encoder.fc"]'] + ONE_EPOCH,
        )
    with pytest.raises(ConfigError, match=r"train\.lock\[0\]: 'vision' is not a module"):
        Trainer(tiny_config(data, tmp_path / "b", ['train.lock=["vision"]']))
    with pytest.raises(ConfigError, match=r"train\.freeze_bn: expected one of eval, train"):
        tiny_config(data, tmp_path / "c", ["train.freeze_bn=frozen"])
    model = BNModel()
    LockModules(model, ["backbone"])
    assert [p.requires_grad for p in model.parameters()] == [False] * 4 + [True] * 2


# -- precision ----------------------------------------------------------------------------------


def test_amp_settings():
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert amp_dtype(True, cpu) is None and amp_dtype(False, cuda) is None
    assert amp_dtype(True, cuda) == amp_dtype("fp16", cuda) == torch.float16
    assert amp_dtype("bf16", cpu) == amp_dtype("bf16", cuda) == torch.bfloat16
    with pytest.raises(ConfigError, match=r"train\.amp: 'fp16' needs CUDA"):
        amp_dtype("fp16", cpu)


def test_amp_config_keeps_booleans_and_names_the_key(tmp_path, data):
    for value, want in (("true", True), ("false", False), ("bf16", "bf16")):
        assert tiny_config(data, tmp_path, [f"train.amp={value}"]).train.amp == want
    with pytest.raises(ConfigError, match=r"train\.amp: expected true or false, or one of"):
        tiny_config(data, tmp_path, ["train.amp=fp8"])


def test_bf16_autocast_trains_on_the_cpu_with_the_loss_in_float32(tmp_path, data):
    class Seen(TrainHook):
        def __init__(self) -> None:
            self.losses: list[float] = []
            self.ctx_dtypes: list[torch.dtype] = []

        def after_step(self, trainer, step):
            self.losses.append(step.loss)
            self.ctx_dtypes.append(step.context["img"].dtype)

    over = ["train.amp=bf16", "train.device=cpu", "train.epochs=1", "train.max_steps_per_epoch=3"]
    seen = Seen()
    trainer = Trainer(tiny_config(data, tmp_path / "run", over), hooks=[seen])
    inside: list[torch.dtype] = []
    fc = trainer.model.image_encoder.fc  # in training steps (validation is float32)
    fc.register_forward_hook(lambda m, i, o: inside.append(o.dtype) if m.training else None)
    init = model_params(trainer.model)
    trainer.fit()
    assert len(seen.losses) == 3 and all(math.isfinite(v) for v in seen.losses)
    assert inside and set(inside) == {torch.bfloat16}  # the model ran under bf16 autocast
    assert set(seen.ctx_dtypes) == {torch.float32}  # the loss saw float32 embeddings
    assert not trainer.scaler.is_enabled()
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())
    assert any(not torch.equal(v, init[k]) for k, v in model_params(trainer.model).items())


def test_clipping_sees_unscaled_gradients(tmp_path, data):
    """With a gradient scaler the clip applies to the true gradients (unscale first): the
    clipped total norm is grad_clip, not grad_clip / scale."""
    over = ["optim.grad_clip=1e-4", "train.epochs=1", "train.max_steps_per_epoch=1"]

    class Norm(TrainHook):
        norm = 0.0

        def after_step(self, trainer, step):
            grads = [p.grad for g in trainer.optimizer.param_groups for p in g["params"]]
            self.norm = torch.linalg.vector_norm(
                torch.stack([torch.linalg.vector_norm(g.double()) for g in grads if g is not None])
            ).item()

    hook = Norm()
    trainer = Trainer(tiny_config(data, tmp_path / "run", over), hooks=[hook])
    trainer.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    trainer.fit()
    assert hook.norm == pytest.approx(1e-4, rel=1e-4)  # clip_grad_norm_'s eps is 1e-6


# -- torch.compile and activation checkpointing ------------------------------------------------


def _tiny_bert():
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        vocab_size=30,
        hidden_size=8,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=16,
        max_position_embeddings=16,
    )
    torch.manual_seed(0)
    return transformers.BertModel(config).double()


class TextTower(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bert = _tiny_bert()
        self.proj = nn.Linear(8, 4).double()

    def forward(self, ids):
        return self.proj(self.bert(input_ids=ids).last_hidden_state[:, 0])


def _loss_and_grads(model: nn.Module, ids: torch.Tensor):
    model.zero_grad()
    torch.manual_seed(1)  # the same dropout masks
    loss = model(ids).pow(2).sum()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads


def test_activation_checkpointing_gives_the_same_loss_and_gradients():
    ids = torch.randint(0, 30, (3, 7), generator=torch.Generator().manual_seed(0))
    plain, checkpointed = TextTower(), TextTower()
    checkpointed.load_state_dict(plain.state_dict())
    plain.train(), checkpointed.train()  # dropout on: the RNG is replayed in the recompute
    assert enable_activation_checkpointing(checkpointed) == ["bert"]
    calls: list[int] = []
    checkpointed.bert.encoder.layer[0].attention.register_forward_hook(
        lambda m, i, o: calls.append(1)
    )
    loss_a, grads_a = _loss_and_grads(plain, ids)
    loss_b, grads_b = _loss_and_grads(checkpointed, ids)
    assert grads_a.keys() == grads_b.keys() and len(grads_a) > 10  # BERT's pooler gets none
    assert len(calls) == 2  # forward, then recomputed in the backward pass
    # float64, the same operations replayed: equal to rounding
    torch.testing.assert_close(loss_b, loss_a, rtol=1e-12, atol=0)
    for name in grads_a:
        torch.testing.assert_close(grads_b[name], grads_a[name], rtol=1e-10, atol=1e-14)


def test_activation_checkpointing_refuses_a_model_without_a_hugging_face_module(tmp_path, data):
    with pytest.raises(ConfigError, match=r"train\.activation_checkpointing: the model holds no"):
        Trainer(tiny_config(data, tmp_path / "run", ["train.activation_checkpointing=true"]))


def test_compile_gives_the_same_loss_and_gradients():
    torch._dynamo.reset()
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(5, 6), nn.Tanh(), nn.Linear(6, 2)).double()
    compiled = nn.Sequential(nn.Linear(5, 6), nn.Tanh(), nn.Linear(6, 2)).double()
    compiled.load_state_dict(plain.state_dict())
    train = SimpleNamespace(lock=[], activation_checkpointing=False, compile="aot_eager")
    prepare_model(compiled, train)  # type: ignore[arg-type]
    x = torch.randn(4, 5, dtype=torch.float64)
    loss_a, grads_a = _loss_and_grads(plain, x)
    loss_b, grads_b = _loss_and_grads(compiled, x)
    assert compiled._compiled_call_impl is not None  # nn.Module.compile, in place
    assert list(compiled.state_dict()) == list(plain.state_dict())  # checkpoint names kept
    torch.testing.assert_close(loss_b, loss_a, rtol=1e-12, atol=0)
    for name in grads_a:
        torch.testing.assert_close(grads_b[name], grads_a[name], rtol=1e-12, atol=1e-15)
    bad = SimpleNamespace(lock=[], activation_checkpointing=False, compile="nope")
    with pytest.raises(ConfigError, match=r"train\.compile: unknown torch\.compile backend"):
        prepare_model(nn.Linear(1, 1), bad)  # type: ignore[arg-type]


def test_optim_eps_is_adams_denominator_term():
    """Adam's first step is ``lr * g / (|g| + eps)``: IRRA's eps 1e-3 halves a 1e-3 gradient's
    step, torch's default 1e-8 leaves it at ``lr``."""
    for eps, want in ((1e-3, 0.5), (1e-8, 1e-3 / (1e-3 + 1e-8))):
        p = nn.Parameter(torch.zeros(3, dtype=torch.float64))
        opt = build_optimizer(OptimConfig(name="adam", lr=0.1, eps=eps), [p])
        assert opt.param_groups[0]["eps"] == eps
        p.grad = torch.full_like(p, 1e-3)
        opt.step()
        torch.testing.assert_close(p.detach(), torch.full_like(p, -0.1 * want), rtol=1e-12, atol=0)
