"""vlret.analysis.gradients: the Unified paper's tangent components (Sec. 3.3, Eq. 8-19).

The closed forms are written here from the paper's equations with angles from ``arccos`` (Eq.
9-12 for Triplet-HN, Eq. 14-19 for the Unified loss and VLC, Eq. 15 with the derivative's
``1 + sum_k D_k``); the module computes them from the losses' autograd gradients."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from vlret.analysis.gradients import (
    check_analysable,
    component_summary,
    gradient_components,
    gradient_record,
)
from vlret.losses import build_loss

B, D = 7, 5


def _batch(seed: int = 0, b: int = B, d: int = D) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    v = F.normalize(torch.randn(b, d, generator=g, dtype=torch.float64), dim=1)
    t = F.normalize(v + 0.9 * torch.randn(b, d, generator=g, dtype=torch.float64), dim=1)
    return v, t


def _sin(a: torch.Tensor, x: torch.Tensor) -> float:
    """sin of the angle between two vectors, through arccos (0 for a zero vector)."""
    if float(x.norm()) == 0.0:
        return 0.0
    cos = float(a @ x) / (float(a.norm()) * float(x.norm()))
    return math.sin(math.acos(max(-1.0, min(1.0, cos))))


def _roles(direction: str, v: torch.Tensor, t: torch.Tensor):
    return (v, t) if direction == "i2t" else (t, v)


@pytest.mark.parametrize("direction", ["i2t", "t2i"])
def test_triplet_hn_matches_eq_9_to_12(direction):
    v, t = _batch(1)
    loss = build_loss("triplet", margin=0.2)  # sum reduction: weights +-1
    parts = gradient_components(loss, v, t, direction=direction)
    anchors, cands = _roles(direction, v, t)
    s = anchors @ cands.t()
    norms = parts.norms()
    active_seen = inactive_seen = 0
    for i in range(B):
        row = s[i].clone()
        row[i] = -math.inf
        hard = int(row.argmax())
        active = float(s[i, hard] - s[i, i] + 0.2) > 0
        active_seen += active
        inactive_seen += not active
        grad = (cands[hard] - cands[i]) * active  # Eq. 9
        assert torch.allclose(parts.gradient[i], grad, atol=1e-12)
        eq11 = float(grad.norm()) * _sin(anchors[i], grad)
        eq12 = float(anchors[i].norm()) * _sin(anchors[i], cands[hard]) * active  # Eq. 10, 12
        assert norms["tangent"][i] == pytest.approx(eq11, abs=1e-10)
        assert norms["tangent_sum"][i] == pytest.approx(eq11, abs=1e-10)
        assert norms["on_negatives"][i] == pytest.approx(eq12, abs=1e-10)
        assert norms["positive"][i] == pytest.approx(_sin(anchors[i], cands[i]) * active, abs=1e-10)
        assert norms["negatives"][i] == pytest.approx(eq12, abs=1e-10)
        assert norms["radial"][i] == pytest.approx(abs(float(anchors[i] @ grad)), abs=1e-12)
    assert active_seen and inactive_seen  # both branches of the indicator are checked


@pytest.mark.parametrize(
    "name, params, gamma, margin, scale",
    [
        # VLC = InfoNCE, Eq. 3 / 19: weight gamma * D_j / (1 + sum D), mean reduction: / B
        ("infonce", {"temperature": 0.25}, 4.0, 0.0, 4.0 / B),
        ("infonce", {"temperature": 0.25, "reduction": "sum"}, 4.0, 0.0, 4.0),
        # Unified, Eq. 5 / 13-16: (1/gamma) log(...) gives D_j / (1 + sum D) itself
        ("unified", {"gamma": 6.0, "margin": 0.3}, 6.0, 0.3, 1.0),
    ],
)
@pytest.mark.parametrize("direction", ["i2t", "t2i"])
def test_unified_and_vlc_match_eq_14_to_19(name, params, gamma, margin, scale, direction):
    v, t = _batch(2)
    loss = build_loss(name, **params)
    parts = gradient_components(loss, v, t, direction=direction)
    anchors, cands = _roles(direction, v, t)
    norms = parts.norms()
    for i in range(B):
        others = [j for j in range(B) if j != i]
        big_d = {
            j: math.exp(gamma * float(anchors[i] @ cands[j] - anchors[i] @ cands[i] + margin))
            for j in others
        }  # Eq. 16 (Eq. 19 with m = 0)
        denom = 1.0 + sum(big_d.values())
        w = {j: scale * big_d[j] / denom for j in others}
        grad = sum(w[j] * (cands[j] - cands[i]) for j in others)  # Eq. 14
        assert torch.allclose(parts.gradient[i], grad, atol=1e-12)
        eq17 = sum(
            float((cands[j] - cands[i]).norm()) * _sin(anchors[i], cands[j] - cands[i]) * w[j]
            for j in others
        )
        eq18 = sum(w[j] * float(anchors[i].norm()) * _sin(anchors[i], cands[j]) for j in others)
        assert norms["tangent_sum"][i] == pytest.approx(eq17, rel=1e-10)
        assert norms["on_negatives"][i] == pytest.approx(eq18, rel=1e-10)
        tangent = float(grad.norm()) * _sin(anchors[i], grad)
        assert norms["tangent"][i] == pytest.approx(tangent, rel=1e-10)
        assert norms["tangent"][i] <= norms["tangent_sum"][i] + 1e-12  # triangle inequality


LOSSES = [
    ("triplet", {}),
    ("triplet", {"hardest": False}),
    ("infonce", {}),
    ("unified", {"gamma": 10.0}),
    ("dcl", {}),
    ("hn_nce", {}),
    ("sdm", {}),
]


@pytest.mark.parametrize("name, params", LOSSES)
@pytest.mark.parametrize("direction", ["i2t", "t2i"])
@pytest.mark.parametrize("terms", ["anchor", "all"])
def test_components_are_tangent_and_add_up(name, params, direction, terms):
    v, t = _batch(3)
    ids = [0, 0, 1, 2, 3, 4, 5]  # a further positive pair: (0, 1) and (1, 0)
    loss = build_loss(name, **params)
    parts = gradient_components(loss, v, t, img_ids=ids, direction=direction, terms=terms)
    anchors = parts.anchors
    for vec in (parts.positive, parts.negatives, parts.tangent):
        assert (vec * anchors).sum(1).abs().max() < 1e-12  # on the sphere's tangent plane
    radial_dir = F.normalize(parts.radial, dim=1)
    cross = radial_dir - (radial_dir * anchors).sum(1, keepdim=True) * anchors
    assert cross.abs().max() < 1e-9  # the radial part is along the anchor
    assert torch.allclose(parts.positive + parts.negatives + parts.radial, parts.gradient)
    # the gradient is the loss's own: d loss / d anchor through the score matrix
    a = anchors.clone().requires_grad_(True)
    c = parts.candidates
    sim = a @ c.t() if direction == "i2t" else c @ a.t()
    mask = torch.tensor(ids)[:, None] == torch.tensor(ids)[None, :]
    value = loss.from_similarity(sim, pos_mask=mask)
    if terms == "all":
        (full,) = torch.autograd.grad(value, a)
        assert torch.allclose(parts.gradient, full, atol=1e-12)
        # what the normalisation leaves: the gradient of the loss's own forward, which
        # L2-normalises unit inputs (its Jacobian at a unit vector is the tangent projection)
        img = a if direction == "i2t" else c
        txt = c if direction == "i2t" else a
        (projected,) = torch.autograd.grad(loss(img, txt, ids), a)
        assert torch.allclose(parts.tangent, projected, atol=1e-12)
    # the positive pull is only the positives' and the push only the negatives'
    # a further positive is no negative: its weight is in the pull, not the push
    assert parts.positives[0, 1] and parts.positives[1, 0]
    pull = parts.weights.masked_fill(~parts.positives, 0.0) @ c
    assert torch.allclose(parts.positive, pull - (pull * anchors).sum(1, keepdim=True) * anchors)


@pytest.mark.parametrize("name, params", LOSSES)
def test_the_two_directions_anchor_terms_make_the_whole_loss(name, params):
    v, t = _batch(4)
    loss = build_loss(name, **params)
    whole = gradient_components(loss, v, t, terms="all").weights
    i2t = gradient_components(loss, v, t, direction="i2t").weights
    t2i = gradient_components(loss, v, t, direction="t2i").weights
    assert torch.allclose(i2t + t2i.t(), whole, atol=1e-12)
    assert not torch.allclose(i2t, whole)  # the separation did something


@pytest.mark.parametrize("name", ["siglip", "circle"])
def test_per_pair_losses_have_no_anchor_terms_but_a_whole_gradient(name):
    v, t = _batch(5)
    loss = build_loss(name)
    with pytest.raises(ValueError, match=f"'{name}' is not a function of the score differences"):
        gradient_components(loss, v, t)
    parts = gradient_components(loss, v, t, terms="all")
    assert parts.tangent_sum is None and "tangent_sum" not in parts.norms()


def test_losses_without_a_score_function_are_refused():
    with pytest.raises(ValueError, match="'id' classifies training identities"):
        check_analysable(build_loss("id", num_classes=4, dim=D))
    v, t = _batch(6)
    with pytest.raises(ValueError, match="memory queue"):
        gradient_components(build_loss("adacl", queue_size=8, embed_dim=D), v, t)


def test_bad_inputs_are_named():
    v, t = _batch(7)
    loss = build_loss("triplet")
    with pytest.raises(ValueError, match="direction must be one of i2t, t2i"):
        gradient_components(loss, v, t, direction="both")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="terms must be one of anchor, all"):
        gradient_components(loss, v, t, terms="own")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="one shape"):
        gradient_components(loss, v, t[:3])
    with pytest.raises(ValueError, match="img_ids must have one id per row"):
        gradient_components(loss, v, t, img_ids=[0, 1])
    bad = v.clone()
    bad[0, 0] = math.nan
    with pytest.raises(ValueError, match="img_emb contains NaN"):
        gradient_components(loss, bad, t)


def test_the_loss_and_the_generators_are_left_as_they_were():
    v, t = _batch(8)
    loss = build_loss("infonce", learnable_temperature=True, temperature=0.1)
    before = {k: x.clone() for k, x in loss.state_dict().items()}
    state = torch.get_rng_state()
    gradient_record(loss, v.float(), t.float())
    assert loss.training
    assert all(torch.equal(before[k], x) for k, x in loss.state_dict().items())
    assert all(p.grad is None for p in loss.parameters())
    assert torch.equal(torch.get_rng_state(), state)


def test_record_and_summary_keys():
    v, t = _batch(9)
    loss = build_loss("unified", gamma=10.0)
    rec = gradient_record(loss, v, t)
    parts = gradient_components(loss, v, t, direction="t2i")
    summary = component_summary(parts)
    assert rec["loss"] == "unified" and rec["batch"] == B and rec["terms"] == "anchor"
    for key, value in summary.items():
        assert rec[key] == pytest.approx(value)
    assert summary["t2i_tangent"] == pytest.approx(float(parts.tangent.norm(dim=1).mean()))
    s = t @ v.t()
    hardest = s.masked_fill(torch.eye(B, dtype=torch.bool), -2).amax(1).mean()
    assert summary["t2i_hardest_neg_sim"] == pytest.approx(float(hardest))
    assert summary["t2i_pos_sim"] == pytest.approx(float(s.diagonal().mean()))
