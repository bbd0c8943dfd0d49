"""The synthetic extras of a pair-scoring model (CE, MMT, SCAN, ...): its score matrix ``S`` is
fed to the embedding metrics as ``(I, S^T)`` with the identity on the image side (4 MB for
1000 images, where ``(S, I)`` needed an ``N_txt x N_txt`` identity: 1.6 GB for 20000
captions). Every metric must equal the one computed from ``(S, I)``."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from vlret.analysis.compare import scoring
from vlret.eval import Evaluation, MatrixScorer
from vlret.metrics import retrieval_metrics_from_similarity
from vlret.worlds import evaluate_synthetic, load_synthetic, write_synthetic


def flat(value):
    if dataclasses.is_dataclass(value):
        return flat(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {k: flat(v) for k, v in value.items()}
    return value


def assert_same(a, b, path="") -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            assert_same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b), path
    else:
        assert a == pytest.approx(b, rel=0, abs=1e-9), path


def test_identity_on_the_image_side_gives_the_same_metrics(tmp_path):
    root = write_synthetic("tiny", tmp_path / "world", format="precomp", seed=0)
    annotations = load_synthetic(root, "test")
    n_img, n_txt = len(annotations.groups), len(annotations.txt_to_img)
    gen = torch.Generator().manual_seed(0)
    sim = torch.rand(n_img, n_txt, generator=gen, dtype=torch.float64)
    sim[0, :3] = sim[1, :3]  # ties between two images: counted the same in both forms
    old = evaluate_synthetic(sim, torch.eye(n_txt, dtype=sim.dtype), annotations)
    new = evaluate_synthetic(torch.eye(n_img, dtype=sim.dtype), sim.t(), annotations)
    assert_same(flat(old), flat(new))


class _Matrix(MatrixScorer):
    """A scorer with a fixed full matrix, counting how often it is asked for it."""

    def __init__(self, sim):
        self.sim, self.calls = sim, 0

    def scores(self, data, *, blocks=None):
        assert blocks is None  # the extras need the whole matrix
        self.calls += 1
        return self.sim


def test_pair_scores_as_embeddings_multiply_back_to_the_score_matrix():
    sim = torch.randn(3, 7, dtype=torch.float64)
    metrics = retrieval_metrics_from_similarity(sim, torch.tensor([0, 0, 1, 1, 2, 2, 2]))
    scorer = _Matrix(sim)

    def evaluation(scores):
        return Evaluation(metrics, 3, 7, scores=scores, scorer=scorer, data=object())

    img, txt = scoring._as_embeddings(evaluation(sim), None)  # the evaluation's own matrix
    assert img.shape == (3, 3) and txt.shape == (7, 3)
    assert torch.equal(img @ txt.t(), sim) and scorer.calls == 0
    folds_only = sim.clone()
    folds_only[0, 3:] = math.nan  # COCO 1K kept only the fold blocks: scored again, whole
    img, txt = scoring._as_embeddings(evaluation(folds_only), None)
    assert torch.equal(img @ txt.t(), sim) and scorer.calls == 1
    given = torch.randn(3, 7, dtype=torch.float64)  # the caller's full matrix wins
    img, txt = scoring._as_embeddings(evaluation(folds_only), given)
    assert torch.equal(img @ txt.t(), given) and scorer.calls == 1
    pair = (torch.randn(3, 4), torch.randn(7, 4))  # a two-tower run: its embeddings as scored
    two_tower = Evaluation(metrics, 3, 7, embeddings=pair)
    assert scoring._as_embeddings(two_tower, None) is pair
    with pytest.raises(ValueError, match="the synthetic extras need a score matrix"):
        scoring._as_embeddings(Evaluation(metrics, 3, 7), None)
