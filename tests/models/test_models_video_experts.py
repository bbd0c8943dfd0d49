"""CE and the shared multi-expert machinery (vlret.models.video_experts): mixture scoring
against a float64 per-pair loop, mixture weights, masked NetVLAD and collaborative gating
against naive loops, absent experts that never contribute, gradients, build_model configs and
the pair-scoring evaluation's score_matrix."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from vlret.data.expert_batch import ExpertBatch
from vlret.eval import TextTokens, pack_words, score_matrix
from vlret.models import build_model
from vlret.models.video_experts import (
    CollaborativeExperts,
    CollaborativeGating,
    NetVLAD,
    mixture_scores,
    mixture_weights,
)

EXPERTS = {"appearance": 6, "audio": 4, "ocr": 5, "face": 3}
NAMES = ("face", "ocr", "appearance", "audio", "extra")  # data order differs from the model's
VOCAB = 23
EMB = 8


def make_batch(n: int = 6, *, seed: int = 0, fill: float | None = None) -> ExpertBatch:
    """Videos with pooled (appearance, face, extra) and temporal (audio, ocr) experts, some
    absent (one video lacks every model expert). ``fill`` overwrites every absent expert and
    every padding frame with that value."""
    g = torch.Generator().manual_seed(seed)
    feats = {
        "appearance": torch.randn(n, 6, generator=g),
        "audio": torch.randn(n, 4, 4, generator=g),
        "ocr": torch.randn(n, 3, 5, generator=g),
        "face": torch.randn(n, 3, generator=g),
        "extra": torch.randn(n, 2, generator=g),
    }
    present = torch.rand(n, len(NAMES), generator=g) < 0.6
    present[0, :] = True
    present[1, :4] = False  # no model expert at all
    present[2, :4] = torch.tensor([False, True, False, False])  # only ocr
    frames = torch.ones(n, len(NAMES), dtype=torch.long)
    frames[:, NAMES.index("audio")] = torch.randint(1, 5, (n,), generator=g)
    frames[:, NAMES.index("ocr")] = torch.randint(1, 4, (n,), generator=g)
    frames = torch.where(present, frames, 0)
    batch = ExpertBatch(NAMES, feats, present, frames)
    if fill is not None:
        for i, name in enumerate(NAMES):
            x = feats[name]
            if x.dim() == 2:
                x[~present[:, i]] = fill
            else:
                real = batch.frame_mask(name)
                x[~real] = fill
    return batch


def ce_model(**kw) -> CollaborativeExperts:
    torch.manual_seed(1)
    cfg = {
        "kind": "ce",
        "experts": EXPERTS,
        "embed_dim": EMB,
        "vlad_clusters": {"audio": 3},
        "text": {"word_dim": 7, "vlad_clusters": 4},
        **kw,
    }
    return build_model(cfg, vocab_size=VOCAB)


def captions(n: int = 5, seed: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 7, (n,), generator=g)
    lengths[0] = 6
    return torch.randint(0, VOCAB, (n, 6), generator=g), lengths


# -- mixture scoring ---------------------------------------------------------------------------


def naive_scores(videos: torch.Tensor, texts: torch.Tensor) -> torch.Tensor:
    v, t = videos.double(), texts.double()
    out = torch.zeros(v.shape[0], t.shape[0], dtype=torch.float64)
    for i in range(v.shape[0]):
        for j in range(t.shape[0]):
            have = [e for e in range(v.shape[1]) if v[i, e, -1] > 0]
            if not have:
                continue
            z = sum(math.exp(float(t[j, e, -1])) for e in have)
            for e in have:
                w = math.exp(float(t[j, e, -1])) / z
                out[i, j] += w * float(v[i, e, :-1] @ t[j, e, :-1])
    return out


def random_encoded(n_v=5, n_t=7, e=4, d=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    present = torch.rand(n_v, e, generator=g) < 0.6
    present[0] = False
    present[1] = True
    vid = torch.randn(n_v, e, d, generator=g, dtype=torch.float64)
    vid = torch.where(present[..., None], vid, 0.0)
    videos = torch.cat([vid, present[..., None].double()], -1)
    texts = torch.randn(n_t, e, d + 1, generator=g, dtype=torch.float64)
    texts[..., -1] *= 4  # logits of some spread
    return videos, texts


def test_mixture_scores_match_float64_pair_loop():
    videos, texts = random_encoded()
    got = mixture_scores(videos, texts)
    assert torch.allclose(got, naive_scores(videos, texts), rtol=0, atol=1e-12)
    assert torch.equal(got[0], torch.zeros(texts.shape[0], dtype=torch.float64))  # no experts


def test_mixture_scores_ignore_garbage_in_absent_slots():
    videos, texts = random_encoded()
    garbage = videos.clone()
    absent = garbage[..., -1] == 0
    garbage[..., :-1][absent] = float("nan")
    assert torch.equal(mixture_scores(garbage, texts), mixture_scores(videos, texts))


def test_mixture_weights_sum_to_one_over_present_and_zero_elsewhere():
    videos, texts = random_encoded(seed=3)
    present = videos[..., -1] > 0
    w = mixture_weights(present, texts[..., -1])
    assert w.shape == (5, 7, 4)
    assert bool((w[~present.unsqueeze(1).expand_as(w)] == 0).all())
    sums = w.sum(-1)
    has = present.any(1)
    assert torch.allclose(sums[has], torch.ones_like(sums[has]), atol=1e-12)
    assert torch.equal(sums[~has], torch.zeros_like(sums[~has]))
    # restricted softmax, by hand
    i, j = 2, 4
    have = present[i].nonzero().flatten()
    expect = torch.softmax(texts[j, have, -1], 0)
    assert torch.allclose(w[i, j, have], expect, atol=1e-12)


def test_model_mixture_weights_and_scores_consistent():
    model = ce_model().double().eval()
    with torch.no_grad():
        videos = model.encode_images(make_batch())
        texts = model.encode_texts(*captions())
    w = model.mixture_weights(videos, texts)
    cos = torch.einsum("ved,ted->vte", videos[..., :-1], texts[..., :-1])
    assert torch.allclose((w * cos).sum(-1), model.score(videos, texts), atol=1e-12)
    assert torch.allclose(model.score(videos, texts), naive_scores(videos, texts), atol=1e-12)


# -- building blocks --------------------------------------------------------------------------


def test_netvlad_matches_loop_and_ignores_padding():
    torch.manual_seed(0)
    vlad = NetVLAD(3, 2).double()
    x = torch.randn(4, 5, 3, dtype=torch.float64)
    lengths = torch.tensor([5, 2, 1, 0])
    mask = torch.arange(5)[None] < lengths[:, None]
    noisy = x.clone()
    noisy[~mask] = float("nan")
    got = vlad(noisy, mask)
    assert torch.equal(got, vlad(x, mask))
    for i in range(4):
        parts = []
        for k in range(2):
            v = torch.zeros(3, dtype=torch.float64)
            for t in range(int(lengths[i])):
                a = torch.softmax(vlad.assign(x[i, t]), 0)[k]
                v += a * (x[i, t] - vlad.centroids[k])
            parts.append(v / (v.norm() + 1e-8))
        flat = torch.cat(parts)
        assert torch.allclose(got[i], flat / (flat.norm() + 1e-8), atol=1e-12)
    assert torch.equal(got[3], torch.zeros(6, dtype=torch.float64))


@pytest.mark.parametrize("reduce", ["mean", "sum"])
def test_collaborative_gating_uses_only_present_partners(reduce):
    torch.manual_seed(0)
    cg = CollaborativeGating(4, reduce=reduce).double()
    p = torch.randn(3, 3, 4, dtype=torch.float64)
    present = torch.tensor([[1, 1, 1], [1, 0, 1], [0, 1, 0]]).bool()
    got = cg(p, present)
    for n in range(3):
        for e in range(3):
            terms = [
                cg.g2(torch.relu(cg.g1(torch.cat([p[n, e], p[n, j]]))))
                for j in range(3)
                if j != e and present[n, j] and present[n, e]
            ]
            agg = sum(terms) if terms else torch.zeros(4, dtype=torch.float64)
            if reduce == "mean" and terms:
                agg = agg / len(terms)
            want = torch.sigmoid(cg.h2(torch.relu(cg.h1(agg))))
            assert torch.allclose(got[n, e], want, atol=1e-12), (n, e)


# -- CE end to end ------------------------------------------------------------------------------


def test_ce_absent_experts_never_contribute():
    model = ce_model().eval()
    caps, lens = captions()
    with torch.no_grad():
        texts = model.encode_texts(caps, lens)
        base = model.encode_images(make_batch(fill=0.0))
        scores = model.score(base, texts)
        assert bool(torch.isfinite(base).all())
        for fill in (float("nan"), float("inf"), -float("inf"), 1e30):
            got = model.encode_images(make_batch(fill=fill))
            assert torch.equal(got, base), fill
            assert torch.equal(model.score(got, texts), scores), fill
    present = base[..., -1] > 0
    assert torch.equal(base[..., :-1][~present], torch.zeros_like(base[..., :-1][~present]))
    norms = base[..., :-1][present].norm(dim=-1)
    assert torch.allclose(norms, torch.ones_like(norms), atol=1e-5)
    assert torch.equal(scores[1], torch.zeros_like(scores[1]))  # the video without experts


def test_ce_a_partner_absent_for_one_video_changes_only_that_video():
    """Marking video 0's face absent changes video 0's other experts (collaborative gating
    reads present partners) and nothing of any other video."""
    model = ce_model().eval()
    batch = make_batch()
    other = make_batch()
    other.present[0, NAMES.index("face")] = False
    with torch.no_grad():
        a, b = model.encode_images(batch), model.encode_images(other)
    assert torch.equal(a[1:], b[1:])
    assert not torch.allclose(a[0, 0, :-1], b[0, 0, :-1])  # appearance gated differently
    assert b[0, 3, -1] == 0


def test_ce_expert_lookup_by_name_and_errors():
    model = ce_model().eval()
    batch = make_batch()
    order = [NAMES.index(n) for n in reversed(NAMES)]
    swapped = ExpertBatch(
        tuple(reversed(NAMES)),
        dict(batch.features),
        batch.present[:, order],
        batch.frames[:, order],
    )
    with torch.no_grad():
        assert torch.equal(model.encode_images(batch), model.encode_images(swapped))
    short = ExpertBatch(
        NAMES[:2],
        {n: batch.features[n] for n in NAMES[:2]},
        batch.present[:, :2],
        batch.frames[:, :2],
    )
    with pytest.raises(ValueError, match="'appearance' is not in the batch"):
        model.encode_images(short)
    bad = make_batch()
    bad.features["face"] = torch.randn(6, 9)
    with pytest.raises(ValueError, match=r"experts\.face"):
        model.encode_images(bad)
    with pytest.raises(ValueError, match="ExpertBatch"):
        model.encode_images(torch.randn(6, 4))
    assert model.token_lengths(torch.tensor([3, 9])).tolist() == [4, 4]
    assert model.experts == tuple(EXPERTS)
    assert model.image_encoder.in_dim == EXPERTS


def test_ce_forward_shapes_and_gradients_reach_every_parameter():
    model = ce_model().train()
    caps, lens = captions(6)
    batch = SimpleNamespace(features=make_batch(fill=float("nan")), captions=caps, lengths=lens)
    scores = model(batch)
    assert scores.shape == (6, 6)
    (scores.diagonal().sum() - scores.sum() / 6).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and bool(torch.isfinite(p.grad).all()), name
        assert float(p.grad.abs().sum()) > 0, name

    def gather(texts, rows):  # a second "rank" holding the same captions reversed
        return torch.cat([texts, texts.flip(0)]), torch.cat([rows, rows.flip(0)])

    wide = model(batch, gather_texts=gather)
    assert wide.shape == (6, 12)
    # The same pairs in other columns of one float32 matmul: a cosine mixture (|s| <= 1) of
    # EMB + 1 products per expert, rounded per its summation order (bound (EMB + 1) eps32).
    tol = (EMB + 1) * torch.finfo(torch.float32).eps
    torch.testing.assert_close(wide[:, 6:], wide[:, :6].flip(1), rtol=0, atol=tol)


def assert_pair_scoring_matches_score(model, caps, lens) -> None:
    """The blocked pair-scoring evaluation (4 videos x 3 captions a block, packed words) gives
    the model's own ``score`` of the whole batch. The model runs in float64 on both sides,
    differing in blocking only; the evaluation stores its matrix in float32, one rounding of
    scores that are mixtures of cosines (|s| <= 1): within float32's eps of the truth."""
    model = model.double()
    b = make_batch()
    feats = {n: f.double() for n, f in b.features.items()}
    batch = ExpertBatch(b.names, feats, b.present, b.frames)
    with torch.no_grad():
        videos = model.encode_images(batch)
        texts = model.encode_texts(caps, lens)
        rows = model.token_lengths(lens)
        tokens = TextTokens(pack_words(texts, rows), rows)
        got = score_matrix(model, videos, tokens, device="cpu", image_block=4, text_block=3)
        want = model.score(videos, texts)
    assert want.dtype == torch.float64 and bool((want.abs() <= 1 + 1e-12).all())
    tol = torch.finfo(torch.float32).eps + 64 * torch.finfo(torch.float64).eps
    torch.testing.assert_close(got.double(), want, rtol=0, atol=tol)


def test_ce_runs_in_the_pair_scoring_evaluation():
    assert_pair_scoring_matches_score(ce_model().eval(), *captions(7))


# -- config -------------------------------------------------------------------------------------


def test_ce_config_round_trip_and_defaults():
    model = ce_model()
    cfg = model.config
    assert cfg["text"] == {"vocab_size": VOCAB, "word_dim": 7, "vlad_clusters": 4}
    assert cfg["collaborative"] is True and cfg["cg_reduce"] == "mean"
    assert list(cfg["experts"]) == list(EXPERTS)
    again = build_model(cfg)
    assert isinstance(again, CollaborativeExperts)
    assert again.config == cfg
    default = build_model({"kind": "ce", "experts": {"a": 3}}, vocab_size=5)
    assert default.embed_dim == 512 and default.config["text"]["vlad_clusters"] == 32


@pytest.mark.parametrize(
    ("change", "vocab", "match"),
    [
        ({"experts": None}, VOCAB, "^experts: required"),
        ({"experts": {}}, VOCAB, "^experts: must be a non-empty table"),
        ({"experts": {"a": 0}}, VOCAB, r"^experts\.a: must be a positive int"),
        ({"vlad_clusters": {"speech": 4}}, VOCAB, r"^vlad_clusters\.speech: not one of"),
        ({"vlad_clusters": {"audio": 0}}, VOCAB, r"^vlad_clusters\.audio: must be a positive"),
        ({"cg_reduce": "max"}, VOCAB, "^cg_reduce: must be one of"),
        ({"collaborative": 1}, VOCAB, "^collaborative: must be true or false"),
        ({"embed_dim": -2}, VOCAB, "^embed_dim: must be a positive"),
        ({"heads": 2}, VOCAB, "^heads: unknown key"),
        ({"text": {"clusters": 3}}, VOCAB, r"^text\.clusters: unknown key"),
        ({}, None, r"^text\.vocab_size: CE's word embedding needs"),
        ({"text": {"vocab_size": 3}}, VOCAB, r"^text\.vocab_size: 3 in the config disagrees"),
    ],
)
def test_ce_config_errors_name_the_key(change, vocab, match):
    cfg = {"kind": "ce", "experts": EXPERTS, **change}
    if cfg["experts"] is None:
        del cfg["experts"]
    with pytest.raises(ValueError, match=match):
        build_model(cfg, vocab_size=vocab)


def test_unknown_kind_lists_the_video_kinds():
    with pytest.raises(ValueError, match="'ce'.*'mmt'|'mmt'.*'ce'"):
        build_model({"kind": "cee", "experts": EXPERTS})
