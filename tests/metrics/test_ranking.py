"""The ranking core (vlret.metrics.ranking): rank_blocks / rank_queries and the metrics as
functions of the counts.

Oracle: a naive per-query loop in float64 written here. Each query's gallery is sorted by
(score descending, non-relevant before relevant: ties count against the query) and the
1-based position of every relevant item read off. Scores are small integers, so exact ties are
everywhere; blocks come in sizes that do not divide the number of queries, in a shuffled
order. Property tests check the core against the public metric functions that rank through
their own paths (the caption-level tile path of retrieval_ranks_from_similarity, R-Precision /
mAP@R's topk path).
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vlret.metrics import (
    QueryRanks,
    accuracy_at_k,
    block_rows,
    get_relevance,
    matrix_blocks,
    mean_average_precision,
    mean_inverse_negative_penalty,
    mean_per_class_recall,
    mean_rank,
    median_rank,
    metrics_from_ranks,
    rank_blocks,
    rank_queries,
    recall_at_k,
    relevance_names,
    retrieval_ranks_from_similarity,
    rprecision_map_at_r,
    rprecision_map_at_r_of,
    rsum,
)


def naive_positions(scores: torch.Tensor, relevant: torch.Tensor) -> list[list[int]]:
    """Per query (row), the 1-based positions of its relevant items, the best first."""
    rows = scores.to(torch.float64).tolist()
    out = []
    for row, rel in zip(rows, relevant.tolist(), strict=True):
        ranked = sorted(range(len(row)), key=lambda j: (-row[j], rel[j]))
        out.append([p + 1 for p, j in enumerate(ranked) if rel[j]])
    return out


def shuffled_blocks(scores: torch.Tensor, size: int, seed: int, mask=None):
    blocks = []
    for a in range(0, scores.shape[0], size):
        block = (a, scores[a : a + size])
        blocks.append(block if mask is None else (*block, mask[a : a + size]))
    random.Random(seed).shuffle(blocks)
    return blocks


def labelled_world(kind: str, seed: int):
    """``(labels, n_rows, n_columns)`` of a small world of relevance ``kind``: every row and
    every column query has at least one relevant item."""
    g = torch.Generator().manual_seed(seed)
    if kind in ("image-of-caption", "any-caption-of-video"):
        n_img = 7
        t2i = torch.cat([torch.arange(n_img), torch.randint(0, n_img, (11,), generator=g)])
        return {"txt_to_img": t2i[torch.randperm(len(t2i), generator=g)]}, n_img, len(t2i)
    if kind == "same-identity":
        image_ids = torch.cat([torch.arange(4), torch.randint(0, 4, (9,), generator=g)]) * 10 + 3
        caption_ids = image_ids[torch.randint(0, len(image_ids), (17,), generator=g)]
        caption_ids[:4] = torch.arange(4) * 10 + 3  # every person has a caption
        return {"image_ids": image_ids, "caption_ids": caption_ids}, 13, 17
    labels = torch.randint(0, 6, (19,), generator=g)
    return {"labels": labels, "n_classes": 6}, 19, 6


@pytest.mark.parametrize("kind", relevance_names())
@pytest.mark.parametrize("size", [1, 3, 5, 64])
def test_every_kind_and_direction_equals_the_naive_loop(kind: str, size: int) -> None:
    relevance = get_relevance(kind)
    for seed in range(3):
        labels, n_rows, n_cols = labelled_world(kind, seed)
        g = torch.Generator().manual_seed(100 + seed)
        sim = torch.randint(-2, 3, (n_rows, n_cols), generator=g).to(torch.float32)
        for direction in relevance.directions:
            q_ids, g_ids = relevance.ids(direction, labels)
            scores = sim if direction[0] == "i" else sim.t()
            relevant = q_ids[:, None] == g_ids[None, :]
            expected = naive_positions(scores, relevant)
            for every in (False, True):
                got = rank_queries(
                    shuffled_blocks(scores, size, seed),
                    relevance,
                    labels,
                    direction=direction,
                    n_queries=scores.shape[0],
                    every=every,
                )
                assert got.first.tolist() == [p[0] - 1 for p in expected]
                assert got.relevant.tolist() == [len(p) for p in expected]
                if every:
                    assert got.positions is not None
                    for q, p in enumerate(expected):
                        assert got.positions[q].tolist() == p + [0] * (
                            len(got.positions[q]) - len(p)
                        )
                masked = rank_blocks(
                    shuffled_blocks(scores, size, seed + 1, relevant),
                    n_queries=scores.shape[0],
                    every=every,
                )
                assert torch.equal(masked.first, got.first)
                if every:
                    assert torch.equal(masked.positions, got.positions)


def test_many_relevant_items_take_the_searchsorted_path() -> None:
    g = torch.Generator().manual_seed(3)
    gallery = torch.randint(0, 3, (200,), generator=g)
    queries = torch.tensor([0, 1, 2, 2, 0, 1, 1])
    sim = torch.randint(0, 6, (7, 200), generator=g).to(torch.float64)
    expected = naive_positions(sim, queries[:, None] == gallery[None, :])
    for compare_max in (0, 48, 1000):  # every width through searchsorted, some, none
        got = rank_blocks(
            [(0, sim[:4]), (4, sim[4:])],
            n_queries=7,
            query_ids=queries,
            gallery_ids=gallery,
            every=True,
            compare_max=compare_max,
        )
        assert got.positions is not None
        for q, p in enumerate(expected):
            assert got.positions[q, : len(p)].tolist() == p


def test_a_collapsed_scorer_ranks_every_query_last() -> None:
    ids = torch.arange(5)
    got = rank_blocks([(0, torch.zeros(5, 5))], n_queries=5, query_ids=ids, gallery_ids=ids)
    assert got.first.tolist() == [4] * 5


def test_half_precision_is_ranked_in_float32() -> None:
    # 2049 and 2048 are one float16 number; in float32 they differ
    scores = torch.tensor([[2049.0, 2048.0]])
    ids = (torch.tensor([0]), torch.tensor([0, 1]))
    as_half = rank_blocks([(0, scores.half())], n_queries=1, query_ids=ids[0], gallery_ids=ids[1])
    as_float = rank_blocks([(0, scores)], n_queries=1, query_ids=ids[0], gallery_ids=ids[1])
    assert as_float.first.tolist() == [0] and as_half.first.tolist() == [1]


def test_thread_count_and_block_rows_change_no_rank() -> None:
    g = torch.Generator().manual_seed(8)
    gallery = torch.randint(0, 40, (700,), generator=g)
    queries = gallery[torch.randint(0, 700, (900,), generator=g)]
    sim = torch.randint(0, 9, (900, 700), generator=g).to(torch.float32)
    threads = torch.get_num_threads()
    results = []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            for rows in (block_rows(700), 97, 900):
                results.append(
                    rank_blocks(
                        matrix_blocks(sim, rows=rows),
                        n_queries=900,
                        query_ids=queries,
                        gallery_ids=gallery,
                        every=True,
                    )
                )
    finally:
        torch.set_num_threads(threads)
    assert torch.get_num_threads() == threads
    for other in results[1:]:
        assert torch.equal(other.first, results[0].first)
        assert torch.equal(other.positions, results[0].positions)


def test_block_rows_grow_with_threads() -> None:
    assert block_rows(1 << 10, threads=1) == 1024
    assert block_rows(1 << 12, threads=1, limit=10_000) == 256
    assert block_rows(1 << 12, threads=2, limit=10_000) == 512
    assert block_rows(1 << 30, threads=1) == 1


def test_bad_blocks_are_one_line_errors() -> None:
    ids = torch.arange(3)
    ok = torch.zeros(3, 3)
    with pytest.raises(ValueError, match="no score block ranked query 2"):
        rank_blocks([(0, ok[:2])], n_queries=3, query_ids=ids, gallery_ids=ids)
    with pytest.raises(ValueError, match="rows 1:2 were ranked already"):
        rank_blocks([(0, ok[:2]), (1, ok[1:2])], n_queries=3, query_ids=ids, gallery_ids=ids)
    with pytest.raises(ValueError, match="cover the whole gallery"):
        rank_blocks([(0, ok[:, :2])], n_queries=3, query_ids=ids, gallery_ids=ids)
    with pytest.raises(ValueError, match="exceed the 3 queries"):
        rank_blocks([(2, ok)], n_queries=3, query_ids=ids, gallery_ids=ids)
    with pytest.raises(ValueError, match=r"query_ids\[1\] = 7: no gallery item has this id"):
        rank_blocks([(0, ok)], n_queries=3, query_ids=[0, 7, 1], gallery_ids=ids)
    with pytest.raises(ValueError, match="scores contains NaN or inf"):
        bad = ok.clone()
        bad[1, 1] = math.nan
        rank_blocks([(0, bad)], n_queries=3, query_ids=ids, gallery_ids=ids)
    with pytest.raises(ValueError, match="query 1 of the block has no relevant"):
        mask = torch.eye(3, dtype=torch.bool)
        mask[1, 1] = False
        rank_blocks([(0, ok, mask)], n_queries=3)


def test_recall_and_rank_functions_of_the_counts() -> None:
    first = torch.tensor([0, 0, 3, 9, 12])
    assert recall_at_k(first, 1) == 40.0 and recall_at_k(first, 5) == 60.0
    assert recall_at_k(first, 10) == 80.0
    assert median_rank(first) == 4.0  # floor(3) + 1
    assert mean_rank(first) == 5.8  # 24 / 5 + 1
    assert rsum({"a": 1.5, "b": 2.0, "c": 9.0}, ("a", "b")) == 3.5
    assert accuracy_at_k(first, 1) == 0.4
    # classes 0 (queries 0, 2), 1 (query 1), 2 (query 3); class 3 has no image: left out
    assert mean_per_class_recall(first[:4], [0, 1, 0, 2], 4) == pytest.approx((0.5 + 1 + 0) / 3)


def test_map_minp_rprecision_from_positions() -> None:
    # query 0: relevant at 1, 3 (R=2); query 1: at 2, 3, 6 (R=3)
    ranks = QueryRanks(
        first=torch.tensor([0, 1]),
        relevant=torch.tensor([2, 3]),
        positions=torch.tensor([[1, 3, 0], [2, 3, 6]]),
    )
    ap = [(1 / 1 + 2 / 3) / 2, (1 / 2 + 2 / 3 + 3 / 6) / 3]
    assert mean_average_precision(ranks) == pytest.approx(100 * sum(ap) / 2, abs=1e-12)
    inp = [2 / 3, 3 / 6]
    assert mean_inverse_negative_penalty(ranks) == pytest.approx(100 * sum(inp) / 2, abs=1e-12)
    rp, map_r = rprecision_map_at_r_of(ranks)
    assert rp.tolist() == pytest.approx([1 / 2, 2 / 3])  # top 2: 1 relevant; top 3: 2
    assert map_r.tolist() == pytest.approx([(1 / 1) / 2, (1 / 2 + 2 / 3) / 3])


@settings(max_examples=40, deadline=None)
@given(
    n_img=st.integers(1, 9),
    extra=st.integers(0, 12),
    levels=st.integers(1, 4),
    seed=st.integers(0, 10_000),
)
def test_caption_ranks_equal_the_tile_path(n_img: int, extra: int, levels: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    t2i = torch.cat([torch.arange(n_img), torch.randint(0, n_img, (extra,), generator=g)])
    sim = torch.randint(0, levels, (n_img, len(t2i)), generator=g).to(torch.float32)
    i2t, t2i_ranks = retrieval_ranks_from_similarity(sim, t2i)
    labels = {"txt_to_img": t2i, "n_images": n_img}
    got = {
        d: rank_queries(
            matrix_blocks(s, rows=3), "image-of-caption", labels, direction=d, n_queries=len(s)
        ).first
        for d, s in (("i2t", sim), ("t2i", sim.t()))
    }
    assert torch.equal(got["i2t"], i2t) and torch.equal(got["t2i"], t2i_ranks)
    ours = metrics_from_ranks(got["i2t"], got["t2i"]).as_dict()
    assert ours == metrics_from_ranks(i2t, t2i_ranks).as_dict()


@settings(max_examples=40, deadline=None)
@given(n_q=st.integers(1, 8), n_g=st.integers(1, 12), seed=st.integers(0, 10_000))
def test_rprecision_map_at_r_equal_the_topk_path(n_q: int, n_g: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    scores = torch.randint(0, 4, (n_q, n_g), generator=g).to(torch.float64)
    relevant = torch.rand(n_q, n_g, generator=g) < 0.4
    relevant[torch.arange(n_q), torch.randint(0, n_g, (n_q,), generator=g)] = True
    got = rank_blocks([(0, scores, relevant)], n_queries=n_q, every=True)
    rp, map_r = rprecision_map_at_r_of(got)
    want_rp, want_map, want_r = rprecision_map_at_r(scores, relevant)
    assert torch.equal(got.relevant, want_r)
    np.testing.assert_allclose(rp.numpy(), want_rp.numpy(), rtol=0, atol=1e-15)
    np.testing.assert_allclose(map_r.numpy(), want_map.numpy(), rtol=0, atol=1e-15)
