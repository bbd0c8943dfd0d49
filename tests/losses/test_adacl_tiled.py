"""AdaCL's tiled form against the dense one: Eq. (3) (queue blocks included), the anchor
selection read through tiles of every height (the dense matrix is the one-tile case), and the
module trained with and without ``chunk_size``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vlret.losses import AdaCLLoss, adacl_loss, infonce_loss
from vlret.losses.adacl import (
    DenseAdaCLBatch,
    QueueBlock,
    TiledAdaCLBatch,
    adacl_anchor,
    select_anchor,
    tiled_adacl_loss,
)
from vlret.similarity import cosine_similarity, positive_mask

REDUCTIONS = ("sum", "mean", "none")


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Many tiny ops: on shared cores, OpenMP spin-waits cost more than a second thread saves."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _group_ids(batch):
    """Several texts of the same image: image ids 0,0,0,1,1,2,2,2,3,... (groups of 1 to 3)."""
    return torch.tensor([i // 3 if i % 7 else i // 2 for i in range(batch)])


def _clone_world(batch, dtype=torch.float64, seed=0):
    """Texts near their images, so the batch has salient and clone-like negatives."""
    gen = torch.Generator().manual_seed(seed)
    img = torch.randn(batch, 16, generator=gen, dtype=torch.float64)
    txt = img + 0.8 * torch.randn(batch, 16, generator=gen, dtype=torch.float64)
    return img.to(dtype), txt.to(dtype)


def _value_and_grads(loss, inputs, reduction, seed=1):
    """The loss and the gradients of a fixed random projection of it w.r.t. ``inputs``."""
    if reduction == "none":
        gen = torch.Generator().manual_seed(seed)
        weight = torch.randn(loss.shape, generator=gen, dtype=torch.float64).to(loss.dtype)
        target = (loss * weight).sum()
    else:
        target = loss * 1.7
    return loss.detach(), torch.autograd.grad(target, inputs)


def _assert_same(got, want, atol=1e-10):
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=atol)


def _anchor_fields(found):
    return (found.row, found.clone_count, found.salient_row, found.clone_row, found.guard)


# ----------------------------------------------------------------------------- Eq. (3)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("with_ids", [False, True])
def test_tiled_loss_and_tensor_margins_equal_dense(reduction, with_ids):
    img, txt = (t.requires_grad_() for t in _clone_world(37, seed=15))
    ids = _group_ids(37) if with_ids else None
    m1 = torch.tensor(12.0, dtype=torch.float64, requires_grad=True)
    m2 = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    inputs = (img, txt, m1, m2)
    pos = None if ids is None else positive_mask(ids, ids)
    dense = adacl_loss(cosine_similarity(img, txt), m1=m1, m2=m2, pos_mask=pos, reduction=reduction)
    tiled = tiled_adacl_loss(img, txt, m1=m1, m2=m2, img_ids=ids, chunk_size=8, reduction=reduction)
    want, got = (
        _value_and_grads(dense, inputs, reduction),
        _value_and_grads(tiled, inputs, reduction),
    )
    _assert_same((got[0], *got[1]), (want[0], *want[1]))


def test_tiled_unit_margins_are_infonce_at_temperature_one():
    img, txt = _clone_world(20, seed=16)
    ada = tiled_adacl_loss(img, txt, m1=1.0, m2=0.0, chunk_size=6)
    nce = infonce_loss(cosine_similarity(img, txt), temperature=1.0)
    _assert_same((ada,), (nce,))


def test_tiled_loss_rejects_bad_margins():
    img, txt = _clone_world(4)
    with pytest.raises(ValueError, match="m1 must be a positive"):
        tiled_adacl_loss(img, txt, m1=0.0, m2=0.1, chunk_size=2)
    with pytest.raises(ValueError, match="m2 must be a scalar"):
        tiled_adacl_loss(img, txt, m1=1.0, m2=torch.zeros(2), chunk_size=2)
    with pytest.raises(ValueError, match="m2 must be a finite"):
        tiled_adacl_loss(img, txt, m1=1.0, m2=float("inf"), chunk_size=2)


def _queue(batch_img, ids, seed=8):
    """Queue blocks of 20 texts and 13 images, some slots empty, ids shared with the batch."""
    gen = torch.Generator().manual_seed(seed)
    noise = torch.randn(20, 16, generator=gen, dtype=torch.float64)
    keys_txt = F.normalize(batch_img[:20].detach() + 0.5 * noise, dim=1)
    keys_img = F.normalize(torch.randn(13, 16, generator=gen, dtype=torch.float64), dim=1)
    txt_block = QueueBlock(keys_txt, torch.arange(20) < 17, torch.arange(20) % 15, ids)
    img_block = QueueBlock(keys_img, torch.arange(13) != 4, torch.arange(13) % 9, ids)
    return txt_block, img_block


@pytest.mark.parametrize("scale", [1.0, 2.5])
def test_tiled_queue_negatives_equal_dense_blocks(scale):
    """Eq. (3) with queue negatives: the engine's rectangles equal the dense score blocks
    (values and gradients, both directions), for logits ``scale * s``."""
    img, txt = (t.requires_grad_() for t in _clone_world(30, seed=2))
    ids = torch.arange(30) // 2
    q_txt, q_img = _queue(img, ids)
    x, y = F.normalize(img, dim=1), F.normalize(txt, dim=1)
    allowed_txt = q_txt.valid[None, :] & (q_txt.ids[None, :] != ids[:, None])
    allowed_img = q_img.valid[:, None] & (q_img.ids[:, None] != ids[None, :])
    dense = DenseAdaCLBatch(
        cosine_similarity(img, txt),
        positive_mask(ids, ids),
        x @ q_txt.keys.t(),
        allowed_txt,
        q_img.keys @ y.t(),
        allowed_img,
    )
    tiled = TiledAdaCLBatch(img, txt, ids, chunk_size=7, queue_txt=q_txt, queue_img=q_img)
    for batch in (dense, tiled):
        assert batch.widths == (30, 20)
    got = _value_and_grads(tiled.loss(9.0, 0.2, "none", scale=scale), (img, txt), "none")
    want = _value_and_grads(dense.loss(9.0, 0.2, "none", scale=scale), (img, txt), "none")
    _assert_same((got[0], *got[1]), (want[0], *want[1]))


# ----------------------------------------------------------------------------- anchor selection


@pytest.mark.parametrize("selection", ["median", "min", "max", "random"])
@pytest.mark.parametrize("with_ids", [False, True])
@pytest.mark.parametrize("chunk_size", [1, 7, 64])
def test_anchor_over_tiles_equals_the_one_tile_anchor(selection, with_ids, chunk_size):
    """One algorithm, two sources: embeddings streamed in tiles of 1, 7 or 64 (> B: one tile)
    rows against the similarity matrix held whole."""
    img, txt = _clone_world(53)
    ids = _group_ids(53) if with_ids else None
    pos = None if ids is None else positive_mask(ids, ids)
    dense = adacl_anchor(
        cosine_similarity(img, txt),
        pos_mask=pos,
        selection=selection,
        generator=torch.Generator().manual_seed(3),
        negative_temperature=0.5,
    )
    tiled = select_anchor(
        TiledAdaCLBatch(img, txt, ids, chunk_size=chunk_size),
        selection=selection,
        generator=torch.Generator().manual_seed(3),
        scale=2.0,
    )
    assert dense.guard is None and dense.clone_count > 0
    assert _anchor_fields(tiled) == _anchor_fields(dense)
    assert tiled.anchor == pytest.approx(dense.anchor, abs=1e-12)
    assert tiled.log_sigma_anchor == pytest.approx(dense.log_sigma_anchor, abs=1e-12)
    assert tiled.fit.mu_clone == pytest.approx(dense.fit.mu_clone, abs=1e-12)
    assert tiled.fit.var_salient == pytest.approx(dense.fit.var_salient, abs=1e-12)


@pytest.mark.parametrize("band", ["sampled", "none"])
@pytest.mark.parametrize("selection", ["median", "min", "max", "random"])
def test_anchor_exact_ties_and_refined_histograms(selection, band, monkeypatch):
    """Integer dot products tie everywhere: the first clone in row-major order among equal
    deltas wins in both sources; a zero bin cap forces every histogram refinement (the
    streamed median without its one-pass band, ``band="none"``)."""
    import vlret.losses.adacl.anchor as anchor

    monkeypatch.setattr(anchor, "_BIN_CAP_PER_ROW", 0)
    if band == "none":
        import vlret.losses.adacl.median as median

        monkeypatch.setattr(median, "choose_band", lambda *args: None)
    gen = torch.Generator().manual_seed(4)
    img = torch.randint(0, 2, (40, 12), generator=gen).double()
    txt = (img + torch.randint(0, 2, (40, 12), generator=gen)).clamp(max=1)
    dense = adacl_anchor(
        img @ txt.t(), selection=selection, generator=torch.Generator().manual_seed(1)
    )
    got = select_anchor(
        TiledAdaCLBatch(img, txt, chunk_size=6, normalize=False),
        selection=selection,
        generator=torch.Generator().manual_seed(1),
    )
    assert dense.guard is None
    assert _anchor_fields(got) == _anchor_fields(dense)
    assert (got.anchor, got.log_sigma_anchor) == pytest.approx(
        (dense.anchor, dense.log_sigma_anchor), abs=1e-12
    )


def test_anchor_with_queue_blocks_equals_dense():
    """A queue text block whose clones can win the median (flat order: batch block, then
    queue block)."""
    img, txt = _clone_world(30, seed=2)
    ids = torch.arange(30) // 2
    q_txt, _ = _queue(img, ids)
    x = F.normalize(img, dim=1)
    allowed = q_txt.valid[None, :] & (q_txt.ids[None, :] != ids[:, None])
    for selection in ("median", "min", "max", "random"):
        dense = adacl_anchor(
            cosine_similarity(img, txt),
            pos_mask=positive_mask(ids, ids),
            extra_neg_txt=x @ q_txt.keys.t(),
            extra_neg_txt_mask=allowed,
            selection=selection,
            generator=torch.Generator().manual_seed(6),
        )
        got = select_anchor(
            TiledAdaCLBatch(img, txt, ids, chunk_size=7, queue_txt=q_txt),
            selection=selection,
            generator=torch.Generator().manual_seed(6),
        )
        assert dense.guard is None
        assert _anchor_fields(got) == _anchor_fields(dense), selection
        assert got.log_sigma_anchor == pytest.approx(dense.log_sigma_anchor, abs=1e-12)


# ----------------------------------------------------------------------------- the module


def test_chunk_size_always_tiles_even_a_batch_within_one_tile(monkeypatch):
    """chunk_size is the tile height (issue 25): set, the tiled batch is built for any batch
    size; one tile gives the dense module's values to float64 rounding."""
    import vlret.losses.adacl.module as module

    built = []
    tiled_batch = module.TiledAdaCLBatch

    def record(*args, **kwargs):
        built.append(kwargs["chunk_size"])
        return tiled_batch(*args, **kwargs)

    monkeypatch.setattr(module, "TiledAdaCLBatch", record)
    img, txt = (t.requires_grad_(True) for t in _clone_world(16))
    dense, one_tile = AdaCLLoss(), AdaCLLoss(chunk_size=16)
    want = _value_and_grads(dense(img, txt), (img, txt), "mean")
    got = _value_and_grads(one_tile(img, txt), (img, txt), "mean")
    _assert_same(
        (got[0], *got[1], one_tile.m1, one_tile.m2), (*want[:1], *want[1], dense.m1, dense.m2)
    )
    assert built == [16]
    AdaCLLoss()(img, txt)
    assert built == [16]  # no chunk_size: the dense path


def test_module_refuses_a_shard():
    img, txt = _clone_world(8)
    with pytest.raises(ValueError, match="not supported by AdaCLLoss"):
        AdaCLLoss(chunk_size=4)(img, txt, shard=(0, 4))


@pytest.mark.parametrize("scale_negatives", [False, True])
@pytest.mark.parametrize("selection", ["median", "random"])
def test_module_with_chunk_size_trains_like_the_dense_module(scale_negatives, selection):
    kw = {
        "anchor_selection": selection,
        "scale_negatives": scale_negatives,
        "negative_temperature": 1.0 if scale_negatives else 0.5,
        "margin_momentum": 0.5,
        "seed": 7,
    }
    dense, tiled = AdaCLLoss(**kw), AdaCLLoss(chunk_size=9, **kw)
    for step in range(4):
        img, txt = (t.requires_grad_(True) for t in _clone_world(41, seed=step))
        ids = _group_ids(41)
        want = _value_and_grads(dense(img, txt, ids), (img, txt), "mean")
        got = _value_and_grads(tiled(img, txt, ids), (img, txt), "mean")
        _assert_same((got[0], *got[1], tiled.m1, tiled.m2), (want[0], *want[1], dense.m1, dense.m2))
        stats, expected = tiled.last_stats, dense.last_stats
        assert stats["guard"] == expected["guard"]
        assert stats["clone_count"] == expected["clone_count"] > 0
    assert sum(dense.guard_counts) == 0 and float(dense.m1) != 20.0  # updates were accepted
    tiled.eval()  # eval mode: the loss with fixed margins, no update
    steps = tiled.steps
    tiled(img, txt, ids)
    assert tiled.steps == steps


@pytest.mark.parametrize("selection", ["median", "random", "max"])
@pytest.mark.parametrize("with_ids", [False, True])
def test_module_with_a_queue_and_chunk_size_trains_like_the_dense_module(selection, with_ids):
    """Queue of 24 keys filled by 4 batches of 11 (it wraps): the queue blocks are tiled too."""
    kw = {"anchor_selection": selection, "queue_size": 24, "embed_dim": 16, "seed": 3}
    dense, tiled = AdaCLLoss(**kw), AdaCLLoss(chunk_size=4, **kw)
    for step in range(4):
        img, txt = (t.requires_grad_(True) for t in _clone_world(11, seed=10 + step))
        ids = torch.arange(11) // 2 + 100 * step if with_ids else None
        want = _value_and_grads(dense(img, txt, ids), (img, txt), "mean")
        got = _value_and_grads(tiled(img, txt, ids), (img, txt), "mean")
        _assert_same((got[0], *got[1], tiled.m1, tiled.m2), (want[0], *want[1], dense.m1, dense.m2))
        assert tiled.last_stats["guard"] == dense.last_stats["guard"]
        assert tiled.last_stats["clone_count"] == dense.last_stats["clone_count"]
    assert bool(dense.txt_queue.valid.all())  # 44 keys through a queue of 24: it wrapped
    assert sum(dense.guard_counts) == 0 and dense.last_stats["clone_count"] > 0
    _assert_same(tiled.state_dict().values(), dense.state_dict().values())
