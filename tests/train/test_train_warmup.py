"""VSE-infinity's all-negatives warm-up (train.all_negatives_epochs) for the losses that declare
it (triplet-HN, GOAL, VSL with a triplet base): the loss used in a warm-up epoch, the switch
epoch, config errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from train_helpers import tiny_config, tiny_data
from vlret.losses import GoalObjective, loss_capabilities
from vlret.run.config import ConfigError
from vlret.run.warmup import warmup_refusal
from vlret.train import Trainer

MARGIN = 0.2


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return tiny_data(tmp_path_factory.mktemp("data"))


def _hinges(img: torch.Tensor, txt: torch.Tensor, ids: torch.Tensor, margin: float):
    """Naive loops: (sum of all hinges, sum of the hardest hinges), both directions."""
    s = F.normalize(img.double(), dim=1) @ F.normalize(txt.double(), dim=1).t()
    b = len(ids)
    total, hardest = 0.0, 0.0
    for a in range(b):
        i2t = [max(0.0, margin + float(s[a, j] - s[a, a])) for j in range(b) if ids[j] != ids[a]]
        t2i = [max(0.0, margin + float(s[i, a] - s[a, a])) for i in range(b) if ids[i] != ids[a]]
        total += sum(i2t) + sum(t2i)
        hardest += max(i2t, default=0.0) + max(t2i, default=0.0)
    return total, hardest


def _batch(trainer: Trainer):
    trainer.sampler.set_epoch(0)
    indices = next(iter(trainer.sampler))
    return trainer.train_set.collate([trainer.train_set[i] for i in indices])


def _loss_at(trainer: Trainer, epoch: int, batch) -> tuple[float, dict]:
    trainer.epoch = epoch
    trainer.hooks.before_epoch(trainer.context)
    _, logged, ctx = trainer.compute_loss(batch)
    return float(logged), ctx


SETTINGS = {
    "triplet": [],
    "goal": ["loss.name=goal", "loss.margin=0.2"],
    "vsl": ["loss.name=vsl"],
}


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_warmup_loss_is_the_triplet_sum_of_hinges(tmp_path, data, name):
    cfg = tiny_config(data, tmp_path / "run", [*SETTINGS[name], "train.all_negatives_epochs=2"])
    trainer = Trainer(cfg)
    batch = _batch(trainer)
    warm, ctx = _loss_at(trainer, 1, batch)  # the last warm-up epoch
    hard, ctx2 = _loss_at(trainer, 2, batch)  # the first hardest-negative epoch
    assert torch.equal(ctx["img"], ctx2["img"])  # same model, same batch
    total, hardest = _hinges(ctx["img"], ctx["txt"], ctx["ids"], MARGIN)
    assert total > hardest + 1e-3  # the batch tells the two phases apart
    if name == "vsl":  # the L_vs term is the same in both phases; only the base switches
        assert warm - hard == pytest.approx(total - hardest, rel=1e-5, abs=1e-5)
    else:
        assert warm == pytest.approx(total, rel=1e-5)
        assert hard == pytest.approx(hardest, rel=1e-5)  # GOAL's value: hardest-negative triplet


def test_goal_warmup_switches_to_the_gradient_objective(tmp_path, data):
    cfg = tiny_config(data, tmp_path / "run", ["loss.name=goal", "train.all_negatives_epochs=1"])
    trainer = Trainer(cfg)
    assert isinstance(trainer.loss_fn, GoalObjective)  # the objective carries its warm-up
    g = torch.Generator().manual_seed(0)
    img = torch.randn(8, 6, generator=g, requires_grad=True)
    txt = torch.randn(8, 6, generator=g, requires_grad=True)
    ids = torch.tensor([0, 1, 1, 2, 3, 4, 5, 6])
    grads = {}
    for epoch in (0, 1):
        trainer.epoch = epoch
        trainer.hooks.before_epoch(trainer.context)
        img.grad = txt.grad = None
        trainer.loss_fn(img, txt, ids, ids).backward()
        grads[epoch] = torch.cat([img.grad, txt.grad])
    img.grad = txt.grad = None
    GoalObjective(margin=0.2)(img, txt, ids, ids).backward()
    assert torch.equal(grads[1], torch.cat([img.grad, txt.grad]))  # the objective, unchanged
    assert not torch.allclose(grads[0], grads[1])  # the warm-up is another gradient
    assert trainer.loss_fn.state_dict() == {}  # checkpoints as with the bare objective


def _mines_hardest(name: str, loss_fn: torch.nn.Module) -> bool:
    """Whether the loss built for ``SETTINGS[name]`` is past its warm-up (each family's state)."""
    if name == "goal":
        return not loss_fn.all_negatives
    return (loss_fn.base if name == "vsl" else loss_fn).hardest


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_switch_happens_at_the_configured_epoch(tmp_path, data, name, monkeypatch):
    overrides = [*SETTINGS[name], "train.all_negatives_epochs=2", "train.validate=false"]
    trainer = Trainer(tiny_config(data, tmp_path / "run", overrides))
    seen: list[tuple[int, bool]] = []
    original = Trainer.compute_loss

    def record(self, batch):
        seen.append((self.epoch, _mines_hardest(name, self.loss_fn)))
        return original(self, batch)

    monkeypatch.setattr(Trainer, "compute_loss", record)
    trainer.fit()
    assert {e for e, _ in seen} == {0, 1, 2}
    assert all(hardest == (epoch >= 2) for epoch, hardest in seen)


@pytest.mark.parametrize("name", ["goal", "vsl"])
def test_configured_all_negatives_loss_stays_all_negatives(tmp_path, data, name):
    extra = (
        ["loss.base_params={margin = 0.2, hardest = false}"]
        if name == "vsl"
        else ["loss.name=triplet", "loss.hardest=false"]
    )
    overrides = [*SETTINGS[name], *extra, "train.all_negatives_epochs=1"]
    trainer = Trainer(tiny_config(data, tmp_path / "run", overrides))
    target = trainer.loss_fn.base if name == "vsl" else trainer.loss_fn
    for epoch in (0, 1, 2):
        trainer.epoch = epoch
        trainer.hooks.before_epoch(trainer.context)
        assert target.hardest is False


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        (["loss.name=unified"], "loss 'unified' has no hardest-negative phase"),
        (["loss.name=infonce"], "loss 'infonce' has no hardest-negative phase"),
        (["loss.name=adacl"], "loss 'adacl' has no hardest-negative phase"),
        (["loss.name=vsl", "loss.base=unified"], "'vsl' with base='unified' has no hardest"),
    ],
)
def test_warmup_refused_for_losses_without_a_hardest_phase(tmp_path, data, overrides, words):
    with pytest.raises(ConfigError, match=words) as err:
        tiny_config(data, tmp_path / "run", [*overrides, "train.all_negatives_epochs=1"])
    assert err.value.key == "train.all_negatives_epochs"


def test_negative_warmup_is_an_error(tmp_path, data):
    with pytest.raises(ConfigError, match=">= 0") as err:
        tiny_config(data, tmp_path / "run", ["train.all_negatives_epochs=-1"])
    assert err.value.key == "train.all_negatives_epochs"


def test_goal_is_the_bare_objective_without_warmup(tmp_path, data):
    trainer = Trainer(tiny_config(data, tmp_path / "run", ["loss.name=goal"]))
    assert isinstance(trainer.loss_fn, GoalObjective) and not trainer.loss_fn.all_negatives


def test_goal_warmup_keeps_the_tiled_form_and_local_shards():
    loss = GoalObjective(margin=MARGIN, chunk_size=3)
    assert loss_capabilities(loss).local_shards  # tiled GOAL and its tiled warm-up both split
    g = torch.Generator().manual_seed(0)
    # float64: the shards' sum then equals the whole to float64 rounding on any CPU.
    img, txt = (torch.randn(8, 6, generator=g, dtype=torch.float64) for _ in range(2))
    ids = torch.arange(8)
    total, hardest = _hinges(img, txt, ids, MARGIN)
    for all_negatives in (True, False):
        loss.set_all_negatives(all_negatives)
        full = loss(img, txt, ids, ids)
        parts = sum(loss(img, txt, ids, ids, shard=(a, a + 4)) for a in (0, 4))
        torch.testing.assert_close(parts, full)
        if all_negatives:
            assert float(full) == pytest.approx(total, rel=1e-9)
    assert float(full) != pytest.approx(total)  # back to the gradient objective


def test_refusal_names_the_losses_that_take_the_warmup():
    assert warmup_refusal("triplet", {}) is None
    assert warmup_refusal("vsl", {"base": "triplet", "base_params": {"hardest": False}}) is None
    reason = warmup_refusal("infonce", {"temperature": 0.05})
    assert reason.startswith("loss 'infonce' with temperature=0.05 has no hardest-negative")
    assert reason.endswith("applies to aoq, goal, ssp, triplet, vsl (with their defaults)")
