"""identity_retrieval_metrics: the identity-level (person search) R@K, mAP and mINP.

Oracles: a naive per-query ranking written here (a full sort in float64 with the tie rule
spelled out: among equal scores, irrelevant items first) and IRRA's own computation (a full
``torch.argsort`` per row, its ``utils/metrics.py`` rewritten) where no score is tied.
"""

from __future__ import annotations

import pytest
import torch

from vlret.metrics import (
    IDENTITY_KEYS,
    IDENTITY_METRIC_KEYS,
    IdentityMetrics,
    identity_retrieval_metrics,
    identity_retrieval_metrics_from_embeddings,
)
from vlret.metrics import identity as identity_module

TOL = 1e-9  # percent; both sides sum float64 fractions of a few hundred queries
#: against IRRA: its INP fractions are float32 (a long over a float), each within 2**-24 of
#: its value (at most 1), so their mean in percent is within 100 * 2**-24 = 6e-6
IRRA_TOL = 1e-5


def naive(sim, q_ids, g_ids) -> dict[str, float]:
    """Each query's gallery sorted by (score descending, irrelevant before relevant)."""
    sim = torch.as_tensor(sim, dtype=torch.float64).tolist()
    q_ids, g_ids = list(map(int, q_ids)), list(map(int, g_ids))
    r1 = r5 = r10 = ap = inp = 0.0
    for row, q in zip(sim, q_ids, strict=True):
        relevant = [g == q for g in g_ids]
        ranked = sorted(range(len(row)), key=lambda j: (-row[j], relevant[j]))
        positions = [p + 1 for p, j in enumerate(ranked) if relevant[j]]
        first = positions[0]
        r1 += first <= 1
        r5 += first <= 5
        r10 += first <= 10
        ap += sum((k + 1) / p for k, p in enumerate(positions)) / len(positions)
        inp += len(positions) / positions[-1]
    n = len(q_ids)
    return {k: 100 * v / n for k, v in zip(IDENTITY_KEYS, (r1, r5, r10, ap, inp), strict=True)}


def irra_rank(similarity, q_pids, g_pids, max_rank=10) -> dict[str, float]:
    """IRRA's ``rank(similarity, q_pids, g_pids, max_rank=10, get_mAP=True)``."""
    indices = torch.argsort(similarity, dim=1, descending=True)
    pred_labels = g_pids[indices]
    matches = pred_labels.eq(q_pids.view(-1, 1))
    all_cmc = matches[:, :max_rank].cumsum(1)
    all_cmc[all_cmc > 1] = 1
    all_cmc = all_cmc.double().mean(0) * 100
    num_rel = matches.sum(1)
    tmp_cmc = matches.cumsum(1)
    inp = [
        tmp_cmc[i][row.nonzero()[-1]] / (row.nonzero()[-1] + 1.0) for i, row in enumerate(matches)
    ]
    minp = torch.cat(inp).double().mean() * 100
    steps = torch.arange(1, tmp_cmc.shape[1] + 1, dtype=torch.float64)
    ap = ((tmp_cmc / steps) * matches).sum(1) / num_rel
    return {
        "r1": float(all_cmc[0]),
        "r5": float(all_cmc[4]),
        "r10": float(all_cmc[9]),
        "map": float(ap.mean() * 100),
        "minp": float(minp),
    }


def close(a: dict[str, float], b: dict[str, float], tol: float = TOL) -> bool:
    return set(a) == set(b) and all(abs(a[k] - b[k]) <= tol for k in a)


def person_world(n_ids: int, per_id: int, n_queries: int, *, seed: int, levels: int | None):
    """Random gallery ids (``per_id`` items each, shuffled), queries drawn from the ids, and
    scores; with ``levels``, scores are rounded to that many values (many ties)."""
    g = torch.Generator().manual_seed(seed)
    g_ids = torch.arange(n_ids).repeat_interleave(per_id)[
        torch.randperm(n_ids * per_id, generator=g)
    ]
    g_ids = g_ids * 7 + 3  # raw ids, not 0..N-1
    q_ids = g_ids[torch.randint(len(g_ids), (n_queries,), generator=g)]
    sim = torch.rand(n_queries, len(g_ids), generator=g, dtype=torch.float64)
    if levels is not None:
        sim = torch.floor(sim * levels) / levels
    return sim, q_ids, g_ids


def test_hand_worked_ties_count_against_the_query():
    # query id 1; gallery [id2 0.9, id1 0.5, id1 0.9, id3 0.1]: the tied irrelevant 0.9 ranks
    # first, the relevant items sit at 2 and 3
    sim = torch.tensor([[0.9, 0.5, 0.9, 0.1]])
    out = identity_retrieval_metrics(sim, [1], [2, 1, 1, 3])
    assert out["r1"] == 0.0 and out["r5"] == 100.0 and out["r10"] == 100.0
    assert out["map"] == pytest.approx(100 * (1 / 2 + 2 / 3) / 2, abs=1e-12)
    assert out["minp"] == pytest.approx(100 * 2 / 3, abs=1e-12)
    assert tuple(out) == IDENTITY_KEYS


def test_hand_worked_two_queries_relevant_items_tied_among_themselves():
    # q0 (id 5): relevant 0.8, 0.8 tied with each other, one irrelevant 0.8 -> positions 2, 3
    # q1 (id 6): its only relevant item is the best -> all 100
    sim = torch.tensor([[0.8, 0.8, 0.8, 0.2], [0.1, 0.3, 0.2, 0.9]])
    out = identity_retrieval_metrics(sim, [5, 6], [5, 9, 5, 6])
    assert out["r1"] == 50.0
    assert out["map"] == pytest.approx(100 * ((1 / 2 + 2 / 3) / 2 + 1) / 2, abs=1e-12)
    assert out["minp"] == pytest.approx(100 * (2 / 3 + 1) / 2, abs=1e-12)


def test_all_scores_equal_rank_every_relevant_item_last():
    sim = torch.zeros(3, 6)
    g_ids = [0, 0, 1, 1, 1, 2]
    out = identity_retrieval_metrics(sim, [0, 1, 2], g_ids)
    assert close(out, naive(sim, [0, 1, 2], g_ids))
    assert out["r1"] == 0.0 and out["r5"] == pytest.approx(200 / 3)  # ids 0 (5th) and 1 (4th)
    # mINP: R / G for every query
    assert out["minp"] == pytest.approx(100 * (2 / 6 + 3 / 6 + 1 / 6) / 3, abs=1e-12)


@pytest.mark.parametrize("chunk_size", [1, 7, 1024])
@pytest.mark.parametrize("per_id", [2, 20])  # 20 relevant items: the searchsorted path
def test_matches_the_naive_oracle_with_many_ties(chunk_size, per_id):
    sim, q_ids, g_ids = person_world(9, per_id, 40, seed=per_id + chunk_size, levels=6)
    out = identity_retrieval_metrics(sim, q_ids, g_ids, chunk_size=chunk_size)
    assert close(out, naive(sim, q_ids, g_ids))


def test_compare_and_searchsorted_paths_agree(monkeypatch):
    sim, q_ids, g_ids = person_world(6, 5, 30, seed=3, levels=4)
    expected = naive(sim, q_ids, g_ids)
    for limit in (0, 100):  # every block through searchsorted, then through comparisons
        monkeypatch.setattr(identity_module, "_COMPARE_MAX", limit)
        assert close(identity_retrieval_metrics(sim, q_ids, g_ids), expected)


def test_uneven_identities_grouped_into_blocks():
    # ids with 1, 3 and 15 gallery items: blocks of queries of different widths
    g_ids = torch.tensor([0] + [1] * 3 + [2] * 15)[
        torch.randperm(19, generator=torch.Generator().manual_seed(0))
    ]
    q_ids = torch.tensor([2, 0, 1, 2, 1, 0, 0, 2])
    sim = torch.rand(8, 19, generator=torch.Generator().manual_seed(1))
    for chunk in (1, 3, 8):
        assert close(
            identity_retrieval_metrics(sim, q_ids, g_ids, chunk_size=chunk),
            naive(sim, q_ids, g_ids),
        )


def test_equals_irra_without_ties():
    sim, q_ids, g_ids = person_world(30, 3, 120, seed=11, levels=None)
    assert len(torch.unique(sim)) == sim.numel()  # no tie anywhere
    out = identity_retrieval_metrics(sim, q_ids, g_ids, chunk_size=16)
    assert close(out, irra_rank(sim, q_ids, g_ids), IRRA_TOL)


def test_image_to_text_equals_irra_i2t():
    # every identity has captions: images as queries, captions as the gallery (IRRA i2t_metric)
    sim, _, img_ids = person_world(12, 2, 1, seed=8, levels=None)
    cap_ids = img_ids.repeat_interleave(2)  # two captions per image
    sim = torch.rand(len(cap_ids), len(img_ids), generator=torch.Generator().manual_seed(8))
    out = identity_retrieval_metrics(sim.t(), img_ids, cap_ids, chunk_size=5)
    assert close(out, irra_rank(sim.t().contiguous().double(), img_ids, cap_ids), IRRA_TOL)


def test_float32_scores_equal_irra_on_the_same_numbers():
    sim, q_ids, g_ids = person_world(25, 2, 60, seed=5, levels=None)
    sim32 = sim.float()
    assert len(torch.unique(sim32)) == sim32.numel()
    out = identity_retrieval_metrics(sim32, q_ids, g_ids)
    assert close(out, irra_rank(sim32, q_ids, g_ids), IRRA_TOL)


def test_gallery_permutation_invariant():
    sim, q_ids, g_ids = person_world(8, 4, 25, seed=2, levels=5)
    perm = torch.randperm(len(g_ids), generator=torch.Generator().manual_seed(9))
    a = identity_retrieval_metrics(sim, q_ids, g_ids)
    b = identity_retrieval_metrics(sim[:, perm], q_ids, g_ids[perm])
    assert close(a, b)


def test_perfect_scores_give_100():
    g_ids = torch.tensor([4, 4, 8, 8, 8, 1])
    q_ids = torch.tensor([8, 1, 4, 4])
    sim = (q_ids[:, None] == g_ids[None, :]).double() + 0.01 * torch.rand(4, 6)
    out = identity_retrieval_metrics(sim, q_ids, g_ids)
    assert all(v == 100.0 for v in out.values())


def test_non_contiguous_and_half_precision_inputs():
    sim, q_ids, g_ids = person_world(10, 3, 30, seed=4, levels=None)
    half = sim.half()
    # half scores are ranked as their float32 values (exactly representable)
    expected = naive(half.double(), q_ids, g_ids)
    assert close(identity_retrieval_metrics(half, q_ids, g_ids), expected)
    transposed = half.t().contiguous().t()  # a non-contiguous view of the same values
    assert not transposed.is_contiguous()
    assert close(identity_retrieval_metrics(transposed, q_ids.numpy(), list(g_ids)), expected)


def test_query_without_a_relevant_item_names_it():
    with pytest.raises(ValueError, match=r"query_ids\[2\] = 77: no gallery item"):
        identity_retrieval_metrics(torch.rand(3, 4), [1, 2, 77], [1, 2, 2, 1])


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((torch.rand(3), [1, 2, 3], [1, 2, 3]), "sim must be a 2-D floating-point"),
        ((torch.ones(2, 2, dtype=torch.long), [1, 2], [1, 2]), "sim must be a 2-D floating"),
        ((torch.rand(0, 2), [], [1, 2]), "sim is empty"),
        ((torch.rand(2, 2), [1, 2, 3], [1, 2]), r"query_ids must have one id per query \(row\)"),
        ((torch.rand(2, 2), [1, 2], [1]), r"gallery_ids must have one id per gallery item"),
        ((torch.rand(2, 2), [1.0, 2.0], [1, 2]), "query_ids must be a 1-D integer tensor"),
        ((torch.rand(2, 2), [1, 2], torch.ones(2, 1, dtype=torch.long)), "gallery_ids must be"),
        ((torch.rand(2, 2), "ab", [1, 2]), "query_ids must be a 1-D integer tensor, got str"),
        ((torch.tensor([[0.1, float("nan")], [0.2, 0.3]]), [1, 2], [1, 2]), "sim contains NaN"),
    ],
)
def test_bad_input_names_the_argument(args, match):
    with pytest.raises(ValueError, match=match):
        identity_retrieval_metrics(*args)


def test_bad_chunk_size():
    with pytest.raises(ValueError, match="chunk_size"):
        identity_retrieval_metrics(torch.rand(2, 2), [1, 2], [1, 2], chunk_size=0)


def test_from_embeddings_equals_the_matrix_form_exactly():
    # small integer embeddings: every dot product is exact in float64, ties included
    g = torch.Generator().manual_seed(6)
    img = torch.randint(-2, 3, (18, 4), generator=g).double()
    txt = torch.randint(-2, 3, (30, 4), generator=g).double()
    img_ids = torch.arange(9).repeat(2)
    txt_ids = img_ids[torch.randint(18, (30,), generator=g)]
    sim = txt @ img.t()
    assert len(torch.unique(sim)) < sim.numel() // 4  # many ties
    for chunk in (1, 4, 1024):
        out = identity_retrieval_metrics_from_embeddings(
            txt, img, txt_ids, img_ids, chunk_size=chunk
        )
        assert close(out, identity_retrieval_metrics(sim, txt_ids, img_ids, chunk_size=chunk))
        assert close(out, naive(sim, txt_ids, img_ids))


def test_from_embeddings_bad_input():
    with pytest.raises(ValueError, match="query_emb and gallery_emb must share their width"):
        identity_retrieval_metrics_from_embeddings(
            torch.rand(2, 3), torch.rand(2, 4), [0, 1], [0, 1]
        )
    with pytest.raises(ValueError, match="gallery_emb contains NaN"):
        bad = torch.tensor([[0.0, float("inf")], [1.0, 0.0]])
        identity_retrieval_metrics_from_embeddings(torch.rand(2, 2), bad, [0, 1], [0, 1])


def test_identity_metrics_record_and_table():
    t2i = dict(zip(IDENTITY_KEYS, (10.0, 20.0, 30.0, 40.0, 50.0), strict=True))
    i2t = dict(zip(IDENTITY_KEYS, (1.0, 2.0, 3.0, 4.0, 5.0), strict=True))
    m = IdentityMetrics(t2i, i2t, identities=7)
    assert m.as_dict()["identity_t2i_map"] == 40.0 and m["identity_i2t_r10"] == 3.0
    assert tuple(m.as_dict()) == IDENTITY_METRIC_KEYS and len(IDENTITY_METRIC_KEYS) == 10
    rows = m.format_table("title").splitlines()  # IRRA's labels in the table, keys lower-case
    assert rows[0] == "title" and rows[1].split() == ["task", "R1", "R5", "R10", "mAP", "mINP"]
    assert rows[2].split() == ["t2i", "10.00", "20.00", "30.00", "40.00", "50.00"]
    assert rows[3].split()[0] == "i2t"
