"""AdaCL's margin update in one pass (issue 31): the salient sums without a pass, the streamed
median through a ``Delta S`` band (hit, miss, overflow, empty S*, ties, queue blocks) and the
band pass riding on the loss's forward tiles, each against the multi-pass selection written
naively here in float64."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import vlret.losses.adacl.anchor as anchor_mod
import vlret.losses.adacl.median as median
from vlret.losses import AdaCLLoss
from vlret.losses.adacl import (
    DenseAdaCLBatch,
    QueueBlock,
    TiledAdaCLBatch,
    clone_log_odds,
    fit_gda,
    select_anchor,
)
from vlret.losses.adacl.fused import visited_square_lse
from vlret.losses.adacl.gda import CloneRegion
from vlret.similarity import positive_mask

pytestmark = pytest.mark.usefixtures("one_thread")


def _world(batch, dim=16, seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    img = torch.randn(batch, dim, generator=gen, dtype=torch.float64)
    txt = img + 0.8 * torch.randn(batch, dim, generator=gen, dtype=torch.float64)
    return img.to(dtype), txt.to(dtype)


def _queue(img, anchor_ids, size=30, seed=5):
    """Queue texts near some batch images, slots 25+ empty, ids shared with the batch."""
    gen = torch.Generator().manual_seed(seed)
    keys = F.normalize(img[:size].detach() + 0.6 * torch.randn(size, img.shape[1], generator=gen))
    return QueueBlock(keys, torch.arange(size) < 25, torch.arange(size) % 17, anchor_ids)


def _naive(x, y, img_ids=None, txt_ids=None, queue=None, scale=1.0, region=None):
    """Algorithm 1 steps 2-3 as the paper reads (module docstrings), float64, every entry in
    memory: the rows' negatives, Eq. (7) sums, the GDA of the two extreme rows, S* by the
    log-odds, the lower median of Delta S (first in flat order among equals)."""
    x, y = x.double(), y.double()
    size = x.shape[0]
    blocks = [x @ y.t()]
    excluded = [torch.eye(size, dtype=torch.bool)]
    if img_ids is not None:
        excluded[0] |= positive_mask(img_ids, img_ids if txt_ids is None else txt_ids)
    if queue is not None:
        blocks.append(x @ queue.keys.double().t())
        allowed = queue.valid[None, :] & (queue.ids[None, :] != queue.anchor_ids[:, None])
        excluded.append(~allowed)
    s, out = torch.cat(blocks, 1), torch.cat(excluded, 1)
    pos = (x * y).sum(1)
    neg = ~out
    salient = pos - torch.where(neg, s, 0.0).sum(1) / neg.sum(1)
    i_plus, i_minus = int(salient.argmax()), int(salient.argmin())
    fit = fit_gda(s[i_plus][neg[i_plus]], s[i_minus][neg[i_minus]])
    # flat order: each block row-major, the batch block first
    flat_s = torch.cat([b.flatten() for b in blocks])
    flat_neg = torch.cat([(~e).flatten() for e in excluded])
    rows = torch.cat([torch.arange(size).repeat_interleave(b.shape[1]) for b in blocks])
    inside = clone_log_odds(flat_s, fit) > 0 if region is None else ~region.outside(flat_s)
    clone = flat_neg & inside
    delta = (pos[rows] - flat_s).abs()[clone]
    where = clone.nonzero()[:, 0]
    if len(delta) == 0:
        return {"row": None, "clone_count": 0, "salient_row": i_plus, "clone_row": i_minus}
    value = np.sort(delta.numpy())[(len(delta) + 1) // 2 - 1]  # the lower median
    pick = int(where[delta == value][0])  # among equal deltas the first clone in flat order
    u = int(rows[pick])
    row_neg = s[u][neg[u]]
    return {
        "row": u,
        "clone_count": len(delta),
        "salient_row": i_plus,
        "clone_row": i_minus,
        "anchor": float(pos[u]),
        "log_sigma": float(torch.logsumexp(scale * row_neg, 0)),
        "delta": float(value),
    }


def _fields(found):
    out = {
        "row": found.row,
        "clone_count": found.clone_count,
        "salient_row": found.salient_row,
        "clone_row": found.clone_row,
    }
    if found.row is not None:
        out.update(anchor=found.anchor, log_sigma=found.log_sigma_anchor, delta=found.delta)
    return out


def _assert_matches(found, want):
    got = _fields(found)
    for key in ("row", "clone_count", "salient_row", "clone_row"):
        assert got[key] == want[key], key
    for key in ("anchor", "log_sigma", "delta"):
        if key in want:
            assert got[key] == pytest.approx(want[key], abs=1e-12), key


class _Spy:
    """Counts the band passes that found the median, and the histogram fallbacks. A small
    batch's first tile is a small sample: its band is widened so that it holds the median."""

    def __init__(self, monkeypatch):
        monkeypatch.setattr(median, "BAND_QUANTILE", 0.3)
        self.hits = self.fallbacks = 0
        result, members = anchor_mod.BandMedian.result, anchor_mod._median_members

        def spy_result(band):
            got = result(band)
            self.hits += got[0] is not None
            return got

        def spy_members(*args, **kwargs):
            self.fallbacks += 1
            return members(*args, **kwargs)

        monkeypatch.setattr(anchor_mod.BandMedian, "result", spy_result)
        monkeypatch.setattr(anchor_mod, "_median_members", spy_members)


# ----------------------------------------------------------------------------- Eq. (7)


def test_negative_sums_equal_the_float64_row_sums():
    """By linearity, with id groups, a text whose id differs from its image's (the diagonal
    outside the row's group), and a queue block with empty and same-id slots; the dense
    source's sums agree."""
    img, txt = _world(37)
    img_ids = torch.tensor([i // 3 for i in range(37)])
    txt_ids = img_ids.clone()
    txt_ids[5] = 99  # text 5 describes no batch image: (5, 5) is excluded as the diagonal
    queue = _queue(F.normalize(img, dim=1), img_ids)
    batch = TiledAdaCLBatch(img, txt, img_ids, txt_ids, chunk_size=8, queue_txt=queue)
    x, y = F.normalize(img, dim=1), F.normalize(txt, dim=1)
    excluded = positive_mask(img_ids, txt_ids) | torch.eye(37, dtype=torch.bool)
    allowed = queue.valid[None, :] & (queue.ids[None, :] != img_ids[:, None])
    want_total = torch.where(excluded, 0.0, x @ y.t()).sum(1) + torch.where(
        allowed, x @ queue.keys.t(), 0.0
    ).sum(1)
    want_count = (~excluded).sum(1) + allowed.sum(1)
    total, count = batch.negative_sums()
    torch.testing.assert_close(total, want_total, rtol=0, atol=1e-12)
    assert torch.equal(count, want_count.double())
    dense = DenseAdaCLBatch(x @ y.t(), excluded, x @ queue.keys.t(), allowed)
    d_total, d_count = dense.negative_sums()
    torch.testing.assert_close(d_total, want_total, rtol=0, atol=1e-12)
    assert torch.equal(d_count, want_count.double())


# ----------------------------------------------------------------------------- the median


@pytest.mark.parametrize("chunk_size", [5, 16])
@pytest.mark.parametrize("with_ids", [False, True])
def test_band_median_equals_the_naive_multipass_anchor(chunk_size, with_ids, monkeypatch):
    """The band holds the median: one pass, the naive selection's anchor, row, |S*|, Delta S."""
    spy = _Spy(monkeypatch)
    img, txt = _world(70, seed=1)
    ids = torch.arange(70) // 3 if with_ids else None
    found = select_anchor(TiledAdaCLBatch(img, txt, ids, chunk_size=chunk_size), scale=2.0)
    want = _naive(F.normalize(img, dim=1), F.normalize(txt, dim=1), ids, scale=2.0)
    _assert_matches(found, want)
    assert (spy.hits, spy.fallbacks) == (1, 0)


def test_the_default_band_holds_the_median_of_a_larger_batch(monkeypatch):
    """B=1536 in tiles of 512: the first tile's quantiles 0.5 -+ 0.04 hold the batch's median
    (one pass), and the anchor is the naive selection's."""
    spy = _Spy(monkeypatch)
    monkeypatch.setattr(median, "BAND_QUANTILE", 0.04)  # the default, not the spy's
    img, txt = _world(1536, dim=32, seed=9)
    found = select_anchor(TiledAdaCLBatch(img, txt, chunk_size=512))
    _assert_matches(found, _naive(F.normalize(img, dim=1), F.normalize(txt, dim=1)))
    assert (spy.hits, spy.fallbacks) == (1, 0)


@pytest.mark.parametrize("case", ["below", "above", "empty", "overflow", "no_band"])
def test_a_band_that_misses_falls_back_to_the_same_anchor(case, monkeypatch):
    """A stale band (wholly below or above the median, or holding no clone), one past the
    collection cap, or none at all: the histogram passes give the same anchor."""
    spy = _Spy(monkeypatch)
    img, txt = _world(60, seed=2)
    x, y = F.normalize(img, dim=1), F.normalize(txt, dim=1)
    want = _naive(x, y)
    bands = {
        "below": (0.0, want["delta"] / 2),
        "above": (want["delta"] * 1.5, want["delta"] * 3),
        "empty": (want["delta"] + 1e-9, want["delta"] + 2e-9),
        "overflow": (0.0, math.inf),
        "no_band": None,
    }
    monkeypatch.setattr(median, "choose_band", lambda *args: bands[case])
    if case == "overflow":
        monkeypatch.setattr(anchor_mod, "band_cap", lambda size, tile: 100)
    found = select_anchor(TiledAdaCLBatch(img, txt, chunk_size=7))
    _assert_matches(found, want)
    assert (spy.hits, spy.fallbacks) == (0, 1)


@pytest.mark.parametrize("exact_band", [False, True])
def test_exact_ties_pick_the_first_clone_in_flat_order(exact_band, monkeypatch):
    """Integer dot products tie everywhere; a band whose bounds are tied values themselves
    (the clones equal to ``low`` are in it, those below are counted) finds the same clone."""
    spy = _Spy(monkeypatch)
    gen = torch.Generator().manual_seed(4)
    img = torch.randint(0, 2, (48, 12), generator=gen).double()
    txt = (img + torch.randint(0, 2, (48, 12), generator=gen)).clamp(max=1)
    want = _naive(img, txt)
    if exact_band:
        monkeypatch.setattr(median, "choose_band", lambda *a: (want["delta"],) * 2)
    found = select_anchor(TiledAdaCLBatch(img, txt, chunk_size=6, normalize=False))
    _assert_matches(found, want)
    assert (spy.hits, spy.fallbacks) == (1, 0)


def test_queue_block_clones_through_the_band(monkeypatch):
    """Queue texts (empty and same-id slots excluded) are clones of the image rows too: the
    band pass reads both blocks; flat order puts the batch block first."""
    spy = _Spy(monkeypatch)
    img, txt = _world(50, seed=3)
    ids = torch.arange(50) // 2
    queue = _queue(F.normalize(img, dim=1), ids)
    found = select_anchor(TiledAdaCLBatch(img, txt, ids, chunk_size=9, queue_txt=queue))
    want = _naive(F.normalize(img, dim=1), F.normalize(txt, dim=1), ids, None, queue)
    _assert_matches(found, want)
    assert (spy.hits, spy.fallbacks) == (1, 0)


def test_an_empty_clone_set_is_the_guard_on_both_paths(monkeypatch):
    """S* empty (a region holding no score): ``empty_clone_set`` from the band pass and from
    the histograms, and the module keeps its margins."""
    nowhere = CloneRegion(math.inf, -math.inf, True)
    monkeypatch.setattr(anchor_mod, "clone_region", lambda fit: nowhere)
    img, txt = _world(40, seed=4)
    want = _naive(F.normalize(img, dim=1), F.normalize(txt, dim=1), region=nowhere)
    assert want["clone_count"] == 0
    for band in ((0.0, 1.0), None):
        monkeypatch.setattr(median, "choose_band", lambda *a, band=band: band)
        found = select_anchor(TiledAdaCLBatch(img, txt, chunk_size=6))
        assert found.guard == "empty_clone_set" and found.anchor is None
        _assert_matches(found, want)
    loss = AdaCLLoss(chunk_size=6)
    loss(img, txt)
    assert loss.last_stats["guard"] == "empty_clone_set"
    assert (float(loss.m1), loss.guard_counts[1]) == (20.0, 1)


# ----------------------------------------------------------------------------- the fused step


def test_visited_tiles_are_the_sources_scores_and_the_lse_is_exact():
    """Each tile the forward shows is bit for bit ``TiledAdaCLBatch.scores``' (so the anchor
    is the same); the log-sum-exps and their gradients match float64 for float32 inputs."""
    img, txt = _world(45, dim=24, seed=6, dtype=torch.float32)
    img.requires_grad_(True)
    txt.requires_grad_(True)
    ids = torch.arange(45) // 4
    batch = TiledAdaCLBatch(img, txt, ids, chunk_size=10)
    seen = []

    def visit(block, start, s, excluded):
        want_s, want_ex = batch.scores(block, start, start + s.shape[0])
        assert block == 0 and torch.equal(s, want_s) and torch.equal(excluded, want_ex)
        seen.append(start)

    rows, cols = batch.negatives_lse(2.0, visit)
    assert seen == [0, 10, 20, 30, 40]
    x64, y64 = (F.normalize(t.detach().double(), dim=1).requires_grad_() for t in (img, txt))
    logits = (2.0 * x64 @ y64.t()).masked_fill(positive_mask(ids, ids), -math.inf)
    want = (logits.logsumexp(1), logits.logsumexp(0))
    # float32 scores of unit vectors: about 1e-7 each, times the scale 2, through the lse
    for got, ref in zip((rows, cols), want, strict=True):
        torch.testing.assert_close(got.double(), ref.detach(), rtol=0, atol=2e-6)
    weight = torch.linspace(-1, 1, 45)
    got_g = torch.autograd.grad((rows * weight).sum() + cols.sum(), (img, txt))
    want_g = torch.autograd.grad(
        (want[0] * weight.double()).sum() + want[1].sum(),
        (x64, y64),
    )
    # through normalize: compare the gradients with respect to the normalised embeddings
    x32 = F.normalize(img.detach(), dim=1).requires_grad_()
    y32 = F.normalize(txt.detach(), dim=1).requires_grad_()
    r32, c32 = visited_square_lse(x32, y32, 2.0, batch.square, 10, lambda *a: None)
    got_n = torch.autograd.grad((r32 * weight).sum() + c32.sum(), (x32, y32))
    for g, w in zip(got_n, want_g, strict=True):
        torch.testing.assert_close(g.double(), w, rtol=0, atol=2e-6)
    assert all(torch.isfinite(g).all() for g in got_g)


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_fused_training_step_equals_the_dense_module(temperature, monkeypatch):
    """Training with chunk_size: the band pass is the loss's forward (no tile of the batch
    block read again) and the margins, loss and gradients are the dense module's (float64),
    step after step on independent batches."""
    reads = []
    scores = TiledAdaCLBatch.scores

    def counted(self, block, start, stop):
        reads.append(stop - start)
        return scores(self, block, start, stop)

    monkeypatch.setattr(TiledAdaCLBatch, "scores", counted)
    spy = _Spy(monkeypatch)
    kw = {"negative_temperature": temperature, "margin_momentum": 0.3}
    dense, tiled = AdaCLLoss(**kw), AdaCLLoss(chunk_size=12, **kw)
    for step in range(3):
        img, txt = (t.requires_grad_(True) for t in _world(64, seed=20 + step))
        ids = torch.arange(64) // 2
        reads.clear()
        got = tiled(img, txt, ids)
        assert reads == [1, 1]  # the GDA's two rows: the band pass was the loss's forward
        want = dense(img, txt, ids)
        got_g = torch.autograd.grad(got, (img, txt))
        want_g = torch.autograd.grad(want, (img, txt))
        torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
        for g, w in zip(got_g, want_g, strict=True):
            torch.testing.assert_close(g, w, rtol=0, atol=1e-10)
        assert (tiled.last_stats["anchor"], tiled.clone_count) == (
            pytest.approx(dense.last_stats["anchor"], abs=1e-12),
            dense.clone_count,
        )
        assert float(tiled.m1) == pytest.approx(float(dense.m1), rel=1e-10)
        assert float(tiled.m2) == pytest.approx(float(dense.m2), rel=1e-10, abs=1e-12)
    assert dense.last_stats["guard"] is None and float(dense.m1) != 20.0
    assert (spy.hits, spy.fallbacks) == (3, 0)
