"""Fault and bad-input cases of evaluation (issue 26): re-scoring settings that underflow,
output paths checked before the work, missing extras, non-finite test features, titles and
caption counts of eval and compare, and a stalled torchrun rank.

Each case was a traceback, a hang or a silent wrong number before; the tests pin the one-line
error or the held behaviour.
"""

from __future__ import annotations

import decimal
import math
from decimal import Decimal

import pytest
import torch

from vlret.metrics import Rescoring, metrics_from_ranks, qb_norm, rescored_metrics
from vlret.metrics.rescore import RescoreParameterError, dual_softmax_rank_keys

# -- DSL and QB-Norm at extreme settings, against exact (decimal) truth -------------------------

#: decimal context wide enough for exp(-(s_max - s) / T) at T = 1e-30 (exponents ~ -1e30)
EXACT = decimal.Context(prec=40, Emin=decimal.MIN_EMIN, Emax=decimal.MAX_EMAX)


def scores(n_img: int, per_image: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Cosine-like float64 scores (matching pairs higher), some negative and one exactly 0."""
    g = torch.Generator().manual_seed(seed)
    t2i = torch.arange(n_img).repeat_interleave(per_image)
    sim = torch.rand(n_img, n_img * per_image, generator=g, dtype=torch.float64) * 1.6 - 0.8
    sim[t2i, torch.arange(t2i.numel())] += 0.3
    sim[0, -1] = 0.0
    return sim, t2i


def _exact_key(s: Decimal, log_prior: Decimal) -> tuple[int, Decimal]:
    """An exact product ``s * exp(log_prior)`` as a comparable key: its sign, then its log
    (positive) or minus its log (negative)."""
    if s == 0:
        return (1, Decimal(0))
    log_mag = abs(s).ln() + log_prior
    return (2, log_mag) if s > 0 else (0, -log_mag)


def _log_softmax(z: list[Decimal]) -> list[Decimal]:
    top = max(z)
    log_sum = sum((v - top).exp() for v in z).ln()  # terms below 1e-1e18 round to 0
    return [v - top - log_sum for v in z]


def exact_dsl(sim: torch.Tensor, t: float) -> tuple[list, list]:
    """CAMoE's products in 40-digit decimals, as comparable keys (nothing underflows)."""
    T = Decimal(t)
    with decimal.localcontext(EXACT):
        s = [[Decimal(v) for v in row] for row in sim.tolist()]
        z = [[v / T for v in row] for row in s]
        cols = [_log_softmax(list(col)) for col in zip(*z, strict=True)]
        rows = [_log_softmax(row) for row in z]
        i2t = [[_exact_key(v, cols[j][i]) for j, v in enumerate(r)] for i, r in enumerate(s)]
        t2i = [[_exact_key(v, rows[i][j]) for j, v in enumerate(r)] for i, r in enumerate(s)]
    return i2t, t2i


def exact_values(keys: list) -> torch.Tensor:
    def value(key: tuple[int, Decimal]) -> float:
        tier, log = key
        return (
            0.0
            if tier == 1
            else (1 if tier == 2 else -1) * math.exp(float(log if tier == 2 else -log))
        )

    return torch.tensor([[value(k) for k in row] for row in keys], dtype=torch.float64)


def exact_ranks(by_img: list, by_txt: list, t2i: torch.Tensor):
    """The VSE ranks (ties against the query) of exact values."""
    own = t2i.tolist()
    n_img, n_txt = len(by_img), len(by_img[0])
    i2t = []
    for i in range(n_img):
        best = max(by_img[i][j] for j in range(n_txt) if own[j] == i)
        i2t.append(sum(by_img[i][j] >= best for j in range(n_txt) if own[j] != i))
    t2i_ranks = [
        sum(by_txt[a][j] >= by_txt[own[j]][j] for a in range(n_img) if a != own[j])
        for j in range(n_txt)
    ]
    return torch.tensor(i2t), torch.tensor(t2i_ranks)


@pytest.mark.parametrize("t", [0.05, 0.01, 1e-3, 1e-6, 1e-30])
def test_dsl_ranks_equal_exact_products_at_any_temperature(t):
    """Before: T = 1e-6 underflowed every prior to 0: all recalls 0.0, medr = N (silent)."""
    sim, t2i = scores(8, 2, seed=3)
    metrics, _ = rescored_metrics(sim, t2i, Rescoring("dsl", temperature=t))
    want = metrics_from_ranks(*exact_ranks(*exact_dsl(sim, t), t2i))
    assert metrics == want
    assert metrics.i2t_r10 > 0 and metrics.t2i_r10 > 0


def test_dsl_keys_are_the_exact_values_where_nothing_underflows():
    sim, _ = scores(6, 3, seed=4)
    i2t, t2i = dual_softmax_rank_keys(sim, temperature=0.05)
    want_i2t, want_t2i = exact_dsl(sim, 0.05)
    torch.testing.assert_close(i2t, exact_values(want_i2t), rtol=1e-12, atol=0)
    torch.testing.assert_close(t2i, exact_values(want_t2i), rtol=1e-12, atol=0)


def test_dsl_keys_order_each_line_as_the_exact_products_with_ties():
    """A collapsed model (every score equal) and a row of zeros tie exactly, also at 1e-6."""
    sim = torch.full((4, 8), 0.3, dtype=torch.float64)
    sim[1] = 0.0
    sim[2, :4] = -0.2
    i2t, t2i = dual_softmax_rank_keys(sim, temperature=1e-6)
    want_i2t, want_t2i = exact_dsl(sim, 1e-6)
    for got, want, dim in ((i2t, want_i2t, 1), (t2i, want_t2i, 0)):
        lines = got if dim == 1 else got.t()
        exact = want if dim == 1 else [list(c) for c in zip(*want, strict=True)]
        for line, truth in zip(lines.tolist(), exact, strict=True):
            for a in range(len(line)):
                for b in range(len(line)):
                    assert (line[a] >= line[b]) == (truth[a] >= truth[b])


def test_dsl_temperature_too_small_for_float64_is_refused_in_one_line():
    sim, t2i = scores(4, 2, seed=5)
    with pytest.raises(RescoreParameterError, match=r"^temperature 1e-320 is too small") as err:
        rescored_metrics(sim, t2i, Rescoring("dsl", temperature=1e-320))
    assert err.value.param == "temperature" and "\n" not in str(err.value)


def exact_qb_norm(sim: torch.Tensor, bank: torch.Tensor, beta: float) -> list:
    """Static inverted softmax, log eta = beta s - log sum_b exp(beta s_b), in decimals."""
    s = [[Decimal(v) for v in row] for row in sim.tolist()]
    b = [[Decimal(v) for v in row] for row in bank.tolist()]
    B = Decimal(beta)
    with decimal.localcontext(EXACT):
        lse = [sum((B * row[g]).exp() for row in b).ln() for g in range(len(s[0]))]
        return [[B * row[g] - lse[g] for g in range(len(row))] for row in s]


@pytest.mark.parametrize("beta", [20.0, 1e4, 1e8])
def test_qb_norm_holds_at_large_beta(beta):
    """QB-Norm re-scores in log space: a large beta neither underflows nor ties (held)."""
    sim, _ = scores(5, 1, seed=6)
    bank, _ = scores(5, 1, seed=7)
    got = qb_norm(sim, bank[:, :5], beta=beta, dynamic=False)
    want = exact_qb_norm(sim, bank[:, :5], beta)
    for row, truth in zip(got.tolist(), want, strict=True):
        for g, value in enumerate(row):
            assert math.isclose(value, float(truth[g]), rel_tol=1e-12, abs_tol=1e-12 * beta)
        order = sorted(range(len(row)), key=lambda g: (row[g], g))
        assert order == sorted(range(len(row)), key=lambda g: (truth[g], g))


def test_qb_norm_beta_that_overflows_is_refused_in_one_line():
    sim, _ = scores(3, 1, seed=8)
    with pytest.raises(RescoreParameterError, match=r"^beta 1e\+305 is too large"):
        qb_norm(sim, sim, beta=1e305)
