"""IRRA's MLM loss (vlret.losses.mlm) against a cross-entropy written by hand over the masked
positions only, in float64; its reductions, its place in IRRA's ``sdm+mlm+id`` and its errors."""

from __future__ import annotations

import math

import pytest
import torch

from vlret.losses import build_loss, loss_capabilities
from vlret.losses.mlm import IGNORE_INDEX, mlm_loss

B, L, V = 4, 6, 9


def inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, L, V, generator=g, dtype=torch.float64).requires_grad_()
    labels = torch.randint(0, V, (B, L), generator=g)
    keep = torch.rand(B, L, generator=g) < 0.3
    keep[0, 1] = True
    return logits, torch.where(keep, labels, torch.full_like(labels, IGNORE_INDEX))


def hand_written(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The mean over masked positions of ``-z_y + log sum_v exp z_v``, one position at a time."""
    terms = []
    for b in range(logits.shape[0]):
        for t in range(logits.shape[1]):
            y = int(labels[b, t])
            if y == IGNORE_INDEX:
                continue
            z = logits[b, t]
            terms.append(-z[y] + torch.log(sum(torch.exp(z[v]) for v in range(z.shape[0]))))
    return sum(terms) / len(terms)


def test_the_value_and_gradient_are_a_hand_written_cross_entropy_over_masked_positions():
    logits, labels = inputs()
    got = mlm_loss(logits, labels)
    expected = hand_written(logits, labels)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    (g_got,) = torch.autograd.grad(got, logits)
    (g_exp,) = torch.autograd.grad(hand_written(logits, labels), logits)
    torch.testing.assert_close(g_got, g_exp, rtol=1e-12, atol=1e-12)
    assert g_got[labels == IGNORE_INDEX].abs().max() == 0  # unmasked positions get nothing


def test_reductions_share_the_mean_over_masked_tokens():
    """ "none": each caption's share times B (mean of the terms = the value), "sum": B times it;
    a batch without a masked token: zero, attached to the scores."""
    logits, labels = inputs(1)
    value = mlm_loss(logits, labels)
    terms = mlm_loss(logits, labels, reduction="none")
    assert terms.shape == (B,)
    torch.testing.assert_close(terms.mean(), value)
    torch.testing.assert_close(mlm_loss(logits, labels, reduction="sum"), B * value)
    count = int((labels != IGNORE_INDEX).sum())
    row0 = labels[0] != IGNORE_INDEX
    ce0 = -torch.log_softmax(logits[0], dim=-1)[row0, labels[0][row0]].sum()
    torch.testing.assert_close(terms[0], ce0 * B / count)
    none = torch.full_like(labels, IGNORE_INDEX)
    zero = mlm_loss(logits, none)
    assert float(zero.detach()) == 0.0 and zero.requires_grad


def test_half_scores_are_computed_in_float32():
    logits, labels = inputs(2)
    half = logits.detach().to(torch.bfloat16)
    got = mlm_loss(half, labels)
    assert got.dtype == torch.float32
    assert math.isclose(float(got), float(hand_written(half.double(), labels)), rel_tol=1e-5)


def test_in_irras_objective_each_part_gets_its_own_inputs():
    """``sdm+mlm+id`` = sdm + mlm + id computed alone; the scores go to mlm only; the
    combination declares masked_language (it trains with the irr procedure)."""
    torch.manual_seed(0)
    ids = torch.tensor([0, 1, 0, 2])
    x, y = torch.randn(B, 5, dtype=torch.float64), torch.randn(B, 5, dtype=torch.float64)
    logits, labels = inputs(3)
    id_params = {"num_classes": 3, "dim": 5}
    torch.manual_seed(1)
    full = build_loss("sdm+mlm+id", id=id_params).double()
    torch.manual_seed(1)
    alone = build_loss("id", **id_params).double()
    got = full(x, y, ids, ids, mlm_logits=logits, mlm_labels=labels)
    expected = build_loss("sdm")(x, y, ids, ids) + mlm_loss(logits, labels) + alone(x, y, ids)
    torch.testing.assert_close(got, expected)
    assert loss_capabilities("sdm+mlm+id").masked_language
    assert not loss_capabilities("sdm+id").masked_language


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "loss 'mlm' needs mlm_logits and mlm_labels"),
        ({"mlm_logits": torch.zeros(B, L, V)}, "needs mlm_logits and mlm_labels"),
        (
            {"mlm_logits": torch.zeros(B, L, V), "mlm_labels": torch.zeros(B, L + 1).long()},
            r"mlm_logits must be \(B, L, V\) and mlm_labels \(B, L\)",
        ),
        (
            {"mlm_logits": torch.zeros(B, L, V), "mlm_labels": torch.full((B, L), V)},
            r"mlm_labels must be ids in \[0, 9\) or -100",
        ),
        (
            {"mlm_logits": torch.zeros(B + 1, L, V), "mlm_labels": torch.zeros(B + 1, L).long()},
            r"mlm_logits must have one row per pair \(4\)",
        ),
        ({"shard": (0, 2)}, "loss 'mlm' takes no shard"),
    ],
)
def test_bad_inputs_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        build_loss("mlm")(torch.randn(B, 5), torch.randn(B, 5), **kwargs)


def test_a_pair_scorer_is_refused_by_name():
    with pytest.raises(ValueError, match="loss 'mlm' scores IRRA's masked caption tokens"):
        build_loss("mlm").from_similarity(torch.zeros(B, B))
