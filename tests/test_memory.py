"""Memory queue (ring buffer with ids) and momentum encoder; a two-process gloo run."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from vlret.losses import AdaCLLoss
from vlret.memory import NO_ID, MemoryQueue, MomentumEncoder


class NaiveQueue:
    """Slot-by-slot FIFO: each row overwrites the slot at the pointer, which then advances."""

    def __init__(self, size: int):
        self.slots: list[tuple[list[float], int] | None] = [None] * size
        self.ptr = 0

    def enqueue(self, rows: list[list[float]], ids: list[int]) -> None:
        for row, i in zip(rows, ids, strict=True):
            self.slots[self.ptr] = (row, i)
            self.ptr = (self.ptr + 1) % len(self.slots)


def assert_same(queue: MemoryQueue, naive: NaiveQueue) -> None:
    assert int(queue.ptr) == naive.ptr
    for k, slot in enumerate(naive.slots):
        if slot is None:
            assert not bool(queue.valid[k]) and int(queue.ids[k]) == NO_ID
        else:
            assert bool(queue.valid[k])
            assert queue.keys[k].tolist() == slot[0]
            assert int(queue.ids[k]) == slot[1]


def test_wrap_around_matches_naive_fifo():
    g = torch.Generator().manual_seed(0)
    queue, naive = MemoryQueue(7, 3), NaiveQueue(7)
    next_id = 0
    for n in [3, 3, 0, 5, 1, 9, 16, 2, 7, 4]:
        keys = torch.randn(n, 3, generator=g)
        ids = list(range(next_id, next_id + n))
        next_id += n
        mask = torch.rand(n, generator=g) > 0.25
        queue.enqueue(keys, torch.tensor(ids, dtype=torch.long), mask=mask)
        kept = [k for k in range(n) if bool(mask[k])]
        naive.enqueue([keys[k].tolist() for k in kept], [ids[k] for k in kept])
        assert_same(queue, naive)
        assert len(queue) == sum(s is not None for s in naive.slots)


def test_first_fill_and_wrap_positions():
    queue = MemoryQueue(5, 1)
    queue.enqueue(torch.tensor([[1.0], [2.0], [3.0]]), [10, 11, 12])
    assert not queue.is_full and len(queue) == 3 and int(queue.ptr) == 3
    queue.enqueue(torch.tensor([[4.0], [5.0], [6.0]]), [13, 14, 15])
    assert queue.is_full and int(queue.ptr) == 1
    assert queue.keys.flatten().tolist() == [6.0, 2.0, 3.0, 4.0, 5.0]
    assert queue.ids.tolist() == [15, 11, 12, 13, 14]


def test_gather_false_is_identical_in_a_single_process():
    a, b = MemoryQueue(5, 3), MemoryQueue(5, 3)
    for k in range(3):
        keys = torch.randn(3, 3)
        a.enqueue(keys, [k, k, k + 1])
        b.enqueue(keys, [k, k, k + 1], gather=False)
    for name, buf in a.state_dict().items():
        assert torch.equal(buf, b.state_dict()[name]), name


def test_negative_mask_excludes_own_image_and_empty_slots():
    queue = MemoryQueue(6, 2)
    queue.enqueue(torch.ones(4, 2), [7, 8, 7, 9])  # two captions of image 7
    mask = queue.negative_mask(torch.tensor([7, 9, 5]))
    assert mask.tolist() == [
        [False, True, False, True, False, False],
        [True, True, True, False, False, False],
        [True, True, True, True, False, False],
    ]
    assert queue.negative_mask().tolist() == [[True] * 4 + [False] * 2]
    queue.enqueue(torch.ones(1, 2))  # no id: a negative of every query
    assert queue.negative_mask([7]).tolist() == [[False, True, False, True, True, False]]


def test_keys_are_detached_and_cast():
    queue = MemoryQueue(4, 2)
    keys = torch.randn(2, 2, dtype=torch.float64, requires_grad=True)
    queue.enqueue(keys)
    assert queue.keys.dtype == torch.float32 and not queue.keys.requires_grad
    torch.testing.assert_close(queue.keys[:2], keys.detach().float())


def test_state_dict_round_trip_restores_pointer_and_contents():
    queue = MemoryQueue(5, 2)
    for k in range(3):
        queue.enqueue(torch.full((2, 2), float(k)), [k, k + 10])
    restored = MemoryQueue(5, 2)
    restored.load_state_dict(copy.deepcopy(queue.state_dict()))
    assert set(queue.state_dict()) == {"keys", "ids", "valid", "ptr"}
    nxt = torch.tensor([[9.0, 9.0]])
    queue.enqueue(nxt, [99])
    restored.enqueue(nxt, [99])
    for name, buf in queue.state_dict().items():
        assert torch.equal(buf, restored.state_dict()[name]), name
    queue.reset()
    assert len(queue) == 0 and int(queue.ptr) == 0


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda q: q.enqueue(torch.zeros(2, 3)), "keys"),
        (lambda q: q.enqueue(torch.zeros(2, 2, dtype=torch.long)), "keys"),
        (lambda q: q.enqueue(torch.full((1, 2), float("nan"))), "keys"),
        (lambda q: q.enqueue(torch.zeros(2, 2), [1]), "ids"),
        (lambda q: q.enqueue(torch.zeros(2, 2), [-3, 1]), "ids"),
        (lambda q: q.enqueue(torch.zeros(2, 2), ["a", "b"]), "ids"),
        (lambda q: q.enqueue(torch.zeros(2, 2), torch.zeros(2)), "ids"),
        (lambda q: q.enqueue(torch.zeros(2, 2), mask=torch.ones(3, dtype=torch.bool)), "mask"),
        (lambda q: q.enqueue(torch.zeros(2, 2), mask=torch.ones(2)), "mask"),
        (lambda q: q.enqueue(torch.zeros(2, 2), gather=1), "gather"),
        (lambda q: MemoryQueue(0, 2), "size"),
        (lambda q: MemoryQueue(4, 0), "dim"),
    ],
)
def test_queue_rejects_bad_input(call, name):
    with pytest.raises(ValueError, match=name):
        call(MemoryQueue(4, 2))


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))


def test_momentum_encoder_is_an_ema_of_the_online_model():
    online = _net()
    ema = MomentumEncoder(online, momentum=0.9)
    assert all(not p.requires_grad for p in ema.parameters())
    before = {k: v.clone() for k, v in ema.module.state_dict().items()}
    with torch.no_grad():
        for p in online.parameters():
            p.add_(torch.randn_like(p))
    online.train()
    online(torch.randn(8, 4))  # moves the batch-norm running statistics
    ema.update(online)
    for name, p in online.named_parameters():
        want = 0.9 * before[name] + 0.1 * p.detach()
        torch.testing.assert_close(dict(ema.module.named_parameters())[name], want)
    torch.testing.assert_close(ema.module[1].running_mean, online[1].running_mean)
    out = ema(torch.randn(5, 4))
    assert not out.requires_grad


def test_momentum_encoder_round_trip_and_mismatch():
    ema = MomentumEncoder(_net(), momentum=0.99)
    other = MomentumEncoder(_net(), momentum=0.99)
    with torch.no_grad():
        for p in other.parameters():
            p.fill_(0.5)
    ema.load_state_dict(other.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(ema.parameters(), other.parameters(), strict=True))
    with pytest.raises(ValueError, match="model"):
        ema.update(nn.Linear(4, 3))
    with pytest.raises(ValueError, match="momentum"):
        MomentumEncoder(_net(), momentum=1.5)


@pytest.mark.parametrize("bad", ["x", None, True, [0.9], float("nan")])
def test_momentum_encoder_rejects_non_numbers_with_value_error(bad):
    # A string used to reach the range comparison and raise TypeError.
    with pytest.raises(ValueError, match="momentum"):
        MomentumEncoder(_net(), momentum=bad)


WORKER = textwrap.dedent(
    """
    import sys
    import torch
    import torch.distributed as dist
    from vlret.losses import AdaCLLoss
    from vlret.memory import MemoryQueue
    from vlret.train.parallel.distributed import broadcast_from_main

    rank, world, init, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    dist.init_process_group("gloo", init_method="file://" + init, rank=rank, world_size=world)
    queue = MemoryQueue(6, 2)
    # Unequal local batches: rank r enqueues r + 1 rows of value r with ids 10 r + k.
    queue.enqueue(torch.full((rank + 1, 2), float(rank)), torch.arange(rank + 1) + 10 * rank)
    torch.manual_seed(rank)
    loss = AdaCLLoss()
    img = torch.randn(12, 16)
    loss(img, img + 0.7 * torch.randn(12, 16))
    # The margin sync a training loop runs after each step (vlret.train.hooks.core.SyncLossBuffers).
    broadcast_from_main(loss.synced_buffers())
    # gather=False: the rows are written as given, without the all-gather.
    local = MemoryQueue(6, 2)
    local.enqueue(torch.full((rank + 1, 2), float(rank)), torch.arange(rank + 1), gather=False)
    # gathered=True: every rank passes the same global batch; it is enqueued exactly once.
    torch.manual_seed(100)
    glob = AdaCLLoss(queue_size=12, embed_dim=16)
    values = []
    for k in range(2):
        g_img = torch.randn(8, 16)
        values.append(glob(g_img, g_img + 0.5 * torch.randn(8, 16), torch.arange(8) + 8 * k,
                           gathered=True))
    torch.save({"keys": queue.keys, "ids": queue.ids, "ptr": queue.ptr, "m1": loss.m1,
                "m2": loss.m2, "anchor": loss.anchor, "local_ptr": local.ptr,
                "local_keys": local.keys, "global": glob.state_dict(),
                "global_values": torch.stack(values)}, out)
    dist.destroy_process_group()
    """
)


def test_distributed_gather_and_margin_sync(tmp_path: Path):
    world = 2
    init = tmp_path / "init"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                WORKER,
                str(r),
                str(world),
                str(init),
                str(tmp_path / f"{r}.pt"),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for r in range(world)
    ]
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, out.decode()
    r0, r1 = (torch.load(tmp_path / f"{r}.pt") for r in range(world))
    for res in (r0, r1):
        # Rank 0's row first, then rank 1's two rows: the same queue on every rank.
        assert res["keys"][:3].tolist() == [[0.0, 0.0], [1.0, 1.0], [1.0, 1.0]]
        assert res["ids"].tolist() == [0, 10, 11, -1, -1, -1]
        assert int(res["ptr"]) == 3
    assert torch.equal(r0["m1"], r1["m1"]) and torch.equal(r0["m2"], r1["m2"])
    assert r0["anchor"] != r1["anchor"]  # anchors stay local to each rank
    for r, res in enumerate((r0, r1)):  # gather=False: only this rank's rows
        assert int(res["local_ptr"]) == r + 1
        assert res["local_keys"][: r + 1].eq(float(r)).all()
    # gathered=True on the global batch: each queue holds what one process holds (16 keys of
    # two steps in a queue of 12, wrapped), not the doubled 32 of a second all-gather.
    torch.manual_seed(100)
    single = AdaCLLoss(queue_size=12, embed_dim=16)
    values = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the workers (OMP_NUM_THREADS=1): same kernels, same bits
    try:
        for k in range(2):
            g_img = torch.randn(8, 16)
            txt = g_img + 0.5 * torch.randn(8, 16)
            values.append(single(g_img, txt, torch.arange(8) + 8 * k))
    finally:
        torch.set_num_threads(threads)
    assert int(single.img_queue.ptr) == 4
    for res in (r0, r1):
        assert torch.equal(res["global_values"], torch.stack(values))
        for name, value in single.state_dict().items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(res["global"][name], value), name
