"""SCAN and BFAN scores against naive per-caption loops that form the attended vectors.

The oracles follow the reference code's algorithm (kuanghuei/SCAN ``xattn_score_t2i`` /
``xattn_score_i2t``, CrossmodalGroup/BFAN ``xattn_score``): for each caption and image, slice
the caption's real words, attend, form every attended vector explicitly and take cosines, all
in float64. The one documented deviation (BFAN keeps the largest weights where the reference
would divide 0 by 0) is part of the oracle.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vlret.models.cross_attention import (
    COSINE_EPS,
    NORM_EPS,
    attention_weights,
    bfan_scores,
    block_plan,
    check_tokens,
    scan_scores,
)

EPS64 = torch.finfo(torch.float64).eps
EPS32 = torch.finfo(torch.float32).eps
N_IMG, N_CAP, R, L, D = 3, 5, 6, 7, 16
AGGREGATIONS = ("lse", "mean", "max", "sum")


def tolerance(eps: float, lambda_softmax: float) -> float:
    """Rounding bound of the computation with a 16x margin: dot products over D (raw), the
    context (attended dot product) and the context squared (Gram quadratic form), each error
    magnified at most by the softmax's inverse temperature."""
    return 16 * eps * lambda_softmax * (D + R * R + L * L)


# ----------------------------------------------------------------------------- oracles


def oracle_weights(query: torch.Tensor, context: torch.Tensor, lam: float) -> torch.Tensor:
    """Reference func_attention's weights (q, c) for one query set against one context set."""
    raw = context @ query.T  # (c, q)
    clipped = F.leaky_relu(raw, 0.1)
    clipped = clipped / (clipped.pow(2).sum(dim=1, keepdim=True).sqrt() + 1e-8)
    return torch.softmax(clipped.T * lam, dim=1)


def oracle_focal(weights: torch.Tensor, focal: str) -> torch.Tensor:
    diff = weights.unsqueeze(-1) - weights.unsqueeze(-2)  # (q, c_i, c_j): x_i - x_j
    if focal == "prob":
        diff = diff * weights.sqrt().unsqueeze(-2)
    keep = (diff.sum(dim=-1) > 0).to(weights.dtype)
    # documented deviation: a row with nothing kept keeps its largest weights
    none = keep.sum(dim=-1, keepdim=True) == 0
    top = (weights == weights.amax(dim=-1, keepdim=True)).to(weights.dtype)
    keep = torch.where(none, top, keep)
    kept = weights * keep
    return kept / kept.sum(dim=-1, keepdim=True)


def cosine(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (x * y).sum(-1) / (x.norm(dim=-1) * y.norm(dim=-1)).clamp(min=1e-8)


def pool(rel: torch.Tensor, aggregation: str, lambda_lse: float) -> torch.Tensor:
    if aggregation == "lse":
        return torch.log(torch.exp(rel * lambda_lse).sum()) / lambda_lse
    if aggregation == "max":
        return rel.max()
    if aggregation == "sum":
        return rel.sum()
    return rel.mean()


def oracle_scan(regions, words, lengths, direction, lam, aggregation, lambda_lse):
    rows = []
    for c in range(words.shape[0]):
        cap = words[c, : int(lengths[c])].double()
        column = []
        for i in range(regions.shape[0]):
            img = regions[i].double()
            query, context = (cap, img) if direction == "t2i" else (img, cap)
            attended = oracle_weights(query, context, lam) @ context
            column.append(pool(cosine(query, attended), aggregation, lambda_lse))
        rows.append(torch.stack(column))
    return torch.stack(rows, dim=1)


def oracle_bfan(regions, words, lengths, focal, lam):
    rows = []
    for c in range(words.shape[0]):
        cap = words[c, : int(lengths[c])].double()
        column = []
        for i in range(regions.shape[0]):
            img = regions[i].double()
            total = 0.0
            for query, context in ((cap, img), (img, cap)):
                weights = oracle_focal(oracle_weights(query, context, lam), focal)
                total = total + cosine(query, weights @ context).mean()
            column.append(total)
        rows.append(torch.stack(column))
    return torch.stack(rows, dim=1)


# ----------------------------------------------------------------------------- data


def make_tokens(seed=0, n_img=N_IMG, n_cap=N_CAP, dtype=torch.float64, pad=0.0, r=R, l=L, d=D):
    g = torch.Generator().manual_seed(seed)
    regions = F.normalize(torch.randn(n_img, r, d, generator=g, dtype=torch.float64), dim=-1)
    # captions share directions with the images, as trained embeddings do
    words = torch.randn(n_cap, l, d, generator=g, dtype=torch.float64)
    words = words + 2.0 * regions[torch.arange(n_cap) % n_img].mean(1, True)
    words = F.normalize(words, dim=-1)
    lengths = torch.randint(1, l + 1, (n_cap,), generator=g)
    lengths[0], lengths[-1] = l, 2
    mask = torch.arange(l) < lengths[:, None]
    words = torch.where(mask[..., None], words, pad)
    return regions.to(dtype), words.to(dtype), lengths


# ----------------------------------------------------------------------------- oracles


@pytest.mark.parametrize("direction", ["t2i", "i2t"])
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_scan_matches_oracle(direction, aggregation):
    regions, words, lengths = make_tokens(seed=1)
    lam = 9.0 if direction == "t2i" else 4.0
    got = scan_scores(
        regions,
        words,
        lengths,
        direction=direction,
        aggregation=aggregation,
        lambda_softmax=lam,
        lambda_lse=6.0,
    )
    want = oracle_scan(regions, words, lengths, direction, lam, aggregation, 6.0)
    assert got.dtype == torch.float64 and got.shape == (N_IMG, N_CAP)
    torch.testing.assert_close(got, want, rtol=0, atol=tolerance(EPS64, lam) * L)


@pytest.mark.parametrize("focal", ["equal", "prob"])
@pytest.mark.parametrize("lam", [20.0, 5.0, 50.0])
def test_bfan_matches_oracle(focal, lam):
    regions, words, lengths = make_tokens(seed=2)
    got = bfan_scores(regions, words, lengths, focal=focal, lambda_softmax=lam)
    want = oracle_bfan(regions, words, lengths, focal, lam)
    torch.testing.assert_close(got, want, rtol=0, atol=2 * tolerance(EPS64, lam))


@pytest.mark.parametrize("focal", ["equal", "prob"])
def test_bfan_focal_actually_drops_items(focal):
    """The focal step matters: without it (all items kept) the scores differ."""
    regions, words, lengths = make_tokens(seed=3)
    got = bfan_scores(regions, words, lengths, focal=focal)
    kept_all = torch.stack(
        [
            torch.stack(
                [
                    sum(
                        cosine(q, oracle_weights(q, c, 20.0) @ c).mean()
                        for q, c in (
                            (words[j, : lengths[j]], regions[i]),
                            (regions[i], words[j, : lengths[j]]),
                        )
                    )
                    for i in range(N_IMG)
                ]
            )
            for j in range(N_CAP)
        ],
        dim=1,
    )
    assert (got - kept_all).abs().max() > 1e-3


def test_bfan_one_word_caption_and_equal_weights():
    """Degenerate rows (one-word caption for i2t, identical regions for t2i) keep every
    item, where the reference would return NaN."""
    regions, words, lengths = make_tokens(seed=4)
    regions[0] = regions[0, :1].expand(R, D)
    lengths[1] = 1
    got = bfan_scores(regions, words, lengths)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(
        got,
        oracle_bfan(regions, words, lengths, "equal", 20.0),
        rtol=0,
        atol=2 * tolerance(EPS64, 20.0),
    )
    # one word: every region attends to that word alone (i2t)
    word = words[1, :1]
    t2i = cosine(word, oracle_focal(oracle_weights(word, regions[2], 20.0), "equal") @ regions[2])
    i2t = cosine(regions[2], word.expand(R, D)).mean()
    torch.testing.assert_close(got[2, 1], t2i.mean() + i2t, rtol=0, atol=1e-12)
    # identical regions: every word's attended vector is that region (t2i)
    n = int(lengths[0])
    t2i = cosine(words[0, :n], regions[0, :1].expand(n, D)).mean()
    i2t = cosine(
        regions[0],
        oracle_focal(oracle_weights(regions[0], words[0, :n], 20.0), "equal") @ words[0, :n],
    ).mean()
    torch.testing.assert_close(got[0, 0], t2i + i2t, rtol=0, atol=1e-12)


def test_attention_weights_matches_oracle_layout():
    """The shared primitive (used by SGRAF) agrees with the reference func_attention."""
    regions, words, lengths = make_tokens(seed=5)
    raw = torch.einsum("cld,ird->cilr", words, regions)  # (cap, img, q=L, c=R)
    mask = torch.arange(L) < lengths[:, None]
    got = attention_weights(raw, query_mask=mask[:, None, :], context_mask=None, lambda_softmax=9.0)
    for c in range(N_CAP):
        for i in range(N_IMG):
            n = int(lengths[c])
            want = oracle_weights(words[c, :n], regions[i], 9.0)
            torch.testing.assert_close(got[c, i, :n], want, rtol=0, atol=1e-14)
    # i2t: regions query the caption's real words; padded words get weight 0
    raw_t = raw.transpose(-1, -2)  # (cap, img, R, L)
    got = attention_weights(
        raw_t, query_mask=None, context_mask=mask[:, None, :], lambda_softmax=4.0
    )
    for c in range(N_CAP):
        n = int(lengths[c])
        want = oracle_weights(regions[1], words[c, :n], 4.0)
        torch.testing.assert_close(got[c, 1, :, :n], want, rtol=0, atol=1e-14)
        assert (got[c, 1, :, n:] == 0).all()


def test_reference_epsilons():
    assert NORM_EPS == 1e-8 and COSINE_EPS == 1e-8


# ----------------------------------------------------------------------------- padding, blocks


def _all_scorers():
    yield lambda *a, **k: scan_scores(*a, direction="t2i", aggregation="lse", **k)
    yield lambda *a, **k: scan_scores(*a, direction="i2t", aggregation="mean", **k)
    yield lambda *a, **k: scan_scores(*a, direction="t2i", aggregation="max", **k)
    yield lambda *a, **k: bfan_scores(*a, focal="equal", **k)
    yield lambda *a, **k: bfan_scores(*a, focal="prob", **k)


@pytest.mark.parametrize("scorer", list(_all_scorers()))
@pytest.mark.parametrize("garbage", [1e30, float("nan"), -3.0])
def test_padding_never_takes_part(scorer, garbage):
    regions, words, lengths = make_tokens(seed=6, dtype=torch.float32)
    clean = scorer(regions, words, lengths)
    # garbage in the padding and in extra padding positions appended to every caption
    longer = torch.cat([words, torch.zeros(N_CAP, 3, D)], dim=1)
    mask = torch.arange(L + 3) < lengths[:, None]
    dirty = torch.where(mask[..., None], longer, torch.full_like(longer, garbage))
    dirty[:, :, 0] = torch.where(mask, dirty[:, :, 0], 7.0)
    torch.testing.assert_close(scorer(regions, dirty, lengths), clean, rtol=0, atol=0)


@pytest.mark.parametrize("scorer", list(_all_scorers()))
@pytest.mark.parametrize("max_elements", [1, 97, 3 * R * L * 2])
def test_blocking_gives_the_same_scores(scorer, max_elements):
    regions, words, lengths = make_tokens(seed=7, n_img=4, n_cap=6)
    whole = scorer(regions, words, lengths)
    blocked = scorer(regions, words, lengths, max_elements=max_elements)
    torch.testing.assert_close(blocked, whole, rtol=0, atol=tolerance(EPS64, 20.0))


@pytest.mark.parametrize("autograd", [False, True])
@pytest.mark.parametrize("max_elements", [1, 500, 5000, 10**6, None])
def test_block_plan_bounds_every_block(max_elements, autograd):
    lengths = torch.randint(1, 20, (50,), generator=torch.Generator().manual_seed(0))
    step, order, blocks = block_plan(
        30, 7, 16, lengths, max_elements=max_elements, autograd=autograd
    )
    budget = max_elements or 2**24
    assert sorted(order.tolist()) == list(range(50))
    assert lengths[order].tolist() == sorted(lengths.tolist())
    assert [b[0] for b in blocks] == [0] + [b[1] for b in blocks[:-1]] and blocks[-1][1] == 50
    assert step == 1 or step * 7 * max(16, int(lengths.max())) <= budget
    for start, stop, longest in blocks:
        assert longest == int(lengths[order[start:stop]].max())
        single_pair = step == 1 and stop - start == 1
        assert single_pair or (stop - start) * longest * max(step * 7, 16) <= budget


def test_caption_order_does_not_matter():
    """Captions are sorted by length internally; the output keeps the input order."""
    regions, words, lengths = make_tokens(seed=8, n_cap=9)
    perm = torch.randperm(9, generator=torch.Generator().manual_seed(0))
    got = scan_scores(regions, words[perm], lengths[perm], max_elements=R * L * 2)
    torch.testing.assert_close(
        got, scan_scores(regions, words, lengths)[:, perm], rtol=0, atol=tolerance(EPS64, 9.0)
    )


def test_empty_sets():
    regions, words, lengths = make_tokens()
    assert scan_scores(regions[:0], words, lengths).shape == (0, N_CAP)
    assert bfan_scores(regions, words[:0], lengths[:0]).shape == (N_IMG, 0)


# ----------------------------------------------------------------------------- dtypes


@pytest.mark.parametrize("scorer", list(_all_scorers()))
def test_half_inputs_give_float32(scorer):
    regions, words, lengths = make_tokens(seed=9, dtype=torch.float16)
    got = scorer(regions, words, lengths)
    assert got.dtype == torch.float32
    want = scorer(regions.double(), words.double(), lengths)
    torch.testing.assert_close(got.double(), want, rtol=0, atol=tolerance(EPS32, 20.0))


def test_mixed_dtypes_promote():
    regions, words, lengths = make_tokens()
    assert scan_scores(regions.float(), words, lengths).dtype == torch.float64
    assert bfan_scores(regions.float(), words.float(), lengths.tolist()).dtype == torch.float32


# ----------------------------------------------------------------------------- gradients


@pytest.mark.parametrize("scorer", list(_all_scorers()))
def test_gradcheck(scorer):
    regions, words, lengths = make_tokens(seed=10, n_img=2, n_cap=2, r=3, l=3, d=4)
    regions.requires_grad_(True)
    words.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda r, w: scorer(r, w, lengths), (regions, words))


@pytest.mark.parametrize("scorer", list(_all_scorers()))
def test_blocked_gradient_equals_whole(scorer):
    regions, words, lengths = make_tokens(seed=12, n_img=3, n_cap=4)
    grads = []
    for max_elements in (None, R * L * 2):
        r = regions.clone().requires_grad_(True)
        w = words.clone().requires_grad_(True)
        scorer(r, w, lengths, max_elements=max_elements).square().sum().backward()
        grads.append(torch.cat([r.grad.flatten(), w.grad.flatten()]))
    torch.testing.assert_close(grads[1], grads[0], rtol=0, atol=tolerance(EPS64, 20.0))


@pytest.mark.parametrize(
    ("name", "ours", "oracle"),
    [
        (
            "scan_t2i_lse",
            lambda r, w, n: scan_scores(r, w, n),
            lambda r, w, n: oracle_scan(r, w, n, "t2i", 9.0, "lse", 6.0),
        ),
        (
            "scan_i2t_mean",
            lambda r, w, n: scan_scores(
                r, w, n, direction="i2t", aggregation="mean", lambda_softmax=4.0
            ),
            lambda r, w, n: oracle_scan(r, w, n, "i2t", 4.0, "mean", 6.0),
        ),
        (
            "bfan_prob",
            lambda r, w, n: bfan_scores(r, w, n, focal="prob"),
            lambda r, w, n: oracle_bfan(r, w, n, "prob", 20.0),
        ),
    ],
)
def test_gradient_matches_oracle(name, ours, oracle):
    regions, words, lengths = make_tokens(seed=11)
    weights = torch.randn(
        N_IMG, N_CAP, generator=torch.Generator().manual_seed(1), dtype=torch.float64
    )
    grads = []
    for fn in (ours, oracle):
        r = regions.clone().requires_grad_(True)
        w = words.clone().requires_grad_(True)
        (fn(r, w, lengths) * weights).sum().backward()
        grads.append((r.grad, w.grad))
    tol = tolerance(EPS64, 20.0) * 20.0
    torch.testing.assert_close(grads[0][0], grads[1][0], rtol=0, atol=tol)
    torch.testing.assert_close(grads[0][1], grads[1][1], rtol=0, atol=tol)
    # padding words get no gradient
    mask = torch.arange(L) < lengths[:, None]
    assert (grads[0][1][~mask] == 0).all()


# ----------------------------------------------------------------------------- errors


def test_check_tokens_returns_long_lengths():
    regions, words, lengths = make_tokens()
    out = check_tokens(regions, words, lengths.int().tolist())
    assert out.dtype == torch.long and torch.equal(out, lengths)


def _bad_inputs():
    regions, words, lengths = make_tokens(dtype=torch.float32)
    nan_regions = regions.clone()
    nan_regions[1, 2, 3] = float("nan")
    inf_words = words.clone()
    inf_words[0, 0, 0] = float("inf")
    yield "regions", (regions[0], words, lengths), {}
    yield "words", (regions, words[0], lengths), {}
    yield "words", (regions, words[..., :-1], lengths), {}
    yield "regions", (regions.long(), words, lengths), {}
    yield "regions", (regions[:, :0], words, lengths), {}
    yield "word_lengths", (regions, words, lengths[:-1]), {}
    yield "word_lengths", (regions, words, lengths[None]), {}
    yield "word_lengths", (regions, words, lengths.double()), {}
    yield "word_lengths", (regions, words, torch.where(lengths == 2, 0, lengths)), {}
    yield "word_lengths", (regions, words, lengths + L), {}
    yield "regions", (nan_regions, words, lengths), {}
    yield "words", (regions, inf_words, lengths), {}
    yield "max_elements", (regions, words, lengths), {"max_elements": 0}


@pytest.mark.parametrize("fn", [scan_scores, bfan_scores])
@pytest.mark.parametrize(("name", "args", "kwargs"), list(_bad_inputs()))
def test_bad_inputs_name_their_argument(fn, name, args, kwargs):
    with pytest.raises(ValueError, match=name):
        fn(*args, **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"direction": "both"}, "direction"),
        ({"aggregation": "median"}, "aggregation"),
        ({"lambda_softmax": 0.0}, "lambda_softmax"),
        ({"lambda_softmax": float("nan")}, "lambda_softmax"),
        ({"lambda_lse": -1.0}, "lambda_lse"),
    ],
)
def test_scan_bad_options(kwargs, name):
    regions, words, lengths = make_tokens()
    with pytest.raises(ValueError, match=name):
        scan_scores(regions, words, lengths, **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [({"focal": "none"}, "focal"), ({"lambda_softmax": -2.0}, "lambda_softmax")],
)
def test_bfan_bad_options(kwargs, name):
    regions, words, lengths = make_tokens()
    with pytest.raises(ValueError, match=name):
        bfan_scores(regions, words, lengths, **kwargs)


@pytest.mark.parametrize("scorer", list(_all_scorers()))
def test_inference_buffers_give_the_autograd_numbers(scorer):
    """Without autograd the blocks reuse buffers and work in place: the same operations."""
    regions, words, lengths = make_tokens(seed=13, n_img=4, n_cap=7, dtype=torch.float32)
    with torch.no_grad():
        buffered = scorer(regions, words, lengths, max_elements=R * L * 4)
    fresh = scorer(regions.requires_grad_(True), words, lengths, max_elements=R * L * 4)
    torch.testing.assert_close(fresh.detach(), buffered, rtol=0, atol=0)
