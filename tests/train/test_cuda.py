"""GPU checks: skipped without CUDA, run on a machine with one (results must match the CPU).

Covered here: the losses and metrics against the CPU in float64, fp16 autocast with a
GradScaler (on a loss and on the Trainer's own ``train.amp = "fp16"`` step), non-blocking
host-to-device copies of the data path from pinned memory, and NCCL's process group (when the
machine has two GPUs or more; skipped with the reason otherwise).
"""

from __future__ import annotations

import copy
import socket

import pytest
import torch
import torch.multiprocessing as mp

from train_helpers import rank_env, tiny_config, tiny_data
from vlret.losses import infonce_loss, triplet_loss, unified_loss
from vlret.metrics import retrieval_ranks, retrieval_ranks_from_similarity

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA: torch.cuda.is_available() is False"
)


@pytest.mark.parametrize("fn", [triplet_loss, infonce_loss, unified_loss])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_losses_on_cuda_match_cpu(fn, dtype):
    g = torch.Generator().manual_seed(0)
    sim = torch.nn.functional.normalize(torch.randn(256, 64, generator=g), dim=1)
    sim = sim @ torch.nn.functional.normalize(torch.randn(256, 64, generator=g), dim=1).t()
    mask = torch.rand(256, 256, generator=g) < 0.01
    s = sim.to("cuda", dtype).requires_grad_(True)
    out = fn(s, pos_mask=mask.cuda())
    out.backward()
    ref_in = s.detach().cpu().double().requires_grad_(True)
    ref = fn(ref_in, pos_mask=mask)
    ref.backward()
    torch.testing.assert_close(out.double().cpu(), ref, rtol=1e-4, atol=1e-4)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(s.grad.double().cpu(), ref_in.grad, rtol=tol, atol=tol)


@pytest.mark.parametrize("gamma", [60.0, 1e4])
def test_unified_under_autocast_and_gradscaler(gamma):
    """fp16 autocast with a GradScaler, as ``train.amp = "fp16"`` runs it. The scaler's first
    scale (2**16) can overflow the fp16 gradient of the similarity matrix (the sum-reduced loss
    has |dL/ds_ii| up to 2; fp16 ends at 65504), so the first steps may be found non-finite
    and skipped; the scaler must back off to a step whose unscaled gradients are finite
    and, at the paper's gamma, match a float32 step of the same weights (fp16 similarities
    carry ~1e-3 relative error, times gamma in the softmax weights: a few percent of the
    largest gradient)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(32, 32).cuda()
    ref = copy.deepcopy(model)
    x, y = torch.randn(64, 32, device="cuda"), torch.randn(64, 32, device="cuda")

    def loss_of(m):
        a = torch.nn.functional.normalize(m(x), dim=1)
        b = torch.nn.functional.normalize(m(y), dim=1)
        return unified_loss(a @ b.t(), gamma=gamma)

    loss_of(ref).backward()
    scaler = torch.amp.GradScaler("cuda")
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # the weights stay those of ``ref``
    for _ in range(24):
        opt.zero_grad()
        with torch.autocast("cuda", dtype=torch.float16):
            loss = loss_of(model)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        finite = all(torch.isfinite(p.grad).all() for p in model.parameters())
        scaler.step(opt)
        scaler.update()
        if finite:
            break
    assert finite and torch.isfinite(loss)
    if gamma == 60.0:
        for p, q in zip(model.parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(
                p.grad, q.grad, rtol=0, atol=0.05 * float(q.grad.abs().max())
            )


def test_metrics_on_cuda_match_cpu():
    g = torch.Generator().manual_seed(1)
    img = torch.nn.functional.normalize(torch.randn(3000, 64, generator=g), dim=1)
    t2i = torch.arange(3000).repeat_interleave(5)
    txt = torch.nn.functional.normalize(img[t2i] + 0.2 * torch.randn(15000, 64, generator=g), dim=1)
    img64, txt64 = img.double(), txt.double()
    cpu = retrieval_ranks(img64, txt64, t2i, chunk_size=700)
    gpu = retrieval_ranks(img64.cuda(), txt64.cuda(), t2i.cuda(), chunk_size=700)
    assert torch.equal(cpu[0], gpu[0]) and torch.equal(cpu[1], gpu[1])
    gpu_sim = retrieval_ranks_from_similarity((img64 @ txt64.t()).cuda(), t2i.cuda())
    assert torch.equal(cpu[0], gpu_sim[0]) and torch.equal(cpu[1], gpu_sim[1])
    collapsed = retrieval_ranks(
        torch.ones(10, 8, device="cuda").half(),
        torch.ones(50, 8, device="cuda").half(),
        torch.arange(50, device="cuda") // 5,
    )
    assert int(collapsed[0].min()) == 45 and int(collapsed[1].min()) == 9


def test_trainer_fp16_step_with_gradscaler_matches_float32(tmp_path):
    """``train.amp = "fp16"``: the Trainer's step runs under autocast with its GradScaler and
    moves the weights as the float32 step does, within fp16's rounding (the scaler unscales
    before clipping, so the clipped update is the float32 one up to ~1e-3 relative)."""
    from torch.utils.data import DataLoader

    from vlret.train import Trainer

    data = tiny_data(tmp_path / "data")
    trainers = {}
    for amp in ("fp16", "off"):
        overrides = ["train.device=cuda", "train.amp=fp16" if amp == "fp16" else "train.amp=false"]
        config = tiny_config(data, tmp_path / amp, overrides)
        trainers[amp] = Trainer(config, print_fn=None)
    fp16, ref = trainers["fp16"], trainers["off"]
    ref.model.load_state_dict(fp16.model.state_dict())
    assert fp16.scaler.is_enabled() and not ref.scaler.is_enabled()
    fp16.sampler.set_epoch(0)
    loader = DataLoader(
        fp16.train_set, batch_sampler=fp16.sampler, collate_fn=fp16.train_set.collate
    )
    batch = next(iter(loader))  # on the host: the step copies it (non_blocking) to the GPU
    before = {k: v.detach().clone() for k, v in ref.model.state_dict().items()}
    for _ in range(8):  # the scaler may skip overflowing steps while it backs off
        fp16.train_step(batch)
        if any(not torch.equal(v, before[k]) for k, v in fp16.model.state_dict().items()):
            break
    ref.train_step(batch)
    moved = False
    for name, value in fp16.model.state_dict().items():
        if not value.is_floating_point():
            continue
        want = ref.model.state_dict()[name].double() - before[name].double()
        got = value.double() - before[name].double()
        moved |= bool(got.abs().max() > 0)
        torch.testing.assert_close(got, want, rtol=0, atol=0.05 * float(want.abs().max()) + 1e-6)
    assert moved and fp16.scaler.get_scale() > 0


def test_non_blocking_copies_from_pinned_memory_match():
    """The data path's ``RetrievalBatch.to(device, non_blocking=True)`` (the Trainer's step) from
    pinned host memory: the copies are asynchronous and, once the stream is synchronised, equal
    to the host values; uint8 pixels arrive normalised as on the CPU."""
    from vlret.data.dataset import RetrievalBatch
    from vlret.data.pixel_batch import PixelBatch

    g = torch.Generator().manual_seed(0)
    feats = torch.randn(64, 36, 128, generator=g).pin_memory()
    caps = torch.randint(1, 100, (64, 12), generator=g).pin_memory()
    lengths = torch.full((64,), 12).pin_memory()
    idx = torch.arange(64).pin_memory()
    assert feats.is_pinned()
    batch = RetrievalBatch(feats, caps, lengths, idx, idx)
    moved = batch.to("cuda", non_blocking=True)
    torch.cuda.current_stream().synchronize()
    for name in ("features", "captions", "lengths", "img_index", "cap_index"):
        got = getattr(moved, name)
        assert got.is_cuda and torch.equal(got.cpu(), getattr(batch, name)), name

    pixels = torch.randint(0, 256, (4, 3, 8, 8), dtype=torch.uint8, generator=g)
    scale, bias = torch.rand(3, generator=g) + 0.5, torch.randn(3, generator=g)
    host = PixelBatch(pixels, scale, bias).pin_memory()
    assert host.pixels.is_pinned()
    on_cpu = RetrievalBatch(host, caps[:4], lengths[:4], idx[:4], idx[:4]).to("cpu")
    on_gpu = RetrievalBatch(host, caps[:4], lengths[:4], idx[:4], idx[:4]).to(
        "cuda", non_blocking=True
    )
    torch.cuda.current_stream().synchronize()
    assert on_gpu.features.is_cuda and on_gpu.features.dtype == torch.float32
    torch.testing.assert_close(on_gpu.features.cpu(), on_cpu.features, rtol=0, atol=1e-6)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _nccl_rank(rank: int, world: int, port: int) -> None:
    import torch.distributed as dist

    from vlret.train.parallel.distributed import init_distributed

    rank_env(rank, world, port)
    torch.set_default_dtype(torch.float32)
    env = init_distributed()
    try:
        assert dist.get_backend() == "nccl" and env.rank == rank and env.world_size == world
        assert torch.cuda.current_device() == rank
        x = torch.full((3,), float(rank + 1), device="cuda")
        dist.all_reduce(x)
        assert torch.equal(x.cpu(), torch.full((3,), world * (world + 1) / 2))
    finally:
        dist.destroy_process_group()


def test_nccl_process_group_on_two_gpus():
    """``init_distributed`` picks NCCL when CUDA is present, binds each rank to its GPU and
    an all-reduce sums over the ranks."""
    if torch.cuda.device_count() < 2:
        pytest.skip(f"NCCL needs >= 2 GPUs; this machine has {torch.cuda.device_count()}")
    world = 2
    mp.start_processes(_nccl_rank, args=(world, _free_port()), nprocs=world, start_method="spawn")
