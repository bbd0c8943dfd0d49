"""VSE-infinity's all-negatives warm-up (train.all_negatives_epochs) for triplet-HN, GOAL and VSL:
the loss used in a warm-up epoch, the switch epoch, config errors and resume."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from train_helpers import tiny_config, tiny_data
from vlret.losses import GoalObjective
from vlret.train import Trainer
from vlret.train.config import ConfigError
from vlret.train.warmup import AllNegativesWarmup

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
    trainer._set_epoch_schedule()
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
    assert isinstance(trainer.loss_fn, AllNegativesWarmup)
    g = torch.Generator().manual_seed(0)
    img = torch.randn(8, 6, generator=g, requires_grad=True)
    txt = torch.randn(8, 6, generator=g, requires_grad=True)
    ids = torch.tensor([0, 1, 1, 2, 3, 4, 5, 6])
    grads = {}
    for epoch in (0, 1):
        trainer.epoch = epoch
        trainer._set_epoch_schedule()
        img.grad = txt.grad = None
        trainer.loss_fn(img, txt, ids, ids).backward()
        grads[epoch] = torch.cat([img.grad, txt.grad])
    img.grad = txt.grad = None
    GoalObjective(margin=0.2)(img, txt, ids, ids).backward()
    assert torch.equal(grads[1], torch.cat([img.grad, txt.grad]))  # the objective, unchanged
    assert not torch.allclose(grads[0], grads[1])  # the warm-up is another gradient
    assert trainer.loss_fn.state_dict() == {}  # checkpoints as with the bare objective


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_switch_happens_at_the_configured_epoch(tmp_path, data, name, monkeypatch):
    overrides = [*SETTINGS[name], "train.all_negatives_epochs=2", "train.validate=false"]
    trainer = Trainer(tiny_config(data, tmp_path / "run", overrides))
    target = trainer.loss_fn.base if name == "vsl" else trainer.loss_fn
    seen: list[tuple[int, bool]] = []
    original = Trainer.compute_loss

    def record(self, batch):
        seen.append((self.epoch, target.hardest))
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
        trainer._set_epoch_schedule()
        assert target.hardest is False


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        (["loss.name=unified"], "not 'unified'"),
        (["loss.name=infonce"], "not 'infonce'"),
        (["loss.name=adacl"], "not 'adacl'"),
        (["loss.name=vsl", "loss.base=unified"], "base 'unified' has no such switch"),
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


def test_no_warmup_leaves_goal_unwrapped(tmp_path, data):
    trainer = Trainer(tiny_config(data, tmp_path / "run", ["loss.name=goal"]))
    assert isinstance(trainer.loss_fn, GoalObjective)


def test_wrapper_passes_the_tiled_form_and_local_anchors_through():
    wrapped = AllNegativesWarmup(GoalObjective(chunk_size=3))
    assert wrapped.chunk_size == 3 and wrapped.warmup.chunk_size == 3
    assert wrapped.supports_anchors  # tiled GOAL and tiled triplet both split by anchors
    g = torch.Generator().manual_seed(0)
    # float64: the anchor pieces' sum then equals the whole to float64 rounding on any CPU.
    img, txt = (torch.randn(8, 6, generator=g, dtype=torch.float64) for _ in range(2))
    ids = torch.arange(8)
    for hardest in (False, True):
        wrapped.hardest = hardest
        full = wrapped(img, txt, ids, ids)
        parts = sum(wrapped(img, txt, ids, ids, anchors=(a, a + 4)) for a in (0, 4))
        torch.testing.assert_close(parts, full)
        assert torch.equal(full, wrapped.active(img, txt, ids, ids))
    assert not AllNegativesWarmup(GoalObjective()).chunk_size


def test_wrapper_needs_a_goal_objective():
    with pytest.raises(ValueError, match="loss must be a GoalObjective"):
        AllNegativesWarmup(torch.nn.Identity())
