"""Two CPU ranks (gloo): one optimisation step equals the single-process step on the
concatenated batch (in-batch negatives gathered from all ranks, gradient scaled by the world
size to undo DDP's averaging)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader

from train_helpers import assert_same_params, tiny_config, tiny_data
from vlret.train import Trainer
from vlret.train.distributed import ShardedBatchSampler

SETTINGS = {
    "triplet_sgd": ["optim.name=sgd", "optim.lr=0.1"],
    "infonce_learnable_adam": [
        "loss.name=infonce",
        "loss.learnable_temperature=true",
        "optim.lr=0.01",
    ],
    "adacl_sgd": ["loss.name=adacl", "optim.name=sgd", "optim.lr=0.1"],
    "vsl_sgd": ["loss.name=vsl", "optim.name=sgd", "optim.lr=0.1", "optim.grad_clip=0"],
}
COMMON = ["optim.warmup_steps=0", "train.validate=false"]


def one_step(data: Path, out: Path, name: str) -> dict[str, torch.Tensor]:
    trainer = Trainer(tiny_config(data, out / name, COMMON + SETTINGS[name]))
    trainer.sampler.set_epoch(0)
    loader = DataLoader(
        trainer.train_set, batch_sampler=trainer.sampler, collate_fn=trainer.train_set.collate
    )
    batch = next(iter(loader))
    loss, _ = trainer.train_step(batch)
    state = {f"model.{k}": v.detach().clone() for k, v in trainer.model.state_dict().items()}
    for k, p in trainer.model.named_parameters():
        state[f"grad.{k}"] = p.grad.detach().clone()
    for k, v in trainer.loss_fn.state_dict().items():
        if isinstance(v, torch.Tensor):
            state[f"loss.{k}"] = v.detach().clone()
    state["loss_value"] = torch.tensor(loss)
    state["local_batch"] = torch.tensor(len(batch.img_index))
    return state


def worker(rank: int, world: int, port: int, data: str, out: str) -> None:
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    torch.set_num_threads(1)
    try:
        for name in SETTINGS:
            state = one_step(Path(data), Path(out), name)
            torch.save(state, Path(out) / f"{name}.rank{rank}.pt")
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
    single = one_step(data, tmp_path, name)
    assert int(single["local_batch"]) == 8
    for state in ranks:
        torch.testing.assert_close(state["loss_value"], single["loss_value"], atol=1e-6, rtol=1e-6)
        params = {k: v for k, v in state.items() if k.startswith(("model.", "loss."))}
        expected = {k: v for k, v in single.items() if k.startswith(("model.", "loss."))}
        assert_same_params(params, expected, atol=1e-6)
        for k, g in single.items():
            if k.startswith("grad."):
                torch.testing.assert_close(state[k], g, atol=1e-5, rtol=1e-5, msg=k)


def test_sharded_sampler_concatenates_to_the_global_batch():
    single = list(ShardedBatchSampler(20, 8, seed=3))
    shards = [list(ShardedBatchSampler(20, 8, seed=3, rank=r, world_size=2)) for r in range(2)]
    assert [a + b for a, b in zip(*shards, strict=True)] == single
    with pytest.raises(ValueError, match="multiple of the number of ranks"):
        ShardedBatchSampler(20, 7, world_size=2)
