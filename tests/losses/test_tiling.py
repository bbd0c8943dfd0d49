"""The streaming engine's primitives against naive float64 oracles written here."""

from __future__ import annotations

import pytest
import torch

from vlret.losses._tiling import (
    PairExclusions,
    QueueBlock,
    QueueExclusions,
    SquareExclusions,
    check_shard,
    hardest_negatives,
    hinge_sums,
    masked_tiles,
    negatives_lse,
    prepare_embeddings,
    shard_directions,
    softmax_terms,
    tile_rows,
    tiles,
)

LOWEST = torch.finfo(torch.float64).min


def _data(n=11, width=None, dim=6, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=gen, dtype=torch.float64)
    y = torch.randn(width or n, dim, generator=gen, dtype=torch.float64)
    return x.requires_grad_(), y.requires_grad_()


def _ids(n):
    return torch.tensor([i // 3 for i in range(n)])  # groups of three share an id


def _square_negatives(ids, n):
    neg = torch.ones(n, n, dtype=torch.bool) if ids is None else ids[:, None] != ids[None, :]
    return neg & ~torch.eye(n, dtype=torch.bool)


def _naive_lse(s, neg, dim):
    """log-sum-exp over the negatives, one line at a time; the most negative float if none."""
    lines = s if dim == 1 else s.t()
    masks = neg if dim == 1 else neg.t()
    out = [
        line[m].logsumexp(0) if m.any() else line.new_tensor(LOWEST)
        for line, m in zip(lines, masks, strict=True)
    ]
    return torch.stack(out)


def test_tiles_cover_the_range_in_order():
    assert list(tiles(7, 3)) == [(0, 3), (3, 6), (6, 7)]
    assert list(tiles(4, 8)) == [(0, 4)]


@pytest.mark.parametrize("shard", [(3, 3), (-1, 2), (0, 12), (2,), [0.0, 1.0], "0:2", (True, 2)])
def test_bad_shard_is_refused_by_name(shard):
    with pytest.raises(ValueError, match="shard"):
        check_shard(shard, 11)


@pytest.mark.parametrize("with_ids", [False, True])
@pytest.mark.parametrize("tile", [1, 4, 11])
def test_square_lse_equals_the_naive_lines_value_and_gradient(with_ids, tile):
    x, y = _data()
    ids = _ids(11) if with_ids else None
    codes = None if ids is None else (ids, ids)
    neg = _square_negatives(ids, 11)
    rows, cols = negatives_lse(x, y, SquareExclusions(codes, 11), tile, columns=True)
    s = x @ y.t()
    want_rows, want_cols = _naive_lse(s, neg, 1), _naive_lse(s, neg, 0)
    torch.testing.assert_close(rows, want_rows, rtol=0, atol=1e-12)
    torch.testing.assert_close(cols, want_cols, rtol=0, atol=1e-12)
    w = torch.linspace(-1, 1, 11, dtype=torch.float64)
    got = torch.autograd.grad((rows * w).sum() + (cols * w.flip(0)).sum(), (x, y))
    want = torch.autograd.grad((want_rows * w).sum() + (want_cols * w.flip(0)).sum(), (x, y))
    for g, e in zip(got, want, strict=True):
        torch.testing.assert_close(g, e, rtol=0, atol=1e-12)


def test_square_lse_lines_without_negatives_give_the_sentinel_and_no_gradient():
    x, y = _data(n=4)
    ids = torch.tensor([0, 0, 1, 2])
    codes = (ids, torch.tensor([0, 0, 0, 0]))  # every text shares image 0's id
    rows, cols = negatives_lse(x, y, SquareExclusions(codes, 4), 2, columns=True)
    assert rows[0] == LOWEST and rows[1] == LOWEST
    assert torch.isfinite(rows).all() and torch.isfinite(cols).all()
    (gx, gy) = torch.autograd.grad(torch.logaddexp(torch.zeros(()), rows).sum(), (x, y))
    assert torch.isfinite(gx).all() and gx[:2].abs().max() == 0


@pytest.mark.parametrize("tile", [2, 5])
def test_rectangle_lse_with_a_queue_block_matches_naive(tile):
    x, keys = _data(n=7, width=9, seed=3)
    keys = keys.detach()
    valid = torch.tensor([True] * 7 + [False] * 2)
    block = QueueBlock(keys, valid, ids=torch.arange(9) % 4, anchor_ids=torch.arange(7) % 4)
    out = negatives_lse(x, keys, QueueExclusions(block), tile, columns=False)
    neg = valid[None, :] & (block.ids[None, :] != block.anchor_ids[:, None])
    want = _naive_lse(x @ keys.t(), neg, 1)
    torch.testing.assert_close(out, want, rtol=0, atol=1e-12)
    (g,) = torch.autograd.grad(out.sum(), x)
    (e,) = torch.autograd.grad(want.sum(), x)
    torch.testing.assert_close(g, e, rtol=0, atol=1e-12)


def test_rectangle_lse_is_gradchecked_in_both_inputs():
    x, y = _data(n=3, width=5, dim=3, seed=5)
    pair = torch.tensor([1, 4, 0])
    exclusions = PairExclusions(None, None, pair, 5)
    assert torch.autograd.gradcheck(
        lambda a, b: negatives_lse(a, b, exclusions, 2, columns=False), (x, y)
    )


def test_hardest_negatives_ties_go_to_the_lowest_index_across_tiles():
    x = torch.ones(4, 2, dtype=torch.float64)
    y = torch.ones(4, 2, dtype=torch.float64)  # every score ties
    row_top, row_arg, col_top, col_arg = hardest_negatives(
        x, y, SquareExclusions(None, 4), 1, columns=True
    )
    assert row_arg.tolist() == [1, 0, 0, 0] and col_arg.tolist() == [1, 0, 0, 0]
    assert (row_top == 2).all() and (col_top == 2).all()


def test_hardest_negatives_and_visit_see_every_masked_tile():
    x, y = _data()
    ids = _ids(11)
    seen = []
    row_top, row_arg, col_top, col_arg = hardest_negatives(
        x,
        y,
        SquareExclusions((ids, ids), 11),
        4,
        columns=True,
        visit=lambda a, b, t: seen.append((a, b, t.clone())),
    )
    full = torch.cat([t for _, _, t in seen])
    s = (x @ y.t()).detach()
    neg = _square_negatives(ids, 11)
    torch.testing.assert_close(full, s.masked_fill(~neg, LOWEST), rtol=0, atol=0)
    torch.testing.assert_close(row_top, s.masked_fill(~neg, LOWEST).amax(1), rtol=0, atol=0)
    torch.testing.assert_close(col_top, s.masked_fill(~neg, LOWEST).amax(0), rtol=0, atol=0)
    assert bool(neg[torch.arange(11), row_arg].all()) and bool(neg[col_arg, torch.arange(11)].all())


@pytest.mark.parametrize("tile", [3, 11])
def test_hinge_sums_match_the_naive_clamped_sums(tile):
    x, y = _data(seed=8)
    ids = _ids(11)
    d = (x * y).sum(1)
    neg = _square_negatives(ids, 11)
    rows, cols = hinge_sums(
        x, y, d, d, margin=0.3, exclusions=SquareExclusions((ids, ids), 11), tile=tile
    )
    s = x @ y.t()
    want_rows = ((0.3 + s - d[:, None]).clamp(min=0) * neg).sum(1)
    want_cols = ((0.3 + s - d[None, :]).clamp(min=0) * neg).sum(0)
    torch.testing.assert_close(rows, want_rows, rtol=0, atol=1e-12)
    torch.testing.assert_close(cols, want_cols, rtol=0, atol=1e-12)
    got = torch.autograd.grad(rows.sum() + 2 * cols.sum(), (x, y), retain_graph=True)
    want = torch.autograd.grad(want_rows.sum() + 2 * want_cols.sum(), (x, y))
    for g, e in zip(got, want, strict=True):
        torch.testing.assert_close(g, e, rtol=0, atol=1e-12)


def test_masked_tiles_fill_exactly_the_exclusions():
    x, y = _data(n=5)
    pair = torch.tensor([4, 3, 2, 1, 0])
    codes = torch.tensor([0, 1, 1, 2, 3])
    exclusions = PairExclusions(codes, codes, pair, 5)
    full = torch.cat([t for _, _, t in masked_tiles(x, y, exclusions, 2, -7.0)])
    excluded = (codes[:, None] == codes[None, :]) | (torch.arange(5)[None, :] == pair[:, None])
    assert torch.equal(full == -7.0, excluded)
    assert torch.equal(exclusions.mask(1, 4), excluded[1:4])


def test_the_shards_softmax_terms_add_up_to_the_square():
    x, y = _data(n=9, seed=4)
    ids = _ids(9)
    batch = prepare_embeddings(x, y, ids, None, chunk_size=4, normalize=True)
    scale = torch.tensor(7.0, dtype=torch.float64)
    whole = softmax_terms(batch, scale, None, None)
    parts = torch.cat([softmax_terms(batch, scale, None, s) for s in ((0, 4), (4, 9))])
    torch.testing.assert_close(parts, whole, rtol=0, atol=1e-12)
    rows, cands = shard_directions(batch, (2, 5))
    assert rows.rows.shape == (3, 6) and rows.pair.tolist() == [2, 3, 4]
    torch.testing.assert_close(rows.positives, (batch.x * batch.y).sum(1)[2:5], rtol=0, atol=0)
    assert cands.cands is batch.x


def test_prepare_embeddings_names_bad_arguments():
    x, y = _data(n=3)
    with pytest.raises(ValueError, match="chunk_size"):
        prepare_embeddings(x, y, None, None, chunk_size=0, normalize=True)
    with pytest.raises(ValueError, match="img_emb"):
        prepare_embeddings(x[:1], y[:1], None, None, chunk_size=2, normalize=True)
    with pytest.raises(ValueError, match="txt_ids"):
        prepare_embeddings(x, y, None, [0, 1, 2], chunk_size=2, normalize=True)
    with pytest.raises(ValueError, match="img_ids"):
        prepare_embeddings(x, y, [0, 1], None, chunk_size=2, normalize=True)
    half = prepare_embeddings(x.half(), y.half(), None, None, chunk_size=2, normalize=False)
    assert half.x.dtype == torch.float32


def test_square_lse_mixes_one_exponential_and_careful_tiles(monkeypatch):
    """Scale 1000: rows 0-7 clustered (one-exponential tile), rows 8-15 spread (underflow:
    careful), rows 16-19 share one text id (columns 16-19 have no negative in their tile:
    careful); values and gradients equal the naive masked log-sum-exp."""
    import vlret.losses._tiling.lse as lse

    starts = []
    careful = lse._careful_tile
    monkeypatch.setattr(lse, "_careful_tile", lambda *a: starts.append(a[3]) or careful(*a))
    gen = torch.Generator().manual_seed(3)
    u, v = torch.randn(2, 8, generator=gen, dtype=torch.float64)
    noise = torch.randn(20, 8, generator=gen, dtype=torch.float64)
    txt = (u + 0.01 * noise).requires_grad_()
    img_rows = [v + 0.01 * noise[:8], torch.randn(12, 8, generator=gen, dtype=torch.float64)]
    img = torch.cat(img_rows).requires_grad_()
    ids = torch.cat([torch.arange(16), torch.full((4,), 16)])
    got = negatives_lse(img * 1000.0, txt, SquareExclusions((ids, ids), 20), 8, columns=True)
    assert starts == [8, 16]  # the spread tile and the id tile only
    s = 1000.0 * img @ txt.t()
    neg = _square_negatives(ids, 20)
    want = (_naive_lse(s, neg, 1), _naive_lse(s, neg, 0))
    w_row, w_col = torch.randn(2, 20, generator=gen, dtype=torch.float64)
    grads_got = torch.autograd.grad((got[0] * w_row).sum() + (got[1] * w_col).sum(), (img, txt))
    grads_want = torch.autograd.grad((want[0] * w_row).sum() + (want[1] * w_col).sum(), (img, txt))
    for a, b in zip((*got, *grads_got), (*want, *grads_want), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_masks_are_built_on_the_batchs_device_even_without_ids():
    """A bare diagonal has no tensor to take a device from: the batch's device is carried."""
    mask = SquareExclusions(None, 4, device="meta").mask(0, 2)
    assert mask.device.type == "meta" and mask.shape == (2, 4)
    x, y = _data(n=3)
    batch = prepare_embeddings(x, y, None, None, chunk_size=2, normalize=True)
    assert batch.exclusions.device == x.device
    assert torch.equal(batch.exclusions.mask(0, 3), torch.eye(3, dtype=torch.bool))


def test_tile_rows_equals_the_whole_matrix_in_value_and_every_gradient():
    """A per-row function of whole rows (with a row argument and a closed-over scale), tiled
    and recomputed in the backward pass, against the dense matrix; any tile height."""
    gen = torch.Generator().manual_seed(7)
    x, y = (torch.randn(11, 5, generator=gen, dtype=torch.float64).requires_grad_() for _ in "xy")
    offset = torch.randn(11, generator=gen, dtype=torch.float64).requires_grad_()
    scale = torch.tensor(3.0, dtype=torch.float64, requires_grad=True)
    seen = []

    def fn(s, start, off):
        seen.append(start)
        return torch.nn.functional.softplus(scale * s - off[:, None]).sum(1) * (start + 1)

    weights = torch.randn(11, generator=gen, dtype=torch.float64)
    for tile in (1, 4, 11, 50):
        seen.clear()
        got = tile_rows(fn, x, y, tile, offset)
        starts = list(range(0, 11, tile))
        assert seen == starts  # one call per tile, each told its first row
        factor = torch.tensor([s + 1 for s in starts for _ in range(min(tile, 11 - s))])
        want = torch.nn.functional.softplus(scale * x @ y.t() - offset[:, None]).sum(1) * factor
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
        inputs = (x, y, offset, scale)
        grads_got = torch.autograd.grad((got * weights).sum(), inputs)
        grads_want = torch.autograd.grad((want * weights).sum(), inputs)
        for a, b in zip(grads_got, grads_want, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-11)
    with torch.no_grad():
        assert not tile_rows(fn, x, y, 4, offset).requires_grad
