"""Retrieval metrics against a full-sort oracle, tie rules and the COCO 5-fold protocol."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import vlret.metrics.ranks as metrics  # the module whose private tile constants are patched
from vlret.metrics import (
    RetrievalMetrics,
    average_metrics,
    coco_5fold_metrics,
    metrics_from_ranks,
    retrieval_metrics,
    retrieval_metrics_from_similarity,
    retrieval_ranks,
    retrieval_ranks_from_similarity,
)


def oracle_ranks(sim: np.ndarray, txt_to_img: np.ndarray):
    """Full sort, in the VSE++ style, but with ties counted against the query.

    i2t: sort all texts by score descending; the rank is the number of non-matching texts
    scoring >= the best matching one. t2i: the same over images.
    """
    n_img, n_txt = sim.shape
    i2t = np.zeros(n_img, dtype=np.int64)
    for i in range(n_img):
        order = np.argsort(-sim[i], kind="stable")
        match = txt_to_img[order] == i
        best = sim[i, order[np.argmax(match)]]  # first matching text in sorted order
        i2t[i] = sum(1 for j in order if txt_to_img[j] != i and sim[i, j] >= best)
    t2i = np.zeros(n_txt, dtype=np.int64)
    for j in range(n_txt):
        own = sim[txt_to_img[j], j]
        t2i[j] = sum(1 for k in range(n_img) if k != txt_to_img[j] and sim[k, j] >= own)
    return i2t, t2i


def oracle_metrics(i2t, t2i):
    out = {}
    for p, r in (("i2t", i2t), ("t2i", t2i)):
        for k in (1, 5, 10):
            out[f"{p}_r{k}"] = 100.0 * len([x for x in r if x < k]) / len(r)
        s = sorted(r)
        n = len(s)
        med = s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2
        out[f"{p}_medr"] = float(int(med) + 1)
        out[f"{p}_meanr"] = sum(r) / n + 1
    out["rsum"] = sum(out[f"{p}_r{k}"] for p in ("i2t", "t2i") for k in (1, 5, 10))
    return out


def make_problem(n_img, texts_per_image, dim=16, seed=0, noise=1.0, shuffle=False):
    g = torch.Generator().manual_seed(seed)
    img = torch.randn(n_img, dim, generator=g, dtype=torch.float64)
    if isinstance(texts_per_image, int):
        counts = [texts_per_image] * n_img
    else:
        counts = texts_per_image
    t2i = torch.tensor([i for i, c in enumerate(counts) for _ in range(c)])
    if shuffle:
        t2i = t2i[torch.randperm(len(t2i), generator=g)]
    txt = img[t2i] + noise * torch.randn(len(t2i), dim, generator=g, dtype=torch.float64)
    return img, txt, t2i


@pytest.mark.parametrize("texts_per_image", [1, 5, 20, [1, 3, 7, 2, 5, 1, 4, 6, 2, 3, 1, 2, 8, 1]])
@pytest.mark.parametrize("chunk_size", [1, 3, 1024])
@pytest.mark.parametrize("shuffle", [False, True])
def test_ranks_match_full_sort_oracle(texts_per_image, chunk_size, shuffle):
    n_img = 14
    img, txt, t2i = make_problem(
        n_img, texts_per_image, seed=len(str(texts_per_image)), shuffle=shuffle
    )
    sim = (img @ txt.t()).numpy()
    exp_i2t, exp_t2i = oracle_ranks(sim, t2i.numpy())
    i2t, t2i_r = retrieval_ranks(img, txt, t2i, chunk_size=chunk_size)
    np.testing.assert_array_equal(i2t.numpy(), exp_i2t)
    np.testing.assert_array_equal(t2i_r.numpy(), exp_t2i)
    i2t, t2i_r = retrieval_ranks_from_similarity(torch.from_numpy(sim), t2i, chunk_size=chunk_size)
    np.testing.assert_array_equal(i2t.numpy(), exp_i2t)
    np.testing.assert_array_equal(t2i_r.numpy(), exp_t2i)
    m = retrieval_metrics(img, txt, t2i, chunk_size=chunk_size).as_dict()
    expected = oracle_metrics(exp_i2t, exp_t2i)
    assert m.keys() == expected.keys()
    for k in expected:
        assert m[k] == pytest.approx(expected[k]), k


def test_larger_random_problem_float32():
    img, txt, t2i = make_problem(300, 5, dim=32, seed=3, noise=2.0, shuffle=True)
    img, txt = img.float(), txt.float()
    sim = (img @ txt.t()).double().numpy()
    # the oracle ranks float32 embeddings with float64 scores: no near-ties at this size
    exp = oracle_ranks(sim, t2i.numpy())
    got = retrieval_ranks(img, txt, t2i, chunk_size=64)
    np.testing.assert_array_equal(got[0].numpy(), exp[0])
    np.testing.assert_array_equal(got[1].numpy(), exp[1])


def test_ties_count_against_the_query():
    # exact small-integer scores: every computation order gives the same numbers
    sim = torch.tensor(
        [
            [3.0, 1.0, 3.0, 0.0],  # image 0: texts 0, 1; non-matching text 2 ties its best
            [2.0, 2.0, 2.0, 2.0],  # image 1: text 2; everything ties
            [0.0, 5.0, 1.0, 4.0],  # image 2: text 3; text 1 beats it
        ]
    )
    t2i = torch.tensor([0, 0, 1, 2])
    i2t, t2i_r = retrieval_ranks_from_similarity(sim, t2i)
    assert i2t.tolist() == [1, 3, 1]
    # text 0: own 3, others 2, 0 -> 0; text 1: own 1, others 2, 5 -> 2;
    # text 2: own 2, others 3, 1 -> 1; text 3: own 4, others 0, 2 -> 0
    assert t2i_r.tolist() == [0, 2, 1, 0]
    np.testing.assert_array_equal(i2t.numpy(), oracle_ranks(sim.numpy(), t2i.numpy())[0])


def test_collapsed_model_scores_worst_not_best():
    img = torch.ones(20, 8)
    txt = torch.ones(100, 8)
    t2i = torch.arange(100) // 5
    m = retrieval_metrics(img, txt, t2i)
    assert m.i2t_r1 == 0.0 and m.t2i_r1 == 0.0
    assert m.i2t_medr == 96.0  # 95 non-matching texts tie with the best
    assert m.t2i_medr == 20.0
    half = retrieval_metrics(img.half(), txt.half(), t2i)
    assert half == m


def test_exact_values_small_case():
    # 2 images, 1 text each; both images rank their text first, text 0 prefers image 1
    sim = torch.tensor([[0.1, 0.0], [0.5, 0.9]])
    m = retrieval_metrics_from_similarity(sim, [0, 1])
    assert (m.i2t_r1, m.t2i_r1) == (100.0, 50.0)
    assert (m.i2t_r5, m.t2i_r5, m.t2i_r10) == (100.0, 100.0, 100.0)
    assert m.rsum == 550.0
    assert (m.i2t_medr, m.i2t_meanr) == (1.0, 1.0)
    assert (m.t2i_medr, m.t2i_meanr) == (1.0, 1.5)  # ranks [1, 0]: median 0.5 -> floor + 1


def test_coco_5fold_protocol():
    img, txt, t2i = make_problem(50, 5, dim=8, seed=5, noise=1.5, shuffle=True)
    m = coco_5fold_metrics(img, txt, t2i)
    assert len(m.folds) == 5
    for f, fold in enumerate(m.folds):
        sel = ((t2i >= 10 * f) & (t2i < 10 * (f + 1))).nonzero().squeeze(1)
        sub = (img[10 * f : 10 * (f + 1)] @ txt[sel].t()).numpy()
        exp = oracle_metrics(*oracle_ranks(sub, (t2i[sel] - 10 * f).numpy()))
        for k, v in exp.items():
            assert fold[k] == pytest.approx(v), (f, k)
    for k in ("i2t_r1", "t2i_r10", "i2t_medr", "t2i_meanr"):
        assert m[k] == pytest.approx(np.mean([fold[k] for fold in m.folds]))
    # rsum is the sum of the averaged recalls, not 6 x the mean i2t recall
    recalls = ("i2t_r1", "i2t_r5", "i2t_r10", "t2i_r1", "t2i_r5", "t2i_r10")
    assert m.rsum == pytest.approx(sum(np.mean([fold[k] for fold in m.folds]) for k in recalls))
    assert m.rsum == pytest.approx(np.mean([fold.rsum for fold in m.folds]))
    with pytest.raises(ValueError, match="5 folds of equal size.* 49 images, not divisible by 5"):
        coco_5fold_metrics(img[:49], txt[:245], t2i[t2i < 49])


def test_average_metrics_rsum_is_not_the_known_bug():
    a = metrics_from_ranks(torch.tensor([0, 0, 9]), torch.tensor([0, 4, 20]))
    b = metrics_from_ranks(torch.tensor([0, 2, 2]), torch.tensor([1, 1, 30]))
    avg = average_metrics([a, b])
    assert avg.rsum == pytest.approx((a.rsum + b.rsum) / 2)
    assert avg.rsum != pytest.approx(6 * (avg.i2t_r1 + avg.i2t_r5 + avg.i2t_r10) / 3)


def test_metrics_object_api():
    m = metrics_from_ranks(torch.tensor([0, 1]), torch.tensor([0, 0, 3]))
    assert isinstance(m, RetrievalMetrics)
    assert m["rsum"] == m.rsum
    with pytest.raises(KeyError):
        m["folds"]
    assert "rsum" in m.format_table("demo")


def test_table_header_names_the_gallery_side():
    """MSR-VTT tables say video, the image protocols image; the columns stay aligned."""
    from vlret.run.evaluate import format_metrics_table

    m = metrics_from_ranks(torch.tensor([0, 1]), torch.tensor([0, 0, 3]))
    video = format_metrics_table(m, "msrvtt-full").splitlines()
    image = format_metrics_table(m, "f30k").splitlines()
    assert video[1].split("|")[:2] == ["   video -> text   ", "   text -> video   "]
    assert image[1].split("|")[:2] == ["   image -> text   ", "   text -> image   "]
    assert [len(line) for line in video[1:]] == [len(line) for line in image[1:]]
    assert "video" not in m.format_table() and "video" in m.format_table(visual="video")
    with pytest.raises(ValueError, match="visual must be"):
        m.format_table(visual="audio")


def test_metric_input_errors():
    img, txt = torch.randn(3, 4), torch.randn(6, 4)
    with pytest.raises(ValueError, match="one entry per text"):
        retrieval_metrics(img, txt, [0, 1, 2])
    with pytest.raises(ValueError, match=r"\[0, 3\)"):
        retrieval_metrics(img, txt, [0, 0, 1, 1, 2, 3])
    with pytest.raises(ValueError, match="image 2 no text"):
        retrieval_metrics(img, txt, [0, 0, 1, 1, 1, 1])
    with pytest.raises(ValueError, match="embedding size"):
        retrieval_metrics(img, torch.randn(6, 5), [0, 0, 1, 1, 2, 2])
    with pytest.raises(ValueError, match="NaN"):
        retrieval_metrics(img * float("nan"), txt, [0, 0, 1, 1, 2, 2])
    with pytest.raises(ValueError, match="chunk_size"):
        retrieval_metrics(img, txt, [0, 0, 1, 1, 2, 2], chunk_size=0)
    with pytest.raises(ValueError, match="integer"):
        retrieval_metrics(img, txt, torch.zeros(6))


def test_memory_is_bounded_by_chunk(monkeypatch):
    """No score block larger than chunk_size x N_txt is ever formed."""
    seen = []
    original = metrics._count_at_least

    def spy(block, *rest):
        seen.append(block.numel())
        return original(block, *rest)

    monkeypatch.setattr(metrics, "_count_at_least", spy)
    img, txt, t2i = make_problem(100, 5, dim=8, seed=1)
    metrics.retrieval_ranks(img, txt, t2i, chunk_size=10)
    assert seen and max(seen) <= 10 * 500
    seen.clear()
    metrics.retrieval_ranks_from_similarity(img @ txt.t(), t2i, chunk_size=10)
    assert seen and max(seen) <= 10 * 500


def integer_problem(counts, dim=3, seed=0, shuffle=True):
    """Embeddings with entries in {-1, 0, 1}: every score is a small integer, exact in every dtype
    and summation order, so ties are everywhere and each path must decide them the same way."""
    g = torch.Generator().manual_seed(seed)
    t2i = torch.tensor([i for i, c in enumerate(counts) for _ in range(c)])
    if shuffle:
        t2i = t2i[torch.randperm(len(t2i), generator=g)]
    img = torch.randint(-1, 2, (len(counts), dim), generator=g).double()
    txt = torch.randint(-1, 2, (len(t2i), dim), generator=g).double()
    return img, txt, t2i


def assert_ranks(got, expected):
    np.testing.assert_array_equal(got[0].numpy(), expected[0])
    np.testing.assert_array_equal(got[1].numpy(), expected[1])


@pytest.mark.parametrize("tile_scores", [1, 7, 40, 1 << 25])
@pytest.mark.parametrize("chunk_size", [1, 4, 9])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_ties_across_tile_boundaries(monkeypatch, tile_scores, chunk_size, dtype):
    # 9 images with 1-7 texts (31 texts: no tile width divides it); scores in [-3, 3]
    img, txt, t2i = integer_problem([3, 1, 5, 2, 7, 1, 4, 2, 6])
    sim = img @ txt.t()
    expected = oracle_ranks(sim.numpy(), t2i.numpy())
    monkeypatch.setattr(metrics, "_TILE_SCORES", tile_scores)
    got = retrieval_ranks(img.to(dtype), txt.to(dtype), t2i, chunk_size=chunk_size)
    assert_ranks(got, expected)
    got = retrieval_ranks_from_similarity(sim.to(dtype), t2i, chunk_size=chunk_size)
    assert_ranks(got, expected)


@settings(max_examples=60, deadline=None)
@given(
    counts=st.lists(st.integers(1, 6), min_size=1, max_size=12),
    dim=st.integers(1, 4),
    seed=st.integers(0, 2**16),
    chunk_size=st.integers(1, 13),
    tile_scores=st.integers(1, 200),
    shuffle=st.booleans(),
)
def test_any_tiling_gives_the_oracle_ranks(counts, dim, seed, chunk_size, tile_scores, shuffle):
    img, txt, t2i = integer_problem(counts, dim=dim, seed=seed, shuffle=shuffle)
    sim = img @ txt.t()
    expected = oracle_ranks(sim.numpy(), t2i.numpy())
    original = metrics._TILE_SCORES
    metrics._TILE_SCORES = tile_scores
    try:
        assert_ranks(retrieval_ranks(img, txt, t2i, chunk_size=chunk_size), expected)
        got = retrieval_ranks_from_similarity(sim.float(), t2i, chunk_size=chunk_size)
        assert_ranks(got, expected)
    finally:
        metrics._TILE_SCORES = original


def test_tiles_narrower_than_a_chunk_own_texts(monkeypatch):
    """A chunk's own texts (pass 1) wider than a tile, and float32 noise scores (no ties)."""
    img, txt, t2i = make_problem(60, 20, dim=8, seed=4, noise=1.5, shuffle=True)
    img, txt = img.float(), txt.float()
    sim = img @ txt.t()
    expected = oracle_ranks(sim.double().numpy(), t2i.numpy())
    monkeypatch.setattr(metrics, "_TILE_SCORES", 16 * 37)
    assert_ranks(retrieval_ranks(img, txt, t2i, chunk_size=16), expected)
    assert_ranks(retrieval_ranks_from_similarity(sim, t2i, chunk_size=16), expected)


def test_counts_past_float32_exact_range_switch_to_float64(monkeypatch):
    """Sums of 0/1 beyond 2**24 ones are inexact in float32: such tiles count in float64."""
    monkeypatch.setattr(metrics, "_FLOAT32_EXACT_COUNT", 4)
    scratch = metrics._Scratch.make(3, 5, torch.float32, torch.device("cpu"))
    assert scratch.hits.dtype == torch.float64
    assert metrics._Scratch.make(3, 4, torch.float32, torch.device("cpu")).hits.dtype == (
        torch.float32
    )
    img, txt, t2i = integer_problem([2, 3, 1, 4, 2])
    expected = oracle_ranks((img @ txt.t()).numpy(), t2i.numpy())
    assert_ranks(retrieval_ranks(img.float(), txt.float(), t2i, chunk_size=3), expected)


def test_half_precision_is_ranked_in_float32():
    # 1 + 2**-11 is exact in float32 but rounds to 1 in float16, where it would tie with 1
    img = torch.tensor([[1.0, 2**-11], [1.0, 0.0]], dtype=torch.float16)
    txt = torch.tensor([[1.0, 1.0], [1.0, 0.0]], dtype=torch.float16)
    t2i = torch.tensor([0, 1])
    # scores: [[1 + 2**-11, 1], [1, 1]]; only image 1 and text 1 meet a tie
    i2t, t2i_r = retrieval_ranks(img, txt, t2i)
    assert i2t.tolist() == [0, 1]
    assert t2i_r.tolist() == [0, 1]
    sim = (img.float() @ txt.float().t()).half()  # the caller's half matrix: ties, ranked as given
    i2t, t2i_r = retrieval_ranks_from_similarity(sim, t2i)
    assert i2t.tolist() == [1, 1] and t2i_r.tolist() == [1, 1]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_one_non_finite_entry_is_caught(bad):
    img, txt = torch.randn(5, 4), torch.randn(10, 4)
    t2i = torch.arange(5).repeat_interleave(2)
    for which in ("img_emb", "txt_emb"):
        a, b = img.clone(), txt.clone()
        (a if which == "img_emb" else b)[3, 2] = bad
        with pytest.raises(ValueError, match=which):
            retrieval_ranks(a, b, t2i)
    sim = img @ txt.t()
    sim[4, 7] = bad
    with pytest.raises(ValueError, match="sim"):
        retrieval_ranks_from_similarity(sim, t2i)


def test_huge_finite_scores_are_not_mistaken_for_inf():
    # every row sum overflows float32, yet every score is finite: all tie, all ranked last
    sim = torch.full((3, 6), 3e38)
    i2t, t2i_r = retrieval_ranks_from_similarity(sim, torch.arange(3).repeat_interleave(2))
    assert i2t.tolist() == [4, 4, 4] and t2i_r.tolist() == [2] * 6
