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
from vlret.data.synthetic import evaluate_synthetic, load_synthetic, write_synthetic


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


def test_pair_scores_as_embeddings_multiply_back_to_the_score_matrix(monkeypatch):
    sim = torch.randn(3, 7, dtype=torch.float64)
    monkeypatch.setattr("vlret.eval.encode_tokens", lambda *a, **k: (None, None))
    monkeypatch.setattr("vlret.eval.score_matrix", lambda *a, **k: sim)
    img, txt = scoring._pair_scores_as_embeddings(None, None, 4, "cpu")
    assert img.shape == (3, 3) and txt.shape == (7, 3)
    assert torch.equal(img @ txt.t(), sim)
