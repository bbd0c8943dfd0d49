"""Training the cross-attention models (SCAN, BFAN, SGRAF) on their score matrices: every loss
through ``from_similarity``, the settings that need embeddings refused, exact resume, and two
gloo ranks equal to one process on the concatenated batch."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from test_train_distributed import free_port
from torch import nn

from train_helpers import (
    assert_same_params,
    assert_steps_equal,
    model_params,
    rank_env,
    steps_state,
    tiny_data,
    tiny_raw,
)
from vlret.losses import loss_capabilities
from vlret.run.checkpoint import load_checkpoint
from vlret.run.config import ConfigError, apply_overrides, config_from_dict
from vlret.train import Trainer, TrainingInterrupted

#: Tiny models on the tiny precomp data (4 regions of 16 features per image).
MODELS = {
    "scan": {"kind": "scan"},
    "scan_i2t": {"kind": "scan", "direction": "i2t", "lambda_softmax": 4.0, "aggregation": "mean"},
    "bfan": {"kind": "bfan", "focal": "prob"},
    "sgr": {"kind": "sgraf", "sim_dim": 8, "sgr_steps": 2, "num_regions": 4},
    "saf": {"kind": "sgraf", "module": "saf", "sim_dim": 8, "num_regions": 4},
}
LOSSES = {
    "triplet": [],
    "unified": ["loss.name=unified", "loss.gamma=50"],  # Unified B.1 for BFAN and SGRAF
    "vsl": ["loss.name=vsl"],
    "goal": ["loss.name=goal", "train.all_negatives_epochs=1"],
    "adacl": ["loss.name=adacl"],
}


@pytest.fixture(autouse=True)
def one_thread():
    """The 2-core machine is shared: more threads than free cores stall every step."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return tiny_data(tmp_path_factory.mktemp("data"))


def cross_config(data: Path, out: Path, model: str, overrides: list[str] = ()):
    raw = tiny_raw(data, out)
    raw["model"] = {
        **MODELS[model],
        "embed_dim": 16,
        "image": {"in_dim": 16},
        "text": {"word_dim": 8},
    }
    return config_from_dict(apply_overrides(raw, list(overrides)))


def records(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("loss", list(LOSSES))
@pytest.mark.parametrize("model", ["scan", "bfan", "sgr"])
def test_every_loss_trains_every_model(tmp_path, data, model, loss):
    """Two short epochs (GOAL's first one its all-negatives warm-up): finite losses, the
    weights move, per-step score statistics and dev metrics from every dev pair."""
    overrides = ["train.epochs=2", "train.max_steps_per_epoch=2", "train.log_every=1"]
    trainer = Trainer(cross_config(data, tmp_path, model, overrides + LOSSES[loss]))
    assert trainer.scores_pairs and not trainer.local_shards
    before = model_params(trainer.model)
    result = trainer.fit()
    assert result.steps == 4
    after = model_params(trainer.model)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    logs = records(tmp_path)
    steps = [r for r in logs if r["kind"] == "step"]
    assert len(steps) == 4 and all(r["loss"] is not None for r in steps)
    assert all(r["pos_sim"] is not None and r["hardest_neg_sim"] is not None for r in steps)
    epochs = [r for r in logs if r["kind"] == "epoch"]
    assert [r["epoch"] for r in epochs] == [0, 1]
    # 2 dev images x 10 captions, every pair scored: the rsum of 6 recalls lies in 0..600.
    assert all(0 <= r["dev_rsum"] <= 600 and r["dev_pos_sim"] is not None for r in epochs)
    assert (tmp_path / "best.pt").is_file()


def test_saf_and_scan_i2t_train_and_sgraf_batchnorm_statistics_move(tmp_path, data):
    trainer = Trainer(cross_config(data, tmp_path / "saf", "saf", ["train.epochs=1"]))
    bn = trainer.model.scorer.saf.bn
    trainer.fit()
    assert int(bn.num_batches_tracked) > 0  # training-mode statistics, one update per caption
    result = Trainer(cross_config(data, tmp_path / "i2t", "scan_i2t", ["train.epochs=1"])).fit()
    assert result.steps == 5


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["loss.chunk_size=4"], "loss.chunk_size"),
        (["loss.name=unified", "loss.chunk_size=4"], "loss.chunk_size"),
        (["loss.name=adacl", "loss.queue_size=16"], "loss.queue_size"),
        (["loss.name=vsl", "loss.base_params={chunk_size=4}"], "loss.base_params.chunk_size"),
        (["train.grad_cache_chunk=4"], "train.grad_cache_chunk"),  # no per-item embeddings
    ],
)
def test_settings_that_need_embeddings_are_refused_before_the_data_is_read(
    tmp_path, overrides, key
):
    missing = tmp_path / "no_data_here"  # the check runs before any data file is opened
    with pytest.raises(ConfigError) as err:
        Trainer(cross_config(missing, tmp_path / "out", "scan", overrides))
    assert err.value.key == key
    assert "scores pairs itself" in str(err.value)


def test_a_loss_without_from_similarity_is_refused(tmp_path, monkeypatch):
    from vlret.losses import PairLoss
    from vlret.run import pair_scoring

    monkeypatch.setattr(pair_scoring, "loss_class", lambda name: type("NoSim", (PairLoss,), {}))
    with pytest.raises(ConfigError) as err:
        Trainer(cross_config(tmp_path / "no_data_here", tmp_path / "out", "bfan"))
    assert err.value.key == "loss.name" and "has no from_similarity" in str(err.value)


def test_vsl_rank_block_bounds_the_score_matrix_ranks_and_is_accepted(tmp_path, data):
    overrides = ["loss.name=vsl", "loss.rank_block=3", "train.epochs=1", "train.validate=false"]
    trainer = Trainer(cross_config(data, tmp_path, "scan", overrides))
    assert loss_capabilities(trainer.loss_fn).similarity_inputs == ("img_ids", "txt_ids")
    assert trainer.loss_fn.config.rank_block == 3
    assert trainer.fit().steps == 5


def test_vsl_chunk_size_of_an_old_config_is_its_rank_block_with_a_warning(tmp_path, data):
    overrides = ["loss.name=vsl", "loss.chunk_size=3", "train.epochs=1", "train.validate=false"]
    with pytest.warns(DeprecationWarning, match="rank_block"):
        trainer = Trainer(cross_config(data, tmp_path, "scan", overrides))
    assert trainer.loss_fn.config.rank_block == 3


@pytest.mark.parametrize(
    ("model", "overrides"),
    [
        # dropout (global RNG), BatchNorm running statistics, VSL's CaptionTfidf, and the
        # all-negatives warm-up of its triplet base, interrupted mid-warm-up
        ("saf", ["loss.name=vsl", "train.all_negatives_epochs=2"]),
        ("scan", ["loss.name=adacl"]),  # AdaCL's margin buffers and extra state
    ],
)
def test_ctrl_c_mid_epoch_then_resume_matches_uninterrupted(
    tmp_path, data, model, overrides, monkeypatch
):
    overrides = [*overrides, "train.validate=false"]
    full = Trainer(cross_config(data, tmp_path / "full", model, overrides))
    full.fit()
    cfg = cross_config(data, tmp_path / "cut", model, overrides)
    original = Trainer.train_step

    def step_then_ctrl_c(self, batch):
        out = original(self, batch)
        if self.step == 7:  # in the middle of epoch 2 (5 batches per epoch)
            signal.raise_signal(signal.SIGINT)
        return out

    monkeypatch.setattr(Trainer, "train_step", step_then_ctrl_c)
    with pytest.raises(TrainingInterrupted) as err:
        Trainer(cfg).fit()
    monkeypatch.setattr(Trainer, "train_step", original)
    state = load_checkpoint(err.value.checkpoint)
    assert (state["epoch"], state["batch_in_epoch"], state["step"]) == (1, 2, 7)
    resumed = Trainer(cfg, resume=err.value.checkpoint)
    resumed.fit()
    assert_same_params(model_params(resumed.model), model_params(full.model))
    assert_same_params(resumed.loss_fn.state_dict(), full.loss_fn.state_dict())


# -- two gloo ranks against one process ------------------------------------------------------

#: model, optimiser steps, overrides. SGD, no clipping, no warm-up: see test_train_distributed.
#: SGRAF without dropout (each rank draws its own masks) and with its BatchNorms in eval mode:
#: in training mode they normalise over the images of the call, which under torchrun are the
#: rank's own (as for any DistributedDataParallel model with BatchNorm), so only the gradient
#: plumbing can be compared exactly.
DDP_SETTINGS = {
    "scan_triplet": ("scan", []),
    "scan_i2t_adacl": ("scan_i2t", ["loss.name=adacl"]),
    "bfan_unified": ("bfan", ["loss.name=unified", "loss.gamma=50"]),
    "sgr_vsl": ("sgr", ["loss.name=vsl", "model.dropout=0.0", "model.text.dropout=0.0"]),
    "saf_goal": ("saf", ["loss.name=goal", "model.dropout=0.0", "model.text.dropout=0.0"]),
}
#: SGRAF as it trains (BatchNorms in training mode, dropout): each rank normalises over its own
#: images, so only the replicas' agreement is compared (DDP averages the gradients).
DDP_TRAIN_MODE = {"saf_train_mode": ("saf", ["loss.name=unified", "loss.gamma=50"])}
DDP_STEPS = 2
DDP_COMMON = [
    "optim.name=sgd",
    "optim.lr=0.1",
    "optim.warmup_steps=0",
    "optim.grad_clip=0",
    "train.validate=false",
]
#: How many times the loss magnifies a score's rounding (as in test_train_distributed), and the
#: model: the attention softmax multiplies a raw score's rounding by lambda_softmax (<= 20).
LOSS_SCALE = {"triplet": 1, "unified": 50, "goal": 10, "adacl": 100, "vsl": 1000}


def ddp_tolerance(name: str) -> float:
    """Per step ``(64 + c) eps64`` with 16x headroom, as test_train_distributed's
    ``step_tolerance``, where ``c`` is the loss's logit scale times the attention's 20: both
    runs are float64 and differ in summation orders only (the score blocks of 4 local images
    against 8 captions, the gathered gradients, against 8 x 8 in one process)."""
    overrides = DDP_SETTINGS[name][1]
    loss = next((o.split("=")[1] for o in overrides if o.startswith("loss.name=")), "triplet")
    return DDP_STEPS * 16 * (64 + 20 * LOSS_SCALE[loss]) * torch.finfo(torch.float64).eps


def ddp_steps(data: Path, out: Path, name: str) -> dict[str, torch.Tensor]:
    model, overrides = {**DDP_SETTINGS, **DDP_TRAIN_MODE}[name]
    trainer = Trainer(cross_config(data, out / name, model, DDP_COMMON + overrides))
    for module in trainer.model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and name in DDP_SETTINGS:
            module.eval()
    return steps_state(trainer, DDP_STEPS)


def ddp_worker(rank: int, world: int, port: int, data: str, out: str) -> None:
    rank_env(rank, world, port)
    try:
        for name in [*DDP_SETTINGS, *DDP_TRAIN_MODE]:
            state = ddp_steps(Path(data), Path(out), name)
            torch.save(state, Path(out) / f"{name}.rank{rank}.pt")
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory, data):
    out = tmp_path_factory.mktemp("ddp_cross")
    args = (2, free_port(), str(data), str(out))
    # Forked, the ranks inherit the modules already imported (torch, scikit-learn: seconds of
    # CPU each when spawned); safe as DataLoader workers are: one thread before any operation.
    mp.start_processes(ddp_worker, args=args, nprocs=2, start_method="fork")
    return out


@pytest.mark.parametrize("name", list(DDP_SETTINGS))
def test_two_ranks_equal_one_process_on_the_concatenated_batch(ddp_run, data, tmp_path, name):
    """Each rank scores its 4 images against the 8 gathered captions; the row blocks make the
    8 x 8 matrix of one process, and the captions' gradient from both ranks' rows comes back
    to their rank: weights, loss buffers and gradients after 2 steps equal one process's."""
    ranks = [torch.load(ddp_run / f"{name}.rank{r}.pt", weights_only=True) for r in range(2)]
    assert [int(s["local_batch"]) for s in ranks] == [4, 4]
    torch.set_default_dtype(torch.float64)
    try:
        single = ddp_steps(data, tmp_path, name)
    finally:
        torch.set_default_dtype(torch.float32)
    assert int(single["local_batch"]) == 8
    assert single["grad.model.text_encoder.embed.weight"].dtype == torch.float64
    for state in ranks:
        assert_steps_equal(state, single, ddp_tolerance(name))


def test_sgraf_trains_under_torchrun_with_training_mode_batchnorm(ddp_run):
    """Per-rank BatchNorm statistics and dropout masks, but one gradient: after 2 steps both
    replicas hold the same weights, which moved."""
    ranks = [torch.load(ddp_run / f"saf_train_mode.rank{r}.pt", weights_only=True) for r in (0, 1)]
    params = [k for k in ranks[0] if k.startswith("model.") and "running" not in k]
    params = [k for k in params if "num_batches" not in k]
    assert "model.scorer.saf.bn.weight" in params
    for k in params:
        assert torch.equal(ranks[0][k], ranks[1][k]), k
    key = "model.scorer.saf.bn.weight"
    assert not torch.equal(ranks[0][key], ranks[0][f"init.{key}"])
