"""Evaluation of pair-scoring models (vlret.eval): packed tokens, block scoring
against a naive double loop over pairs, ensembles, COCO fold blocks, shortlists, the CLI."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from train_helpers import tiny_raw
from vlret.cli import main
from vlret.data import PrecompDataset
from vlret.data.formats.precomp import build_precomp_vocab
from vlret.data.writers import make_tiny_precomp
from vlret.eval import (
    TextTokens,
    encode_tokens,
    mean_pooled_scores,
    metrics_from_scores,
    score_matrix,
    shortlist_metrics,
)
from vlret.metrics import (
    average_metrics,
    coco_5fold_metrics,
    fold_blocks,
    metrics_from_ranks,
    retrieval_metrics_from_similarity,
)
from vlret.models import build_model
from vlret.run.builders import encoder_state
from vlret.run.checkpoint import save_checkpoint
from vlret.run.config import config_from_dict
from vlret.run.evaluate import check_same_split
from vlret.run.pair_scoring import dev_metrics_from_scores


class MaxMeanScorer(nn.Module):
    """regions = l2norm(fc(features)), words = l2norm(embed(ids)) (zero padding); score(i, j) =
    mean over caption j's words of their best region cosine + 0.01 x the caption's length."""

    scores_pairs = True

    def __init__(self, in_dim: int = 16, vocab: int = 64, dim: int = 8, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.fc = nn.Linear(in_dim, dim)
        self.embed = nn.Embedding(vocab, dim)
        self.calls: list[tuple[int, int, int]] = []

    def encode_images(self, features, lengths=None):
        return F.normalize(self.fc(features.float()), dim=-1)

    def encode_texts(self, captions, lengths):
        words = F.normalize(self.embed(captions), dim=-1)
        mask = torch.arange(captions.shape[1], device=captions.device)[None, :] < lengths[:, None]
        return words * mask[:, :, None]

    def score(self, regions, words, word_lengths, *, max_elements=None):
        self.calls.append((regions.shape[0], words.shape[0], words.shape[1]))
        raw = torch.einsum("ird,cld->icrl", regions, words).amax(dim=2)  # (n_img, n_cap, L)
        mask = torch.arange(words.shape[1])[None, :] < word_lengths[:, None]
        mean = (raw * mask[None]).sum(-1) / word_lengths[None, :]
        return mean + 0.01 * word_lengths[None, :]


def naive_scores(model: MaxMeanScorer, regions, words_list) -> torch.Tensor:
    """float64 double loop over pairs, each caption unpadded."""
    rows = [
        [(r.double() @ w.double().t()).amax(0).mean() + 0.01 * len(w) for w in words_list]
        for r in regions
    ]
    return torch.tensor(rows, dtype=torch.float64)


def random_tokens(n_img=6, n_txt=17, r=3, d=8, max_len=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    regions = F.normalize(torch.randn(n_img, r, d, generator=g), dim=-1)
    lengths = torch.randint(1, max_len + 1, (n_txt,), generator=g)
    words = F.normalize(torch.randn(int(lengths.sum()), d, generator=g), dim=-1)
    return regions, TextTokens(words, lengths)


def unpacked(texts: TextTokens) -> list[torch.Tensor]:
    return list(torch.split(texts.words, texts.lengths.tolist()))


# -- TextTokens ---------------------------------------------------------------------------------


def test_text_tokens_gather_pads_each_block_to_its_own_longest():
    _, texts = random_tokens()
    parts = unpacked(texts)
    index = torch.tensor([4, 0, 9])
    words, lengths = texts.gather(index)
    assert words.shape == (3, int(texts.lengths[index].max()), texts.dim)
    for row, j in enumerate(index.tolist()):
        n = int(texts.lengths[j])
        assert int(lengths[row]) == n
        assert torch.equal(words[row, :n], parts[j])
        assert not words[row, n:].any()
    torch.testing.assert_close(
        texts.mean_pooled(), torch.stack([p.mean(0) for p in parts]), rtol=0, atol=1e-6
    )


@pytest.mark.parametrize(
    ("words", "lengths", "match"),
    [
        (torch.zeros(5, 2), torch.tensor([2, 2]), "lengths sum to 4"),
        (torch.zeros(4, 2), torch.tensor([4, 0]), "lengths must be >= 1"),
        (torch.zeros(4), torch.tensor([4]), "words must be a 2-D"),
        (torch.zeros(4, 2), torch.tensor([4.0]), "lengths must be a 1-D integer"),
    ],
)
def test_text_tokens_rejects_bad_input(words, lengths, match):
    with pytest.raises(ValueError, match=match):
        TextTokens(words, lengths)


# -- encode_tokens ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("pairs")
    make_tiny_precomp(
        root, sizes={"train": 6, "dev": 2, "test": 2, "testall": 10}, feature_shape=(4, 16)
    )
    vocab = build_precomp_vocab(root, min_count=1)
    return root, vocab


def test_encode_tokens_packs_each_caption_once(tiny):
    root, vocab = tiny
    ds = PrecompDataset(root, "testall", encoder=vocab)
    model = MaxMeanScorer(vocab=len(vocab)).train()
    regions, texts = encode_tokens(model, ds, batch_size=7, device="cpu")
    assert model.training  # restored
    assert regions.shape == (10, 4, 8) and regions.dtype == torch.float32
    assert len(texts) == 50 and texts.words.dtype == torch.float32
    with torch.no_grad():
        for j in (0, 13, 49):
            ids = ds.caption(j)
            assert int(texts.lengths[j]) == len(ids)
            expected = model.encode_texts(ids[None], torch.tensor([len(ids)]))[0]
            words, _ = texts.gather(torch.tensor([j]))
            torch.testing.assert_close(words[0], expected, rtol=0, atol=1e-6)
        torch.testing.assert_close(regions[3], model.encode_images(ds.image(3)), rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="batch_size"):
        encode_tokens(model, ds, batch_size=0, device="cpu")


# -- score_matrix -------------------------------------------------------------------------------


@pytest.mark.parametrize(("image_block", "text_block"), [(1, 1), (4, 5), (128, 1024)])
def test_score_matrix_equals_a_naive_double_loop(image_block, text_block):
    regions, texts = random_tokens()
    model = MaxMeanScorer()
    sim = score_matrix(
        model, regions, texts, device="cpu", image_block=image_block, text_block=text_block
    )
    expected = naive_scores(model, regions, unpacked(texts))
    assert sim.dtype == torch.float32 and sim.shape == (6, 17)
    # float32 sums of <= 7 cosines of 8-dim unit vectors: a few eps32
    torch.testing.assert_close(sim.double(), expected, rtol=0, atol=16 * 2**-23)
    # length-sorted blocks: each block is padded to its own longest caption only
    padded = sum(n_img * n_cap * width for n_img, n_cap, width in model.calls)
    if text_block == 5:
        assert padded < 6 * 17 * int(texts.lengths.max())


def test_score_matrix_blocks_equal_the_full_matrix_blocks():
    regions, texts = random_tokens(n_img=10, n_txt=50)
    model = MaxMeanScorer()
    full = score_matrix(model, regions, texts, device="cpu")
    blocks = [(2 * f, 2 * f + 2, 10 * f, 10 * f + 10) for f in range(5)]
    model.calls.clear()
    part = score_matrix(model, regions, texts, device="cpu", blocks=blocks)
    assert sum(a * b for a, b, _ in model.calls) == 5 * 2 * 10  # the diagonal only
    for i0, i1, t0, t1 in blocks:
        torch.testing.assert_close(part[i0:i1, t0:t1], full[i0:i1, t0:t1], rtol=0, atol=1e-6)
        part[i0:i1, t0:t1] = 0.0
    assert bool((part.isnan() | (part == 0)).all()) and int(part.isnan().sum()) == 500 - 100


def test_score_matrix_ensemble_is_the_mean():
    regions, texts = random_tokens()
    regions2 = F.normalize(torch.randn(regions.shape), dim=-1)  # another member's encoding
    texts2 = TextTokens(F.normalize(torch.randn(texts.words.shape), dim=-1), texts.lengths)
    a, b = MaxMeanScorer(seed=0), MaxMeanScorer(seed=1)
    sa = score_matrix(a, regions, texts, device="cpu")
    sb = score_matrix(b, regions2, texts2, device="cpu")
    both = score_matrix([a, b], [regions, regions2], [texts, texts2], device="cpu")
    torch.testing.assert_close(both, (sa + sb) / 2, rtol=0, atol=1e-7)
    shared = score_matrix([a, b], regions, texts, device="cpu")
    torch.testing.assert_close(shared, (sa + score_matrix(b, regions, texts, device="cpu")) / 2)


def test_score_matrix_progress_bar_counts_pairs(capsys, monkeypatch):
    import tqdm.auto

    closed = []

    class Recorder(tqdm.auto.tqdm):
        def close(self):
            closed.append((self.n, self.total, self.unit))
            super().close()

    monkeypatch.setattr(tqdm.auto, "tqdm", Recorder)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # bars are drawn on a terminal
    regions, texts = random_tokens()
    score_matrix(MaxMeanScorer(), regions, texts, device="cpu", progress=True, text_block=4)
    assert set(closed) == {(102, 102, "pair")}  # (tqdm closes again when collected)
    assert "pair/s" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"blocks": [(0, 7, 0, 1)]}, "blocks"),
        ({"blocks": [(0, 2, 0, 5), (1, 3, 2, 6)]}, "overlap"),
        ({"image_block": 0}, "image_block"),
        ({"device": "nowhere"}, "device"),
    ],
)
def test_score_matrix_rejects_bad_arguments(kwargs, match):
    regions, texts = random_tokens()
    kwargs = {"device": "cpu", **kwargs}
    with pytest.raises(ValueError, match=match):
        score_matrix(MaxMeanScorer(), regions, texts, **kwargs)


def test_score_matrix_rejects_members_of_other_sizes():
    regions, texts = random_tokens()
    r2, t2 = random_tokens(n_img=5)
    with pytest.raises(ValueError, match="same images and captions"):
        score_matrix([MaxMeanScorer(), MaxMeanScorer()], [regions, r2], [texts, t2], device="cpu")


def test_dev_metrics_from_scores():
    g = torch.Generator().manual_seed(0)
    sim = torch.randn(4, 8, generator=g)
    t2i = torch.arange(8) // 2
    out = dev_metrics_from_scores(sim, t2i)
    assert out.items() >= retrieval_metrics_from_similarity(sim, t2i).as_dict().items()
    pos = sim[t2i, torch.arange(8)]
    assert out["pos_sim"] == pytest.approx(float(pos.mean()))
    hardest = [max(float(sim[i, j]) for j in range(8) if t2i[j] != i) for i in range(4)]
    hardest += [max(float(sim[i, j]) for i in range(4) if i != t2i[j]) for j in range(8)]
    assert out["hardest_neg_sim"] == pytest.approx(sum(hardest) / len(hardest))


# -- shortlists ---------------------------------------------------------------------------------


class TableScorer(nn.Module):
    """score(i, j) = table[i, j]: image i is the region feature (i,), caption j the word (j,)."""

    scores_pairs = True

    def __init__(self, table: torch.Tensor):
        super().__init__()
        self.table = table
        self.pairs = 0

    def score(self, regions, words, word_lengths, *, max_elements=None):
        self.pairs += regions.shape[0] * words.shape[0]
        return self.table[regions[:, 0, 0].long()][:, words[:, 0, 0].long()]


def table_tokens(n_img: int, n_txt: int):
    regions = torch.arange(n_img, dtype=torch.float32).view(n_img, 1, 1)
    texts = TextTokens(
        torch.arange(n_txt, dtype=torch.float32).view(n_txt, 1), torch.ones(n_txt, dtype=torch.long)
    )
    return regions, texts


def brute_force_ranks(exact, tt, t2i, k):
    """Each query sorts its candidates by (shortlisted, exact score if shortlisted else the
    shortlist score), descending; rank = non-matching candidates ranked >= the best match."""
    n_img, n_txt = exact.shape
    i2t, t2i_ranks = [], []
    for q, (ex, sl, gt) in enumerate(
        [(exact[i], tt[i], t2i == i) for i in range(n_img)]
        + [(exact[:, j], tt[:, j], torch.arange(n_img) == t2i[j]) for j in range(n_txt)]
    ):
        short = torch.zeros(len(sl), dtype=torch.bool)
        short[sl.topk(min(k, len(sl))).indices] = True
        key = [(bool(short[c]), float(ex[c]) if short[c] else float(sl[c])) for c in range(len(sl))]
        best = max(key[c] for c in range(len(sl)) if gt[c])
        rank = sum(1 for c in range(len(sl)) if not gt[c] and key[c] >= best)
        (i2t if q < n_img else t2i_ranks).append(rank)
    return torch.tensor(i2t), torch.tensor(t2i_ranks)


def test_shortlist_of_a_constructed_case():
    rows = [[0.9, 0.1, 0.8, 0.7, 0.2, 0.3], [0.85, 0.8, 0.1, 0.2, 0.7, 0.25]]
    tt = torch.tensor([*rows, [0.1, 0.2, 0.3, 0.4, 0.6, 0.5]])
    exact = torch.full((3, 6), -5.0)  # pairs never shortlisted never matter
    exact[0, 0], exact[0, 2], exact[1, 0] = 0.5, 0.6, 0.4
    exact[1, 4], exact[2, 4], exact[2, 5], exact[0, 5] = 0.9, 0.3, 0.8, 0.1
    t2i = torch.tensor([0, 0, 1, 1, 2, 2])
    model = TableScorer(exact)
    res = shortlist_metrics(model, *table_tokens(3, 6), t2i, tt, k=2, device="cpu")
    # i2t: image 0 -> caption 2 (exact 0.6) beats its caption 0 (0.5): rank 1; image 1 has no
    # caption in its list {0, 1}: 2 + captions 4 and 5 above its best (0.2) by tt: rank 4
    expected = metrics_from_ranks(torch.tensor([1, 4, 0]), torch.tensor([0, 2, 2, 2, 1, 0]))
    assert res.metrics == expected
    assert (res.i2t_in_shortlist, res.t2i_in_shortlist) == (2 / 3, 3 / 6)
    assert (res.k_i2t, res.k_t2i) == (2, 2)
    assert (
        res.pairs_scored
        == model.pairs
        == len(
            {(i, j) for i in range(3) for j in tt[i].topk(2).indices.tolist()}
            | {(i, j) for j in range(6) for i in tt[:, j].topk(2).indices.tolist()}
        )
    )


@pytest.mark.parametrize("k", [1, 2, 3, 7, 100])
def test_shortlist_matches_the_brute_force_definition(k):
    g = torch.Generator().manual_seed(k)
    n_img, n_txt = 6, 18
    exact = torch.randn(n_img, n_txt, generator=g).round(decimals=1)  # ties included
    tt = torch.randn(n_img, n_txt, generator=g)
    t2i = torch.arange(n_txt) // 3
    res = shortlist_metrics(
        TableScorer(exact), *table_tokens(n_img, n_txt), t2i, tt, k=k, device="cpu"
    )
    assert res.metrics == metrics_from_ranks(*brute_force_ranks(exact, tt, t2i, k))
    blocks = fold_blocks(t2i, 3)
    folded = shortlist_metrics(
        TableScorer(exact), *table_tokens(n_img, n_txt), t2i, tt, k=k, device="cpu", blocks=blocks
    )
    per_fold = [
        metrics_from_ranks(
            *brute_force_ranks(exact[i0:i1, t0:t1], tt[i0:i1, t0:t1], t2i[t0:t1] - i0, k)
        )
        for i0, i1, t0, t1 in blocks
    ]
    assert folded.metrics == average_metrics(per_fold)
    assert folded.metrics.folds == tuple(per_fold)


def test_shortlist_of_all_candidates_is_the_exact_protocol():
    regions, texts = random_tokens(n_img=10, n_txt=50)
    t2i = torch.arange(50) // 5
    model = MaxMeanScorer()
    exact = score_matrix(model, regions, texts, device="cpu")
    tt = mean_pooled_scores(regions, texts)
    for blocks in (None, fold_blocks(t2i, 5)):
        res = shortlist_metrics(
            model, regions, texts, t2i, tt, k=50, device="cpu", blocks=blocks, text_block=7
        )
        assert res.metrics == metrics_from_scores(exact, t2i, blocks=blocks)
        assert res.i2t_in_shortlist == res.t2i_in_shortlist == 1.0
        assert res.pairs_scored == (500 if blocks is None else 5 * 2 * 10)


def test_fold_blocks_and_metrics_from_scores():
    t2i = torch.tensor([0, 0, 1, 1, 1, 2, 3, 3])
    assert fold_blocks(t2i, 2) == [(0, 2, 0, 5), (2, 4, 5, 8)]
    with pytest.raises(ValueError, match="not divisible by 3"):
        fold_blocks(t2i, 3)
    with pytest.raises(ValueError, match="grouped by image"):
        fold_blocks(torch.tensor([0, 1, 0, 1]), 2)
    sim = torch.randn(4, 8)
    expected = coco_5fold_metrics(torch.eye(4), torch.eye(4)[t2i], t2i, n_folds=2)
    got = metrics_from_scores(torch.eye(4)[:, t2i].clone(), t2i, blocks=fold_blocks(t2i, 2))
    assert got == expected and got.folds == expected.folds
    assert metrics_from_scores(sim, t2i) == retrieval_metrics_from_similarity(sim, t2i)


def test_shortlist_rejects_bad_arguments():
    regions, texts = table_tokens(3, 6)
    t2i = torch.arange(6) // 2
    model = TableScorer(torch.zeros(3, 6))
    with pytest.raises(ValueError, match="k: expected a positive integer"):
        shortlist_metrics(model, regions, texts, t2i, torch.zeros(3, 6), k=0, device="cpu")
    with pytest.raises(ValueError, match=r"shortlist_sim: expected a \(3, 6\)"):
        shortlist_metrics(model, regions, texts, t2i, torch.zeros(6, 3), k=2, device="cpu")
    with pytest.raises(ValueError, match="shortlist_sim: NaN"):
        shortlist_metrics(
            model, regions, texts, t2i, torch.full((3, 6), math.nan), k=2, device="cpu"
        )


# -- vlret eval on pair-scoring checkpoints -----------------------------------------------------

_SMALL = {"embed_dim": 16, "image": {"in_dim": 16}, "text": {"word_dim": 8}}
CROSS_MODELS = {
    "scan_t2i": {"kind": "scan", **_SMALL},
    "scan_i2t": {"kind": "scan", "direction": "i2t", "aggregation": "mean", **_SMALL},
}


def write_checkpoint(path: Path, data: Path, model_cfg: dict, vocab, *, seed: int, **data_keys):
    """A checkpoint as the trainer writes it (config, encoder, vocab_size, model weights) for an
    untrained model with seeded weights."""
    raw = tiny_raw(data, path.parent / "unused")
    raw["model"] = model_cfg
    raw["data"].update(data_keys)
    config = config_from_dict(raw)
    torch.manual_seed(seed)
    model = build_model(config.model, vocab_size=len(vocab))
    state = {"config": config.to_dict(), "encoder": encoder_state(vocab, config)}
    save_checkpoint({**state, "vocab_size": len(vocab), "model": model.state_dict()}, path)
    return model.eval()


@pytest.fixture(scope="module")
def ckpts(tiny, tmp_path_factory):
    root, vocab = tiny
    out = tmp_path_factory.mktemp("ckpts")
    models = {}
    for seed, (name, cfg) in enumerate(CROSS_MODELS.items()):
        models[name] = write_checkpoint(out / f"{name}.pt", root, cfg, vocab, seed=seed)
    two_tower = tiny_raw(root, out)["model"]
    for seed, name in enumerate(("tower_a", "tower_b")):
        models[name] = write_checkpoint(out / f"{name}.pt", root, two_tower, vocab, seed=10 + seed)
    return root, vocab, out, models


_NAIVE: dict[tuple[int, str], torch.Tensor] = {}


def naive_matrix(model, dataset) -> torch.Tensor:
    """Each caption encoded alone (unpadded) and scored against the images, each image encoded
    alone; two-tower models: cosines of embeddings computed one item at a time. Cached."""
    key = (id(model), dataset.split)
    if key in _NAIVE:
        return _NAIVE[key]
    with torch.no_grad():
        caps = [dataset.caption(j) for j in range(dataset.num_captions)]
        img = torch.cat(
            [model.encode_images(dataset.image(i)[None]) for i in range(dataset.num_images)]
        )
        txt = [model.encode_texts(c[None], torch.tensor([len(c)])) for c in caps]
        if getattr(model, "scores_pairs", False):
            cols = [model.score(img, w, torch.tensor([w.shape[1]]))[:, 0] for w in txt]
            out = torch.stack(cols, dim=1)
        else:
            out = F.normalize(img, dim=1) @ F.normalize(torch.cat(txt), dim=1).t()
    _NAIVE[key] = out
    return out


def expected_metrics(sim, t2i, protocol):
    blocks = fold_blocks(t2i, 5) if protocol == "coco1k" else None
    return metrics_from_scores(sim, t2i, blocks=blocks)


def eval_cli(ckpt_paths, root, split, protocol, out, *extra) -> int:
    args = ["eval", *ckpt_paths, "--data", root, "--split", split, "--protocol", protocol]
    return main([str(a) for a in [*args, "--json", out, *extra]])


@pytest.mark.parametrize(
    ("split", "protocol"), [("test", "f30k"), ("testall", "coco5k"), ("testall", "coco1k")]
)
def test_cli_evaluates_a_cross_attention_checkpoint(
    ckpts, tmp_path, capsys, monkeypatch, split, protocol
):
    root, vocab, out, models = ckpts
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # bars are drawn on a terminal
    js = tmp_path / "m.json"
    assert eval_cli([out / "scan_t2i.pt"], root, split, protocol, js) == 0
    captured = capsys.readouterr()
    assert "pair/s" in captured.err and "pair" not in captured.out  # the bar stays on stderr
    assert captured.out.splitlines()[-1] == str(js)
    record = json.loads(js.read_text())
    ds = PrecompDataset(root, split, encoder=vocab)
    expected = expected_metrics(naive_matrix(models["scan_t2i"], ds), ds.txt_to_img, protocol)
    assert record["metrics"] == pytest.approx(expected.as_dict())
    assert record["approximate"] is False and record["checkpoint"] == str(out / "scan_t2i.pt")
    if protocol == "coco1k":
        assert "5 folds of 2 images" in record["title"]
        assert [f for f in record["folds"]] == [pytest.approx(f.as_dict()) for f in expected.folds]


@pytest.mark.parametrize(
    ("names", "protocol"),
    [(("scan_t2i", "scan_i2t"), "coco1k"), (("tower_a", "tower_b"), "coco5k")],
)
def test_cli_ensemble_averages_score_matrices(ckpts, tmp_path, capsys, names, protocol):
    root, vocab, out, models = ckpts
    js = tmp_path / "m.json"
    paths = [out / f"{n}.pt" for n in names]
    assert eval_cli(paths, root, "testall", protocol, js, "--no-progress") == 0
    captured = capsys.readouterr()
    assert captured.err == "" and "ensemble of 2 (mean of score matrices)" in captured.out
    ds = PrecompDataset(root, "testall", encoder=vocab)
    sim = sum(naive_matrix(models[n], ds) for n in names) / 2
    record = json.loads(js.read_text())
    assert record["metrics"] == pytest.approx(
        expected_metrics(sim, ds.txt_to_img, protocol).as_dict()
    )
    assert record["checkpoints"] == [str(p) for p in paths] and "checkpoint" not in record
    assert record["ensemble"] == "mean of score matrices" and record["approximate"] is False


def test_cli_shortlist_is_approximate_and_reports_coverage(ckpts, tmp_path, capsys):
    """coco1k: per-fold shortlists (the whole-matrix case is tested on shortlist_metrics)."""
    protocol = "coco1k"
    root, vocab, out, models = ckpts
    ds = PrecompDataset(root, "testall", encoder=vocab)
    t2i = ds.txt_to_img
    blocks = fold_blocks(t2i, 5) if protocol == "coco1k" else None
    exact = naive_matrix(models["scan_t2i"], ds)
    js = tmp_path / "all.json"
    assert eval_cli([out / "scan_t2i.pt"], root, "testall", protocol, js, "--shortlist", "50") == 0
    printed = capsys.readouterr().out
    assert (
        "approximate protocol (not the exact evaluation): top-50 (at most the candidates: i2t "
        "10, t2i 2) shortlists by the cosine of the mean-pooled region and word features"
    ) in printed
    assert "ground truth shortlisted for 100.0% of i2t and 100.0% of t2i queries" in printed
    record = json.loads(js.read_text())
    assert record["approximate"] is True
    assert record["metrics"] == pytest.approx(expected_metrics(exact, t2i, protocol).as_dict())
    sl = record["shortlist"]
    assert sl["i2t_ground_truth_in_shortlist"] == sl["t2i_ground_truth_in_shortlist"] == 1.0
    # K = 2 from the two-tower checkpoint's cosines: the brute-force definition
    js = tmp_path / "two.json"
    extra = ["--shortlist", "2", "--shortlist-from", out / "tower_a.pt"]
    assert eval_cli([out / "scan_t2i.pt"], root, "testall", protocol, js, *extra) == 0
    record = json.loads(js.read_text())
    tt = naive_matrix(models["tower_a"], ds)
    spans = blocks or [(0, 10, 0, 50)]
    folds = [
        metrics_from_ranks(
            *brute_force_ranks(exact[i0:i1, t0:t1], tt[i0:i1, t0:t1], t2i[t0:t1] - i0, 2)
        )
        for i0, i1, t0, t1 in spans
    ]
    expected = folds[0] if blocks is None else average_metrics(folds)
    assert record["metrics"] == pytest.approx(expected.as_dict())
    assert record["shortlist"]["k"] == 2 and "tower_a.pt" in record["shortlist"]["source"]
    for direction in ("i2t", "t2i"):
        assert 0 < record["shortlist"][f"{direction}_ground_truth_in_shortlist"] <= 1
    assert (record["shortlist"]["k_i2t"], record["shortlist"]["k_t2i"]) == (2, 2)


@pytest.mark.parametrize(
    ("names", "extra", "words"),
    [
        (("scan_t2i", "tower_a"), ["--shortlist", "3"], "tower_a.pt is a two-tower model"),
        (("scan_t2i",), ["--shortlist", "0"], "shortlist: expected a positive number"),
        (("scan_t2i",), ["--shortlist-from", "x.pt"], "shortlist_from: only used with shortlist"),
        (
            ("scan_t2i",),
            ["--shortlist", "3", "--shortlist-from", "{out}/scan_i2t.pt"],
            "must be a two-tower checkpoint",
        ),
        (("scan_t2i", "karpathy"), [], "trained on different data"),
    ],
)
def test_cli_eval_errors(ckpts, tmp_path, capsys, names, extra, words):
    root, vocab, out, _ = ckpts
    if "karpathy" in names:
        write_checkpoint(
            out / "karpathy.pt",
            root,
            CROSS_MODELS["scan_t2i"],
            vocab,
            seed=0,
            format="karpathy",
            karpathy_json=str(root / "dataset_flickr30k.json"),
            image_root=str(root),
        )
    args = [out / f"{n}.pt" for n in names]
    extra = [e.format(out=out) for e in extra]
    assert eval_cli(args, root, "test", "f30k", tmp_path / "m.json", *extra) == 2
    err = capsys.readouterr().err
    assert err.startswith("vlret eval: ") and words in err and "Traceback" not in err
    assert not (tmp_path / "m.json").exists()


def test_members_must_see_the_same_split():
    a = SimpleNamespace(
        num_images=2, num_captions=4, image_ids=[1, 2], txt_to_img=torch.tensor([0, 0, 1, 1])
    )
    b = SimpleNamespace(
        num_images=2, num_captions=2, image_ids=[1, 2], txt_to_img=torch.tensor([0, 1])
    )
    with pytest.raises(
        ValueError, match="A.pt and B.pt see different test splits: 2 x 4 and 2 x 2"
    ):
        check_same_split("A.pt", a, "B.pt", b, "test")
    c = SimpleNamespace(num_images=2, num_captions=4, image_ids=[2, 1], txt_to_img=a.txt_to_img)
    with pytest.raises(ValueError, match="in another order"):
        check_same_split("A.pt", a, "C.pt", c, "test")
    check_same_split("A.pt", a, "A2.pt", SimpleNamespace(**vars(a)), "test")
