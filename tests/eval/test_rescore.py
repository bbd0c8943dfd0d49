"""NON-STANDARD inference re-scoring (vlret.metrics.rescore): dual softmax and QB-Norm against
naive float64 loops, their invariances, the querybank draw, and metrics of re-scored matrices."""

from __future__ import annotations

import math

import pytest
import torch

from vlret.metrics import (
    Rescoring,
    average_metrics,
    draw_bank,
    dual_softmax,
    make_rescoring,
    metrics_from_ranks,
    normalised_queries,
    qb_norm,
    querybank_activation,
    rescored_metrics,
    retrieval_metrics_from_similarity,
    retrieval_ranks_from_similarity,
)
from vlret.metrics import _blocks as blocks_module
from vlret.metrics import rescore as rescore_module

# float32 scores re-scored in float64 against the float64 oracle on the same float32 values: the
# only error is float64 rounding of a few exp/log/sum steps (scores of size <= 100 / T).
F64_TOL = 1e-10


def f64(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def cosines(n_img: int, n_txt: int, seed: int = 0, dtype=torch.float64) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(n_img, n_txt, generator=g, dtype=torch.float64) * 2 - 1).to(dtype)


def naive_dual_softmax(sim: torch.Tensor, t: float) -> tuple[list, list]:
    """CAMoE's priors by loops: i2t over the images of each text, t2i over the texts of each
    image."""
    s = sim.double().tolist()
    n_img, n_txt = len(s), len(s[0])
    i2t = [[0.0] * n_txt for _ in range(n_img)]
    t2i = [[0.0] * n_txt for _ in range(n_img)]
    for i in range(n_img):
        for j in range(n_txt):
            over_images = sum(math.exp((s[a][j] - s[i][j]) / t) for a in range(n_img))
            over_texts = sum(math.exp((s[i][b] - s[i][j]) / t) for b in range(n_txt))
            i2t[i][j] = s[i][j] / over_images
            t2i[i][j] = s[i][j] / over_texts
    return i2t, t2i


def naive_qb_norm(sim, bank, beta, k, dynamic) -> list:
    s, b = sim.double().tolist(), bank.double().tolist()
    n_q, n_g = len(s), len(s[0])
    kk = min(k, n_g)
    active = [False] * n_g
    for row in b:
        kth = sorted(row, reverse=True)[kk - 1]
        for g in range(n_g):
            active[g] = active[g] or row[g] >= kth
    out = []
    for q in range(n_q):
        best = max(s[q])
        hit = any(s[q][g] == best and active[g] for g in range(n_g))
        if dynamic and not hit:
            out.append(list(s[q]))
            continue
        row = []
        for g in range(n_g):
            denom = sum(math.exp(beta * (b[r][g] - s[q][g])) for r in range(len(b)))
            row.append(-math.log(denom))  # log(exp(beta s) / sum exp(beta s_b))
        out.append(row)
    return out


def naive_ranks(i2t_sim, t2i_sim, t2i) -> tuple[torch.Tensor, torch.Tensor]:
    """0-based ranks, ties against the query, one pair at a time."""
    a, b, owner = i2t_sim.tolist(), t2i_sim.tolist(), t2i.tolist()
    n_img, n_txt = len(a), len(a[0])
    r_i2t = []
    for i in range(n_img):
        best = max(a[i][j] for j in range(n_txt) if owner[j] == i)
        r_i2t.append(sum(1 for j in range(n_txt) if owner[j] != i and a[i][j] >= best))
    r_t2i = []
    for j in range(n_txt):
        own = b[owner[j]][j]
        r_t2i.append(sum(1 for i in range(n_img) if i != owner[j] and b[i][j] >= own))
    return torch.tensor(r_i2t), torch.tensor(r_t2i)


# -- dual softmax --------------------------------------------------------------------------------


@pytest.mark.parametrize("t", [0.5, 0.05])
def test_dual_softmax_equals_the_naive_loops(t):
    sim = cosines(5, 7, seed=1)
    i2t, t2i = dual_softmax(sim, temperature=t)
    want_i2t, want_t2i = naive_dual_softmax(sim, t)
    assert i2t.dtype == t2i.dtype == torch.float64
    torch.testing.assert_close(i2t, f64(want_i2t), rtol=F64_TOL, atol=1e-300)
    torch.testing.assert_close(t2i, f64(want_t2i), rtol=F64_TOL, atol=1e-300)


def test_dual_softmax_t2i_is_camoe_softmax_over_texts():
    """CAMoE's text x video matrix M: M * softmax(M / T, dim=0) is our t2i, transposed."""
    sim = cosines(4, 9, seed=2)
    _, t2i = dual_softmax(sim, temperature=0.01)
    m = sim.t()
    torch.testing.assert_close(t2i.t(), m * torch.softmax(m / 0.01, dim=0), rtol=F64_TOL, atol=0)


def test_dual_softmax_float32_input_at_the_default_temperature_does_not_underflow():
    sim32 = cosines(6, 30, seed=3, dtype=torch.float32)
    i2t, t2i = dual_softmax(sim32)  # T = 0.01: scores 2 apart differ by e^-200 in prior
    want_i2t, want_t2i = naive_dual_softmax(sim32.double(), rescore_module.DSL_TEMPERATURE)
    torch.testing.assert_close(i2t, f64(want_i2t), rtol=F64_TOL, atol=0)
    torch.testing.assert_close(t2i, f64(want_t2i), rtol=F64_TOL, atol=0)
    assert bool((t2i != 0).all()) and bool((i2t != 0).all())  # float32 would hold exact zeros


def test_dual_softmax_row_blocks_equal_one_block(monkeypatch):
    sim = cosines(13, 11, seed=4)
    whole = dual_softmax(sim, temperature=0.1)
    monkeypatch.setattr(blocks_module, "_BLOCK_SCORES", 25)  # 2 rows a block
    blocked = dual_softmax(sim, temperature=0.1)
    for a, b in zip(whole, blocked, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-13, atol=0)


def test_dual_softmax_with_a_huge_temperature_keeps_every_rank():
    sim = cosines(8, 24, seed=5)
    t2i_owner = torch.arange(24) // 3
    i2t, t2i = dual_softmax(sim, temperature=1e9)
    raw = retrieval_ranks_from_similarity(sim, t2i_owner)
    assert torch.equal(retrieval_ranks_from_similarity(i2t, t2i_owner)[0], raw[0])
    assert torch.equal(retrieval_ranks_from_similarity(t2i, t2i_owner)[1], raw[1])


def test_dual_softmax_is_a_function_of_the_test_matrix_only():
    """Permuting the queries (texts, images) permutes the outputs the same way."""
    sim = cosines(6, 10, seed=6)
    rows, cols = torch.randperm(6), torch.randperm(10)
    i2t, t2i = dual_softmax(sim, temperature=0.05)
    p_i2t, p_t2i = dual_softmax(sim[rows][:, cols], temperature=0.05)
    torch.testing.assert_close(p_i2t, i2t[rows][:, cols], rtol=1e-13, atol=0)
    torch.testing.assert_close(p_t2i, t2i[rows][:, cols], rtol=1e-13, atol=0)


def test_dual_softmax_depends_on_the_other_test_queries():
    """The NON-STANDARD part: adding one test text changes the other texts' t2i scores."""
    sim = cosines(4, 6, seed=7)
    _, alone = dual_softmax(sim[:, :5], temperature=0.05)
    _, together = dual_softmax(sim, temperature=0.05)
    assert not torch.allclose(alone, together[:, :5])


@pytest.mark.parametrize(
    ("sim", "kwargs", "match"),
    [
        (torch.zeros(3), {}, "2-D floating-point"),
        (torch.zeros(2, 2, dtype=torch.long), {}, "2-D floating-point"),
        (torch.zeros(0, 3), {}, "must not be empty"),
        (torch.tensor([[0.0, math.nan]]), {}, "NaN or inf"),
        (torch.zeros(2, 2), {"temperature": 0.0}, "temperature must be a positive"),
        (torch.zeros(2, 2), {"temperature": math.inf}, "temperature must be finite"),
        (torch.zeros(2, 2), {"temperature": True}, "temperature must be a positive"),
    ],
)
def test_dual_softmax_rejects_bad_input(sim, kwargs, match):
    with pytest.raises(ValueError, match=match):
        dual_softmax(sim, **kwargs)


# -- QB-Norm -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("k", "dynamic"), [(1, True), (2, True), (1, False), (50, True)])
def test_qb_norm_equals_the_naive_loops(k, dynamic):
    sim = cosines(9, 6, seed=8)
    bank = cosines(12, 6, seed=9)
    out = qb_norm(sim, bank, beta=20.0, k=k, dynamic=dynamic)
    want = f64(naive_qb_norm(sim, bank, 20.0, k, dynamic))
    torch.testing.assert_close(out, want, rtol=F64_TOL, atol=1e-12)


def test_qb_norm_float32_input_against_float64_truth():
    sim32, bank32 = cosines(7, 5, 10, torch.float32), cosines(20, 5, 11, torch.float32)
    out = qb_norm(sim32, bank32)
    want = f64(naive_qb_norm(sim32.double(), bank32.double(), 20.0, 1, True))
    torch.testing.assert_close(out, want, rtol=F64_TOL, atol=1e-12)
    assert sim32.dtype == torch.float32  # the input is left as it was


def test_qb_norm_blocks_equal_one_block(monkeypatch):
    sim, bank = cosines(11, 7, seed=12), cosines(9, 7, seed=13)
    whole = qb_norm(sim, bank, k=2)
    monkeypatch.setattr(blocks_module, "_BLOCK_SCORES", 10)
    torch.testing.assert_close(qb_norm(sim, bank, k=2), whole, rtol=1e-13, atol=0)


def test_dynamic_qb_norm_without_activated_top1_leaves_scores_unchanged():
    """Every bank caption's top-1 is gallery item 0; no query has item 0 as its top-1."""
    sim = cosines(6, 5, seed=14)
    sim[:, 0] = -1.0
    bank = cosines(8, 5, seed=15)
    bank[:, 0] = 2.0
    assert querybank_activation(bank).tolist() == [True, False, False, False, False]
    assert not bool(normalised_queries(sim, querybank_activation(bank)).any())
    assert torch.equal(qb_norm(sim, bank), sim)


def test_qb_norm_with_a_flat_bank_keeps_every_ranking():
    """A bank scoring every gallery item alike divides each column by the same sum."""
    sim = cosines(7, 6, seed=16)
    bank = torch.full((4, 6), 0.3, dtype=torch.float64)
    out = qb_norm(sim, bank, dynamic=False)
    assert torch.equal(out.argsort(dim=1), sim.argsort(dim=1))
    torch.testing.assert_close(out, 20.0 * sim - (20.0 * 0.3 + math.log(4)), rtol=0, atol=1e-12)


def test_qb_norm_demotes_a_hub():
    """Gallery item 0 is every bank caption's nearest item (a hub); a query whose true item 1
    comes second to the hub ranks it first after normalisation."""
    bank = torch.tensor([[0.9, 0.1, 0.2], [0.8, 0.2, 0.1], [0.85, 0.0, 0.3]], dtype=torch.float64)
    sim = torch.tensor([[0.6, 0.55, 0.1]], dtype=torch.float64)
    out = qb_norm(sim, bank)
    assert int(sim.argmax()) == 0 and int(out.argmax()) == 1


def test_qb_norm_is_per_query_and_order_free():
    sim, bank = cosines(8, 6, seed=17), cosines(10, 6, seed=18)
    out = qb_norm(sim, bank)
    rows, cols, bank_rows = torch.randperm(8), torch.randperm(6), torch.randperm(10)
    moved = qb_norm(sim[rows][:, cols], bank[bank_rows][:, cols])
    torch.testing.assert_close(moved, out[rows][:, cols], rtol=1e-13, atol=0)
    torch.testing.assert_close(qb_norm(sim[:3], bank), out[:3], rtol=0, atol=0)  # alone


def test_activation_ties_are_inclusive():
    bank = torch.tensor([[0.5, 0.5, 0.1], [0.0, 0.2, 0.2]])
    assert querybank_activation(bank, k=1).tolist() == [True, True, True]
    assert querybank_activation(torch.tensor([[0.3, 0.2, 0.1]]), k=9).tolist() == [True] * 3


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"bank_sim": torch.zeros(3, 4)}, "same gallery"),
        ({"bank_sim": torch.zeros(0, 5)}, "bank_sim must not be empty"),
        ({"bank_sim": torch.full((2, 5), math.inf)}, "bank_sim contains NaN"),
        ({"beta": -1.0}, "beta must be a positive"),
        ({"k": 0}, "k must be a positive integer"),
        ({"k": 0, "dynamic": False}, "k must be a positive integer"),
        ({"dynamic": 1}, "dynamic must be a bool"),
    ],
)
def test_qb_norm_rejects_bad_input(kwargs, match):
    args = {"bank_sim": torch.zeros(2, 5), **kwargs}
    with pytest.raises(ValueError, match=match):
        qb_norm(torch.zeros(3, 5), **args)


def test_normalised_queries_checks_the_activation_mask():
    with pytest.raises(ValueError, match=r"active must be a \(3,\) bool"):
        normalised_queries(torch.zeros(2, 3), torch.ones(3))


# -- querybank draw, settings --------------------------------------------------------------------


def test_draw_bank_is_seeded_distinct_sorted_and_capped():
    state = torch.get_rng_state()
    a = draw_bank(1000, size=50, seed=0)
    assert torch.equal(torch.get_rng_state(), state)  # the global RNG is untouched
    assert torch.equal(a, draw_bank(1000, size=50, seed=0))
    assert not torch.equal(a, draw_bank(1000, size=50, seed=1))
    assert a.unique().numel() == 50 and torch.equal(a, a.sort().values) and int(a.max()) < 1000
    assert torch.equal(draw_bank(7, size=50), torch.arange(7))
    with pytest.raises(ValueError, match="size must be a positive integer"):
        draw_bank(10, size=0)


def test_rescoring_labels_and_records_say_non_standard():
    dsl = Rescoring("dsl", temperature=0.02)
    assert dsl.label().startswith("NON-STANDARD") and "temperature 0.02" in dsl.label()
    assert dsl.record() == {
        "method": "dsl",
        "standard": False,
        "temperature": 0.02,
        "directions": "i2t and t2i",
        "uses_test_statistics": True,
    }
    qb = Rescoring("qbnorm", bank_size=100)
    info = {"bank_size": 40, "t2i_queries_normalised": 0.25}
    assert "querybank of 40 training captions" in qb.label(info) and "25.0%" in qb.label(info)
    record = qb.record(info)
    assert record["standard"] is False and record["method"] == "qbnorm"
    assert (record["beta"], record["k"], record["dynamic"], record["bank_size"]) == (20, 1, 1, 40)
    with pytest.raises(ValueError, match="rescore method must be one of dsl, qbnorm"):
        Rescoring("csls")


def test_make_rescoring_refuses_another_methods_settings():
    assert make_rescoring(None) is None
    assert make_rescoring("qbnorm", beta=None, k=3) == Rescoring("qbnorm", k=3)
    with pytest.raises(ValueError, match="--qb-beta: only used with the qbnorm re-scoring"):
        make_rescoring("dsl", names={"beta": "--qb-beta"}, beta=10.0)
    with pytest.raises(ValueError, match="temperature: only used with the dsl"):
        make_rescoring(None, temperature=0.1)
    with pytest.raises(ValueError, match="not a re-scoring parameter"):
        make_rescoring("dsl", gamma=1.0)


# -- metrics of re-scored matrices ---------------------------------------------------------------


def test_rescored_metrics_dsl_ranks_each_direction_on_its_matrix():
    sim = cosines(6, 18, seed=19)
    t2i = torch.arange(18) // 3
    metrics, info = rescored_metrics(sim, t2i, Rescoring("dsl", temperature=0.05))
    by_img, by_txt = (f64(m) for m in naive_dual_softmax(sim, 0.05))
    assert info == {}
    assert metrics == metrics_from_ranks(*naive_ranks(by_img, by_txt, t2i))


def test_rescored_metrics_qbnorm_changes_text_to_image_only():
    sim, bank = cosines(5, 10, seed=20), cosines(7, 5, seed=21)
    t2i = torch.arange(10) // 2
    metrics, info = rescored_metrics(sim, t2i, Rescoring("qbnorm"), bank_sim=bank)
    by_txt = f64(naive_qb_norm(sim.t(), bank, 20.0, 1, True)).t()
    assert metrics == metrics_from_ranks(*naive_ranks(sim, by_txt, t2i))
    raw = retrieval_metrics_from_similarity(sim, t2i)
    assert (metrics.i2t_r1, metrics.i2t_medr) == (raw.i2t_r1, raw.i2t_medr)
    flags = normalised_queries(sim.t(), querybank_activation(bank))
    assert info == {"bank_size": 7, "t2i_queries_normalised": float(flags.double().mean())}


def test_rescored_metrics_rescores_each_block_as_its_own_test_set():
    sim = cosines(6, 12, seed=22)
    sim[:3, 6:] = math.nan  # outside the blocks (pair-scoring COCO 1K)
    sim[3:, :6] = math.nan
    bank = cosines(4, 6, seed=23)
    t2i = torch.arange(12) // 2
    blocks = [(0, 3, 0, 6), (3, 6, 6, 12)]
    for rescoring, bank_sim in ((Rescoring("dsl"), None), (Rescoring("qbnorm"), bank)):
        got, _ = rescored_metrics(sim, t2i, rescoring, bank_sim=bank_sim, blocks=blocks)
        folds = [
            rescored_metrics(
                sim[i0:i1, t0:t1],
                t2i[t0:t1] - i0,
                rescoring,
                bank_sim=None if bank_sim is None else bank_sim[:, i0:i1],
            )[0]
            for i0, i1, t0, t1 in blocks
        ]
        assert got == average_metrics(folds) and len(got.folds) == 2


def test_rescored_metrics_checks_the_bank():
    sim, t2i = cosines(3, 3, seed=24), torch.arange(3)
    with pytest.raises(ValueError, match="qbnorm needs querybank scores"):
        rescored_metrics(sim, t2i, Rescoring("qbnorm"))
    with pytest.raises(ValueError, match="dsl takes no querybank scores"):
        rescored_metrics(sim, t2i, Rescoring("dsl"), bank_sim=torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r"bank_sim must be \(N_bank, 3\)"):
        rescored_metrics(sim, t2i, Rescoring("qbnorm"), bank_sim=torch.zeros(2, 4))
