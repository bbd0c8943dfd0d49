"""USER's UTO loss against a naive per-row float64 oracle of the release's formula (loops of
scalar torch operations, so its gradient is autograd's of the loops), with further positives,
and its momentum-queue form over steps (the release's ``moco_forward``)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from vlret._checks import ParamError
from vlret.losses import build_loss, loss_capabilities
from vlret.losses.uto import UTOLoss, uto_loss

pytestmark = pytest.mark.usefixtures("one_thread")

B, D, K = 6, 5, 8


def _scores(seed: int, size: int = B) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(size, size, generator=g, dtype=torch.float64) * 1.8 - 0.9).requires_grad_()


def naive_batch_terms(s, alpha, epsilon, positives=None):
    """Per index ``i``: the release's row-``i`` and column-``i`` sums of
    ``exp(alpha (s' - epsilon))`` over ``s'``, the scores with the diagonal zeroed, each sum's
    ``log(1 + .) / alpha``, minus ``log(1 + relu(s_ii))``; an off-diagonal pair marked in
    ``positives`` is left out of both sums."""
    size = s.shape[0]
    out = []
    for i in range(size):
        row = s.new_zeros(())
        col = s.new_zeros(())
        for j in range(size):
            if j != i and positives is not None and bool(positives[i, j]):
                pass
            else:
                value = s.new_zeros(()) if j == i else s[i, j]
                row = row + torch.exp(alpha * (value - epsilon))
            if j != i and positives is not None and bool(positives[j, i]):
                continue
            value = s.new_zeros(()) if j == i else s[j, i]
            col = col + torch.exp(alpha * (value - epsilon))
        term = torch.log(1 + row) / alpha + torch.log(1 + col) / alpha
        out.append(term - torch.log(1 + torch.relu(s[i, i])))
    return torch.stack(out)


def naive_queue_term(anchor, key_positive, queued, queued_ids, anchor_id, alpha, epsilon):
    """One anchor's ``moco_forward`` term: ``log(1 + sum_k exp(alpha (a.q_k - epsilon))) /
    alpha - log(1 + relu(a.key))`` over the queued keys of another image."""
    total = anchor.new_zeros(())
    for key, key_id in zip(queued, queued_ids, strict=True):
        if key_id != anchor_id:
            total = total + torch.exp(alpha * (anchor @ key - epsilon))
    return torch.log(1 + total) / alpha - torch.log(1 + torch.relu(anchor @ key_positive))


@pytest.mark.parametrize("alpha, epsilon", [(90.0, 0.5), (2.0, 0.5), (5.0, -0.3)])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_values_and_gradients_are_the_naive_release_formula(alpha, epsilon, reduction):
    """With alpha = 2 the zeroed diagonal's constant exp(-alpha epsilon) is visible in float64:
    the diagonal is handled as released (a constant in each sum, no gradient)."""
    s = _scores(0)
    got = uto_loss(s, alpha=alpha, epsilon=epsilon, reduction=reduction)
    naive = naive_batch_terms(s, alpha, epsilon)
    expected = {"none": naive, "mean": naive.mean(), "sum": naive.sum()}[reduction]
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    (g_got,) = torch.autograd.grad(got.sum(), s)
    (g_naive,) = torch.autograd.grad(expected.sum(), s)
    torch.testing.assert_close(g_got, g_naive, rtol=1e-10, atol=1e-12)


def test_the_release_zeroes_the_diagonal_rather_than_dropping_it():
    """The constant exp(-alpha epsilon) per sum is what separates the release from leaving the
    diagonal out: exactly that much at alpha = 2 (float64)."""
    s = _scores(1).detach()
    alpha, epsilon = 2.0, 0.5
    got = uto_loss(s, alpha=alpha, epsilon=epsilon, reduction="none")
    off = ~torch.eye(B, dtype=torch.bool)
    z = torch.exp(alpha * (s - epsilon)) * off
    dropped = (
        torch.log1p(z.sum(1)) / alpha
        + torch.log1p(z.sum(0)) / alpha
        - torch.log1p(torch.relu(s.diagonal()))
    )
    c = math.exp(-alpha * epsilon)
    kept = (
        torch.log1p(z.sum(1) + c) / alpha
        + torch.log1p(z.sum(0) + c) / alpha
        - torch.log1p(torch.relu(s.diagonal()))
    )
    torch.testing.assert_close(got, kept, rtol=1e-13, atol=1e-13)
    assert float((got - dropped).abs().min()) > 1e-3


def test_further_positives_are_neither_pushed_nor_pulled():
    ids = [0, 1, 2, 0, 3, 1]
    positives = torch.tensor([[a == b for b in ids] for a in ids])
    s = _scores(2)
    got = uto_loss(s, alpha=4.0, epsilon=0.2, pos_mask=positives, reduction="none")
    expected = naive_batch_terms(s, 4.0, 0.2, positives)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    (grad,) = torch.autograd.grad(got.sum(), s)
    further = positives & ~torch.eye(B, dtype=torch.bool)
    assert bool((grad[further] == 0).all()) and bool((grad[~further] != 0).any())


def test_gradcheck_float64():
    s = _scores(3)
    assert torch.autograd.gradcheck(
        lambda x: uto_loss(x, alpha=6.0, epsilon=0.1), (s,), eps=1e-6, atol=1e-7
    )


def test_large_scores_stay_finite():
    """Raw dot products far above 1 (normalize=False, or a pair scorer's scores) would
    overflow exp(90 s) in float32; the sums are log-sum-exps."""
    s = (_scores(4).detach() * 20).float().requires_grad_()
    value = uto_loss(s)
    (grad,) = torch.autograd.grad(value, s)
    assert torch.isfinite(value) and torch.isfinite(grad).all()


def test_batch_weight_scales_the_in_batch_loss():
    s = _scores(5).detach()
    torch.testing.assert_close(uto_loss(s, batch_weight=20.0), 20 * uto_loss(s))


def _unit(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return F.normalize(torch.randn(n, D, generator=g, dtype=torch.float64), dim=1)


@pytest.mark.parametrize("with_keys", [True, False], ids=["momentum-keys", "no-keys"])
def test_queue_form_over_steps_is_the_release_moco_forward(with_keys):
    """Three training steps: each is ``batch_weight`` x the in-batch loss plus, per image, its
    term against the queued texts with the momentum key of its caption as positive, and per
    text the same against the queued images; then the keys are enqueued. Without keys the
    detached embeddings are the keys. A queued key of the anchor's own image is no negative."""
    alpha, epsilon, weight = 5.0, 0.2, 3.0
    loss = build_loss(
        "uto", alpha=alpha, epsilon=epsilon, batch_weight=weight, queue_size=K, embed_dim=D
    ).to(torch.float64)  # the queues' buffers hold float64 keys
    assert isinstance(loss, UTOLoss) and loss.training
    q_img: list[torch.Tensor] = []
    q_txt: list[torch.Tensor] = []
    q_ids: list[int] = []
    batches = [[0, 1, 2, 2, 3, 4], [5, 1, 6, 7, 8, 0], [9, 10, 3, 11, 12, 13]]
    for step, ids in enumerate(batches):
        img = (_unit(B, 10 * step) * 1.5).requires_grad_()
        txt = (_unit(B, 10 * step + 1) * 0.7).requires_grad_()
        img_keys = _unit(B, 10 * step + 2) if with_keys else None
        txt_keys = _unit(B, 10 * step + 3) if with_keys else None
        got = loss(img, txt, torch.tensor(ids), img_keys=img_keys, txt_keys=txt_keys)

        x, y = F.normalize(img, dim=1), F.normalize(txt, dim=1)
        kx = x.detach() if img_keys is None else img_keys
        ky = y.detach() if txt_keys is None else txt_keys
        positives = torch.tensor([[a == b for b in ids] for a in ids])
        terms = weight * naive_batch_terms(x @ y.t(), alpha, epsilon, positives)
        queue = []
        for i in range(B):
            to_txt = naive_queue_term(x[i], ky[i], q_txt, q_ids, ids[i], alpha, epsilon)
            to_img = naive_queue_term(y[i], kx[i], q_img, q_ids, ids[i], alpha, epsilon)
            queue.append(to_txt + to_img)
        expected = (terms + torch.stack(queue)).mean()
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12, msg=f"step {step}")
        g_got = torch.autograd.grad(got, [img, txt])
        g_naive = torch.autograd.grad(expected, [img, txt])
        for a, b in zip(g_got, g_naive, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=f"step {step}")
        q_img = (q_img + list(kx))[-K:]
        q_txt = (q_txt + list(ky))[-K:]
        q_ids = (q_ids + ids)[-K:]
    assert len(q_ids) == K  # the last step's queue was full and had wrapped


def test_queue_capabilities_and_named_errors():
    assert not loss_capabilities("uto").owns_queue
    caps = loss_capabilities("uto", {"queue_size": 2048, "embed_dim": 8})
    assert caps.owns_queue and caps.momentum_keys and caps.needs_embed_dim
    assert not caps.local_shards
    with pytest.raises(ParamError, match="embed_dim"):
        build_loss("uto", queue_size=16)
    with pytest.raises(ParamError, match="alpha"):
        build_loss("uto", alpha=0)
    loss = build_loss("uto", queue_size=K, embed_dim=D)
    x, y = _unit(B, 0), _unit(B, 1)
    with pytest.raises(ValueError, match="txt_keys"):
        loss(x, y, txt_keys=_unit(B - 1, 2))
    with pytest.raises(ValueError, match="key_pos_txt"):
        uto_loss(_scores(0), extra_neg_txt=torch.zeros(B, 3), key_pos_txt=torch.zeros(B + 1))
    with pytest.raises(ValueError, match="img_keys"):
        build_loss("uto")(x, y, img_keys=x)
