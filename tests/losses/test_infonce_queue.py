"""InfoNCE with a memory queue (``queue_size``): the queue's keys are further negatives, checked
against a naive float64 loss over the batch with those keys appended as negative columns."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from vlret._checks import ParamError
from vlret.losses import build_loss, infonce_loss, loss_capabilities

B, D, K = 6, 5, 7
TAU = 0.2


def _unit(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return F.normalize(torch.randn(n, D, generator=g, dtype=torch.float64), dim=1)


def naive_queued_infonce(img, txt, ids, q_txt, q_txt_ids, q_img, q_img_ids, tau):
    """Mean over indices of the two cross-entropies, written as loops in float64: row ``i``'s
    candidates are the batch texts not of image ``ids[i]`` (besides its own) and the queued
    texts of another image; the same for column ``i`` with the queued images."""
    img, txt = F.normalize(img, dim=1), F.normalize(txt, dim=1)
    total = img.new_zeros(())
    for i in range(len(ids)):
        for anchor, others, queued, queued_ids in (
            (img[i], txt, q_txt, q_txt_ids),
            (txt[i], img, q_img, q_img_ids),
        ):
            positive = torch.exp(anchor @ others[i] / tau)
            denominator = positive
            for j in range(len(ids)):
                if j != i and ids[j] != ids[i]:
                    denominator = denominator + torch.exp(anchor @ others[j] / tau)
            for k in range(len(queued_ids)):
                if queued_ids[k] != ids[i]:
                    denominator = denominator + torch.exp(anchor @ queued[k] / tau)
            total = total - torch.log(positive / denominator)
    return total / len(ids)


def _filled(loss, q_img, q_txt, ids):
    loss.img_queue.enqueue(q_img, ids)
    loss.txt_queue.enqueue(q_txt, ids)


@pytest.mark.parametrize("chunk_size", [None, 4], ids=["dense", "tiled"])
def test_a_queue_adds_its_keys_as_negative_columns(chunk_size):
    """Values and gradients equal the naive loss with the queued keys appended, an entry of the
    anchor's own image id (a stale copy of its pair) and the empty slots left out."""
    ids = torch.tensor([0, 1, 2, 2, 3, 4])  # rows 2 and 3: captions of one image
    img, txt = (_unit(B, s).mul(1.5).requires_grad_() for s in (0, 1))
    q_ids = torch.tensor([9, 1, 7, 4, 8])  # ids 1 and 4 are batch images: not their negatives
    q_img, q_txt = _unit(5, 2), _unit(5, 3)  # 5 of the K = 7 slots filled
    loss = build_loss(
        "infonce", temperature=TAU, queue_size=K, embed_dim=D, chunk_size=chunk_size
    ).double()
    _filled(loss, q_img, q_txt, q_ids)
    loss.eval()  # no enqueue: the value is of the queue as filled
    got = loss(img, txt, ids)
    want = naive_queued_infonce(img, txt, ids.tolist(), q_txt, q_ids, q_img, q_ids, TAU)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    g_got = torch.autograd.grad(got, [img, txt])
    g_want = torch.autograd.grad(want, [img, txt])
    for a, b in zip(g_got, g_want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_the_queue_changes_the_loss_and_an_empty_queue_does_not():
    img, txt = _unit(B, 0), _unit(B, 1)
    plain = build_loss("infonce", temperature=TAU).double()
    queued = build_loss("infonce", temperature=TAU, queue_size=K, embed_dim=D).double().eval()
    torch.testing.assert_close(queued(img, txt), plain(img, txt), rtol=1e-14, atol=0)
    _filled(queued, _unit(3, 2), _unit(3, 3), None)
    assert float(queued(img, txt)) > float(plain(img, txt)) + 0.1  # more negatives


def test_training_enqueues_the_momentum_keys_and_the_next_batch_scores_them():
    loss = build_loss("infonce", temperature=TAU, queue_size=K, embed_dim=D).double().train()
    first = (_unit(B, 0), _unit(B, 1))
    keys = (_unit(B, 4) * 3.0, _unit(B, 5) * 0.5)  # normalised before they are stored
    ids1 = torch.arange(B)
    loss(*first, ids1, img_keys=keys[0], txt_keys=keys[1])
    assert len(loss.img_queue) == B and torch.equal(loss.img_queue.ids[:B], ids1)
    torch.testing.assert_close(loss.img_queue.keys[:B], F.normalize(keys[0], dim=1))
    torch.testing.assert_close(loss.txt_queue.keys[:B], F.normalize(keys[1], dim=1))
    img, txt = _unit(B, 6), _unit(B, 7)
    ids2 = torch.arange(B) + 3  # ids 3, 4, 5 were enqueued: those entries are no negatives
    got = loss(img, txt, ids2)
    # the first batch's keys are the only filled slots (the second batch is enqueued after)
    q_img, q_txt = F.normalize(keys[0], dim=1), F.normalize(keys[1], dim=1)
    want = naive_queued_infonce(img, txt, ids2.tolist(), q_txt, ids1, q_img, ids1, TAU)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert len(loss.img_queue) == K  # 12 entries written into 7 slots: full, wrapped


def test_learnable_temperature_gets_the_queue_terms_gradient():
    img, txt = _unit(B, 0), _unit(B, 1)
    loss = build_loss(
        "infonce", temperature=TAU, learnable_temperature=True, queue_size=K, embed_dim=D
    ).double()
    _filled(loss, _unit(4, 2), _unit(4, 3), None)
    loss.eval()
    value = loss(img, txt)
    (grad,) = torch.autograd.grad(value, [loss.log_scale])

    # d/d(log_scale) of the naive loss at tau = exp(-log_scale), by central differences
    def naive(log_scale: float) -> float:
        q = (loss.txt_queue.keys[:4], loss.img_queue.keys[:4])
        none = [-1] * 4
        tau = math.exp(-log_scale)
        return float(naive_queued_infonce(img, txt, list(range(B)), q[0], none, q[1], none, tau))

    h, x = 1e-6, float(loss.log_scale.detach())
    torch.testing.assert_close(
        float(grad), (naive(x + h) - naive(x - h)) / (2 * h), rtol=1e-6, atol=1e-8
    )


def test_capabilities_follow_the_queue():
    plain = loss_capabilities("infonce", {})
    queued = loss_capabilities("infonce", {"queue_size": 16, "embed_dim": 4})
    assert plain.local_shards and not (plain.owns_queue or plain.momentum_keys)
    assert queued.owns_queue and queued.needs_embed_dim and queued.momentum_keys
    assert not queued.local_shards  # each rank would enqueue only its own keys
    assert loss_capabilities(build_loss("infonce", queue_size=16, embed_dim=4)) == queued


def test_bad_queue_inputs_are_named():
    with pytest.raises(ParamError, match="embed_dim"):
        build_loss("infonce", queue_size=4)
    img, txt = _unit(B, 0), _unit(B, 1)
    with pytest.raises(ValueError, match="img_keys/txt_keys need a memory queue"):
        build_loss("infonce").double()(img, txt, img_keys=img, txt_keys=txt)
    queued = build_loss("infonce", queue_size=4, embed_dim=D, chunk_size=2).double()
    with pytest.raises(ValueError, match="shard"):
        queued(img, txt, shard=(0, 3))
    with pytest.raises(ValueError, match="embed_dim"):
        build_loss("infonce", queue_size=4, embed_dim=D + 1).double()(img, txt)
    sim = img @ txt.t()
    with pytest.raises(ValueError, match="extra_neg_txt must have shape"):
        infonce_loss(sim, extra_neg_txt=torch.zeros(B + 1, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match="extra_neg_img_mask given without extra_neg_img"):
        infonce_loss(sim, extra_neg_img_mask=torch.ones(3, B, dtype=torch.bool))
