"""NCR (``train.procedure = "ncr"``): the division against scikit-learn, label refinement and
soft margins against the paper's formulas, co-divide, an exact resume across the per-epoch
pass, and evaluation as the two-network ensemble."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from vlret.train.procedures.ncr import (
    NCROptions,
    clean_probability,
    per_pair_loss,
    predictions,
    refined_labels,
    soft_margin_factor,
    soft_margin_triplet,
    split_clean,
)


def test_gmm_split_matches_a_direct_scikit_learn_call():
    from sklearn.mixture import GaussianMixture

    rng = np.random.default_rng(0)
    losses = np.concatenate([rng.normal(1.0, 0.2, 80), rng.normal(3.0, 0.3, 20)])
    prob = clean_probability(losses, random_state=3)
    x = ((losses - losses.min()) / (losses.max() - losses.min())).reshape(-1, 1)
    gmm = GaussianMixture(n_components=2, max_iter=10, tol=1e-2, reg_covar=5e-4, random_state=3)
    gmm.fit(x)
    want = gmm.predict_proba(x)[:, gmm.means_.argmin()]
    np.testing.assert_array_equal(prob, want)
    clean = split_clean(prob, 0.5)
    np.testing.assert_array_equal(clean, want > 0.5)
    assert clean[:80].mean() > 0.9 and clean[80:].mean() < 0.1  # the low-loss component
    # no probability at or below the threshold: the lowest 1% (at least one) is called noisy
    p = np.linspace(0.6, 0.99, 250)
    assert (~split_clean(p, 0.5)).sum() == 3  # p[:2] below p[250 // 100] = p[2], and p[2]
    assert split_clean(p, 0.5)[3:].all()


def _naive_hinges(sim, pos, margin):
    b = sim.shape[0]
    rows, cols = [], []
    for i in range(b):
        r = [max(0.0, margin + sim[i, j] - sim[i, i]) for j in range(b) if not pos[i, j]]
        c = [max(0.0, margin + sim[j, i] - sim[i, i]) for j in range(b) if not pos[j, i]]
        rows.append(sum(r) / max(len(r), 1))
        cols.append(sum(c) / max(len(c), 1))
    return np.array(rows), np.array(cols)


def test_per_pair_loss_and_predictions_against_loops():
    g = torch.Generator().manual_seed(0)
    sim = torch.rand(12, 12, generator=g, dtype=torch.float64)
    ids = torch.tensor([0, 0, 1, 2, 3, 3, 4, 5, 6, 7, 8, 9])
    pos = ids[:, None] == ids[None, :]
    rows, cols = _naive_hinges(sim.numpy(), pos.numpy(), 0.2)
    np.testing.assert_allclose(per_pair_loss(sim, margin=0.2, pos_mask=pos), rows + cols, 1e-12)
    p = np.clip(0.2 - (rows + cols) / 2, 0, 0.2)
    top = np.sort(p)[::-1][: 12 // 10 + 1].mean()
    np.testing.assert_allclose(
        predictions(sim, margin=0.2, pos_mask=pos), np.clip(p / top, 0, 1), 1e-12
    )


def test_label_refinement_and_the_three_soft_margins():
    w = torch.tensor([0.0, 0.3, 0.9, 1.0], dtype=torch.float64)
    p = torch.tensor([0.5, 0.2, 0.1, 0.7], dtype=torch.float64)
    want = [wi + (1 - wi) * pi for wi, pi in zip(w.tolist(), p.tolist(), strict=True)]
    np.testing.assert_allclose(refined_labels(w, p), want, rtol=1e-15)
    y = torch.tensor([0.0, 0.25, 0.5, 1.0], dtype=torch.float64)
    ys = y.tolist()
    np.testing.assert_allclose(soft_margin_factor(y, "linear"), ys)
    np.testing.assert_allclose(
        soft_margin_factor(y, "exponential"), [(10**v - 1) / 9 for v in ys], rtol=1e-14
    )
    np.testing.assert_allclose(
        soft_margin_factor(y, "sin"),
        [math.sin(math.pi * v - math.pi / 2) / 2 + 0.5 for v in ys],
        atol=1e-15,
    )
    with pytest.raises(ValueError, match="soft_margin: expected one of"):
        soft_margin_factor(y, "cubic")


def test_soft_margin_triplet_against_a_loop_and_the_plain_triplet():
    from vlret.losses import triplet_loss

    g = torch.Generator().manual_seed(1)
    sim = torch.rand(6, 6, generator=g, dtype=torch.float64)
    m = torch.rand(6, generator=g, dtype=torch.float64) * 0.3
    want = 0.0
    for i in range(6):
        want += max(max(0.0, m[i] + sim[i, j] - sim[i, i]) for j in range(6) if j != i)
        want += max(max(0.0, m[i] + sim[j, i] - sim[i, i]) for j in range(6) if j != i)
    assert float(soft_margin_triplet(sim, m)) == pytest.approx(float(want), abs=1e-12)
    equal = torch.full((6,), 0.2, dtype=torch.float64)
    assert float(soft_margin_triplet(sim, equal, hardest=False)) == pytest.approx(
        float(triplet_loss(sim, margin=0.2, hardest=False)), abs=1e-12
    )


def test_options_are_validated_naming_the_key():
    assert NCROptions.parse({}).soft_margin == "exponential"
    assert NCROptions.parse({"warmup_epochs": 5}).noisy_start(45) == 25  # 5 + 40 // 2
    for bad, key in (
        ({"p_threshold": 1.5}, "p_threshold"),
        ({"soft_margin": "cubic"}, "soft_margin"),
        ({"warmup_epochs": -1}, "warmup_epochs"),
        ({"gmm_tol": 0}, "gmm_tol"),
        ({"nope": 1}, "nope"),
    ):
        with pytest.raises(ValueError, match=f"^train.procedure_options.{key}: "):
            NCROptions.parse(bad)


# -- a tiny noisy precomp world -----------------------------------------------------------------


def _config(tmp_path, out="run", **train):
    from vlret.run.config import config_from_dict

    return config_from_dict(
        {
            "output_dir": str(tmp_path / out),
            "data": {
                "root": str(tmp_path / "data"),
                "format": "precomp",
                "min_count": 1,
                "noise_ratio": 0.4,
                "noise_seed": 1,
            },
            "model": {
                "kind": "sgraf",
                "embed_dim": 8,
                "module": "sgr",
                "sim_dim": 4,
                "sgr_steps": 1,
                "num_regions": 3,
                "image": {"in_dim": 16},
                "text": {"word_dim": 4},
            },
            "loss": {"name": "triplet"},
            "train": {
                "epochs": 2,
                "batch_size": 10,
                "progress": False,
                "procedure": "ncr",
                # noisy pairs from epoch 1: both branches of the step run
                "procedure_options": {"warmup_epochs": 1, "noisy_from": 1},
                **train,
            },
        }
    )


@pytest.fixture
def world(tmp_path):
    from vlret.data.writers import make_tiny_precomp

    sizes = {"train": 8, "dev": 3, "test": 3}
    make_tiny_precomp(tmp_path / "data", sizes=sizes, feature_shape=(3, 16))
    return tmp_path


class Kill(RuntimeError):
    pass


def _killer(**when):
    from vlret.train.hooks.core import TrainHook

    class Killer(TrainHook):
        def before_epoch(self, ctx):
            if when.get("before_epoch") == ctx.epoch:
                raise Kill

        def after_step(self, ctx, step):
            if when.get("after_step") == ctx.step:
                raise Kill

    return Killer()


def _params(trainer):
    return [p.detach().clone() for p in trainer.model.parameters()] + [
        p.detach().clone() for p in trainer.loss_step.model_b.parameters()
    ]


def test_co_divide_a_trains_with_bs_division(world, monkeypatch):
    from vlret.train import Trainer
    from vlret.train.procedures.ncr import step as step_module

    trainer = Trainer(_config(world))
    ncr = trainer.loss_step
    trainer.epoch = 1
    ncr.before_epoch(trainer.context)  # the pass on the (untrained) networks
    d = ncr.division
    d["clean_a"] = torch.zeros_like(d["clean_a"])  # A's division: every pair noisy
    d["clean_b"] = torch.ones_like(d["clean_b"])  # B's: every pair clean
    d["prob_b"] = torch.full_like(d["prob_b"], 0.25)
    seen = []
    real = step_module.refined_labels
    monkeypatch.setattr(
        step_module, "refined_labels", lambda w, p: seen.append(w.clone()) or real(w, p)
    )
    ncr.options = NCROptions(warmup_epochs=1, noisy_from=5)  # noisy pairs not yet trained
    batch = trainer.train_set.collate([trainer.train_set[i] for i in range(10)])
    loss, _, ctx = ncr(trainer.context, batch)
    # B trains on A's division (no clean pair, no noisy pair yet: nothing), A on B's (all ten)
    assert ctx["sim"].shape == (10, 10) and float(loss.detach()) > 0
    assert any(torch.equal(w, torch.full((10,), 0.25, dtype=w.dtype)) for w in seen)


def test_resume_across_the_pass_is_exact_and_evaluates_as_the_ensemble(world):
    from vlret.train import Trainer

    full = Trainer(_config(world, "full"))
    full.fit()
    want = _params(full)
    records = [json.loads(x) for x in (world / "full" / "metrics.jsonl").read_text().splitlines()]
    ncr = [r for r in records if r["kind"] == "ncr"]
    assert [r["epoch"] for r in ncr] == [1] and 0 < ncr[0]["ncr_clean_fraction"] < 1
    assert 0 <= ncr[0]["ncr_noisy_recall"] <= 1 and "ncr_noisy_precision" in ncr[0]

    # killed right after epoch 1's pass, before its first step: last.pt is epoch 0's end
    config = _config(world, "killed")
    with pytest.raises(Kill):
        Trainer(config, hooks=[_killer(before_epoch=1)]).fit()
    resumed = Trainer(config, resume=world / "killed" / "last.pt")
    resumed.fit()
    assert resumed.loss_step.passes == 1  # redone, identically
    for a, b in zip(want, _params(resumed), strict=True):
        assert torch.equal(a, b)

    # killed inside epoch 1 after a checkpoint that holds the division: not redone
    config = _config(world, "mid", checkpoint_every=1)
    with pytest.raises(Kill):
        Trainer(config, hooks=[_killer(after_step=full.step - 1)]).fit()
    resumed = Trainer(config, resume=world / "mid" / "last.pt")
    assert resumed.loss_step.division["epoch"] == 1
    resumed.fit()
    assert resumed.loss_step.passes == 0
    for a, b in zip(want, _params(resumed), strict=True):
        assert torch.equal(a, b)

    # vlret eval of the checkpoint: the mean of both networks' score matrices
    from vlret.eval import encode_tokens, score_matrix
    from vlret.metrics import retrieval_metrics_from_similarity
    from vlret.run.evaluate import run_evaluation

    result = run_evaluation(
        world / "full" / "last.pt", data=world / "data", split="test", protocol="f30k"
    )
    assert len(result.members) == 2 and result.members[1].endswith("(network B)")
    from vlret.data.formats import open_dataset

    ds = open_dataset(full.config.data, "test", encoder=full.encoder)
    sims = []
    for net in (full.model, full.loss_step.model_b):
        net.eval()
        regions, texts = encode_tokens(net, ds, batch_size=16, device="cpu")
        sims.append(score_matrix(net, regions, texts, device="cpu").double())
    direct = retrieval_metrics_from_similarity(((sims[0] + sims[1]) / 2).float(), ds.txt_to_img)
    assert result.metrics.as_dict()["rsum"] == pytest.approx(direct.as_dict()["rsum"])
    assert result.members[0].endswith("(network A)")


def test_ncr_refuses_a_loss_without_margins(world):
    from vlret.train import Trainer

    config = _config(world)
    config.loss.name = "infonce"
    with pytest.raises(ValueError, match="loss.name must be triplet or unified"):
        Trainer(config)


def _older_layout(state):
    """A checkpoint as written while B had its own optimiser, schedule and scaler (the naive
    inverse of the merge: the optimiser groups holding B's parameters, renumbered from 0)."""
    opt, sched = state["optimizer"], state["scheduler"]
    sizes = [len(g["params"]) for g in opt["param_groups"]]
    n_a = len(sizes) // 2  # A's groups, then B's mirrors of them
    offset = sum(sizes[:n_a])
    groups_b = [
        {**g, "params": [i - offset for i in g["params"]]} for g in opt["param_groups"][n_a:]
    ]
    moments_b = {i - offset: v for i, v in opt["state"].items() if i >= offset}
    old = dict(state)
    old["optimizer"] = {
        "state": {i: v for i, v in opt["state"].items() if i < offset},
        "param_groups": opt["param_groups"][:n_a],
    }
    old["scheduler"] = {**sched, "base_lrs": sched["base_lrs"][:n_a]}
    old["procedure"] = {
        **state["procedure"],
        "optimizer_b": {"state": moments_b, "param_groups": groups_b},
        "scheduler_b": {**sched, "base_lrs": sched["base_lrs"][n_a:]},
        "scaler_b": state["scaler"],
    }
    return old


def test_a_checkpoint_of_the_older_layout_resumes_as_the_current_one(world):
    """Before network B joined the trainer's optimiser, a checkpoint's procedure held B's own
    optimiser, schedule and scaler: resuming one restores the same state as the current layout."""
    from vlret.train import Trainer

    first = Trainer(_config(world, "first", epochs=1))
    first.fit()
    # B's parameters are in the trainer's optimiser, in groups after A's
    names = [n for n, _ in first.loss_step.model_b.named_parameters()]
    in_optimizer = {id(p) for g in first.optimizer.param_groups for p in g["params"]}
    assert all(id(p) in in_optimizer for p in first.loss_step.model_b.parameters()) and names
    state = torch.load(world / "first" / "last.pt", weights_only=False)
    assert "optimizer_b" not in state["procedure"]
    old = world / "old.pt"
    torch.save(_older_layout(state), old)
    now = Trainer(_config(world, "now"), resume=world / "first" / "last.pt")
    then = Trainer(_config(world, "then"), resume=old)
    a, b = now.optimizer.state_dict(), then.optimizer.state_dict()
    assert a["param_groups"] == b["param_groups"] and a["state"].keys() == b["state"].keys()
    for i in a["state"]:
        for key, value in a["state"][i].items():
            assert torch.equal(value, b["state"][i][key]), (i, key)
    assert now.scheduler.base_lrs == then.scheduler.base_lrs
    for p, q in zip(_params(now), _params(then), strict=True):
        assert torch.equal(p, q)
    with pytest.raises(ValueError, match="optimizer_b, scheduler_b, scaler_b of the layout"):
        then.loss_step.load_state_dict(_older_layout(state)["procedure"])


def test_a_step_whose_clean_pairs_are_fewer_than_two_is_logged(world):
    """Small batches before noisy_from: a batch may hold fewer than two of A's clean pairs, so A
    trains on none and has no score matrix; its step record says so (null batch statistics)
    instead of failing on an empty one."""
    from vlret.train import Trainer

    options = {"warmup_epochs": 1, "noisy_from": 5}
    config = _config(world, "small", batch_size=4, epochs=3, log_every=1, procedure_options=options)
    Trainer(config).fit()
    steps = [json.loads(x) for x in (world / "small" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in steps if r["kind"] == "step"]
    assert len(steps) == 3 * 10  # 40 pairs in batches of 4, every step logged
    empty = [r for r in steps if r["pos_sim"] is None]
    assert empty and all(r["hardest_neg_sim"] is None and r["epoch"] >= 1 for r in empty)


def test_ncr_under_torchrun_is_refused_in_one_line_saying_why(world):
    """NCR's division and clean-pair steps assume one process holds the whole batch: under
    torchrun the check refuses it, in one line naming the procedure, the reason and the world."""
    from types import SimpleNamespace

    from vlret.train.procedures.ncr import NCRStep

    step = NCRStep(_config(world), NCROptions())
    with pytest.raises(ValueError, match=r"'ncr' runs in one process .* world size of 2") as err:
        step.hooks(SimpleNamespace(world_size=2))
    assert "\n" not in str(err.value)
