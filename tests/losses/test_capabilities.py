"""Capabilities declared on the loss classes and the module switches the harness relies on."""

from __future__ import annotations

import pytest
import torch

from vlret.losses import (
    CircleLoss,
    GoalObjective,
    TripletLoss,
    build_loss,
    compared_losses,
    loss_capabilities,
    loss_parameters,
    triplet_loss,
)
from vlret.semantic import CaptionTfidf
from vlret.similarity import cosine_similarity


def _pairs(n=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    img = torch.randn(n, 6, generator=gen, dtype=torch.float64)
    return img, img + 0.5 * torch.randn(n, 6, generator=gen, dtype=torch.float64)


def test_the_papers_losses_in_their_declared_order():
    assert compared_losses() == ["triplet", "infonce", "unified", "goal", "vsl", "adacl"]


@pytest.mark.parametrize(
    ("name", "params", "warmup"),
    [
        ("triplet", {}, True),
        ("goal", {}, True),
        ("infonce", {}, False),
        ("vsl", {}, True),
        ("vsl", {"base": "infonce"}, False),
        ("vsl", {"base": "goal"}, True),
        ("vsl", {"base": "no-such-loss"}, False),
        ("circle", {}, False),
    ],
)
def test_all_negatives_warmup_follows_the_loss_and_vsls_base(name, params, warmup):
    assert loss_capabilities(name, params).all_negatives_warmup is warmup


def test_adacls_queue_decides_embed_dim_and_ownership():
    plain = loss_capabilities("adacl", {})
    queued = loss_capabilities("adacl", {"queue_size": 16, "embed_dim": 4})
    assert not plain.owns_queue and not plain.needs_embed_dim and plain.momentum_keys
    assert queued.owns_queue and queued.needs_embed_dim
    built = build_loss("adacl", queue_size=16, embed_dim=4)
    assert loss_capabilities(built) == queued


def test_declared_inputs_of_vsl_and_shards_of_the_tiled_families():
    vsl = loss_capabilities("vsl")
    assert vsl.needs_semantics and vsl.similarity_inputs == ("img_ids", "txt_ids")
    assert not vsl.local_shards
    # chunk_size is a tile height only: VSL, without a tiled form, has none (rank_block instead)
    assert "chunk_size" not in loss_parameters("vsl") and "rank_block" in loss_parameters("vsl")
    shards = {n for n in ("triplet", "infonce", "unified", "goal", "adacl", "vsl", "circle")}
    assert {n for n in shards if loss_capabilities(n).local_shards} == {
        "triplet",
        "infonce",
        "unified",
        "goal",
    }
    assert loss_capabilities(torch.nn.Identity()) == loss_capabilities("circle")


def test_triplet_warmup_switches_and_returns_to_the_configured_mining():
    img, txt = _pairs()
    sim = cosine_similarity(img, txt)
    loss = TripletLoss()
    loss.set_all_negatives(True)
    torch.testing.assert_close(loss(img, txt), triplet_loss(sim, hardest=False))
    loss.set_all_negatives(False)
    torch.testing.assert_close(loss(img, txt), triplet_loss(sim, hardest=True))
    configured_sum = TripletLoss(hardest=False)
    configured_sum.set_all_negatives(False)
    assert configured_sum.hardest is False


@pytest.mark.parametrize("chunk_size", [None, 3])
def test_goal_warmup_is_the_triplet_sum_with_its_margin_and_reduction(chunk_size):
    img, txt = _pairs(seed=1)
    goal = GoalObjective(margin=0.3, reduction="mean", chunk_size=chunk_size)
    hardest = goal(img, txt)
    goal.set_all_negatives(True)
    want = triplet_loss(cosine_similarity(img, txt), margin=0.3, hardest=False, reduction="mean")
    torch.testing.assert_close(goal(img, txt), want, rtol=0, atol=1e-12)
    goal.set_all_negatives(False)
    torch.testing.assert_close(goal(img, txt), hardest, rtol=0, atol=0)
    assert not list(goal.state_dict())  # the warm-up adds no state to checkpoints


def test_vsl_switches_its_base_and_a_loss_without_warmup_refuses():
    semantic = CaptionTfidf().fit({i: [f"caption {i}"] for i in range(4)})
    vsl = build_loss("vsl", semantic=semantic)
    vsl.set_all_negatives(True)
    assert vsl.base.hardest is False
    vsl.set_all_negatives(False)
    assert vsl.base.hardest is True
    with pytest.raises(ValueError, match="warm-up"):
        build_loss("vsl", semantic=semantic, base="infonce").set_all_negatives(True)
    with pytest.raises(ValueError, match="CircleLoss"):
        CircleLoss().set_all_negatives(True)
    assert CircleLoss().last_stats == {}
