"""vlret.analysis.score_spread: where a model's scores sit, against a loss's constants."""

from __future__ import annotations

import itertools

import pytest
import torch

from train_helpers import tiny_raw
from vlret.analysis.score_spread import (
    _exact_rank,
    batch_spread,
    checkpoint_batches,
    summarise,
)
from vlret.losses import GoalParams, goal_anchor_weights, goal_objective, smooth_rank
from vlret.run.builders import load_trained_model
from vlret.run.config import apply_overrides, config_from_dict
from vlret.train import Trainer
from vlret.worlds import write_synthetic

pytestmark = pytest.mark.usefixtures("one_thread")


def test_per_anchor_quantities_by_hand():
    sim = torch.tensor([[0.9, 0.2, 0.5], [0.1, 0.4, 0.7], [0.3, 0.6, 0.8]], dtype=torch.float64)
    out = batch_spread(sim)
    # image anchors read rows, text anchors columns
    assert out["positive"].tolist() == [[0.9, 0.4, 0.8]] * 2
    assert out["hardest"].tolist() == [[0.5, 0.7, 0.6], [0.3, 0.6, 0.7]]
    torch.testing.assert_close(out["gap"], out["positive"] - out["hardest"])
    torch.testing.assert_close(
        out["width"],
        torch.tensor([[0.7, 0.6, 0.5], [0.8, 0.4, 0.3]], dtype=torch.float64),
    )


def naive_rank(row: list[float], j: int) -> float:
    """1 + the entries above row[j], ties counting one half (the smooth rank's tau -> 0)."""
    return 1 + sum(
        1.0 if v > row[j] else 0.5 if v == row[j] else 0.0 for k, v in enumerate(row) if k != j
    )


def test_exact_rank_against_a_loop_with_ties():
    rows = torch.tensor([[0.3, 0.1, 0.3, 0.9, 0.1], [1.0, 1.0, 1.0, 0.0, 2.0]])
    want = [[naive_rank(r, j) for j in range(len(r))] for r in rows.tolist()]
    assert _exact_rank(rows).tolist() == want


def test_smooth_rank_regime_follows_the_row_width():
    gen = torch.Generator().manual_seed(0)
    # (i + 3j) mod 64 is a permutation of 0..63 along every row and every column: rows and
    # columns spread over 1.0 with distinct values at least 1/64 apart
    i, j = torch.meshgrid(torch.arange(64), torch.arange(64), indexing="ij")
    wide = ((i + 3 * j) % 64 / 64).double()
    wide = wide[torch.randperm(64, generator=gen)][:, torch.randperm(64, generator=gen)]
    out = batch_spread(wide, tau=0.001)
    # every pairwise gap is >= 1/64 = 15.6 tau: all saturated; error ~ 0
    assert out["saturated"].min().item() == 1.0
    assert out["rank_error"].max().item() < 1e-6
    narrow = wide * 0.001  # the same order squeezed into a band 0.001 wide (64 tau = 0.064)
    out = batch_spread(narrow, tau=0.001)
    assert out["saturated"].max().item() == 0.0  # every |gap| / tau < 1
    rows = torch.cat((narrow, narrow.t()))
    want = (smooth_rank(rows, tau=0.001) - _exact_rank(rows)).abs().mean(-1)
    torch.testing.assert_close(out["rank_error"].reshape(-1), want)
    assert out["rank_error"].mean().item() > 5  # far from the exact rank


@pytest.mark.parametrize(("t", "p"), [("cir", "sig-ms"), ("con", "con"), ("nca", "lin-ms")])
def test_goal_weights_are_the_objectives_gradient_at_each_triplet(t, p):
    gen = torch.Generator().manual_seed(1)
    sim = (torch.rand(6, 6, generator=gen, dtype=torch.float64) * 1.2 - 0.2).requires_grad_()
    params = GoalParams(triplet_weight=t, pair_weight=p)
    goal_objective(sim, triplet_weight=t, pair_weight=p).backward()
    n = sim.shape[0]
    w = goal_anchor_weights(sim.detach(), ~torch.eye(n, dtype=torch.bool), params)
    want = torch.zeros(n, n, dtype=torch.float64)
    rows = sim.detach().masked_fill(torch.eye(n, dtype=torch.bool), -1e9)
    for i in range(n):  # naive: each anchor's hardest negative by a loop
        j = max((k for k in range(n) if k != i), key=lambda k: rows[i, k].item())
        want[i, j] += (w["triplet"][0, i] * w["pair_neg"][0, i]).item()
        want[i, i] -= (w["triplet"][0, i] * w["pair_pos"][0, i]).item()
        k = max((k for k in range(n) if k != i), key=lambda k: rows[k, i].item())
        want[k, i] += (w["triplet"][1, i] * w["pair_neg"][1, i]).item()
        want[i, i] -= (w["triplet"][1, i] * w["pair_pos"][1, i]).item()
        assert w["hardest"][0, i].item() == sim[i, j].item()
        assert w["hardest"][1, i].item() == sim[k, i].item()
    torch.testing.assert_close(sim.grad, want, rtol=1e-12, atol=1e-12)
    spread = batch_spread(sim.detach(), goal=params)
    torch.testing.assert_close(spread["goal_triplet"], w["triplet"])


def test_summarise_pools_the_batches_per_direction():
    a = {"positive": torch.tensor([[1.0, 2.0], [5.0, 6.0]])}
    b = {"positive": torch.tensor([[3.0, 4.0], [7.0, 8.0]])}
    out = summarise([a, b])
    assert out["i2t_positive"] == 2.5 and out["t2i_positive"] == 6.5
    assert out["i2t_positive_q25"] == 1.75 and out["i2t_positive_q75"] == 3.25
    assert out["n_anchors"] == 4.0
    with pytest.raises(ValueError, match="batches is empty"):
        summarise([])


@pytest.mark.parametrize(
    ("sim", "kw", "match"),
    [
        (torch.zeros(2, 3), {}, "square"),
        (torch.zeros(1, 1), {}, "B >= 2"),
        (torch.zeros(2, 2, dtype=torch.long), {}, "floating"),
        (torch.zeros(2, 2), {"tau": 0.0}, "tau must be positive"),
    ],
)
def test_bad_input_is_named(sim, kw, match):
    with pytest.raises(ValueError, match=match):
        batch_spread(sim, **kw)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("spread")
    world = tmp / "world"
    write_synthetic("tiny", world, format="precomp", seed=0, relevance_splits=())
    raw = tiny_raw(world, tmp / "run")
    raw["model"]["image"]["in_dim"] = 32
    steps = ["train.epochs=1", "train.max_steps_per_epoch=1", "train.batch_size=8"]
    Trainer(config_from_dict(apply_overrides(raw, steps)), print_fn=None).fit()
    return world, tmp / "run" / "last.pt"


def test_checkpoint_batches_are_distinct_images_with_one_of_their_captions(run):
    world, ckpt = run
    batches = list(checkpoint_batches(ckpt, data=world, split="dev", batches=3, batch_size=6))
    assert [tuple(b.sim.shape) for b in batches] == [(6, 6)] * 3
    from vlret.data.formats import open_dataset
    from vlret.eval import TwoTowerScorer
    from vlret.run.eval_data import eval_data_config

    model, stored, encoder = load_trained_model(ckpt)
    dataset = open_dataset(eval_data_config(stored.data, world), "dev", encoder=encoder)
    img, txt = TwoTowerScorer(model, scoring=stored.scoring).embeddings(dataset)
    owner = torch.as_tensor(dataset.txt_to_img)
    drawn = set()
    for b in batches:
        assert len(set(b.images.tolist())) == 6  # distinct images
        assert torch.equal(owner[b.captions], b.images)  # each caption its row's image's
        torch.testing.assert_close(b.sim, img[b.images] @ txt[b.captions].t())
        drawn |= set(b.captions.tolist())
    # not always an image's first caption
    firsts = {int((owner == i).nonzero()[0]) for i in range(int(owner.max()) + 1)}
    assert drawn - firsts
    again = list(checkpoint_batches(ckpt, data=world, split="dev", batches=3, batch_size=6))
    assert all(torch.equal(a.sim, b.sim) for a, b in itertools.zip_longest(batches, again))
    with pytest.raises(ValueError, match="batch_size"):
        next(checkpoint_batches(ckpt, data=world, split="dev", batch_size=10**6))
