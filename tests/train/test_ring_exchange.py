"""SigLIP's ring exchange (``train.exchange = "ring" | "bidir"``, :mod:`vlret.train.parallel.ring`).

2 and 3 forked gloo ranks in float64: each rank's share of the loss, the gradients of its image
and text embeddings and its share of the log-scale's and bias's gradients add up to (or equal
the rows of) one process's dense SigLIP on the concatenated batch, for both exchanges, dense and
tiled blocks, with and without ids shared across ranks. A 2-rank trainer with the ring takes the
same two steps as with the all-gather. Tolerances: float64 sums of at most a few hundred terms of
size <= ~10 (the logit scale): 1e-12 of each tensor's scale is thousands of eps of headroom and
far below any error of a misrouted block or gradient (order one)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from test_train_distributed import free_port

from train_helpers import rank_env, steps_state, tiny_config, tiny_data
from vlret.losses import build_loss, siglip_loss
from vlret.run.config import ConfigError
from vlret.train import Trainer
from vlret.train.parallel.distributed import init_distributed
from vlret.train.parallel.ring import ring_loss, ring_terms

LOCAL, DIM = 4, 5
#: (exchange, tile height, ids): ``None`` ids are each pair's own; "shared" repeats ids across
#: ranks (further positives in other ranks' blocks).
CASES = [
    (exchange, chunk, ids)
    for exchange in ("ring", "bidir")
    for chunk in (None, 3)
    for ids in (None, "shared")
]
PARAMS = {"log_scale": math.log(5.0), "bias": -3.0}
TOL = 1e-12


def global_batch(world: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Images, texts and shared ids of the concatenated ``world * LOCAL`` batch (float64)."""
    gen = torch.Generator().manual_seed(world)
    n = world * LOCAL
    img = torch.randn(n, DIM, generator=gen, dtype=torch.float64)
    txt = img + 0.7 * torch.randn(n, DIM, generator=gen, dtype=torch.float64)
    ids = torch.arange(n) % (LOCAL + 1)  # 5 ids over 8 or 12 pairs: equal ids across ranks
    return img, txt, ids


def case_name(case: tuple) -> str:
    return "-".join(str(part) for part in case)


def one_rank_case(world: int, me: int, case: tuple) -> dict[str, torch.Tensor]:
    exchange, chunk, kind = case
    img, txt, ids = global_batch(world)
    rows = slice(me * LOCAL, (me + 1) * LOCAL)
    x, y = img[rows].clone().requires_grad_(), txt[rows].clone().requires_grad_()
    loss_fn = build_loss("siglip", chunk_size=chunk, **PARAMS)
    local_ids = ids[rows] if kind == "shared" else None
    loss = ring_loss(loss_fn, x, y, local_ids, bidir=exchange == "bidir")
    loss.backward()
    return {
        "loss": loss.detach(),
        "img": x.grad,
        "txt": y.grad,
        "log_scale": loss_fn.log_scale.grad,
        "bias": loss_fn.bias.grad,
    }


def trainer_run(data: Path, out: Path, overrides: list[str]) -> dict[str, torch.Tensor]:
    common = ["loss.name=siglip", "optim.name=sgd", "optim.lr=0.1", "optim.warmup_steps=0"]
    common += ["optim.grad_clip=0", "train.validate=false"]
    trainer = Trainer(tiny_config(data, out, common + overrides))
    exchange = trainer.exchange
    state = steps_state(trainer, 2)
    state["exchange_ring"] = torch.tensor(exchange != "gather")
    for k, p in trainer.loss_fn.named_parameters():
        state[f"loss.{k}"] = p.detach().clone()
    return state


def worker(me: int, world: int, port: int, out: str, data: str) -> None:
    rank_env(me, world, port)
    try:
        init_distributed(backend="gloo")
        results = {case_name(c): one_rank_case(world, me, c) for c in CASES}
        torch.save(results, Path(out) / f"loss.rank{me}.pt")
        if data:  # the trainer: ring / bidir (tiled) against the all-gather
            runs = {
                "gather": [],
                "ring": ["train.exchange=ring"],
                "gather_tiled": ["loss.chunk_size=3"],
                "bidir_tiled": ["loss.chunk_size=3", "train.exchange=bidir"],
                # chunks of 3 of each rank's 4 pairs, re-encoded after the ring's backward
                "ring_grad_cache": ["train.exchange=ring", "train.grad_cache_chunk=3"],
            }
            states = {k: trainer_run(Path(data), Path(out) / k, v) for k, v in runs.items()}
            torch.save(states, Path(out) / f"trainer.rank{me}.pt")
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(world: int, out: Path, data: Path | None = None) -> None:
    # Forked (a spawned rank re-imports torch: seconds each); one thread per rank from the start.
    args = (world, free_port(), str(out), str(data) if data else "")
    mp.start_processes(worker, args=args, nprocs=world, start_method="fork")


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    root = tmp_path_factory.mktemp("ring2")
    data = tiny_data(root / "data")
    run_ranks(2, root, data)
    return root


@pytest.fixture(scope="module")
def three_ranks(tmp_path_factory):
    root = tmp_path_factory.mktemp("ring3")
    run_ranks(3, root)
    return root


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory):
    """4 ranks: ``"bidir"`` takes one two-way round and then one rightward step."""
    root = tmp_path_factory.mktemp("ring4")
    run_ranks(4, root)
    return root


def single_process(world: int, case: tuple) -> dict[str, torch.Tensor]:
    """Dense SigLIP on the concatenated batch in one process: the oracle."""
    img, txt, ids = global_batch(world)
    x, y = img.clone().requires_grad_(), txt.clone().requires_grad_()
    t = torch.tensor(PARAMS["log_scale"], dtype=torch.float64, requires_grad=True)
    b = torch.tensor(PARAMS["bias"], dtype=torch.float64, requires_grad=True)
    sim = torch.nn.functional.normalize(x, dim=1) @ torch.nn.functional.normalize(y, dim=1).t()
    pos_mask = ids[:, None] == ids[None, :] if case[2] == "shared" else None
    loss = siglip_loss(sim, scale=t.exp(), bias=b, pos_mask=pos_mask)
    loss.backward()
    return {
        "loss": loss.detach(),
        "img": x.grad,
        "txt": y.grad,
        "log_scale": t.grad,
        "bias": b.grad,
    }


def close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    scale = max(want.abs().max().item(), 1e-300)
    torch.testing.assert_close(got, want, rtol=0, atol=TOL * scale, msg=lambda m: f"{what}: {m}")


def check_ranks(root: Path, world: int, case: tuple) -> None:
    ranks = [torch.load(root / f"loss.rank{r}.pt", weights_only=True) for r in range(world)]
    got = [r[case_name(case)] for r in ranks]
    want = single_process(world, case)
    # the ranks' shares of the loss and of the loss parameters' gradients add up
    for key in ("loss", "log_scale", "bias"):
        close(sum(g[key] for g in got), want[key], key)
    # each rank's embeddings get exactly their rows of the single-process gradient
    for key in ("img", "txt"):
        close(torch.cat([g[key] for g in got]), want[key], key)


@pytest.mark.parametrize("case", CASES, ids=case_name)
def test_two_ranks_equal_one_process_on_the_concatenated_batch(two_ranks, case):
    check_ranks(two_ranks, 2, case)


@pytest.mark.parametrize("case", CASES, ids=case_name)
def test_three_ranks_equal_one_process_on_the_concatenated_batch(three_ranks, case):
    check_ranks(three_ranks, 3, case)


@pytest.mark.parametrize("case", [c for c in CASES if c[0] == "bidir"], ids=case_name)
def test_four_ranks_bidir_equal_one_process_on_the_concatenated_batch(four_ranks, case):
    check_ranks(four_ranks, 4, case)


def test_shared_ids_add_positives_in_other_ranks_blocks(three_ranks):
    """The shared-id case differs from the own-pairs case: the other blocks' ids are used."""
    ranks = [torch.load(three_ranks / f"loss.rank{r}.pt", weights_only=True) for r in range(3)]
    own, shared = (sum(r[f"ring-None-{k}"]["loss"] for r in ranks) for k in ("None", "shared"))
    assert abs(float(own - shared)) > 0.1


def test_trainer_ring_takes_the_same_steps_as_the_gather(two_ranks):
    for r in range(2):
        states = torch.load(two_ranks / f"trainer.rank{r}.pt", weights_only=True)
        rings = [bool(states[k]["exchange_ring"]) for k in states]
        assert rings == [False, True, False, True, True]
        pairs = (("ring", "gather"), ("bidir_tiled", "gather_tiled"), ("ring_grad_cache", "gather"))
        for ring, gather in pairs:
            a, b = states[ring], states[gather]
            assert a.keys() == b.keys()
            for k in b:
                if k.startswith("init."):
                    assert torch.equal(a[k], b[k]), k
                elif k.startswith(("model.", "grad.", "loss.", "loss_value")):
                    start = b.get(f"init.{k}", torch.zeros_like(b[k]))
                    close(a[k] - start, b[k] - start, f"{ring} {k}")
            moved = states[gather]["model.image_encoder.fc.weight"]
            assert not torch.equal(moved, states[gather]["init.model.image_encoder.fc.weight"])


def test_one_process_ring_terms_are_the_dense_rows():
    img, txt, ids = global_batch(1)
    loss_fn = build_loss("siglip", reduction="none", chunk_size=3, **PARAMS)
    got = ring_terms(loss_fn, img, txt, ids)
    sim = torch.nn.functional.normalize(img, dim=1) @ torch.nn.functional.normalize(txt, dim=1).t()
    want = siglip_loss(
        sim,
        scale=math.exp(PARAMS["log_scale"]),
        bias=PARAMS["bias"],
        pos_mask=ids[:, None] == ids[None, :],
        reduction="none",
    )
    close(got.detach(), want, "terms")


def test_ring_refuses_a_loss_that_is_not_a_pair_sum():
    with pytest.raises(ValueError, match="pairwise_sum"):
        ring_terms(build_loss("infonce"), torch.randn(4, 3), torch.randn(4, 3))


@pytest.mark.parametrize(
    ("loss", "value", "match"),
    [("triplet", "ring", "loss 'triplet'"), ("siglip", "allgather", "expected one of")],
)
def test_exchange_key_refused(tmp_path, loss, value, match):
    data = tiny_data(tmp_path / "data")
    with pytest.raises(ConfigError, match=f"train.exchange: .*{match}"):  # when read
        tiny_config(data, tmp_path / "run", [f"loss.name={loss}", f"train.exchange={value}"])


def test_exchange_is_checked_when_the_config_is_read(tmp_path):
    from train_helpers import tiny_raw
    from vlret.run.config import config_from_dict

    raw = tiny_raw(tmp_path / "data", tmp_path / "out")
    raw["train"]["exchange"] = "bidir"
    with pytest.raises(ConfigError, match=r"train\.exchange: 'bidir' needs .* loss 'triplet'"):
        config_from_dict(raw)
    raw["loss"] = {"name": "siglip"}
    assert config_from_dict(raw).train.exchange == "bidir"
