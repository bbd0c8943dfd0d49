"""GPU checks: skipped without CUDA, run on a machine with one (results must match the CPU)."""

from __future__ import annotations

import copy

import pytest
import torch

from vlret.losses import infonce_loss, triplet_loss, unified_loss
from vlret.metrics import retrieval_ranks, retrieval_ranks_from_similarity

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


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
