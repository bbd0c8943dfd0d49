"""Relevance-aware retrieval metrics (R-Precision, mAP@R) against a naive sorted loop."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vlret.metrics import rprecision_map_at_r


def naive_rp_map(scores: np.ndarray, rel: np.ndarray) -> tuple[float, float]:
    """Ranking with ties broken against the query, by an explicit sort key."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], rel[i]))
    r = int(rel.sum())
    hits, ap = 0, 0.0
    for pos, i in enumerate(order[:r], start=1):
        if rel[i]:
            hits += 1
            ap += hits / pos
    return hits / r, ap / r


def test_rprecision_map_at_r_against_naive_loop_with_ties():
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 4, (30, 12)).astype(np.float64)  # many ties
    rel = rng.random((30, 12)) < 0.3
    rel[:, 0] = True
    rp, ap, r = rprecision_map_at_r(torch.from_numpy(scores), torch.from_numpy(rel))
    for q in range(30):
        e_rp, e_ap = naive_rp_map(scores[q], rel[q])
        assert rp[q].item() == pytest.approx(e_rp)
        assert ap[q].item() == pytest.approx(e_ap)
        assert r[q].item() == rel[q].sum()
    # a collapsed model (all scores equal) scores 0 whenever an irrelevant item exists
    rp0, ap0, _ = rprecision_map_at_r(torch.zeros(2, 5), torch.tensor([[1, 0, 0, 0, 0]] * 2))
    assert rp0.tolist() == [0.0, 0.0] and ap0.tolist() == [0.0, 0.0]
