"""Procedures under torchrun: AdaCL's memory bank of a pair scorer (``train.procedure =
"pair_bank"``) and AOQ's pair-scoring path, each on two forked gloo ranks against one process on
the concatenated batch, all in float64: the weights, gradients, loss buffers, momentum encoder
and (for the bank) the bank's contents after several steps agree within a float64 tolerance."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from test_aoq_training import mined_file
from test_train_distributed import free_port

from train_helpers import assert_steps_equal, rank_env, steps_state, tiny_data, tiny_raw
from vlret.run.config import apply_overrides, config_from_dict
from vlret.train import Trainer
from vlret.train.procedures.aoq import AOQStep
from vlret.train.procedures.pair_bank import PairBankStep

#: Tiny pair scorers on the tiny precomp data (4 regions of 16 features per image).
MODELS = {
    "scan": {"kind": "scan", "aggregation": "lse"},
    "bfan": {"kind": "bfan", "focal": "prob"},
}
#: name: (model, steps, overrides). The bank of 12 entries takes the 8 momentum encodings of
#: each global batch: empty at step 1, 8 entries at step 2, wrapped around at step 3 (the
#: newest 12 of 16), so the third step scores against keys of both earlier steps.
SETTINGS = {
    "scan_pair_bank": (
        "scan",
        3,
        ["loss.name=adacl", "loss.queue_size=12", "train.momentum_encoder=0.9"],
    ),
    "scan_aoq": ("scan", 2, ["loss.name=aoq", "train.procedure_options.pair_block=3"]),
    "bfan_aoq": ("bfan", 2, ["loss.name=aoq"]),
}
#: SGD, no clipping, no warm-up (test_train_distributed's reasons).
COMMON = [
    "optim.name=sgd",
    "optim.lr=0.1",
    "optim.warmup_steps=0",
    "optim.grad_clip=0",
    "train.validate=false",
]
#: How many times the loss magnifies a score's rounding: AdaCL's m1 (~100), AOQ's 1 / alpha.
LOSS_SCALE = {"scan_pair_bank": 100, "scan_aoq": 10, "bfan_aoq": 10}


def tolerance(name: str) -> float:
    """Per step ``(64 + 20 c) eps64`` with 16x headroom, as test_train_cross's
    ``ddp_tolerance`` (``c`` the loss's scale, 20 the attention softmax's): both runs are
    float64 and differ in summation orders only."""
    steps = SETTINGS[name][1]
    return steps * 16 * (64 + 20 * LOSS_SCALE[name]) * torch.finfo(torch.float64).eps


def config(data: Path, negatives: Path, out: Path, name: str):
    model, _, overrides = SETTINGS[name]
    raw = tiny_raw(data, out)
    raw["model"] = {**MODELS[model], "embed_dim": 16, "image": {"in_dim": 16}}
    raw["model"]["text"] = {"word_dim": 8}
    if "loss.name=aoq" in overrides:
        raw["data"].update(offline_negatives=str(negatives), offline_candidates=4)
    return config_from_dict(apply_overrides(raw, [*COMMON, *overrides]))


def run_steps(data: Path, negatives: Path, out: Path, name: str) -> dict[str, torch.Tensor]:
    trainer = Trainer(config(data, negatives, out / name, name), print_fn=None)
    step = trainer.loss_step
    assert isinstance(step, PairBankStep if "bank" in name else AOQStep)
    if isinstance(step, AOQStep):
        trainer.train_set.set_seed(trainer.config.train.seed)  # DrawSeed's before_epoch
    momentum = trainer.momentum_encoder
    state = steps_state(trainer, SETTINGS[name][1])
    if isinstance(step, PairBankStep):
        state.update({f"bank.{k}": v.clone() for k, v in step.ready_bank().state_dict().items()})
    if momentum is not None:
        state.update({f"momentum.{k}": v.clone() for k, v in momentum.state_dict().items()})
    return state


def worker(rank: int, world: int, port: int, data: str, negatives: str, out: str) -> None:
    rank_env(rank, world, port)
    try:
        for name in SETTINGS:
            state = run_steps(Path(data), Path(negatives), Path(out), name)
            torch.save(state, Path(out) / f"{name}.rank{rank}.pt")
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("procedures_ddp")
    data = tiny_data(root / "data")
    return data, mined_file(root, data=data)


@pytest.fixture(scope="module")
def ranks_run(tmp_path_factory, files):
    out = tmp_path_factory.mktemp("ranks")
    data, negatives = files
    args = (2, free_port(), str(data), str(negatives), str(out))
    # forked: the ranks inherit the imported modules (test_train_cross's reasons)
    mp.start_processes(worker, args=args, nprocs=2, start_method="fork")
    return out


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("name", list(SETTINGS))
def test_two_ranks_equal_one_process_on_the_concatenated_batch(ranks_run, files, tmp_path, name):
    """Each rank scores its 4 images against the 8 gathered captions and its own items against
    the bank (or their offline pairs); the gathered blocks make one process's scores and the
    gradients averaged by hand its gradient: weights, gradients, loss buffers, momentum
    encoder and bank after the steps equal one process's on the 8-item batches."""
    ranks = [torch.load(ranks_run / f"{name}.rank{r}.pt", weights_only=True) for r in range(2)]
    assert [int(s["local_batch"]) for s in ranks] == [4, 4]
    data, negatives = files
    torch.set_default_dtype(torch.float64)
    try:
        single = run_steps(data, negatives, tmp_path, name)
    finally:
        torch.set_default_dtype(torch.float32)
    assert int(single["local_batch"]) == 8
    assert single["grad.model.text_encoder.embed.weight"].dtype == torch.float64
    for state in ranks:
        assert_steps_equal(state, single, tolerance(name))
    if name == "scan_pair_bank":  # the bank wrapped around: 16 keys into 12 slots
        assert int(single["bank.ptr"]) == (3 * 8) % 12 and bool(single["bank.valid"].all())
        for state in ranks:  # the same entries in the same slots on every rank
            assert torch.equal(state["bank.ids"], single["bank.ids"])
            assert torch.equal(state["bank.lengths"], single["bank.lengths"])
