"""AOQ (ECCV 2020) against a naive per-anchor loop in float64, its gradients, and its inputs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vlret.losses import AOQLoss, aoq_loss, build_loss, loss_capabilities
from vlret.losses.aoq import OFFLINE_EMBEDDINGS, OFFLINE_SCORES


def naive_aoq(
    sim,
    off,
    *,
    margin=0.2,
    offline_margin=0.0,
    alpha=0.3,
    beta=1.5,
    pos=None,
    detach=False,
    hardest=True,
):
    """The released ContrastiveLoss written anchor by anchor (float64, Python loops); with
    ``hardest=False`` every negative's hinge, times the anchor's weight."""
    b = sim.shape[0]
    pos = torch.eye(b, dtype=torch.bool) if pos is None else pos | torch.eye(b, dtype=torch.bool)
    total = sim.new_zeros(())
    for i in range(b):
        s_ii = sim[i, i]
        negs_t = [sim[i, j] for j in range(b) if not pos[i, j]]
        negs_v = [sim[j, i] for j in range(b) if not pos[j, i]]
        for negs, o in ((negs_t, off[0][i]), (negs_v, off[1][i])):
            if negs:
                hard = torch.stack(negs).max()
                w = beta - (o - hard) / alpha
                if detach:
                    w = w.detach()
                chosen = [hard] if hardest else negs
                for n in chosen:
                    total = total + w * torch.clamp(margin + n - s_ii, min=0)
        for o in off:
            total = total + torch.clamp(offline_margin + o[i] - s_ii, min=0)
    return total


def batch(b=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    sim = torch.rand(b, b, generator=g, dtype=torch.float64) * 2 - 1
    sim.diagonal().add_(0.3)  # positives mostly ahead: some hinges active, some not
    off = [torch.rand(b, generator=g, dtype=torch.float64) * 2 - 1 for _ in range(4)]
    return sim, off


def call(sim, off, **kw):
    return aoq_loss(sim, **dict(zip(OFFLINE_SCORES, off, strict=True)), **kw)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(
    "kw",
    [{}, {"margin": 0.5, "offline_margin": 0.1, "alpha": 0.7, "beta": 0.2}, {"margin": 0.0}],
)
def test_value_equals_the_naive_loop(seed, kw):
    sim, off = batch(seed=seed)
    got = call(sim, off, **kw)
    want = naive_aoq(sim, off, **kw)
    # a few dozen float64 operations on O(1) values
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_pos_mask_excludes_further_positives_and_an_anchor_without_negatives():
    sim, off = batch(b=4, seed=5)
    pos = torch.zeros(4, 4, dtype=torch.bool)
    pos[0, 1] = pos[1, 0] = True  # captions 0 and 1 share image 0 and 1
    pos[2, :] = True  # image 2: no online negative caption at all
    got = call(sim, off, pos_mask=pos)
    torch.testing.assert_close(got, naive_aoq(sim, off, pos=pos), rtol=0, atol=1e-12)
    # moving a masked entry above everything changes nothing
    sim2 = sim.clone()
    sim2[0, 1] = sim2[2, 3] = 5.0
    torch.testing.assert_close(call(sim2, off, pos_mask=pos), got, rtol=0, atol=1e-12)


def test_reduction_none_holds_one_term_per_index_summing_to_the_loss():
    sim, off = batch(seed=1)
    terms = call(sim, off, reduction="none")
    assert terms.shape == (6,)
    torch.testing.assert_close(terms.sum(), call(sim, off), rtol=0, atol=1e-12)
    torch.testing.assert_close(call(sim, off, reduction="mean"), terms.mean(), rtol=0, atol=0)


def test_the_weight_is_beta_minus_the_offline_online_gap_over_alpha():
    # B = 2, one active online hinge per direction, offline hinges inactive (scores -1)
    sim = torch.tensor([[0.5, 0.4], [-1.0, 0.9]], dtype=torch.float64)
    low = torch.full((2,), -1.0, dtype=torch.float64)
    off_t = torch.tensor([0.45, -1.0], dtype=torch.float64)  # s(I_0, T'_0)
    value = aoq_loss(
        sim, offline_txt_sim=off_t, offline_img_sim=low, offline_pair_sim=low, quintuplet_sim=low
    )
    # image 0: hinge 0.2 + 0.4 - 0.5 = 0.1, weight 1.5 - (0.45 - 0.4) / 0.3
    # caption 0: hardest image -1.0: hinge 0; image 1: hinge 0.2 - 1 - 0.9 < 0;
    # caption 1: hardest image 0 at 0.4: hinge 0.2 + 0.4 - 0.9 < 0
    want = (1.5 - 0.05 / 0.3) * 0.1
    assert value.item() == pytest.approx(want, abs=1e-12)


def test_gradcheck():
    # the release's form (weights not detached); the detached one has no finite-difference
    # oracle (its gradient ignores a dependence on purpose): see the next test
    sim, off = batch(b=5, seed=2)
    inputs = [sim.requires_grad_(True), *(o.requires_grad_(True) for o in off)]

    def f(s, *o):
        return call(s, list(o))

    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-8)


def test_detach_weights_drops_only_the_weights_gradient():
    sim, off = batch(seed=3)
    grads = {}
    for detach in (False, True):
        o = [t.clone().requires_grad_(True) for t in off]
        s = sim.clone().requires_grad_(True)
        call(s, o, detach_weights=detach).backward()
        o_naive = [t.clone().requires_grad_(True) for t in off]
        s_naive = sim.clone().requires_grad_(True)
        naive_aoq(s_naive, o_naive, detach=detach).backward()
        torch.testing.assert_close(s.grad, s_naive.grad, rtol=0, atol=1e-12)
        torch.testing.assert_close(o[0].grad, o_naive[0].grad, rtol=0, atol=1e-12)
        grads[detach] = o[0].grad
    assert not torch.equal(grads[False], grads[True])  # the release's weight gradient is real


def test_module_scores_the_offline_embeddings_like_the_batch():
    g = torch.Generator().manual_seed(4)
    emb = [torch.randn(6, 5, generator=g, dtype=torch.float64) for _ in range(6)]
    img, txt, off_t, off_i, q_i, q_t = emb
    img_ids = torch.tensor([0, 0, 1, 2, 3, 4])
    loss = AOQLoss()
    got = loss(
        img,
        txt,
        img_ids,
        offline_txt_emb=off_t,
        offline_img_emb=off_i,
        quintuplet_img_emb=q_i,
        quintuplet_txt_emb=q_t,
    )
    n = [F.normalize(e, dim=1) for e in emb]
    sim = n[0] @ n[1].T
    scores = [
        (n[0] * n[2]).sum(1),
        (n[3] * n[1]).sum(1),
        (n[3] * n[2]).sum(1),
        (n[4] * n[5]).sum(1),
    ]
    pos = img_ids[:, None] == img_ids[None, :]
    torch.testing.assert_close(got, naive_aoq(sim, scores, pos=pos), rtol=0, atol=1e-12)
    raw = AOQLoss(normalize=False)(
        img,
        txt,
        offline_txt_emb=off_t,
        offline_img_emb=off_i,
        quintuplet_img_emb=q_i,
        quintuplet_txt_emb=q_t,
    )
    scores = [
        (img * off_t).sum(1),
        (off_i * txt).sum(1),
        (off_i * off_t).sum(1),
        (q_i * q_t).sum(1),
    ]
    torch.testing.assert_close(raw, naive_aoq(img @ txt.T, scores), rtol=0, atol=1e-12)


def test_a_batch_without_its_offline_negatives_is_refused_by_name():
    img, txt = torch.randn(4, 3), torch.randn(4, 3)
    with pytest.raises(ValueError, match="offline_txt_emb, offline_img_emb, quintuplet_img_emb"):
        AOQLoss()(img, txt)
    with pytest.raises(ValueError, match="quintuplet_txt_emb missing"):
        AOQLoss()(img, txt, **{n: torch.randn(4, 3) for n in OFFLINE_EMBEDDINGS[:3]})
    with pytest.raises(ValueError, match=r"offline_img_emb: expected the shape of img_emb"):
        AOQLoss()(
            img,
            txt,
            **{n: torch.randn(4 if n != "offline_img_emb" else 3, 3) for n in OFFLINE_EMBEDDINGS},
        )
    sim, off = batch(b=4)
    with pytest.raises(ValueError, match="offline_pair_sim: AOQ needs the batch's offline"):
        aoq_loss(sim, offline_txt_sim=off[0], offline_img_sim=off[1], quintuplet_sim=off[3])
    with pytest.raises(ValueError, match=r"quintuplet_sim: expected a \(4,\) tensor"):
        call(sim, [*off[:3], off[3][:2]])


@pytest.mark.parametrize("seed", range(3))
def test_all_negatives_sums_every_hinge_with_the_hardest_weight(seed):
    sim, off = batch(seed=seed)
    pos = torch.zeros(6, 6, dtype=torch.bool)
    pos[0, 1] = pos[1, 0] = True  # a further positive: never a negative, summed or not
    got = call(sim, off, hardest=False, pos_mask=pos | torch.eye(6, dtype=torch.bool))
    want = naive_aoq(sim, off, hardest=False, pos=pos)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    assert not torch.allclose(got, call(sim, off))  # the hardest-only value differs


def test_the_all_negatives_warm_up_switches_the_online_hinge():
    """VSE-infinity's warm-up (train.all_negatives_epochs) takes AOQ: the module sums the
    online hinge while warming up, then returns to the hardest negative."""
    loss = build_loss("aoq")
    assert loss_capabilities("aoq").all_negatives_warmup
    sim, off = batch(seed=9)
    inputs = dict(zip(OFFLINE_SCORES, off, strict=True))
    loss.set_all_negatives(True)
    torch.testing.assert_close(
        loss.from_similarity(sim, **inputs), naive_aoq(sim, off, hardest=False), rtol=0, atol=1e-12
    )
    loss.set_all_negatives(False)
    torch.testing.assert_close(
        loss.from_similarity(sim, **inputs), naive_aoq(sim, off), rtol=0, atol=1e-12
    )


def test_registered_with_the_released_defaults():
    loss = build_loss("aoq")
    assert isinstance(loss, AOQLoss)
    assert (loss.margin, loss.offline_margin, loss.alpha, loss.beta) == (0.2, 0.0, 0.3, 1.5)
    assert loss.detach_weights is False and loss.reduction == "sum" and loss.hardest is True
    assert loss_capabilities("aoq").similarity_inputs == OFFLINE_SCORES
    with pytest.raises(ValueError, match="alpha"):
        build_loss("aoq", alpha=0.0)
    sim, off = batch(seed=6)
    torch.testing.assert_close(
        loss.from_similarity(sim, **dict(zip(OFFLINE_SCORES, off, strict=True))),
        naive_aoq(sim, off),
        rtol=0,
        atol=1e-12,
    )
