"""Scorers behind one interface (vlret.eval.scorers), the PairScorer protocol, and the
statistics, folds and unwrapping that exist once (vlret.metrics, vlret._modules)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from vlret._modules import unwrap_model
from vlret.data.formats import open_dataset
from vlret.eval import (
    EnsembleScorer,
    EnsembleSplit,
    PairModelScorer,
    RescoredScorer,
    ShortlistScorer,
    TwoTowerScorer,
    evaluate,
    get_protocol,
    metrics_from_scores,
)
from vlret.metrics import (
    coco_5fold_metrics,
    coco_folds,
    fold_blocks,
    rescored_metrics,
    similarity_stats,
)
from vlret.metrics.rescore import Rescoring
from vlret.models import PairScorer, build_model
from vlret.run.builders import load_trained_model
from vlret.run.pair_scoring import score_stats, scores_pairs
from vlret.train.run_log import batch_similarity_stats

FIXTURES = Path(__file__).parents[1] / "fixtures" / "prev_release"


def _member(name: str, split: str = "test"):
    model, run, encoder = load_trained_model(FIXTURES / name)
    data = open_dataset(run.data, split, encoder=encoder, root=FIXTURES / "data")
    return model, run, data


def _naive_stats(sim: np.ndarray, t2i: np.ndarray, pos: np.ndarray) -> tuple[float, float]:
    positives = [sim[t2i[j], j] for j in range(sim.shape[1])]
    hardest = []
    for i in range(sim.shape[0]):
        negs = [sim[i, j] for j in range(sim.shape[1]) if not pos[i, j]]
        hardest += [max(negs)] if negs else []
    for j in range(sim.shape[1]):
        negs = [sim[i, j] for i in range(sim.shape[0]) if not pos[i, j]]
        hardest += [max(negs)] if negs else []
    return float(np.mean(positives)), float(np.mean(hardest)) if hardest else math.nan


def test_similarity_stats_against_naive_loops():
    g = torch.Generator().manual_seed(0)
    sim = torch.randn(4, 9, generator=g)
    t2i = torch.tensor([0, 0, 1, 1, 1, 2, 3, 3, 3])
    got = similarity_stats(sim, txt_to_img=t2i)
    pos = (t2i[None, :] == torch.arange(4)[:, None]).numpy()
    want = _naive_stats(sim.double().numpy(), t2i.numpy(), pos)
    # float32 means of at most 26 values: a few ulps of their magnitude
    assert got["pos_sim"] == pytest.approx(want[0], rel=0, abs=1e-6)
    assert got["hardest_neg_sim"] == pytest.approx(want[1], rel=0, abs=1e-6)
    # a batch: the diagonal is each item's pair, equal ids are no negatives
    ids = torch.tensor([5, 5, 7])
    batch = torch.randn(3, 3, generator=g)
    got = score_stats(batch, ids)
    pos = (ids[:, None] == ids[None, :]).numpy()
    want = _naive_stats(batch.double().numpy(), np.arange(3), pos)
    assert (got["pos_sim"], got["hardest_neg_sim"]) == pytest.approx(want, rel=0, abs=1e-6)
    all_pos = score_stats(batch, torch.tensor([1, 1, 1]))
    assert math.isnan(all_pos["hardest_neg_sim"])
    img, txt = torch.randn(3, 5, generator=g), torch.randn(3, 5, generator=g)
    cos = torch.nn.functional.cosine_similarity(img[:, None], txt[None], dim=-1)
    got = batch_similarity_stats(img, txt, ids)
    want = _naive_stats(cos.double().numpy(), np.arange(3), pos)
    assert (got["pos_sim"], got["hardest_neg_sim"]) == pytest.approx(want, rel=0, abs=1e-6)
    with pytest.raises(ValueError, match="txt_to_img must have one entry per text"):
        similarity_stats(sim, txt_to_img=t2i[:3])


def test_batch_similarity_stats_in_row_tiles_equal_the_dense_statistics():
    """A large batch's step statistics never form its B x B cosines: row tiles, the columns'
    maxima carried across them, the same values (a query without negatives left out)."""
    g = torch.Generator().manual_seed(3)
    img, txt = torch.randn(11, 6, generator=g), torch.randn(11, 6, generator=g)
    ids = torch.tensor([0, 0, 1, 2, 3, 3, 3, 4, 5, 6, 6])
    cos = torch.nn.functional.cosine_similarity(img[:, None], txt[None], dim=-1)
    pos = (ids[:, None] == ids[None, :]).numpy()
    want = _naive_stats(cos.double().numpy(), np.arange(11), pos)
    for tile in (11, 12, 23, 33, 10**6):  # 1, 1, 2, 3 rows a tile; dense
        got = batch_similarity_stats(img, txt, ids, tile_elements=tile)
        assert (got["pos_sim"], got["hardest_neg_sim"]) == pytest.approx(want, rel=0, abs=1e-6)
    same = batch_similarity_stats(img, txt, torch.zeros(11, dtype=torch.long), tile_elements=22)
    assert math.isnan(same["hardest_neg_sim"])


def test_one_fold_rule_for_embeddings_and_score_blocks():
    t2i = torch.tensor([2, 0, 1, 3, 0, 2, 1, 3])  # captions not grouped by image
    folds = coco_folds(t2i, n_images=4, n_folds=2)
    assert [(f.img0, f.img1, f.texts.tolist()) for f in folds] == [
        (0, 2, [1, 2, 4, 6]),
        (2, 4, [0, 3, 5, 7]),
    ]
    with pytest.raises(ValueError, match="grouped by image"):
        folds[0].block()
    grouped = torch.tensor([0, 0, 1, 2, 2, 3])
    assert fold_blocks(grouped, 2) == [(0, 2, 0, 3), (2, 4, 3, 6)]
    # the core names its arguments; the protocol words it for its users (CLI message as before)
    for call in (lambda: coco_folds(t2i, n_images=4, n_folds=3), lambda: fold_blocks(grouped, 3)):
        with pytest.raises(ValueError) as err:
            call()
        assert str(err.value) == (
            "n_folds: 3 folds of equal size need n_images divisible by 3; got 4 images, "
            "not divisible by 3"
        )
    with pytest.raises(ValueError) as err:
        get_protocol("coco1k").check_folds(4)
    assert str(err.value) == (
        "coco1k averages 5 folds of equal size (COCO testall: 5 x 1000 images); this split has "
        "4 images, not divisible by 5 (use coco5k)"
    )
    get_protocol("coco1k").check_folds(5000)
    get_protocol("coco5k").check_folds(4)  # not folded


def test_embeddings_and_score_blocks_fold_the_same_images():
    # one rule: n_images images, each with a text; the blocks and the embeddings agree on
    # every input both accept, and refuse the same inputs with the same words
    gen = torch.Generator().manual_seed(3)
    for n_img, n_folds in ((6, 3), (10, 5), (8, 2), (12, 4)):
        counts = torch.randint(1, 4, (n_img,), generator=gen)
        t2i = torch.repeat_interleave(torch.arange(n_img), counts)
        img = torch.randn(n_img, 5, generator=gen, dtype=torch.float64)
        txt = torch.randn(len(t2i), 5, generator=gen, dtype=torch.float64)
        blocks = fold_blocks(t2i, n_folds, n_images=n_img)
        assert blocks == fold_blocks(t2i, n_folds)  # the images txt_to_img names: the same
        size = n_img // n_folds
        # naive oracle: fold f is images [f*size, (f+1)*size) and exactly their texts
        for f, (i0, i1, t0, t1) in enumerate(blocks):
            assert (i0, i1) == (f * size, (f + 1) * size)
            assert t2i[t0:t1].tolist() == [i for i in t2i.tolist() if i0 <= i < i1]
        sim = img @ txt.t()  # what coco_5fold_metrics ranks (dot products, float64)
        by_blocks = metrics_from_scores(sim, t2i, blocks=blocks)
        by_embeddings = coco_5fold_metrics(img, txt, t2i, n_folds=n_folds)
        assert by_blocks.folds == by_embeddings.folds
    # an image without a text (the last): both refuse it, in the same words
    t2i = torch.tensor([0, 0, 1, 2, 3])
    for call in (
        lambda: fold_blocks(t2i, 5, n_images=5),
        lambda: coco_5fold_metrics(torch.eye(5), torch.eye(5)[t2i], t2i, n_folds=5),
    ):
        with pytest.raises(ValueError, match="txt_to_img gives image 4 no text"):
            call()
    with pytest.raises(ValueError, match="n_images: expected a positive integer"):
        fold_blocks(t2i, 2, n_images=0)


def test_models_declare_pair_scoring_by_the_protocol():
    for kind in ("scan", "bfan", "sgraf"):
        model = build_model(
            {"kind": kind, "embed_dim": 8, "image": {"in_dim": 4}, "text": {"word_dim": 4}},
            vocab_size=10,
        )
        assert isinstance(model, PairScorer) and scores_pairs(model)
        lengths = torch.tensor([3, 1])
        assert torch.equal(model.token_lengths(lengths), lengths)  # one row per word
    two_tower = build_model({"embed_dim": 8, "image": {"in_dim": 4}}, vocab_size=10)
    assert not isinstance(two_tower, PairScorer) and not scores_pairs(two_tower)
    assert unwrap_model(two_tower) is two_tower
    assert two_tower.scoring == "cosine"
    dot = build_model({"embed_dim": 8, "image": {"in_dim": 4}, "scoring": "dot"}, vocab_size=10)
    assert dot.scoring == "dot" and dot.config["scoring"] == "dot"
    with pytest.raises(ValueError, match="PairScorer"):
        PairModelScorer(two_tower)
    with pytest.raises(ValueError, match="scores pairs"):
        TwoTowerScorer(model)
    with pytest.raises(ValueError, match="scoring must be one of"):
        TwoTowerScorer(two_tower, scoring="angle")


def test_two_tower_scores_are_the_scoring_of_its_embeddings():
    model, _, data = _member("two_tower.pt")
    cos = TwoTowerScorer(model, scoring="cosine")
    dot = TwoTowerScorer(model, scoring="dot")
    img, txt = (e.double() for e in dot.embeddings(data))
    unit = torch.nn.functional.normalize
    # float32 dot products of 8-dim embeddings against the float64 truth: 8 roundings each
    bound = (
        8 * torch.finfo(torch.float32).eps * float(img.norm(dim=1).max() * txt.norm(dim=1).max())
    )
    torch.testing.assert_close(dot.scores(data).double(), img @ txt.t(), rtol=0, atol=bound)
    want_cos = unit(img, dim=1) @ unit(txt, dim=1).t()
    torch.testing.assert_close(cos.scores(data).double(), want_cos, rtol=0, atol=1e-6)
    partial = dot.scores(data, blocks=[(0, 2, 0, 10)])
    assert torch.isnan(partial[2:]).all() and torch.isnan(partial[:, 10:]).all()
    want = (img @ txt.t())[:2, :10]
    torch.testing.assert_close(partial[:2, :10].double(), want, rtol=0, atol=bound)


def test_two_tower_scoring_defaults_to_the_models_own():
    model, run, data = _member("two_tower.pt")  # stored with scoring = dot (normalize = false)
    assert run.scoring == model.scoring == "dot"
    model.scoring = "cosine"
    assert TwoTowerScorer(model).scoring == "cosine"
    model.scoring = "dot"
    implicit = TwoTowerScorer(model)
    assert implicit.scoring == "dot" and TwoTowerScorer(model, scoring="cosine").scoring == "cosine"
    img, txt = TwoTowerScorer(model, scoring="dot").embeddings(data)
    assert torch.equal(implicit.scores(data), img @ txt.t())  # raw dot products, not cosines
    assert not torch.allclose(img.norm(dim=1), torch.ones(len(img)))  # so cosines would differ

    class Plain(torch.nn.Module):  # declares no scoring: cosine
        def encode_images(self, x):
            return x

        def encode_texts(self, x, lengths):
            return x

    assert TwoTowerScorer(Plain()).scoring == "cosine"
    model.scoring = "angle"
    with pytest.raises(ValueError, match="scoring must be one of cosine, dot, got 'angle'"):
        TwoTowerScorer(model)


def test_ensemble_is_the_mean_of_its_members_and_rescoring_wraps_any_matrix():
    tt_model, _, tt_data = _member("two_tower.pt")
    pair_model, _, pair_data = _member("scan.pt")
    tt, pair = TwoTowerScorer(tt_model, scoring="dot"), PairModelScorer(pair_model)
    both = EnsembleSplit((tt_data, pair_data))
    ensemble = EnsembleScorer([tt, pair], members=("a", "b"))
    naive = (tt.scores(tt_data).double() + pair.scores(pair_data).double()) / 2
    torch.testing.assert_close(ensemble.scores(both).double(), naive, rtol=1e-6, atol=1e-7)
    result = evaluate(ensemble, both, "f30k", split="test")
    assert result.members == ("a", "b") and result.scores is not None
    assert "ensemble of 2 (mean of score matrices): a, b" in result.title()
    dsl = Rescoring("dsl")
    rescored = evaluate(RescoredScorer(ensemble, dsl), both, "f30k", split="test")
    want, info = rescored_metrics(ensemble.scores(both), tt_data.txt_to_img, dsl)
    assert rescored.metrics == want and rescored.rescore == dsl.record(info)
    assert rescored.record()["standard"] is False
    with pytest.raises(ValueError, match="querybank"):
        RescoredScorer(ensemble, Rescoring("qbnorm"))


def test_a_rescoring_is_never_used_as_a_plain_matrix():
    # its two directions rank different matrices: as a member or a source it would silently
    # stand for the inner matrix, so every such use is refused by name
    tt_model, _, tt_data = _member("two_tower.pt")
    pair_model, _, _ = _member("scan.pt")
    tt, pair = TwoTowerScorer(tt_model), PairModelScorer(pair_model)
    rescored = RescoredScorer(tt, Rescoring("dsl"))
    with pytest.raises(ValueError, match="rescore dsl ranks each direction on its own"):
        rescored.scores(tt_data)
    with pytest.raises(ValueError, match=r"scorers\[1\]: an ensemble averages score matrices; "):
        EnsembleScorer([pair, rescored])
    with pytest.raises(ValueError, match="source: the shortlists come from a TwoTowerScorer"):
        ShortlistScorer([pair], k=3, source=(rescored, tt_data))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"pairs\[0\]: the shortlist re-ranks by exact pair"):
        ShortlistScorer([tt], k=3)  # type: ignore[list-item]
    with pytest.raises(ValueError, match="inner: re-scoring needs a score matrix"):
        RescoredScorer(rescored, Rescoring("dsl"))  # type: ignore[arg-type]
    # what it measures is still the re-scored ranks of the inner matrix
    want, _ = rescored_metrics(tt.scores(tt_data), tt_data.txt_to_img, Rescoring("dsl"))
    assert rescored.measure(tt_data).metrics == want


def test_shortlist_with_every_candidate_is_the_exact_protocol():
    model, _, data = _member("scan.pt", split="testall")
    pair = PairModelScorer(model)
    for protocol in ("coco5k", "coco1k"):
        exact = evaluate(pair, data, protocol, split="testall")
        approx = evaluate(ShortlistScorer([pair], k=50), data, protocol, split="testall")
        assert approx.metrics == exact.metrics and approx.approximate
        assert approx.shortlist["i2t_ground_truth_in_shortlist"] == 1.0
    with pytest.raises(ValueError, match="shortlist: expected a positive number"):
        ShortlistScorer([pair], k=0)


def test_a_batch_pos_sim_is_the_diagonal_views_mean_as_the_step_log_took_it():
    # The step logs of b84b800 averaged sim.diagonal() (a strided view); a gathered copy sums in
    # another order, so the logged pos_sim of every existing run would change in its last bit.
    sim = torch.randn(256, 256, generator=torch.Generator().manual_seed(0))
    ids = torch.arange(256)
    stats = similarity_stats(sim, txt_to_img=ids, pos_mask=ids[:, None] == ids[None, :])
    assert stats["pos_sim"] == float(sim.diagonal().mean())
    exact = float(sim.double().diagonal().sum() / 256)  # float32 rounding of 256 terms at most
    assert abs(stats["pos_sim"] - exact) <= 256 * torch.finfo(torch.float32).eps * 4
