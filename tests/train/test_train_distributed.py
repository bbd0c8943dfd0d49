"""Two CPU ranks (gloo): optimisation steps equal the single-process steps on the concatenated
batch (in-batch negatives gathered from all ranks, gradient scaled by the world size to undo
DDP's averaging), for AdaCL also with a memory queue filled by a momentum encoder.

Both sides run in float32 (the trainer computes losses in float32) with different summation
orders (4-row shards plus an all-reduce against 8 rows), so they agree to float32 rounding of
each tensor's scale, not bit for bit; see :func:`step_tolerance`."""

from __future__ import annotations

import socket
import weakref
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader

from train_helpers import assert_same_params, rank_env, tiny_config, tiny_data
from vlret.losses import build_loss
from vlret.train import Trainer, train
from vlret.train.hooks.core import StepOutput, SyncLossBuffers
from vlret.train.parallel.distributed import (
    ShardedBatchSampler,
    init_distributed,
    shutdown_distributed,
)

SETTINGS = {
    "triplet_sgd": ["optim.name=sgd", "optim.lr=0.1"],
    # Clipped after DDP's average and the loss-parameter rescale: the global norm must match.
    "infonce_learnable_sgd": [
        "loss.name=infonce",
        "loss.learnable_temperature=true",
        "optim.name=sgd",
        "optim.lr=0.1",
        "optim.grad_clip=2.0",
    ],
    "adacl_sgd": ["loss.name=adacl", "optim.name=sgd", "optim.lr=0.1"],
    "vsl_sgd": ["loss.name=vsl", "optim.name=sgd", "optim.lr=0.1", "optim.grad_clip=0"],
    # Eq. 7's caption matrix: each rank looks up every rank's captions, in rank order.
    "vsl_text_side_sgd": ["loss.name=vsl", "loss.text_side=true", "optim.name=sgd", "optim.lr=0.1"],
    # A queue smaller than the 3 steps' 24 keys wraps around, and a momentum encoder fills it:
    # the later steps score against keys of the earlier ones.
    "adacl_queue_momentum_sgd": [
        "loss.name=adacl",
        "loss.queue_size=16",
        "train.momentum_encoder=0.9",
        "optim.name=sgd",
        "optim.lr=0.1",
    ],
    # Tiled losses split into local shards on 2 ranks (each rank its own pairs' terms) against the
    # tiled loss over the whole batch in one process.
    "infonce_tiled_local_shards": [
        "loss.name=infonce",
        "loss.learnable_temperature=true",
        "loss.chunk_size=3",
        "optim.name=sgd",
        "optim.lr=0.1",
    ],
    "unified_tiled_local_shards": [
        "loss.name=unified",
        "loss.chunk_size=3",
        "optim.name=sgd",
        "optim.lr=0.1",
    ],
    # Tiled AdaCL (loss, margin update and queue blocks streamed) on the gathered batch.
    "adacl_tiled_queue_momentum_sgd": [
        "loss.name=adacl",
        "loss.queue_size=16",
        "loss.chunk_size=3",
        "train.momentum_encoder=0.9",
        "optim.name=sgd",
        "optim.lr=0.1",
    ],
    "goal_tiled_local_shards": [
        "loss.name=goal",
        "loss.chunk_size=3",
        "optim.name=sgd",
        "optim.lr=0.1",
    ],
    "triplet_tiled_local_shards": ["loss.chunk_size=3", "optim.name=sgd", "optim.lr=0.1"],
    # Learnable log-scale and bias (the defaults): their gradients are compared too.
    "siglip_tiled_local_shards": [
        "loss.name=siglip",
        "loss.chunk_size=3",
        "optim.name=sgd",
        "optim.lr=0.1",
    ],
    # Gradient caching (chunks of 3 of each rank's 4 pairs: 3 + 1) under DDP: every chunk but
    # the last back-propagates under no_sync(); tests/test_grad_cache.py shows one process with
    # it equals one without.
    "infonce_tiled_local_shards_grad_cache": [
        "loss.name=infonce",
        "loss.learnable_temperature=true",
        "loss.chunk_size=3",
        "train.grad_cache_chunk=3",
        "optim.name=sgd",
        "optim.lr=0.1",
    ],
    "adacl_queue_momentum_grad_cache": [
        "loss.name=adacl",
        "loss.queue_size=16",
        "train.momentum_encoder=0.9",
        "train.grad_cache_chunk=3",
        "optim.name=sgd",
        "optim.lr=0.1",
    ],
}
#: Optimisation steps per setting (the queue's contents matter from the second step on).
STEPS = {
    "adacl_queue_momentum_sgd": 3,
    "adacl_tiled_queue_momentum_sgd": 3,
    "adacl_queue_momentum_grad_cache": 3,
}
# SGD throughout: Adam's first step lr * g / (|g| + 1e-8) turns the rounding of a gradient entry
# near 1e-8 into a change of order lr. No clipping: it hides a wrong world-size scale.
COMMON = ["optim.warmup_steps=0", "optim.grad_clip=0", "train.validate=false"]
#: How many times each loss magnifies a cosine's rounding: 1 / temperature, gamma, GOAL's tau
#: and beta, AdaCL's m1 (20 adapting to ~90 here), VSL's smooth-rank 1 / tau.
LOGIT_SCALE = {"triplet": 1, "infonce": 20, "unified": 60, "goal": 10, "adacl": 100, "vsl": 1000}
LOGIT_SCALE["siglip"] = 10  # e^t at its initial t = log 10


def step_tolerance(name: str) -> float:
    """Allowed difference of the two runs after the setting's steps, relative to the largest
    entry of what is compared (a step's change of a parameter or buffer, a gradient, the loss).

    Both run in float64 (default dtype float64; the trainer keeps float64 embeddings), in two
    summation orders (4-row shards and an all-reduce against 8 rows): sums of n <= 64 terms
    differ by ~n eps of their scale, a cosine's few eps come out of the loss magnified by its
    logit scale c; per step (64 + c) eps64 with 16x headroom. In float64 the discrete choices
    of AdaCL's margin update (median anchor, clone bins) cannot flip on another CPU's
    rounding. The bugs this test is for move some compared tensor by many orders of magnitude
    more (measured by breaking the trainer: no world-size scale, a wrong anchor offset, a
    loss-parameter gradient not all-reduced or not divided by the world size, the queue
    enqueued twice).
    """
    loss = next((o.split("=")[1] for o in SETTINGS[name] if o.startswith("loss.name=")), "triplet")
    return STEPS.get(name, 1) * 16 * (64 + LOGIT_SCALE[loss]) * torch.finfo(torch.float64).eps


def _state(trainer: Trainer) -> dict[str, torch.Tensor]:
    """Weights, loss buffers (margins, queues) and momentum encoder: what a step changes."""
    state = {f"model.{k}": v.detach().clone() for k, v in trainer.model.state_dict().items()}
    for k, v in trainer.loss_fn.state_dict().items():
        if isinstance(v, torch.Tensor):
            state[f"loss.{k}"] = v.detach().clone()
    if trainer.momentum_encoder is not None:
        for k, v in trainer.momentum_encoder.state_dict().items():
            state[f"momentum.{k}"] = v.detach().clone()
    return state


def run_steps(data: Path, out: Path, name: str) -> dict[str, torch.Tensor]:
    """``STEPS[name]`` (default 1) optimisation steps from the start; the initial state
    (``init.`` keys), the final state and the last step's gradients."""
    trainer = Trainer(tiny_config(data, out / name, COMMON + SETTINGS[name]))
    state = {f"init.{k}": v for k, v in _state(trainer).items()}
    trainer.sampler.set_epoch(0)
    loader = DataLoader(
        trainer.train_set, batch_sampler=trainer.sampler, collate_fn=trainer.train_set.collate
    )
    batches = iter(loader)
    for _ in range(STEPS.get(name, 1)):
        batch = next(batches)
        loss, _ = trainer.train_step(batch)
    wrapper = weakref.ref(trainer.ddp_model)
    trainer.close()  # drop the DDP wrapper now: alive at exit it can abort the process
    released = trainer.ddp_model is trainer.model and (trainer.world == 1 or wrapper() is None)
    state.update(_state(trainer))
    for k, p in trainer.model.named_parameters():
        state[f"grad.model.{k}"] = p.grad.detach().clone()
    for k, p in trainer.loss_fn.named_parameters():  # a learnable temperature (DDP skips it)
        if p.grad is not None:
            state[f"grad.loss.{k}"] = p.grad.detach().clone()
    state["loss_value"] = torch.tensor(loss)
    state["local_batch"] = torch.tensor(len(batch.img_index))
    state["local_shards"] = torch.tensor(trainer.local_shards)
    state["ddp_released"] = torch.tensor(released)
    return state


def worker(rank: int, world: int, port: int, data: str, out: str) -> None:
    rank_env(rank, world, port)
    try:
        for name in SETTINGS:
            state = run_steps(Path(data), Path(out), name)
            torch.save(state, Path(out) / f"{name}.rank{rank}.pt")
        # AdaCL's margin sync hook: every rank ends with rank 0's margins.
        adacl = build_loss("adacl")
        adacl.m1.fill_(20.0 + rank)
        adacl.m2.fill_(0.5 * (rank + 1))
        hooks = Trainer(tiny_config(Path(data), Path(out) / "sync", ["loss.name=adacl"])).hooks
        assert [type(h).__name__ for h in hooks] == ["SyncLossBuffers"]
        SyncLossBuffers(adacl.synced_buffers()).after_step(None, StepOutput(loss=0.0, lr=0.0))
        synced = [float(adacl.m1), float(adacl.m2)]
        # The user's path: train() runs, then destroys the group the trainers created.
        result = train(tiny_config(Path(data), Path(out) / "train_api", COMMON))
        after = {"initialized": dist.is_initialized(), "epochs": result.epochs_done}
        after["synced"] = synced
        torch.save(after, Path(out) / f"train_api.rank{rank}.pt")
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def distributed_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("ddp")
    data = tiny_data(root / "data")
    out = root / "out"
    out.mkdir()
    mp.start_processes(
        worker, args=(2, free_port(), str(data), str(out)), nprocs=2, start_method="spawn"
    )
    return data, out


@pytest.mark.parametrize("name", list(SETTINGS))
def test_two_ranks_equal_one_process_on_the_concatenated_batch(distributed_run, tmp_path, name):
    data, out = distributed_run
    ranks = [torch.load(out / f"{name}.rank{r}.pt", weights_only=True) for r in range(2)]
    assert [int(s["local_batch"]) for s in ranks] == [4, 4]
    torch.set_default_dtype(torch.float64)
    try:
        single = run_steps(data, tmp_path, name)
    finally:
        torch.set_default_dtype(torch.float32)
    assert single["grad.model.image_encoder.fc.weight"].dtype == torch.float64
    assert int(single["local_batch"]) == 8
    assert [bool(s["local_shards"]) for s in ranks] == ["local_shards" in name] * 2
    if "loss.img_queue.valid" in single:  # 3 steps of 8 keys: the queue of 16 has wrapped
        assert bool(single["loss.img_queue.valid"].all()) and int(single["loss.img_queue.ptr"]) == 8
    if "infonce_learnable" in name:
        assert "grad.loss.log_scale" in single  # the loss parameter's gradient is compared
    tol = step_tolerance(name)
    for state in ranks:
        assert state.keys() == single.keys()
        # Same seed, same code, same machine: the initial states are identical.
        init = {k: v for k, v in single.items() if k.startswith("init.")}
        assert_same_params({k: state[k] for k in init}, init)
        for k, want in single.items():
            if k.startswith(("model.", "loss.", "momentum.")) and want.is_floating_point():
                # What the steps changed: the initial values cancel exactly (same on both).
                start = single[f"init.{k}"].double()
                assert_close_to_scale(state[k].double() - start, want.double() - start, tol, k)
            elif k.startswith(("model.", "loss.", "momentum.")):
                assert torch.equal(state[k], want), k  # integer buffers: queue ids, pointers
            elif k.startswith(("grad.", "loss_value")):
                assert_close_to_scale(state[k], want, tol, k)


def assert_close_to_scale(got: torch.Tensor, want: torch.Tensor, tol: float, key: str) -> None:
    """``|got - want| <= tol * max |want|`` entrywise: float32 rounding of the tensor's scale
    (entries near zero carry the rounding of the large ones)."""
    scale = want.abs().max().item()
    torch.testing.assert_close(got, want, rtol=0, atol=tol * scale, msg=lambda m: f"{key}: {m}")


def test_train_releases_ddp_and_destroys_the_group_it_created(distributed_run):
    _, out = distributed_run
    for r in range(2):
        after = torch.load(out / f"train_api.rank{r}.pt")
        synced = [20.0, 0.5]  # rank 0's margins
        assert after == {"initialized": False, "epochs": 3, "synced": synced}
        for name in SETTINGS:
            assert bool(torch.load(out / f"{name}.rank{r}.pt")["ddp_released"]), name


def test_shutdown_leaves_a_group_the_caller_created(tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "1")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        assert init_distributed().world_size == 1  # reused, not created
        shutdown_distributed()
        assert dist.is_initialized()
    finally:
        dist.destroy_process_group()


def test_sharded_sampler_concatenates_to_the_global_batch():
    single = list(ShardedBatchSampler(20, 8, seed=3))
    shards = [list(ShardedBatchSampler(20, 8, seed=3, rank=r, world_size=2)) for r in range(2)]
    assert [a + b for a, b in zip(*shards, strict=True)] == single
    with pytest.raises(ValueError, match="multiple of the number of ranks"):
        ShardedBatchSampler(20, 7, world_size=2)
