"""GPU checks: skipped without CUDA, run on a machine with one (results must match the CPU)."""

from __future__ import annotations

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


def test_unified_under_autocast_and_gradscaler():
    torch.manual_seed(0)
    model = torch.nn.Linear(32, 32).cuda()
    scaler = torch.amp.GradScaler("cuda")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(64, 32, device="cuda"), torch.randn(64, 32, device="cuda")
    with torch.autocast("cuda", dtype=torch.float16):
        a = torch.nn.functional.normalize(model(x), dim=1)
        b = torch.nn.functional.normalize(model(y), dim=1)
        loss = unified_loss(a @ b.t(), gamma=1e4)
    scaler.scale(loss).backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())
    scaler.step(opt)
    scaler.update()


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
